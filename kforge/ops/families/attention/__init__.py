"""Attention: ``scaled_dot_product_attention`` (torch's call, whose eager kernel is the backend SDPA chooses: flash,
memory-efficient, cuDNN or its C++ math), and the same computation written out by hand (``softmax_attention``:
scores, scale, soft-capping, mask, softmax, values), which eager runs as two batched products around a softmax that
reads and writes the whole score matrix.

Both are one kernel design (``strategies``): a flash-style loop over the keys with an online softmax, scores never
stored, float accumulation. Masks are inputs (a model's causal or sliding-window mask arrives as one; ``is_causal``
is computed), grouped-query attention reads each key and value head once for its group of query heads. On Hopper,
``wgmma_tiles`` runs the same design's SDPA on the tensor cores (16-bit inputs, widths 64-256). The
written-out chain is found in the model's ATen graph (``pattern``) and placed there; its kernel rounds the scores
at each step as eager's operators do.
"""
from __future__ import annotations

import torch.nn.functional as F

from ..._family import Family, register_family
from . import _spec
from ._pattern import PATTERN

_STRATEGIES = (f"{__name__}.strategies", f"{__name__}.strategies.wgmma_tiles")   # NB: the proposers layer's, imported by name only

SDPA = register_family(Family(
    _spec.AttentionSpec(name="scaled_dot_product_attention", kind="vendor", vendor="flash",
                        targets=(F.scaled_dot_product_attention,),
                        inputs=("query", "key", "value", "attn_mask"), params=("is_causal", "scale", "enable_gqa"),
                        bind=_spec.bind_sdpa, reference=_spec.sdpa_reference, sample=_spec.sample_attention,
                        doc="softmax(q k^T * scale + mask) v"),
    doc="torch's scaled_dot_product_attention: causal, masked (boolean or added), grouped-query",
    strategies=_STRATEGIES))

SOFTMAX_ATTENTION = register_family(Family(
    _spec.ChainSpec(name="softmax_attention", kind="vendor", targets=(),
                    inputs=("query", "key", "value", "mask"), params=("scale", "softcap", "fill"),
                    bind=_spec.bind_chain, reference=_spec.chain_reference, sample=_spec.sample_attention,
                    doc="softmax(softcap(q k^T * scale) + mask) v written out as torch operators (found in the model's "
                        "graph: no eager spelling)"),
    doc="attention written out: scores, scale, soft-capping, mask added or filled, softmax, values",
    graph="aten", pattern=PATTERN, strategies=_STRATEGIES))
