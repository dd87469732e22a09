"""The region finder: partition an ATen FX graph into fusible regions.

A region is a maximal connected group of supported pointwise operators plus at most one
reduction. A node joins the region of a consumer when every other user of it is in the region
too, or (a residual stream read again later) as one more output of the region, when that makes
no cycle through the rest of the graph. Matmul, convolution, attention, views and anything the
IR does not model are boundaries. A region must plan (``plan_region``): one kernel can compute it.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx as fx

from ..ops import TensorSig, Unsupported, Variant
from ._ir import Node, Ref, RegionIR
from ._plan import plan_region
from ._spec import MAX_INPUTS, region_variant

aten = torch.ops.aten

_UNARY = {aten.neg.default: "neg", aten.abs.default: "abs", aten.exp.default: "exp", aten.log.default: "log",
          aten.sqrt.default: "sqrt", aten.rsqrt.default: "rsqrt", aten.tanh.default: "tanh",
          aten.sigmoid.default: "sigmoid", aten.silu.default: "silu", aten.relu.default: "relu",
          aten.sin.default: "sin", aten.cos.default: "cos", aten.erf.default: "erf",
          aten.reciprocal.default: "reciprocal"}
_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "pow": "pow", "maximum": "maximum",
           "minimum": "minimum", "gt": "gt", "lt": "lt", "ge": "ge", "le": "le"}
_REDUCE = {"mean": "mean", "sum": "sum", "amax": "amax", "amin": "amin"}

# A translated operand: an fx node (its value), ("local", k) = the k-th IR node of this same
# translation, or a Python constant.
Piece = tuple[str, tuple[Any, ...], dict[str, Any]]


def _bind(node: fx.Node) -> dict[str, Any]:
    schema = node.target._schema  # type: ignore[union-attr]
    out, pos = {}, 0
    for a in schema.arguments:
        if not a.kwarg_only and pos < len(node.args):
            out[a.name] = node.args[pos]
            pos += 1
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def _val(x: Any):
    return x.meta.get("val") if isinstance(x, fx.Node) else None


def _rank(x: Any) -> int:
    v = _val(x)
    return v.dim() if isinstance(v, torch.Tensor) else 0


def _scalar(x: Any) -> bool:
    return isinstance(x, (int, float, bool)) and not isinstance(x, torch.Tensor)


def _trailing(dims, rank: int) -> int | None:
    """How many trailing dims ``dims`` names (None when they are not the trailing ones)."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return rank if rank else None
    dims = [dims] if isinstance(dims, int) else list(dims)
    norm = sorted(d % rank for d in dims) if rank else []
    k = len(norm)
    return k if k and norm == list(range(rank - k, rank)) else None


