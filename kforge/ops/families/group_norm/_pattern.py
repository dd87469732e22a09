"""group_norm in a graph: an affine group_norm whose statistics nobody reads, alone (the call its channels-last twin
takes) or with the SiLU that alone reads it, traced (``kforge.ops._pattern``); and the convolution bias a fused
kernel can take as its prologue, a predicate (``peelable_bias``)."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..._aten import bind_node, val
from ..._pattern import Pattern, meta

aten = torch.ops.aten


def group_norm(input, weight, bias, num_groups, eps):
    """NB: ``native_group_norm`` itself, not ``F.group_norm``, whose decomposition first makes its input contiguous
    (a clone on CUDA where it is channels-last): the card takes the tensor the graph's group_norm reads."""
    n, c = input.shape[:2]
    return aten.native_group_norm(input, weight, bias, n, c, input.numel() // (n * c), num_groups, eps)[0]


def group_norm_silu(input, weight, bias, num_groups, eps):
    return F.silu(group_norm(input, weight, bias, num_groups, eps))


_EXAMPLES = ({"input": meta(2, 14, 5, 5), "weight": meta(14), "bias": meta(14), "num_groups": 7, "eps": 0.0123},)
GROUP_NORM = Pattern((group_norm,), _EXAMPLES)
GROUP_NORM_SILU = Pattern((group_norm_silu,), _EXAMPLES)


def inductor_peels_conv_bias(device: torch.device) -> bool:
    """Whether Inductor runs a convolution on ``device`` without its bias and adds the bias in a pointwise
    kernel of its own (torch/_inductor/kernel/conv.py: on every device but the CPU, "cudnn is slower with it")."""
    return device.type != "cpu"


def peelable_bias(x: Any) -> fx.Node | None:
    """The bias of the convolution ``x`` where a fused kernel can take it as a prologue: a 2-d convolution with
    a bias whose output nothing but the group_norm reads, on a device where Inductor peels the bias off.

    NB: a predicate, not a pattern: the kernel's first input is the convolution's own node (deploy runs it without
    its bias), whichever of its many spellings (stride, padding, groups) it has, and whether Inductor peels the bias
    depends on the device and the kernel's design on the shapes."""
    if not (isinstance(x, fx.Node) and x.op == "call_function" and x.target is aten.convolution.default) \
            or len(x.users) != 1:
        return None
    a = bind_node(x)
    bias, v = a.get("bias"), val(x)
    if not isinstance(bias, fx.Node) or not isinstance(val(bias), torch.Tensor) or a.get("transposed") \
            or not isinstance(v, torch.Tensor) or v.dim() != 4 or not inductor_peels_conv_bias(v.device):
        return None
    # NB: the shapes the prologue's CUDA design (group_norm_silu's nhwc_tiles: a position's channels over at most
    # 1024 threads, the samples a grid dimension) takes; elsewhere the plain fused card keeps its other designs
    if v.shape[1] > 1024 or v.shape[0] > 65535:
        return None
    return bias


def silu_reads(fn: Any, user: fx.Node) -> bool:
    """In dynamo's graph: whether ``user`` (calling ``fn`` on a group_norm's value, its only reader) is the SiLU
    epilogue. NB: not an in-place SiLU, which writes into the group_norm's output that the kernel never makes."""
    if fn is not torch.nn.functional.silu:
        return False
    return not (user.kwargs.get("inplace") or (len(user.args) > 1 and user.args[1] is True))
