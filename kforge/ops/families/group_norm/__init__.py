"""group_norm, and the SiLU that alone reads it fused onto it, with or without the bias of the convolution that
alone feeds it.

Under torch.compile Inductor fuses the SiLU into its group_norm; a kforge group_norm alone then costs the model an
extra pass over the tensor for the SiLU. The fused forms have no eager spelling to patch (``targets`` is empty):
their cards come from the model's ATen graph (``pattern``) and their kernels run there (compiled, or the forward
apply() captures), in place of the calls they stand for. Every form gets a channels-last twin where Inductor lays
the graph out channels-last (the layout the CPU graph capture gives convolution outputs).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..._family import Epilogue, Family, register_family
from ..._registry import OpSpec
from . import _spec
from ._pattern import GROUP_NORM, GROUP_NORM_SILU, peelable_bias, silu_reads

_STRATEGIES = (f"{__name__}.strategies",)   # NB: the proposers layer's, imported by name only

GROUP_NORM = register_family(Family(
    OpSpec(name="group_norm", kind="normalization", targets=(F.group_norm, torch.group_norm),
           inputs=("input", "weight", "bias"), params=("num_groups", "eps"), bind=_spec.bind_group_norm,
           reference=_spec.group_norm, doc="group normalization of an N,C,* tensor"),
    doc="group normalization; a channels-last twin where Inductor lays the graph out so",
    layout_twin=True, pattern=GROUP_NORM, strategies=_STRATEGIES))

GROUP_NORM_SILU = register_family(Family(
    OpSpec(name="group_norm_silu", kind="normalization", targets=(),
           inputs=("input", "weight", "bias"), params=("num_groups", "eps"), bind=_spec.bind_group_norm,
           reference=_spec.group_norm_silu,
           doc="silu(group_norm(x)): a group normalization whose only reader is a SiLU (found in the model's graph: "
               "no eager spelling)"),
    doc="silu(group_norm(x)), the SiLU the group_norm's only reader",
    graph="aten", epilogue=Epilogue("group_norm", "silu", silu_reads), layout_twin=True, pattern=GROUP_NORM_SILU,
    strategies=_STRATEGIES))

# NB: a prologue too: the convolution bias Inductor peels off on CUDA ("cudnn is slower with it") and adds in
# a pointwise kernel of its own, which it fuses into its group_norm's reads. A kforge kernel taking the
# convolution's output would make Inductor write that sum first (one more read and write of the tensor: 652 us
# a forward for one SD3.5 VAE call on the H200, profile of 2026-12-03m); this one takes the bias-free output
# and the bias (``peel``: a convolution whose only reader is the group_norm of a group_norm_silu call).
BIASED_GROUP_NORM_SILU = register_family(Family(
    OpSpec(name="biased_group_norm_silu", kind="normalization", targets=(),
           inputs=("input", "input_bias", "weight", "bias"), params=("num_groups", "eps"),
           bind=_spec.bind_biased_group_norm, reference=_spec.biased_group_norm_silu,
           doc="silu(group_norm(x + input_bias per channel)): a convolution's bias, a group normalization and the "
               "SiLU that alone reads it (found in the model's graph: no eager spelling)"),
    doc="silu(group_norm(x + the convolution's bias per channel)), the bias Inductor peels off the convolution",
    graph="aten", epilogue=Epilogue("group_norm", "silu", silu_reads), prologue_of="group_norm_silu",
    peel=peelable_bias, layout_twin=True, strategies=_STRATEGIES))
