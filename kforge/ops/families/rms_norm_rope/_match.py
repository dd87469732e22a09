"""rms_norm_rope in an ATen graph: Gemma's RMSNorm with a weight whose result only the rotate-half rotary embedding
reads, walked node by node (the pattern has several spellings: ``pow(-0.5)`` or ``rsqrt``, products in either
order, the float32 conversions present or not)."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from ..._aten import bind_node, is_call, is_scalar, tensor_nodes, val
from ..._aten import rank as node_rank
from ..._family import FusedMatch
from ..._registry import Unsupported, get_spec
from ..._signature import TensorSig

aten = torch.ops.aten


def _operands(node: Any, target) -> tuple[Any, Any] | None:
    """The two operands of a binary ``target`` call (None for anything else)."""
    if not is_call(node, target) or len(node.args) != 2 or node.kwargs:
        return None
    return node.args[0], node.args[1]


def _either(pair: tuple[Any, Any] | None, test) -> tuple[Any, Any] | None:
    """``pair`` ordered so that ``test`` holds for its first element (None where it holds for neither)."""
    if pair is None:
        return None
    if test(pair[0]):
        return pair
    if test(pair[1]):
        return pair[1], pair[0]
    return None


def _to_copy_of(node: Any, dtype: torch.dtype) -> Any:
    """``x`` where ``node`` is ``x`` converted to ``dtype`` by ``aten._to_copy`` (only the dtype changing), ``node``
    itself where it already has that dtype, else None."""
    v = val(node)
    if not isinstance(v, torch.Tensor) or v.dtype != dtype:
        return None
    if _dtype_copy(node):
        return node.args[0]
    return node


def _dtype_copy(node: Any) -> bool:
    """Whether ``node`` is an ``aten._to_copy`` that changes only the dtype (same device, strided, no copy flags)."""
    if not is_call(node, aten._to_copy.default) or len(node.args) != 1:
        return False
    k, src = node.kwargs, val(node.args[0])
    return (set(k) <= {"dtype", "layout", "device"} and k.get("layout", torch.strided) == torch.strided
            and isinstance(src, torch.Tensor) and torch.device(k.get("device", src.device)) == src.device)


def _rms_norm_of(y: Any) -> tuple[Any, Any, float, list] | None:
    """(x, weight, eps, the nodes) where ``y`` is ``((xf * pow(mean(xf ** 2, -1, keepdim) + eps, -0.5)) *
    weight.float()).to(x.dtype)`` with ``xf = x.float()`` (Gemma's RMSNorm; ``rsqrt`` for the power too)."""
    yv = val(y)
    if not isinstance(yv, torch.Tensor):
        return None
    if _dtype_copy(y):
        z, nodes = y.args[0], [y]
    elif yv.dtype == torch.float32:
        z, nodes = y, []
    else:
        return None
    if not isinstance(val(z), torch.Tensor) or val(z).dtype != torch.float32:
        return None
    pair = _either(_operands(z, aten.mul.Tensor), lambda n: _rs_of(n) is not None)
    if pair is None:
        return None
    p, wf = pair
    xf, rs, eps, rs_nodes = _rs_of(p)
    weight = _to_copy_of(wf, torch.float32)
    if weight is None or not isinstance(val(weight), torch.Tensor) or val(weight).dim() != 1:
        return None
    x = _to_copy_of(xf, torch.float32)
    if x is None:
        return None
    nodes += [z, p] + rs_nodes + ([wf] if wf is not weight and len(wf.users) == 1 else []) \
        + ([xf] if xf is not x else [])
    if val(x).dtype != yv.dtype:
        return None
    return x, weight, eps, nodes


def _rs_of(p: Any) -> tuple[Any, Any, float, list] | None:
    """(xf, the reciprocal root, eps, its nodes) where ``p`` is ``xf * pow(mean(xf ** 2, [-1], True) + eps, -0.5)``
    (or ``rsqrt``)."""
    pair = _operands(p, aten.mul.Tensor)
    if pair is None:
        return None
    for xf, rs in (pair, pair[::-1]):
        if is_call(rs, aten.rsqrt.default):
            added, root = rs.args[0], [rs]
        elif is_call(rs, aten.pow.Tensor_Scalar) and rs.args[1] == -0.5:
            added, root = rs.args[0], [rs]
        else:
            continue
        addp = _operands(added, aten.add.Tensor)
        addp = _either(addp, lambda n: is_call(n, aten.mean.dim))
        if addp is None or not is_scalar(addp[1]):
            continue
        mean, eps = addp
        a = bind_node(mean)
        if list(a["dim"] or []) not in ([-1], [node_rank(xf) - 1]) or not a["keepdim"] or a.get("dtype") is not None:
            continue
        sq = a["self"]
        if not (is_call(sq, aten.pow.Tensor_Scalar) and sq.args[0] is xf and sq.args[1] == 2):
            continue
        return xf, rs, float(eps), root + [added, mean, sq]
    return None


def _rotate_half_of(cat: Any) -> Any:
    """``y`` where ``cat`` is ``torch.cat((-y[..., D/2:], y[..., :D/2]), dim=-1)``, else None."""
    if not is_call(cat, aten.cat.default) or len(cat.args[0]) != 2:
        return None
    rank = node_rank(cat)
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    if rank == 0 or dim % rank != rank - 1:
        return None
    neg, low = cat.args[0]
    if not is_call(neg, aten.neg.default):
        return None
    high = neg.args[0]
    if not (is_call(high, aten.slice.Tensor) and is_call(low, aten.slice.Tensor)) or high.args[0] is not low.args[0]:
        return None
    y = low.args[0]
    if not isinstance(val(y), torch.Tensor) or val(y).dim() != rank:
        return None
    d = val(y).shape[-1]
    half = d // 2

    def bounds(n):
        a = bind_node(n)
        start = 0 if a["start"] is None else a["start"]
        end = d if a["end"] is None or a["end"] >= d else a["end"]
        return a["dim"] % rank, start, end, a["step"]

    if d % 2 or bounds(high) != (rank - 1, half, d, 1) or bounds(low) != (rank - 1, 0, half, 1):
        return None
    return y


def match(graph: fx.Graph) -> list[FusedMatch]:
    """Each ``y * cos + cat((-y[..., D/2:], y[..., :D/2]), -1) * sin`` whose ``y`` is Gemma's RMSNorm of ``x`` with a
    weight (``_rms_norm_of``) and whose intermediates nothing else reads, as one ``rms_norm_rope(x, weight, cos,
    sin)`` call (transformers' q_norm / k_norm, then apply_rotary_pos_emb): its nodes are the norm's and the
    rotation's; cos and sin (the unsqueezed views the model multiplies by) are inputs."""
    spec = get_spec("rms_norm_rope")
    found = []
    for node in graph.nodes:
        pair = _operands(node, aten.add.Tensor)
        if pair is None:
            continue
        # the rotated half's product first: (cat * sin) + (y * cos), in either order of each product
        rot_of = lambda n: _either(_operands(n, aten.mul.Tensor), lambda c: _rotate_half_of(c) is not None)  # noqa: E731
        pair = _either(pair, lambda n: rot_of(n) is not None)
        if pair is None:
            continue
        rot_mul, cos_mul = pair
        cat, sin = rot_of(rot_mul)
        y = _rotate_half_of(cat)
        cos_pair = _either(_operands(cos_mul, aten.mul.Tensor), lambda n: n is y)
        if cos_pair is None:
            continue
        cos = cos_pair[1]
        norm = _rms_norm_of(y)
        if norm is None:
            continue
        x, weight, eps, norm_nodes = norm
        neg = cat.args[0][0]
        rope_nodes = [cat, neg, neg.args[0], cat.args[0][1], rot_mul, cos_mul, node]
        members = set(norm_nodes + rope_nodes)
        if any(u not in members for n in members - {node} for u in n.users):
            continue
        if not tensor_nodes(x, weight, cos, sin):
            continue
        try:
            variant = spec.variant(spec.bind(val(x), val(weight), val(cos), val(sin), eps), [val(node)])
        except (Unsupported, TypeError, ValueError):
            continue
        if variant.outputs[0].shape != val(x).shape or variant.outputs[0].dtype != TensorSig.of(val(x)).dtype:
            continue
        order = {n: i for i, n in enumerate(graph.nodes)}
        nodes = tuple(sorted(set(norm_nodes + rope_nodes), key=order.__getitem__))
        found.append(FusedMatch(variant, nodes, (x, weight, cos, sin), (node,)))
    return found
