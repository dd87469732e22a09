"""A family's calls in an ATen graph, written as torch code and traced (as Inductor's ``register_replacement`` writes
its patterns), and the one matcher that finds them.

A ``Pattern`` is one or more plain torch functions whose parameters are the family's (its binder's names: tensors and
scalars), each traced with ``make_fx`` on example inputs: the ATen graph AOTAutograd makes of the same code, which is
the graph kforge captures and deploys in. Matching a graph is done in two steps:

1. structure: every node calling the pattern's last operator is tried as the pattern's output, and the pattern is
   walked back from there (operands of ``add`` and ``mul`` in either order; a placeholder binds one tensor node; an
   example's scalar, the ``eps`` of a norm, binds the literal found where it went; a ``view`` of the examples'
   contiguous tensors binds the contiguous copy and unsafe view that a reshape of other strides leaves);
2. specialisation: the function is traced again on inputs with exactly the bound tensors' shapes, strides and dtypes
   and with the bound scalars, and that graph must be the matched one, literal for literal. Shapes, dtype casts and
   the views the decompositions put around an operator (``F.linear`` on a 3-d input) are thereby the model's own,
   with no rule written for them. The traces run on the meta device: a spelling whose decomposition depends on the
   device is written at the operator the graph holds (group_norm's: ``F.group_norm`` copies a channels-last input
   to contiguous on CUDA first).

A match's intermediates are read by nothing else (its output is the only value that leaves it), except a view or a
dtype conversion of one of its inputs: a view stays in the graph (the kernel takes the input itself), a conversion
is the match's only where nothing else reads it.
"""
from __future__ import annotations

import functools
import itertools
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
import torch.fx as fx

from ._aten import bind_node, val

aten = torch.ops.aten

# NB: the operators whose two tensor operands a model writes in either order (``x * w`` or ``w * x``)
_COMMUTATIVE = frozenset({aten.add.Tensor, aten.mul.Tensor})


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An example tensor for a pattern's trace (no memory)."""
    return torch.empty(shape, dtype=dtype, device="meta")


@dataclass(frozen=True)
class PatternMatch:
    """One occurrence of a pattern in a graph: its values by parameter name (tensor nodes, scalars), the graph nodes
    it stands for (graph order), and its output node."""

    values: Mapping[str, Any]
    nodes: tuple[fx.Node, ...]
    output: fx.Node


@dataclass(frozen=True, eq=False)
class Pattern:
    """A family's calls written as torch functions. ``fns``: the spellings models use (each a plain torch function
    of the family's parameters, by the names its binder takes). ``examples``: the inputs each is traced with, by
    name (``meta`` tensors; dtypes that make a spelling's casts appear or vanish), whose scalars must appear in the
    trace nowhere but where they go (they mark that place). ``check``: what the graph cannot say, on the bound
    values (fake tensors and scalars, by name) and the output's value; None: nothing."""

    fns: tuple[Callable[..., torch.Tensor], ...]
    examples: tuple[Mapping[str, Any], ...]
    check: Callable[[Mapping[str, Any], Any], bool] | None = None
    _traced: list = field(default_factory=list, compare=False, repr=False)

    def find(self, graph: fx.Graph) -> list[PatternMatch]:
        """Every occurrence in ``graph`` (an ATen graph with "val" metadata), in the graph order of its output."""
        shapes = self._shapes()
        by_target: dict[Any, list[_Traced]] = {}
        for t in shapes:
            by_target.setdefault(t.output.target, []).append(t)
        found = []
        order = {n: i for i, n in enumerate(graph.nodes)}
        for node in graph.nodes:
            for traced in by_target.get(node.target, ()) if node.op == "call_function" else ():
                m = self._match(traced, node, order)
                if m is not None:
                    found.append(m)
                    break
        return found

    def _shapes(self) -> list[_Traced]:
        """Each spelling traced on each example, structures told apart (the same structure traced once)."""
        if not self._traced:
            seen = set()
            for fn in self.fns:
                for example in self.examples:
                    traced = _Traced.of(fn, example)
                    key = traced.structure()
                    if key not in seen:
                        seen.add(key)
                        self._traced.append(traced)
        return self._traced

    def _match(self, traced: _Traced, node: fx.Node, order: dict) -> PatternMatch | None:
        # NB: each structural binding in turn (a product's operands in either order can bind two inputs either
        # way round), until one's specialised trace is the graph's
        for first in itertools.islice(_unify(traced.output, node, _State(), traced.scalars, exact=False), 16):
            found = self._specialised(traced, first, node, order)
            if found is not None:
                return found
        return None

    def _specialised(self, traced: _Traced, first: _State, node: fx.Node, order: dict) -> PatternMatch | None:
        tensors = {name: first.inputs.get(p) for p, name in traced.tensor_names.items()}
        if any(t is None for t in tensors.values()):
            return None
        scalars = {name: first.scalars.get(name, value) for name, value in traced.scalar_values.items()}
        try:
            exact = _Traced.specialised(traced.fn, tuple((k, _meta_key(val(t))) for k, t in tensors.items()),
                                        tuple(scalars.items()))
        except Exception:   # NB: a function that does not trace on these inputs does not match them
            return None
        seed = _State(inputs={p: tensors[name] for p, name in exact.tensor_names.items()})
        second = next(_unify(exact.output, node, seed, {}, exact=True), None)
        if second is None:
            return None
        nodes = _members(exact, second, node)
        if nodes is None:
            return None
        values = {**tensors, **scalars}
        if self.check is not None and not self.check({k: val(v) if isinstance(v, fx.Node) else v
                                                       for k, v in values.items()}, val(node)):
            return None
        return PatternMatch(values, tuple(sorted(nodes, key=order.__getitem__)), node)


