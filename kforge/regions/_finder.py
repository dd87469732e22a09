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

from ..ops import FusedMatch, TensorSig, Unsupported, Variant, all_families
from ..ops._aten import bind_node as _bind, is_scalar as _scalar, rank as _rank, val as _val
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
    # a fused operator with a bias prologue (``Family.prologue_of``): the convolution whose bias its kernel adds,
    # which deploy runs without it (its first input is that convolution, its second the bias)
    peeled: fx.Node | None = None

    @classmethod
    def of(cls, match: FusedMatch) -> FoundRegion:
        """A family's call in a graph (``Family.find``) as the finder lists it."""
        return cls(match.variant, match.nodes, match.inputs, match.outputs, peeled=match.peeled)

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
    """Every fused operator in an ATen graph: each fused family's calls (``Family.find``: its traced pattern),
    family by family. Its card stands for the calls it fuses, as a region's does; its kernel replaces them in graph
    mode."""
    return [FoundRegion.of(m) for family in all_families() if family.fused for m in family.find(graph)]


def find_layout_twin_calls(graph: fx.Graph) -> list[FoundRegion]:
    """Every call of an ATen graph that an operator's channels-last twin may take (the calls of each family that
    is no fused operator and has a layout twin, ``Family.layout_twin``, that no fused family takes with its epilogue):
    what such a twin of the operator card stands for (regions._layout)."""
    return [FoundRegion.of(m) for family in all_families()
            if family.layout_twin and not family.fused for m in family.find(graph)]


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
