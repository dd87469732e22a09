"""softmax_attention in a graph: attention written out by hand, as transformers' ``eager_attention_forward`` writes it
(scores, scaled, optionally soft-capped, masked, a float32 softmax, an inference dropout, times the values) and as
plain PyTorch code writes it (a softmax in the scores' dtype, ``masked_fill`` with a boolean mask), traced
(``kforge.ops._pattern``). Grouped heads are repeated before the chain (``repeat_kv``): the chain's key and value are
the repeated views.

The products are written at the operators the model's functional ATen graph holds for ``torch.matmul`` of 4-d
tensors (each operand expanded to the batch shape and flattened to 3-d, a view where its strides allow it, else a
contiguous copy; ``bmm``; a view back to 4-d), and the inference dropout as the copy it leaves there: a plain trace
of ``torch.matmul`` and ``F.dropout`` gives other operators (``_unsafe_view`` after the product, no copy)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..._pattern import Pattern, meta


def _matmul(a, b):
    """``torch.matmul`` of two 4-d tensors, as the functional graph holds it."""
    *lead, m, k = a.shape
    n, batch = b.shape[-1], math.prod(lead)
    # NB: reshape, as ATen's matmul writes it: a view where the strides allow one, else a contiguous copy and an
    # unsafe view (a query or key the model transposed into [batch, heads, tokens, width] is one of those)
    a3 = a.expand(*lead, m, k).reshape(batch, m, k)
    b3 = b.expand(*lead, k, n).reshape(batch, k, n)
    return torch.bmm(a3, b3).view(*lead, m, n)


def _spelling(upcast: bool, dropout: bool):
    """One spelling: the softmax in float32 and back (``upcast``) or in the scores' dtype; the probabilities through
    an inference dropout or not."""

    def softmax_attention(query, key, value, mask, scale, softcap, fill):
        s = _matmul(query, key.transpose(2, 3)) * scale
        if softcap is not None:
            s = s / softcap
            s = torch.tanh(s)
            s = s * softcap
        if mask is not None:
            s = s.masked_fill(mask, fill) if fill is not None else s + mask
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(query.dtype) if upcast else F.softmax(s, dim=-1)
        if dropout:
            p = p.clone()
        return _matmul(p, value)

    softmax_attention.__qualname__ = f"softmax_attention{'_upcast' if upcast else ''}{'_dropout' if dropout else ''}"
    return softmax_attention


SPELLINGS = tuple(_spelling(upcast, dropout) for upcast in (True, False) for dropout in (True, False))


def _examples():
    """No mask, an added mask, a boolean mask filled; soft-capped or not. bfloat16: the upcast spelling's float32
    casts appear, and the plain one's structure is float32's. The scalars mark where they go: none of them is a
    literal of the chain."""
    q, k, v = meta(1, 2, 3, 8, dtype=torch.bfloat16), meta(1, 2, 5, 8, dtype=torch.bfloat16), \
        meta(1, 2, 5, 4, dtype=torch.bfloat16)
    for mask, fill in ((None, None), (meta(1, 1, 3, 5, dtype=torch.bfloat16), None),
                       (meta(1, 1, 3, 5, dtype=torch.bool), -1234.5)):
        for softcap in (None, 37.25):
            yield {"query": q, "key": k, "value": v, "mask": mask, "scale": 0.0123, "softcap": softcap, "fill": fill}


def _keeps_the_query(values, out) -> bool:
    """The output has the query's dtype and the value's width (the kernel writes that)."""
    q = values["query"]
    return out.dtype == q.dtype and tuple(out.shape) == (*q.shape[:-1], values["value"].shape[-1])


PATTERN = Pattern(SPELLINGS, tuple(_examples()), check=_keeps_the_query)