def _members(traced: _Traced, state: _State, output: fx.Node) -> list[fx.Node] | None:
    """The graph nodes a match stands for; None where an intermediate is read outside it."""
    matched = set(state.nodes.values())
    inputs = set(traced.tensor_names)
    members = []
    for p, n in state.nodes.items():
        outside = n is not output and any(u not in matched for u in n.users)
        reads_inputs = all(a in inputs for a in p.all_input_nodes)
        if reads_inputs and _is_view(p.target):
            continue
        if reads_inputs and p.target is aten._to_copy.default:
            if not outside:
                members.append(n)
            continue
        if outside:
            return None
        members.append(n)
    return members


def _is_view(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def _meta_key(v: Any) -> tuple:
    if not isinstance(v, torch.Tensor):
        raise TypeError("a pattern's tensor input must be a tensor")
    return tuple(v.shape), tuple(v.stride()), v.dtype


@dataclass(frozen=True)
class _Traced:
    """One spelling traced: its graph's output node, its placeholders' names, where its scalars went."""

    fn: Callable
    output: fx.Node
    tensor_names: dict[fx.Node, str]     # placeholder -> parameter name
    scalar_values: dict[str, Any]        # parameter name -> the example's value
    scalars: dict[Any, str]              # the example's value -> parameter name (where it is found, it binds)

    @classmethod
    def of(cls, fn: Callable, example: Mapping[str, Any]) -> _Traced:
        tensors = {k: v for k, v in example.items() if isinstance(v, torch.Tensor)}
        scalars = {k: v for k, v in example.items() if not isinstance(v, torch.Tensor)}
        graph, names = _trace(fn, tensors, scalars)
        return cls(fn, _output(graph), names, scalars, {_scalar_key(v): k for k, v in scalars.items()})

    @staticmethod
    @functools.lru_cache(maxsize=512)
    def specialised(fn: Callable, tensors: tuple, scalars: tuple) -> _Traced:
        """``fn`` traced on tensors of exactly these (shape, stride, dtype) and these scalars."""
        metas = {k: torch.empty_strided(shape, stride, dtype=dtype, device="meta")
                 for k, (shape, stride, dtype) in tensors}
        graph, names = _trace(fn, metas, dict(scalars))
        return _Traced(fn, _output(graph), names, dict(scalars), {})

    def structure(self) -> str:
        """The traced graph's operators and their wiring (literals left out)."""
        nodes = list(self.output.graph.nodes)
        index = {n: i for i, n in enumerate(nodes)}
        return ";".join(f"{n.op}:{n.target}:{[index[a] for a in n.all_input_nodes]}" for n in nodes)


def _trace(fn: Callable, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> tuple[fx.Graph, dict]:
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import make_fx

    names = list(tensors)

    def body(*values):
        return fn(**dict(zip(names, values)), **scalars)

    # NB: the finder runs inside a torch.compile backend, under AOTAutograd's fake mode: the pattern is traced outside it
    with unset_fake_temporarily():
        graph = make_fx(body)(*tensors.values()).graph
    graph.eliminate_dead_code()   # NB: make_fx keeps a multi-output operator's unread items (group_norm's statistics)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    return graph, dict(zip(placeholders, names))


def _output(graph: fx.Graph) -> fx.Node:
    out = next(n for n in reversed(graph.nodes) if n.op == "output").args[0]
    if not isinstance(out, fx.Node) or out.op != "call_function":
        raise ValueError("a pattern returns one tensor that an operator makes")
    return out


def _scalar_key(v: Any) -> Any:
    return (type(v), v)


@dataclass(frozen=True)
class _State:
    """A partial match: pattern node -> graph node, placeholder -> graph node, scalar name -> value."""

    nodes: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)
    scalars: dict = field(default_factory=dict)

    def plus(self, **changes) -> _State:
        return _State(**{k: {**getattr(self, k), **changes.get(k, {})} for k in ("nodes", "inputs", "scalars")})


def _unify(p: Any, t: Any, st: _State, scalars: dict, exact: bool) -> Iterator[_State]:
    """Every extension of ``st`` under which pattern value ``p`` is graph value ``t``."""
    if isinstance(p, fx.Node):
        if not isinstance(t, fx.Node):
            return
        if p.op == "placeholder":
            bound = st.inputs.get(p)
            if bound is None and isinstance(val(t), torch.Tensor):
                yield st.plus(inputs={p: t})
            elif bound is t:
                yield st
            return
        seen = st.nodes.get(p)
        if seen is not None:
            if seen is t:
                yield st
            return
        if not exact and p.target is aten.view.default and _copied_view(t) and t not in st.nodes.values():
            # NB: a reshape is a view where the strides allow one, else a contiguous copy and an unsafe view (a
            # batched product's operands): the structure takes either, the specialised trace says which
            yield from _unify_all(list(p.args[:2]), [t.args[0].args[0], t.args[1]], st.plus(nodes={p: t}), scalars,
                                  exact)
            return
        if t.op != "call_function" or t.target != p.target or t in st.nodes.values():
            return
        st = st.plus(nodes={p: t})
        try:
            pa, ta = _arguments(p), _arguments(t)
        except Exception:
            return
        if pa.keys() != ta.keys():
            return
        keys = list(pa)
        orders = [ta]
        if p.target in _COMMUTATIVE and "alpha" not in ta:   # NB: x + alpha * y is not y + alpha * x
            orders.append({**ta, "self": ta["other"], "other": ta["self"]})
        for order in orders:
            yield from _unify_all([pa[k] for k in keys], [order[k] for k in keys], st, scalars, exact)
    elif isinstance(p, (list, tuple)):
        if isinstance(t, (list, tuple)) and len(p) == len(t):
            yield from _unify_all(list(p), list(t), st, scalars, exact)
    elif not isinstance(p, (bool, torch.dtype, torch.device, torch.layout, torch.memory_format, str)) \
            and p is not None and _scalar_key(p) in scalars:
        name = scalars[_scalar_key(p)]
        if isinstance(t, (int, float)) and not isinstance(t, bool) and st.scalars.get(name, t) == t:
            yield st.plus(scalars={name: t})
    elif not exact or (not isinstance(t, fx.Node) and _same_literal(p, t)):
        yield st


def _copied_view(t: fx.Node) -> bool:
    """``t`` is ``_unsafe_view(clone(x, contiguous), size)``: how a reshape that no view can give is in the graph."""
    if t.op != "call_function" or t.target is not aten._unsafe_view.default or not isinstance(t.args[0], fx.Node):
        return False
    copy = t.args[0]
    return copy.op == "call_function" and copy.target is aten.clone.default \
        and copy.kwargs.get("memory_format") is torch.contiguous_format and len(copy.users) == 1


def _unify_all(ps: Sequence, ts: Sequence, st: _State, scalars: dict, exact: bool) -> Iterator[_State]:
    if not ps:
        yield st
        return
    for s in _unify(ps[0], ts[0], st, scalars, exact):
        yield from _unify_all(ps[1:], ts[1:], s, scalars, exact)


def _same_literal(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b) \
            and all(_same_literal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _arguments(node: fx.Node) -> dict[str, Any]:
    """A node's arguments by name, as the same call however it was spelt: schema defaults filled in and then left
    out where given, ``dim`` (and a transpose's ``dim0``, ``dim1``, in either order) counted from the front, a slice's
    open ends closed, a conversion's own device and strided layout dropped."""
    if node.target is operator.getitem:
        return {"self": node.args[0], "index": node.args[1]}
    if not hasattr(node.target, "_schema"):
        return {f"arg{i}": a for i, a in enumerate(node.args)} | dict(node.kwargs)
    schema = node.target._schema
    bound = bind_node(node)
    defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    first = next((v for v in bound.values() if isinstance(val(v), torch.Tensor)), None)
    if first is None:
        first = next((v[0] for v in bound.values() if isinstance(v, (list, tuple)) and v
                      and isinstance(val(v[0]), torch.Tensor)), None)
    fv = val(first)
    rank = fv.dim() if isinstance(fv, torch.Tensor) else 0
    out = {}
    for name, value in bound.items():
        if name in ("dim", "dim0", "dim1") and rank and isinstance(value, int) and not isinstance(value, bool):
            value = value % rank
        elif name == "dim" and rank and isinstance(value, (list, tuple)) \
                and all(isinstance(d, int) for d in value):
            value = [d % rank for d in value]
        elif name == "device" and value is not None and isinstance(fv, torch.Tensor) \
                and torch.device(value) == fv.device:
            value = None
        elif name == "layout" and value == torch.strided:
            value = None
        if name in defaults and _same_literal(defaults[name], value) and not isinstance(value, fx.Node):
            continue
        out[name] = value
    if node.target is aten.transpose.int and isinstance(out.get("dim0"), int) and isinstance(out.get("dim1"), int):
        # NB: transpose(x, 3, 2) is transpose(x, 2, 3): ``k.transpose(-1, -2)`` is the pattern's ``transpose(2, 3)``
        out["dim0"], out["dim1"] = sorted((out["dim0"], out["dim1"]))
    if node.target is aten.slice.Tensor and isinstance(fv, torch.Tensor):
        size = fv.shape[out.get("dim", 0)]
        start, end = out.get("start", 0), out.get("end")
        out["start"] = 0 if start is None else start
        out["end"] = size if end is None or end >= size else end
    return out
