"""rms_norm_rope: Gemma 4's q/k RMSNorm (float32 statistics and weight, then the input's dtype) whose result only
the rotate-half rotary embedding reads (q_norm / k_norm, then apply_rotary_pos_emb), as one operator.

Under torch.compile Inductor fuses them with the rotary angles' cos and sin into one persistent reduction a layer,
17.2 us a call (one warp a block) on the H200 for Gemma 4 E2B at 512 tokens, with a few microseconds of bytes to
move (compiled profile of 2026-12-04l); kforge finds the chain in the ATen graph (``pattern``) and takes cos and sin
(the unsqueezed views the model multiplies by, made once a forward) as inputs. It is no operator-and-epilogue pair.
"""
from __future__ import annotations

from ..._family import Family, register_family
from ..._registry import OpSpec
from . import _spec
from ._pattern import PATTERN

RMS_NORM_ROPE = register_family(Family(
    OpSpec(name="rms_norm_rope", kind="normalization", targets=(),
           inputs=("input", "weight", "cos", "sin"), params=("eps",), bind=_spec.bind, reference=_spec.reference,
           doc="rope(rms_norm(x) * weight): an RMSNorm over the last dimension (float32 statistics and weight, then "
               "the input's dtype) and the rotary embedding in rotate-half form, cos and sin broadcast over the "
               "leading dimensions (found in the model's graph: no eager spelling)"),
    doc="rope(rms_norm(x) * weight), the rotary embedding in rotate-half form the norm's only reader",
    graph="aten", pattern=PATTERN, strategies=(f"{__name__}.strategies",)))
