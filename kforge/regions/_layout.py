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

import torch.fx as fx

from ..ops import FUSED_EPILOGUES, Variant

log = logging.getLogger("kforge.regions")


def inductor_lays_out_channels_last(gm: fx.GraphModule) -> bool:
    """Whether Inductor would run ``gm``'s convolutions channels-last (its own heuristic, asked on
    the ATen graph; False where it cannot say)."""
    try:
        from torch._inductor import config
        from torch._inductor.graph import GraphLowering

        if not getattr(config, "layout_optimization", False):
            return False
        return bool(GraphLowering.decide_layout_opt(gm, is_inference=True))
    except Exception as exc:  # NB: an Inductor internal; its absence or failure means no layout change
        log.debug("kforge: Inductor's layout decision not available: %s", exc)
        return False


def _channels_last_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    n, c, *spatial = shape
    strides = [0] * len(shape)
    step = 1
    strides[1] = step
    step *= c
    for d in range(len(shape) - 1, 1, -1):
        strides[d] = step
        step *= shape[d]
    strides[0] = step
    return tuple(strides)


def channels_last_twin(variant: Variant) -> Variant | None:
    """The channels-last form of a fused operator's variant whose first input and output are
    contiguous N,C,H,W (or N,C,D,H,W); None where it has no such form (other ops, other ranks,
    a layout already other than contiguous)."""
    if variant.op not in FUSED_EPILOGUES or not variant.inputs or variant.inputs[0] is None or not variant.outputs:
        return None
    x, y = variant.inputs[0], variant.outputs[0]
    if len(x.shape) not in (4, 5) or not x.is_contiguous or x.shape != y.shape or not y.is_contiguous:
        return None
    cl = _channels_last_strides(tuple(x.shape))
    as_cl = lambda s: replace(s, stride=cl)  # noqa: E731
    return replace(variant, inputs=(as_cl(x), *variant.inputs[1:]), outputs=(as_cl(y), *variant.outputs[1:]))



def contiguous_form(variant: Variant) -> Variant | None:
    """A fused operator's variant with its first input and output contiguous (what a channels-last
    twin stands for in eager mode, where the op cards were captured); None where it already is."""
    if variant.op not in FUSED_EPILOGUES or not variant.inputs or variant.inputs[0] is None or not variant.outputs:
        return None
    x, y = variant.inputs[0], variant.outputs[0]
    if x.is_contiguous and y.is_contiguous:
        return None
    dense = lambda s: replace(s, stride=_contiguous_strides(tuple(s.shape)))  # noqa: E731
    return replace(variant, inputs=(dense(x), *variant.inputs[1:]), outputs=(dense(y), *variant.outputs[1:]))


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))
