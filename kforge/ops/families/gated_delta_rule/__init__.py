"""gated_delta_rule: Qwen 3.5's linear attention (a decaying, delta-corrected state), an operator that stands for a
Python function the model calls (transformers' ``torch_chunk_gated_delta_rule`` for a prompt and its token-by-token
twin ``torch_recurrent_gated_delta_rule`` for a decode step on the cached state) rather than a torch callable.

In eager mode it is dozens of small operators (and a loop over 64-token chunks); under torch.compile Inductor fuses
some of them, and the loop and float32 matrix products stay (1.5-1.8 ms of compiled Qwen 3.5's 5.8 ms of GPU time
at 4 layers and 512 tokens on the H200, compiled_profile_qwen35_moe_h200_2026-12-03t). Its calls are reached through
hooks on those functions (kforge.ops._functions) and placed in dynamo's graph as the function's graph twin.
"""
from __future__ import annotations

from ..._family import Family, register_family
from ..._registry import OpSpec
from . import _spec

GATED_DELTA_RULE = register_family(Family(
    OpSpec(name="gated_delta_rule", kind="recurrent", targets=(), functions=_spec.FUNCTIONS,
           eager=_spec.eager, inputs=("query", "key", "value", "g", "beta", "initial_state"),
           params=("use_qk_l2norm", "output_final_state"), bind=_spec.bind,
           reference=_spec.reference, sample=_spec.sample,
           doc="the gated delta rule (linear attention with a decaying, delta-corrected state): output [B, T, Hv, "
               "Dv], and the final state [B, Hv, Dk, Dv] when asked"),
    doc="the gated delta rule, transformers' chunked and token-by-token functions",
    strategies=(f"{__name__}.strategies",)))
