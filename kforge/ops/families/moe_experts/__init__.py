"""moe_experts: a mixture of experts' experts, an operator that stands for transformers' experts implementations
(``grouped_mm_experts_forward``, ``batched_mm_experts_forward``), reached through hooks on those functions
(kforge.ops._functions) and placed in dynamo's graph as their graph twin of bound tensors.

In eager decoding Qwen 3.5's experts are a score of small operators a layer and a token (sort, gather, histc,
cumsum, two grouped products, the gate, the unsort, the sum), paid on the host: its eager decode on the H200 is
host-bound (65 tokens/s at 4 layers, 1.7 ms of GPU kernels in 15 ms a token, 2026-12-04q).
"""
from __future__ import annotations

from ..._family import Family, register_family
from ..._registry import OpSpec
from . import _spec

MOE_EXPERTS = register_family(Family(
    OpSpec(name="moe_experts", kind="vendor", vendor="cublas", targets=(), functions=_spec.FUNCTIONS,
           eager=_spec.eager,
           inputs=("hidden_states", "top_k_index", "top_k_weights", "gate_up_proj", "down_proj"), params=("impl",),
           bind=_spec.bind, reference=_spec.reference, sample=_spec.sample,
           io_bytes=_spec.io_bytes,
           doc="a mixture of experts' experts: each token's K experts (SiLU-gated, weights [E, 2I, H] and [E, H, I]), "
               "summed with their routing weights: output [T, H]"),
    doc="a mixture of experts' SiLU-gated experts, transformers' grouped_mm and batched_mm implementations",
    strategies=(f"{__name__}.strategies",)))