def translate(node: fx.Node) -> list[Piece] | None:
    """The IR nodes one ATen node stands for, or None: a boundary."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        if node.op == "call_function" and node.target is operator.getitem:
            return _layer_norm(node)
        return None
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    t = node.target
    name = t.overloadpacket.__name__
    try:
        a = _bind(node)
    except Exception:
        return None
    if t in _UNARY:
        return [(_UNARY[t], (a["self"],), {})]
    if t is aten.gelu.default:
        return [("gelu", (a["self"],), {"approximate": a.get("approximate", "none")})]
    if name in _BINARY and t._overloadname in ("Tensor", "Scalar", "Tensor_Scalar", "Tensor_Tensor", "default"):
        x = a.get("self", a.get("input"))
        y = a.get("other", a.get("exponent"))
        if x is None or y is None:
            return None
        if name in ("maximum", "minimum") and _scalar(y):
            return None
        alpha = a.get("alpha", 1)
        if name in ("add", "sub") and alpha != 1:
            if not _scalar(alpha):
                return None
            return [("mul", (y, alpha), {}), (name, (x, ("local", 0)), {})]
        if name == "div" and a.get("rounding_mode") is not None:
            return None
        return [(_BINARY[name], (x, y), {})]
    if name == "pow" and t._overloadname == "Scalar":
        return [("pow", (a["self"], a["exponent"]), {})]
    if t is aten.where.self:
        return [("where", (a["condition"], a["self"], a["other"]), {})]
    if t in (aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default):
        lo = a.get("min") if t is not aten.clamp_max.default else None
        hi = a.get("max") if t is not aten.clamp_min.default else None
        if not all(v is None or _scalar(v) for v in (lo, hi)):
            return None
        return [("clamp", (a["self"],), {"min": lo, "max": hi})]
    if t is aten._to_copy.default:
        if any(a.get(k) not in (None, False) for k in ("layout", "pin_memory", "non_blocking", "memory_format")):
            return None
        if a.get("device") is not None and torch.device(a["device"]) != _val(a["self"]).device:
            return None
        if a.get("dtype") is None:
            return None
        return [("cast", (a["self"],), {"dtype": str(a["dtype"]).replace("torch.", "")})]
    if name in _REDUCE and t._overloadname in ("dim", "dim_IntList", "default"):
        x = a["self"]
        k = _trailing(a.get("dim"), _rank(x))
        if k is None:
            return None
        pieces: list[Piece] = []
        if a.get("dtype") is not None:
            pieces.append(("cast", (x,), {"dtype": str(a["dtype"]).replace("torch.", "")}))
            x = ("local", 0)
        pieces.append((_REDUCE[name], (x,), {"k": k, "keepdim": bool(a.get("keepdim", False))}))
        return pieces
    if t in (aten._softmax.default, aten._log_softmax.default):
        x = a["self"]
        if a.get("half_to_float") or _trailing(a["dim"], _rank(x)) != 1:
            return None
        return [("softmax" if t is aten._softmax.default else "log_softmax", (x,), {"k": 1})]
    return None


def _layer_norm(node: fx.Node) -> list[Piece] | None:
    """``getitem(native_layer_norm(x, shape, w, b, eps), 0)`` whose statistics nobody reads."""
    src, index = node.args
    if index != 0 or not isinstance(src, fx.Node) or src.target is not aten.native_layer_norm.default:
        return None
    if len(src.users) != 1 or not isinstance(node.meta.get("val"), torch.Tensor):
        return None
    a = _bind(src)
    pieces: list[Piece] = [("layer_norm", (a["input"],), {"k": len(a["normalized_shape"]), "eps": float(a["eps"])})]
    if a.get("weight") is not None:
        pieces.append(("mul", (("local", len(pieces) - 1), a["weight"]), {}))
    if a.get("bias") is not None:
        pieces.append(("add", (("local", len(pieces) - 1), a["bias"]), {}))
    return pieces


@dataclass(frozen=True)
class FoundRegion:
    """One region of a graph: its variant, its graph nodes, and where its inputs and outputs live."""

    variant: Variant
    nodes: tuple[fx.Node, ...]
    inputs: tuple[fx.Node, ...]
    outputs: tuple[fx.Node, ...]
    traced: Variant | None = None   # where ``variant`` is a layout twin (regions._layout): the call as traced
    # a fused operator with a bias prologue (ops.PROLOGUE_OPS): the convolution whose bias its kernel adds, which
    # deploy runs without it (its first input is that convolution, its second the bias)
    peeled: fx.Node | None = None

    def without_prologue(self) -> FoundRegion:
        """The fused operator as it is without its bias prologue: the convolution keeps its bias."""
        from ..ops import without_prologue

        if self.peeled is None:
            return self
        return replace(self, variant=without_prologue(self.variant), inputs=(self.inputs[0], *self.inputs[2:]),
                       traced=without_prologue(self.traced) if self.traced is not None else None, peeled=None)

    @property
    def ops(self) -> tuple[str, ...]:
        from ._spec import region_ir

        if self.variant.op != "region":   # a fused operator (find_fused)
            return (self.variant.op,)
        return region_ir(self.variant).ops


def build_region(members: list[fx.Node], trans: dict[fx.Node, list[Piece]]) -> FoundRegion:
    """The IR, variant and boundary of a set of graph nodes (in graph order); Unsupported if none."""
    member_set = set(members)
    inputs: list[fx.Node] = []
    index_of: dict[fx.Node, int] = {}
    ir_nodes: list[Node] = []

    def ref(x: Any, local_base: int) -> Ref:
        if isinstance(x, tuple) and len(x) == 2 and x[0] == "local":
            return Ref("n", local_base + x[1])
        if isinstance(x, fx.Node):
            if x in member_set:
                return Ref("n", index_of[x])
            if not isinstance(_val(x), torch.Tensor):
                raise Unsupported(f"operand {x.name} is not a tensor")
            if x not in inputs:
                inputs.append(x)
            return Ref("i", inputs.index(x))
        if _scalar(x):
            return Ref("c", x)
        raise Unsupported(f"operand {x!r}")

    for m in members:
        base = len(ir_nodes)
        for op, args, attrs in trans[m]:
            ir_nodes.append(Node(op, tuple(ref(x, base) for x in args), tuple(sorted(attrs.items()))))
        index_of[m] = len(ir_nodes) - 1
    outputs = [m for m in members if any(u not in member_set for u in m.users)]
    if not outputs:
        raise Unsupported("a region whose values nobody reads")
    if len(inputs) > MAX_INPUTS:
        raise Unsupported("too many inputs")
    ir = RegionIR(len(inputs), tuple(ir_nodes), tuple(index_of[o] for o in outputs))
    sigs = [TensorSig.of(_val(x)) for x in inputs]
    variant = region_variant(ir, sigs)
    plan_region(ir, list(variant.inputs), list(variant.outputs))
    return FoundRegion(variant, tuple(members), tuple(inputs), tuple(outputs))


def find_fused(graph: fx.Graph) -> list[FoundRegion]:
    """Every fused operator of ``ops.FUSED_EPILOGUES`` in an ATen graph: a group_norm (with weight and bias)
    whose output only a SiLU reads, as one ``group_norm_silu`` call (``biased_group_norm_silu`` where it can take
    its convolution's bias as well), and a linear layer (``addmm``) whose output only the tanh GELU reads, as one
    ``linear_gelu`` call. Its card stands for those calls, as a region's does; its kernel replaces them in graph
    mode."""
    return [f for f in _group_norms(graph) if f.variant.op != "group_norm"] + _linear_gelus(graph) \
        + _rms_norm_ropes(graph)


_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)

# NB: on the CPU no built-in design beats MKL's GEMM with Inductor's GELU fused after it (the C loop ran 25x slower
# than eager on a 2-layer SD3.5 transformer's feed-forward, float32, on the 2-core development machine), so a CPU graph gives no linear_gelu card unless this is set
# (kforge's own tests, which check the finder and the placement on the CPU)
LINEAR_GELU_ON_CPU = False


def _call(x: Any, *targets) -> bool:
    return isinstance(x, fx.Node) and x.op == "call_function" and x.target in targets


def _linear_gelus(graph: fx.Graph) -> list[FoundRegion]:
    """Each ``gelu(addmm(bias, x, t(weight)), approximate="tanh")`` (a view of the product between them where
    ``x`` had leading dimensions: ``F.linear`` on a 3-d input) whose intermediates nothing else reads, as one
    ``linear_gelu(x, weight, bias)`` call: its nodes are the product, the view and the GELU (the input's view and
    the weight's transpose stay, for anything else that reads them, or go as dead code)."""
    from ..ops import get_spec

    spec = get_spec("linear_gelu")
    found = []
    for node in graph.nodes:
        if not _call(node, aten.gelu.default):
            continue
        if node.kwargs.get("approximate", "none") != "tanh":   # NB: keyword-only in aten.gelu
            continue
        src, out_view = node.args[0], None
        if _call(src, *_VIEWS):
            if len(src.users) != 1:
                continue
            out_view, src = src, src.args[0]
        if not _call(src, aten.addmm.default) or len(src.users) != 1:
            continue
        a = _bind(src)
        if a["beta"] != 1 or a["alpha"] != 1:
            continue
        bias, mat1, mat2 = a["self"], a["mat1"], a["mat2"]
        if not (_call(mat2, aten.t.default) or (_call(mat2, aten.permute.default) and list(mat2.args[1]) == [1, 0])):
            continue
        weight, x = mat2.args[0], mat1
        if out_view is not None:
            if not _call(mat1, *_VIEWS):
                continue
            x = mat1.args[0]
        if not all(isinstance(t, fx.Node) and isinstance(_val(t), torch.Tensor) for t in (x, weight, bias)):
            continue
        xv, wv, bv, yv = _val(x), _val(weight), _val(bias), _val(node)
        if xv.device.type == "cpu" and not LINEAR_GELU_ON_CPU:
            continue
        if wv.dim() != 2 or bv.dim() != 1 or bv.shape[0] != wv.shape[0] or xv.shape[-1] != wv.shape[1] \
                or not isinstance(yv, torch.Tensor) \
                or tuple(yv.shape) != tuple(xv.shape[:-1]) + (wv.shape[0],):
            continue
        try:
            variant = spec.variant(spec.bind(xv, wv, bv), [yv])
        except (Unsupported, TypeError, ValueError):
            continue
        nodes = (src,) + ((out_view,) if out_view is not None else ()) + (node,)
        found.append(FoundRegion(variant, nodes, (x, weight, bias), (node,)))
    return found


def _operands(node: Any, target) -> tuple[Any, Any] | None:
    """The two operands of a binary ``target`` call (None for anything else)."""
    if not _call(node, target) or len(node.args) != 2 or node.kwargs:
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
    v = _val(node)
    if not isinstance(v, torch.Tensor) or v.dtype != dtype:
        return None
    if _dtype_copy(node):
        return node.args[0]
    return node


def _dtype_copy(node: Any) -> bool:
    """Whether ``node`` is an ``aten._to_copy`` that changes only the dtype (same device, strided, no copy flags)."""
    if not _call(node, aten._to_copy.default) or len(node.args) != 1:
        return False
    k, src = node.kwargs, _val(node.args[0])
    return (set(k) <= {"dtype", "layout", "device"} and k.get("layout", torch.strided) == torch.strided
            and isinstance(src, torch.Tensor) and torch.device(k.get("device", src.device)) == src.device)


def _rms_norm_of(y: Any) -> tuple[Any, Any, float, list] | None:
    """(x, weight, eps, the nodes) where ``y`` is ``((xf * pow(mean(xf ** 2, -1, keepdim) + eps, -0.5)) *
    weight.float()).to(x.dtype)`` with ``xf = x.float()`` (Gemma's RMSNorm; ``rsqrt`` for the power too)."""
    yv = _val(y)
    if not isinstance(yv, torch.Tensor):
        return None
    if _dtype_copy(y):
        z, nodes = y.args[0], [y]
    elif yv.dtype == torch.float32:
        z, nodes = y, []
    else:
        return None
    if not isinstance(_val(z), torch.Tensor) or _val(z).dtype != torch.float32:
        return None
    pair = _either(_operands(z, aten.mul.Tensor), lambda n: _rs_of(n) is not None)
    if pair is None:
        return None
    p, wf = pair
    xf, rs, eps, rs_nodes = _rs_of(p)
    weight = _to_copy_of(wf, torch.float32)
    if weight is None or not isinstance(_val(weight), torch.Tensor) or _val(weight).dim() != 1:
        return None
    x = _to_copy_of(xf, torch.float32)
    if x is None:
        return None
    nodes += [z, p] + rs_nodes + ([wf] if wf is not weight and len(wf.users) == 1 else []) \
        + ([xf] if xf is not x else [])
    if _val(x).dtype != yv.dtype:
        return None
    return x, weight, eps, nodes


def _rs_of(p: Any) -> tuple[Any, Any, float, list] | None:
    """(xf, the reciprocal root, eps, its nodes) where ``p`` is ``xf * pow(mean(xf ** 2, [-1], True) + eps, -0.5)``
    (or ``rsqrt``)."""
    pair = _operands(p, aten.mul.Tensor)
    if pair is None:
        return None
    for xf, rs in (pair, pair[::-1]):
        if _call(rs, aten.rsqrt.default):
            added, root = rs.args[0], [rs]
        elif _call(rs, aten.pow.Tensor_Scalar) and rs.args[1] == -0.5:
            added, root = rs.args[0], [rs]
        else:
            continue
        addp = _operands(added, aten.add.Tensor)
        addp = _either(addp, lambda n: _call(n, aten.mean.dim))
        if addp is None or not _scalar(addp[1]):
            continue
        mean, eps = addp
        a = _bind(mean)
        if list(a["dim"] or []) not in ([-1], [_rank(xf) - 1]) or not a["keepdim"] or a.get("dtype") is not None:
            continue
        sq = a["self"]
        if not (_call(sq, aten.pow.Tensor_Scalar) and sq.args[0] is xf and sq.args[1] == 2):
            continue
        return xf, rs, float(eps), root + [added, mean, sq]
    return None


def _rotate_half_of(cat: Any) -> Any:
    """``y`` where ``cat`` is ``torch.cat((-y[..., D/2:], y[..., :D/2]), dim=-1)``, else None."""
    if not _call(cat, aten.cat.default) or len(cat.args[0]) != 2:
        return None
    rank = _rank(cat)
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    if rank == 0 or dim % rank != rank - 1:
        return None
    neg, low = cat.args[0]
    if not _call(neg, aten.neg.default):
        return None
    high = neg.args[0]
    if not (_call(high, aten.slice.Tensor) and _call(low, aten.slice.Tensor)) or high.args[0] is not low.args[0]:
        return None
    y = low.args[0]
    if not isinstance(_val(y), torch.Tensor) or _val(y).dim() != rank:
        return None
    d = _val(y).shape[-1]
    half = d // 2

    def bounds(n):
        a = _bind(n)
        start = 0 if a["start"] is None else a["start"]
        end = d if a["end"] is None or a["end"] >= d else a["end"]
        return a["dim"] % rank, start, end, a["step"]

    if d % 2 or bounds(high) != (rank - 1, half, d, 1) or bounds(low) != (rank - 1, 0, half, 1):
        return None
    return y


def _rms_norm_ropes(graph: fx.Graph) -> list[FoundRegion]:
    """Each ``y * cos + cat((-y[..., D/2:], y[..., :D/2]), -1) * sin`` whose ``y`` is Gemma's RMSNorm of ``x`` with a
    weight (``_rms_norm_of``) and whose intermediates nothing else reads, as one ``rms_norm_rope(x, weight, cos,
    sin)`` call (transformers' q_norm / k_norm, then apply_rotary_pos_emb): its nodes are the norm's and the
    rotation's; cos and sin (the unsqueezed views the model multiplies by) are inputs."""
    from ..ops import get_spec

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
        if not all(isinstance(t, fx.Node) and isinstance(_val(t), torch.Tensor) for t in (x, weight, cos, sin)):
            continue
        try:
            variant = spec.variant(spec.bind(_val(x), _val(weight), _val(cos), _val(sin), eps), [_val(node)])
        except (Unsupported, TypeError, ValueError):
            continue
        if variant.outputs[0].shape != _val(x).shape or variant.outputs[0].dtype != TensorSig.of(_val(x)).dtype:
            continue
        order = {n: i for i, n in enumerate(graph.nodes)}
        nodes = tuple(sorted(set(norm_nodes + rope_nodes), key=order.__getitem__))
        found.append(FoundRegion(variant, nodes, (x, weight, cos, sin), (node,)))
    return found


def find_lone_group_norms(graph: fx.Graph) -> list[FoundRegion]:
    """Every group_norm (with weight and bias) of an ATen graph that ``find_fused`` does not take, as one
    ``group_norm`` call: what a channels-last twin of the operator card stands for (regions._layout)."""
    return [f for f in _group_norms(graph) if f.variant.op == "group_norm"]


def _group_norms(graph: fx.Graph) -> list[FoundRegion]:
    """Each affine group_norm whose statistics nobody reads: with the SiLU that alone reads it as
    ``group_norm_silu``, else as ``group_norm``."""
    from ..ops import get_spec

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
        a = _bind(node)
        x, w, b = a["input"], a.get("weight"), a.get("bias")
        if not all(isinstance(t, fx.Node) and isinstance(_val(t), torch.Tensor) for t in (x, w, b)):
            continue   # NB: no affine: nothing to hold an example of; the plain group_norm card stays
        last = act if act is not None else outs[0]
        nodes = (node, outs[0]) + ((act,) if act is not None else ())
        conv_bias = _peelable_bias(x) if act is not None else None
        try:
            if conv_bias is not None:
                spec = get_spec("biased_group_norm_silu")
                call = spec.bind(_val(x), _val(conv_bias), int(a["group"]), _val(w), _val(b), float(a["eps"]))
                found.append(FoundRegion(spec.variant(call, [_val(last)]), nodes, (x, conv_bias, w, b), (last,),
                                         peeled=x))
                continue
            spec = get_spec("group_norm_silu" if act is not None else "group_norm")
            call = spec.bind(_val(x), int(a["group"]), _val(w), _val(b), float(a["eps"]))
            variant = spec.variant(call, [_val(last)])
        except (Unsupported, TypeError, ValueError):
            continue
        found.append(FoundRegion(variant, nodes, (x, w, b), (last,)))
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
    a = _bind(x)
    bias, val = a.get("bias"), _val(x)
    if not isinstance(bias, fx.Node) or not isinstance(_val(bias), torch.Tensor) or a.get("transposed") \
            or not isinstance(val, torch.Tensor) or val.dim() != 4 or not inductor_peels_conv_bias(val.device):
        return None
    # NB: the shapes the prologue's CUDA design (group_norm_silu's nhwc_tiles: a position's channels over at most
    # 1024 threads, the samples a grid dimension) takes; elsewhere the plain fused card keeps its other designs
    if val.shape[1] > 1024 or val.shape[0] > 65535:
        return None
    return bias


def find_regions(graph: fx.Graph, min_ops: int = 2, skip: frozenset = frozenset()) -> list[FoundRegion]:
    """Every region of at least ``min_ops`` graph operators in ``graph`` (an ATen graph with "val"
    metadata); nodes in ``skip`` (those of fused operators) join none."""
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    trans = {n: t for n in nodes if n not in skip and (t := translate(n)) is not None}
    assigned: set[fx.Node] = set()
    found: list[FoundRegion] = []

    def producers(members: set[fx.Node]) -> list[fx.Node]:
        out = {x for m in members for _, args, _ in trans[m] for x in args
               if isinstance(x, fx.Node) and x in trans and x not in members and x not in assigned}
        return sorted(out, key=lambda n: -order[n])

    def cycle_free(members: set[fx.Node]) -> bool:
        """No path leaves the region and comes back into it."""
        last = max(order[m] for m in members)
        stack = [u for m in members for u in m.users if u not in members]
        seen: set[fx.Node] = set()
        while stack:
            n = stack.pop()
            if n in seen or order.get(n, -1) > last:
                continue
            seen.add(n)
            for u in n.users:
                if u in members:
                    return False
                stack.append(u)
        return True

    for seed in reversed(nodes):
        if seed not in trans or seed in assigned or not seed.users:
            continue
        members = {seed}
        try:
            best = build_region([seed], trans)
        except Unsupported:
            best = None
        changed = True
        while changed and best is not None:
            changed = False
            for u in producers(members):
                trial = members | {u}
                escapes = any(x not in trial for x in u.users)
                if escapes and not cycle_free(trial):
                    continue
                try:
                    region = build_region(sorted(trial, key=order.__getitem__), trans)
                except (Unsupported, RuntimeError, TypeError, ValueError):
                    continue
                members, best, changed = trial, region, True
                break
        if best is not None and len(best.nodes) >= min_ops:
            found.append(best)
            assigned |= members
    found.sort(key=lambda r: order[r.nodes[0]])
    return found
