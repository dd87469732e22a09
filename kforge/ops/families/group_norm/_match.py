"""group_norm in an ATen graph: an affine ``native_group_norm`` whose statistics nobody reads, fused with the SiLU
that alone reads it (and with the bias of the convolution that alone feeds it, where Inductor peels that bias off),
or alone (the call its channels-last twin takes)."""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from ..._aten import bind_node, tensor_nodes, val
from ..._family import FusedMatch
from ..._registry import Unsupported, get_spec

aten = torch.ops.aten


def match_fused(graph: fx.Graph) -> list[FusedMatch]:
    """Each affine group_norm whose output only a SiLU reads, as one ``group_norm_silu`` call
    (``biased_group_norm_silu`` where its kernel can take its convolution's bias as well)."""
    return [m for m in _group_norms(graph) if m.variant.op != "group_norm"]


def match_lone(graph: fx.Graph) -> list[FusedMatch]:
    """Every affine group_norm that ``match_fused`` does not take, as one ``group_norm`` call: what a channels-last
    twin of the operator card stands for (regions._layout)."""
    return [m for m in _group_norms(graph) if m.variant.op == "group_norm"]


def _group_norms(graph: fx.Graph) -> list[FusedMatch]:
    """Each affine group_norm whose statistics nobody reads: with the SiLU that alone reads it as
    ``group_norm_silu``, else as ``group_norm``."""
    found = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target is not aten.native_group_norm.default:
            continue
        outs = list(node.users)
        if len(outs) != 1 or outs[0].target is not operator.getitem or outs[0].args[1] != 0:
            continue
        (act,) = list(outs[0].users) if len(outs[0].users) == 1 else (None,)
        if act is not None and (act.op != "call_function" or act.target is not aten.silu.default):
            act = None
        a = bind_node(node)
        x, w, b = a["input"], a.get("weight"), a.get("bias")
        if not tensor_nodes(x, w, b):
            continue   # NB: no affine: nothing to hold an example of; the plain group_norm card stays
        last = act if act is not None else outs[0]
        nodes = (node, outs[0]) + ((act,) if act is not None else ())
        conv_bias = _peelable_bias(x) if act is not None else None
        try:
            if conv_bias is not None:
                spec = get_spec("biased_group_norm_silu")
                call = spec.bind(val(x), val(conv_bias), int(a["group"]), val(w), val(b), float(a["eps"]))
                found.append(FusedMatch(spec.variant(call, [val(last)]), nodes, (x, conv_bias, w, b), (last,),
                                        peeled=x))
                continue
            spec = get_spec("group_norm_silu" if act is not None else "group_norm")
            call = spec.bind(val(x), int(a["group"]), val(w), val(b), float(a["eps"]))
            variant = spec.variant(call, [val(last)])
        except (Unsupported, TypeError, ValueError):
            continue
        found.append(FusedMatch(variant, nodes, (x, w, b), (last,)))
    return found


def inductor_peels_conv_bias(device: torch.device) -> bool:
    """Whether Inductor runs a convolution on ``device`` without its bias and adds the bias in a pointwise
    kernel of its own (torch/_inductor/kernel/conv.py: on every device but the CPU, "cudnn is slower with it")."""
    return device.type != "cpu"


def _peelable_bias(x: Any) -> fx.Node | None:
    """The bias of the convolution ``x`` where a fused kernel can take it as a prologue: a 2-d convolution with
    a bias whose output nothing but the group_norm reads, on a device where Inductor peels the bias off."""
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
