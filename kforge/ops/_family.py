"""Operator families: one registered object per operator that is more than a torch call to patch.

A family lives in a folder of its own (``kforge/ops/families/<name>/``) and holds everything kforge knows about
it: its spec (targets, bind, reference, sampling, tolerance), its role in the model's graph as fields (the epilogue
of which operator, the operator it is without its bias prologue, whether it has a channels-last twin, which graph
its kernels go into), its pattern in the ATen graph (torch functions, traced: ``kforge.ops._pattern``), the modules
of its built-in strategies, and a one-line doc.
The finder, the graph passes and the strategy library loop over ``all_families()`` and name none.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
import torch.fx as fx

from ._aten import val
from ._pattern import Pattern, PatternMatch
from ._registry import OpSpec, Unsupported, Variant, get_spec, register

# Where a family's kernels go in graph mode: "dynamo", like any operator (a node of dynamo's graph, a function's
# graph twin there); "aten", found and placed in AOTAutograd's ATen graph only (a fused operator: no eager spelling)
GRAPHS = ("dynamo", "aten")


@dataclass(frozen=True)
class Epilogue:
    """A pointwise operator applied to another operator's result by its only reader, fused into one operator.

    ``of``: the operator whose call the graph holds (the fused kernel takes that call and its reader);
    ``op``: the pointwise operator. ``reads(fn, user)``: whether ``user``, a node of dynamo's graph calling ``fn``
    on ``of``'s value (its only reader), is that epilogue there, so that a plain kernel for ``of`` steps aside for
    the fused one (None: it never does)."""

    of: str
    op: str
    reads: Callable[[Any, fx.Node], bool] | None = None


@dataclass(frozen=True)
class FusedMatch:
    """One call of a family found in an ATen graph: its variant, the graph nodes it stands for, the nodes of its
    inputs and outputs, and (a bias prologue) the convolution whose bias its kernel adds."""

    variant: Variant
    nodes: tuple[fx.Node, ...]
    inputs: tuple[fx.Node, ...]
    outputs: tuple[fx.Node, ...]
    peeled: fx.Node | None = None


@dataclass(frozen=True)
class Family:
    """One operator and its role in kforge: registered with ``register_family`` from its folder.

    ``graph``: see ``GRAPHS``. ``epilogue``: a fused operator's epilogue (``Epilogue``). ``prologue_of``: the
    family it is without its per-channel bias prologue (its second input, the bias of the convolution that made
    its first). ``layout_twin``: its cards get a channels-last twin where Inductor lays a graph out channels-last
    (kforge.regions._layout). ``pattern``: its calls in an ATen graph, written as torch functions of its binder's
    parameters and traced (``kforge.ops._pattern.Pattern``; a fused family's calls, or for an operator with a layout
    twin the calls that twin may take; ``find``); None where it is not found in graphs, or is found as another
    family's call with a prologue. ``peel``: a prologue family's predicate, on the first input of a call of
    ``prologue_of``: the bias node its kernel takes (None: that call stays the plain family's). ``strategies``: the
    modules that hold its built-in CPU and CUDA strategies, its folder's ``strategies`` (imported by name by
    ``kforge.proposers.builtin``: they belong to the proposers layer, so nothing in ops imports them). ``doc``: one line."""

    spec: OpSpec
    doc: str
    graph: str = "dynamo"
    epilogue: Epilogue | None = None
    prologue_of: str | None = None
    layout_twin: bool = False
    pattern: Pattern | None = None
    peel: Callable[[fx.Node], fx.Node | None] | None = None
    strategies: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.graph not in GRAPHS:
            raise ValueError(f"family {self.spec.name!r}: graph must be one of {GRAPHS}, not {self.graph!r}")

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def fused(self) -> bool:
        """A fused operator: found and placed in the ATen graph only, never in dynamo's."""
        return self.graph == "aten"

    def find(self, graph: fx.Graph) -> list[FusedMatch]:
        """Its calls in ``graph`` (an ATen graph with "val" metadata), in graph order: each occurrence of its
        ``pattern`` as a call of it, or of the family with a prologue whose ``peel`` takes it; for an operator that
        a fused family takes with its epilogue, only the calls no such family takes."""
        if self.pattern is None:
            return []
        prologues = [f for f in _FAMILIES.values() if f.prologue_of == self.name and f.peel is not None]
        taken = {n for f in _FAMILIES.values() if not self.fused and f.epilogue is not None
                 and f.epilogue.of == self.name and f.pattern is not None for m in f.pattern.find(graph) for n in m.nodes}
        found = []
        for m in self.pattern.find(graph):
            if m.output in taken:
                continue
            fm = self._call(m, prologues)
            if fm is not None:
                found.append(fm)
        return found

    def _call(self, m: PatternMatch, prologues: list[Family]) -> FusedMatch | None:
        values = {k: val(v) if isinstance(v, fx.Node) else v for k, v in m.values.items()}
        family, nodes, peeled = self, dict(m.values), None
        for p in prologues:
            first = m.values[self.spec.inputs[0]]
            bias = p.peel(first)
            if bias is not None:
                family, peeled = p, first
                nodes[p.spec.inputs[1]] = bias
                values[p.spec.inputs[1]] = val(bias)
                break
        spec = family.spec
        try:
            variant = spec.variant(spec.bind(**values), [val(m.output)])
        except (Unsupported, TypeError, ValueError):
            return None
        return FusedMatch(variant, m.nodes, tuple(nodes[k] for k in spec.inputs), (m.output,), peeled=peeled)


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Register ``family`` and its spec (in registration order: the finder keeps it)."""
    if family.name in _FAMILIES:
        raise ValueError(f"family {family.name!r} is registered twice")
    register(family.spec)
    _FAMILIES[family.name] = family
    return family


def family_of(op: str) -> Family | None:
    """The family of operator ``op`` (None for an operator registered as a plain spec, or a region)."""
    return _FAMILIES.get(op)


def all_families() -> list[Family]:
    return list(_FAMILIES.values())


def is_fused(op: str) -> bool:
    """Whether ``op`` is a fused operator (``Family.fused``)."""
    family = _FAMILIES.get(op)
    return family is not None and family.fused


def has_layout_twin(op: str) -> bool:
    family = _FAMILIES.get(op)
    return family is not None and family.layout_twin


def has_prologue(op: str) -> bool:
    family = _FAMILIES.get(op)
    return family is not None and family.prologue_of is not None


def without_prologue(variant: Variant) -> Variant:
    """``variant`` as the operator its graph call is without a prologue (the bias input dropped): its shapes are
    those of the call the graph holds."""
    family = _FAMILIES.get(variant.op)
    if family is None or family.prologue_of is None:
        return variant
    return replace(variant, op=family.prologue_of, inputs=(variant.inputs[0], *variant.inputs[2:]))


def channels_last_strides(shape) -> tuple[int, ...]:
    """The strides torch gives an N,C,H,W tensor of ``shape`` laid out channels-last."""
    return tuple(torch.empty(tuple(shape), device="meta").to(memory_format=torch.channels_last).stride())


def is_channels_last_twin(variant) -> bool:
    """Whether ``variant``'s first input and output are one 4-d N,C,H,W tensor laid out channels-last (and
    not also contiguous): what a channels-last twin makes of an operator's call."""
    if not variant.inputs or variant.inputs[0] is None or not variant.outputs:
        return False
    x, y = variant.inputs[0], variant.outputs[0]
    if len(x.shape) != 4 or x.is_contiguous or tuple(y.shape) != tuple(x.shape) or tuple(y.stride) != tuple(x.stride):
        return False
    return tuple(x.stride) == channels_last_strides(x.shape)


def is_layout_twin(variant) -> bool:
    """Whether ``variant`` is the channels-last twin of a family that has one (the layout Inductor gives a
    compiled graph)."""
    return has_layout_twin(variant.op) and is_channels_last_twin(variant)


def found_in_graph(op: str) -> bool:
    """Whether ``op`` is a chain graph capture finds, with no torch call of its own to patch: a region or a
    vendor-headed chain (kforge.regions; their specs' kind is "region")."""
    try:
        return get_spec(op).kind == "region"
    except KeyError:
        return False


def placed_in_aten_graph(variant) -> bool:
    """Whether graph mode places ``variant``'s kernel in AOTAutograd's ATen graph (kforge.regions' pass)
    rather than in dynamo's graph: a region, a vendor-headed chain, a fused operator, an operator's channels-last
    twin."""
    if found_in_graph(variant.op) or is_fused(variant.op):
        return True
    return is_layout_twin(variant)
