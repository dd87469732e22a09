"""rms_norm_rope in a graph: Gemma's q/k RMSNorm with a weight whose result only the rotate-half rotary embedding
reads, written as transformers writes them (``Gemma4RMSNorm``, ``apply_rotary_pos_emb``) and traced
(``kforge.ops._pattern``). The float32 conversions come and go with the example dtypes; the products' operand order
is the matcher's."""
from __future__ import annotations

import torch

from ..._pattern import Pattern, meta


def _rope(y, cos, sin):
    half = y.shape[-1] // 2
    return y * cos + torch.cat((-y[..., half:], y[..., :half]), dim=-1) * sin


def rms_norm_rope(input, weight, cos, sin, eps):
    """Gemma's spelling: ``pow(mean_squared, -0.5)``."""
    x = input.float()
    y = (x * torch.pow(x.pow(2).mean(-1, keepdim=True) + eps, -0.5) * weight.float()).type_as(input)
    return _rope(y, cos, sin)


def rms_norm_rope_rsqrt(input, weight, cos, sin, eps):
    """The other spelling of the reciprocal root: ``rsqrt(mean_squared)``."""
    x = input.float()
    y = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).type_as(input)
    return _rope(y, cos, sin)


def _keeps_the_input(values, out) -> bool:
    """The kernel writes the input's shape and dtype (cos and sin of another dtype would promote the result)."""
    x = values["input"]
    return tuple(out.shape) == tuple(x.shape) and out.dtype == x.dtype


# NB: input and weight each in float32 or not: the conversions to float32 (and back) are there or not
PATTERN = Pattern(
    (rms_norm_rope, rms_norm_rope_rsqrt),
    tuple({"input": meta(1, 2, 3, 8, dtype=dt), "weight": meta(8, dtype=wt), "cos": meta(1, 1, 3, 8, dtype=dt),
           "sin": meta(1, 1, 3, 8, dtype=dt), "eps": 0.0123}
          for dt in (torch.bfloat16, torch.float32) for wt in (torch.bfloat16, torch.float32)),
    check=_keeps_the_input)
