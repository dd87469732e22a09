"""Inductor's layout choice for convolution graphs, which fused operators must follow.

Inductor runs the convolutions of a graph channels-last when its heuristic says so (layout
optimization: on the GPU for most inference graphs of 3x3 convolutions, on the CPU whenever mkldnn
runs them). A ``kforge::run`` call that wants the traced (contiguous) layout then costs two copies
in the compiled model: into the kernel's layout before it and back after it (seen in Inductor's
generated code on the CPU: a ``cpp_fused_run`` copy kernel in front of every call). So where the
graph will be laid out channels-last, a fused operator's card and kernel are the channels-last
twin of what the graph traced, and its call goes through ``kforge::run_flexible``, which Inductor
hands its buffers as they are.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Sequence

import torch
import torch.fx as fx

from ..ops import Variant, channels_last_strides, has_layout_twin

log = logging.getLogger("kforge.regions")


def inductor_lays_out_channels_last(gm: fx.GraphModule) -> bool:
    """Whether Inductor would run ``gm``'s convolutions channels-last (its own heuristic, asked on
    the ATen graph; False where it cannot say)."""
    try:
        from torch._inductor import config
        from torch._inductor.graph import GraphLowering

        if not getattr(config, "layout_optimization", False):
            return False
        return bool(GraphLowering.decide_layout_opt(gm, is_inference=not torch.is_grad_enabled()))
    except Exception as exc:  # NB: an Inductor internal; its absence or failure means no layout change
        log.debug("kforge: Inductor's layout decision not available: %s", exc)
        return False


def channels_last_twin(variant: Variant, given: Sequence[bool] = ()) -> Variant | None:
    """The channels-last form of a variant of an operator with a layout twin (``Family.layout_twin``) whose first
    input and output are contiguous N,C,H,W, or of a pointwise region whose full-shape 4-d tensors are all contiguous (a
    residual add + relu between convolutions); None where it has no such form (other ops, a
    reduction, other ranks: Inductor lays out only 2-d convolutions' graphs channels-last, a layout
    already other than contiguous).

    ``given[i]``: input i is one of the graph's own inputs (a placeholder), which Inductor does not lay
    out anew; it keeps its traced layout."""
    given = tuple(given) + (False,) * (len(variant.inputs) - len(given))
    if variant.op == "region":
        return _region_twin(variant, given)
    if not has_layout_twin(variant.op) or not variant.inputs or variant.inputs[0] is None or not variant.outputs \
            or given[0]:
        return None
    x, y = variant.inputs[0], variant.outputs[0]
    if len(x.shape) != 4 or not x.is_contiguous or x.shape != y.shape or not y.is_contiguous:
        return None
    cl = channels_last_strides(tuple(x.shape))
    as_cl = lambda s: replace(s, stride=cl)  # noqa: E731
    return replace(variant, inputs=(as_cl(x), *variant.inputs[1:]), outputs=(as_cl(y), *variant.outputs[1:]))


def _region_twin(variant: Variant, given: Sequence[bool]) -> Variant | None:
    from ._spec import region_ir, region_variant

    ir = region_ir(variant)
    if ir.reduction is not None or not variant.outputs:
        return None
    shape = tuple(variant.outputs[0].shape)
    if len(shape) != 4 or any(tuple(o.shape) != shape or not o.is_contiguous for o in variant.outputs):
        return None
    full = [s is not None and tuple(s.shape) == shape and not g for s, g in zip(variant.inputs, given)]
    if not any(full) or any(f and not s.is_contiguous for f, s in zip(full, variant.inputs)):
        return None
    cl = channels_last_strides(shape)
    inputs = [replace(s, stride=cl) if f else s for f, s in zip(full, variant.inputs)]
    try:
        twin = region_variant(ir, inputs)   # outputs as eager lays them out from channels-last inputs
    except Exception:  # NB: no twin rather than no regions (capture) or no compile (deploy)
        return None
    return twin if all(tuple(o.stride) == cl for o in twin.outputs) else None
