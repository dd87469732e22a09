"""Operators a model computes with a Python function of a library rather than a torch callable.

Some operators have no torch callable to intercept: transformers' Qwen 3.5 layers compute their linear
attention's recurrence with a Python function of dozens of torch calls. An operator names
such functions in ``OpSpec.functions`` (``FunctionTarget``), and kforge reaches them the way the model does:
through the module's global and through every submodule of the model that holds the function as an
attribute (transformers binds it to each layer in some versions).

While anything in kforge uses a function (a capture records it, a deployment runs a kernel for it, a model
compiled with its kernel exists), each of those places holds one **hook**. The hook calls the newest
``handler`` pushed for the operator (capture's recorder, the eager dispatcher) or, with none, the function
itself. Under torch.compile it calls the function, so dynamo traces the function as plain compile would;
inside a call of a model kforge compiled with a kernel for it (``graph_calls``), it calls the function's
**graph twin** instead: the function wrapped so that dynamo puts it in the graph as one node
(``torch.compiler.allow_in_graph``), which kforge's graph pass replaces by the kernel where the call's
signature has one, and which AOTAutograd traces through (as plain compile would) where it has none.
When nothing uses a place any more, the original is put back.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, Sequence

import torch

from ._signature import Unsupported


class OpSpec(Protocol):
    """What this module reads of an operator's spec (``_registry.OpSpec`` is the one kforge registers): typed here
    so that this module does not import the registry that imports it."""

    name: str
    functions: Sequence[FunctionTarget]

    def bind(self, *args: Any, **kwargs: Any) -> Any: ...

    def run_eager(self, *args: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class FunctionTarget:
    """A library's Python function that computes an operator.

    ``outputs``: the operator's outputs (tensors, in the spec's order) from the function's return value.
    ``result``: the function's return value from the operator's outputs and the call's params (what a kernel's
    outputs are handed back as).
    ``bind``: the function's own binder, where its arguments are not the spec's (None: the spec's ``bind``).
    ``mappings``: dotted paths, from the module, of dicts through which the library looks the function up at call
    time (transformers' experts implementations: ``ALL_EXPERTS_FUNCTIONS._global_mapping``); each key whose value
    is the function is a place kforge hooks too.
    ``graph``: how the function goes into a graph kforge compiles: ``"call"``, its graph twin takes the
    function's own arguments (tensors and constants); ``"tensors"``, the call is bound first and its twin takes
    the bound tensor inputs (a function taking a module, as an experts implementation takes ``self``, whose
    tensors are its weights; a call the binder refuses is traced as plain compile traces it).
    ``fixed``: params every call of this function binds to, set over what its binder gives (which of a library's
    implementations of the operator ran); for graph "tensors" its twin takes tensors only, and a node of it binds
    to these.
    """

    module: str
    name: str
    outputs: Callable[[Any], list]
    result: Callable[[Sequence[torch.Tensor], dict], Any]
    bind: Callable | None = None
    mappings: tuple[str, ...] = ()
    graph: str = "call"
    fixed: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.graph not in ("call", "tensors"):
            raise ValueError(f"FunctionTarget.graph is 'call' or 'tensors', not {self.graph!r}")

    def binder(self, spec: "OpSpec") -> Callable:
        """What binds a call of this function to ``spec``'s inputs and params (``fixed`` among them)."""
        bind = self.bind if self.bind is not None else spec.bind
        return functools.partial(_bind_fixed, bind, self.fixed) if self.fixed else bind

    @property
    def path(self) -> str:
        return f"{self.module}.{self.name}"

    def resolve(self) -> Callable | None:
        """The function, when its module is imported (kforge never imports a model's library itself)."""
        module = sys.modules.get(self.module)
        return getattr(module, self.name, None) if module is not None else None

    def lookup_tables(self) -> list[dict]:
        """The dicts of ``mappings`` that exist (the module imported, every attribute on the path there)."""
        module = sys.modules.get(self.module)
        out = []
        for path in self.mappings if module is not None else ():
            obj: Any = module
            for part in path.split("."):
                obj = getattr(obj, part, None)
            if isinstance(obj, dict):
                out.append(obj)
        return out


# A handler takes (the function's entry: ``original``, ``spec``, ``target``; args; kwargs) and returns the
# function's value, or ``PASS`` to leave the call to the handler below it (capture's recorder does so for the
# calls of threads other than its own).
Handler = Callable[["FunctionEntry", tuple, dict], Any]
PASS = object()


class _GraphState:
    depth = 0          # calls of kforge-compiled models under way (any thread)
    active = False     # depth > 0: the one value traced code reads


# NB: read inside the traced hook: dynamo guards on it, so a graph traced for plain torch.compile (False) and one
# traced inside a kforge-compiled model's call (True) are different cache entries of the same code. A bool, not the
# count: dynamo guards on the exact value, and a count would recompile at every new depth (two threads inside
# kforge-compiled models) until its recompile limit. Process-wide: dynamo does not guard on a thread-local, so a
# plain torch.compile that traces while another thread is inside a kforge-compiled model puts the twin in its
# graph too (the same values: AOTAutograd traces through the twin).
GRAPH = _GraphState()


def enter_graph_calls() -> None:
    with _LOCK:
        GRAPH.depth += 1
        GRAPH.active = True


def leave_graph_calls() -> None:
    with _LOCK:
        GRAPH.depth = max(GRAPH.depth - 1, 0)
        GRAPH.active = GRAPH.depth > 0


@contextlib.contextmanager
def graph_calls() -> Iterator[None]:
    """While this runs, a hook traced by dynamo puts its function's graph twin in the graph."""
    enter_graph_calls()
    try:
        yield
    finally:
        leave_graph_calls()


def _bind_fixed(bind: Callable, fixed: tuple[tuple[str, Any], ...], *args: Any, **kwargs: Any) -> Any:
    call = bind(*args, **kwargs)
    for name, value in fixed:
        call.params[name] = value
    return call


@dataclass
class FunctionEntry:
    """One library function kforge hooks: its original, its operator, its graph twin and its one hook (the same
    object at every place, so that a model holding it pickles as holding the function)."""

    original: Callable
    spec: "OpSpec"
    target: FunctionTarget
    twin: Callable = field(repr=False)
    hook: Callable | None = field(default=None, repr=False)   # made from the entry (_make_hook)
    tensor_twin: Callable | None = field(default=None, repr=False)   # graph "tensors": takes the bound inputs


@dataclass
class HookPoint:
    """One place a model reaches an operator's function: ``owner.name``."""

    owner: Any
    name: str
    entry: FunctionEntry
    owned: bool        # the attribute was in the owner's own __dict__ (else inherited: delete to undo)
    users: int = 0

    @property
    def original(self) -> Callable:
        return self.entry.original

    @property
    def spec(self) -> "OpSpec":
        return self.entry.spec


_POINTS: dict[tuple[int, str], HookPoint] = {}
_HANDLERS: dict[str, list[Handler]] = {}
_ENTRIES: dict[int, FunctionEntry] = {}   # by id(original)
_LOCK = threading.RLock()


def _entry(original: Callable, spec: "OpSpec", target: FunctionTarget) -> FunctionEntry:
    with _LOCK:
        found = _ENTRIES.get(id(original))
        if found is not None and found.original is original:
            return found

        def kforge_graph_call(*args: Any, **kwargs: Any) -> Any:
            return original(*args, **kwargs)

        kforge_graph_call.__name__ = f"kforge_{getattr(original, '__name__', spec.name)}"
        kforge_graph_call.__qualname__ = kforge_graph_call.__name__
        kforge_graph_call.kforge_function = spec.name   # type: ignore[attr-defined]
        torch.compiler.allow_in_graph(kforge_graph_call)
        entry = FunctionEntry(original, spec, target, kforge_graph_call)
        if target.graph == "tensors":
            def kforge_graph_tensors(*inputs: Any) -> Any:
                # NB: what eager runs, from the bound tensors: where no kernel replaces the node, AOTAutograd traces
                # this (the library's function itself needs what no node holds, e.g. its module)
                return target.result(_as_list(spec.run_eager(list(inputs), dict(target.fixed))), dict(target.fixed))

            kforge_graph_tensors.__name__ = f"kforge_{getattr(original, '__name__', spec.name)}_tensors"
            kforge_graph_tensors.__qualname__ = kforge_graph_tensors.__name__
            kforge_graph_tensors.kforge_function = spec.name   # type: ignore[attr-defined]
            kforge_graph_tensors.kforge_bound = True            # type: ignore[attr-defined]
            torch.compiler.allow_in_graph(kforge_graph_tensors)
            entry.tensor_twin = kforge_graph_tensors
        entry.hook = _make_hook(entry)
        _ENTRIES[id(original)] = entry
        return entry


def entry_of_twin(fn: Any) -> FunctionEntry | None:
    """The function whose graph twin ``fn`` is (a node of a graph kforge compiled), or None."""
    if getattr(fn, "kforge_function", None) is None:
        return None
    for entry in list(_ENTRIES.values()):
        if entry.twin is fn or entry.tensor_twin is fn:
            return entry
    return None


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def spec_of_twin(fn: Any) -> "OpSpec | None":
    """The operator whose graph twin ``fn`` is, or None."""
    entry = entry_of_twin(fn)
    return entry.spec if entry is not None else None


def _function_at(module: str, name: str) -> Callable:
    """The library's own function at ``module.name`` (never a kforge hook): what a pickled hook loads as."""
    import importlib

    fn = getattr(importlib.import_module(module), name)
    return getattr(fn, "kforge_original", fn)


class FunctionHook:
    """What kforge puts where a model reaches a library's function (one object for every place of the function).

    Called outside dynamo, it asks the operator's handlers, newest first, and with none answering runs the
    function; under dynamo, the function (plain torch.compile) or its graph twin (inside a kforge-compiled
    model's call). It pickles and deep-copies as the function itself: a copy of a model made while hooked holds
    the function, not a hook that outlives kforge's use of it. A hook left where kforge did not find it (a
    layer built while the global was hooked) only runs the function once no handler is pushed.
    """

    def __init__(self, entry: FunctionEntry):
        original = entry.original
        self.entry = entry
        self.kforge_original = original
        self.__wrapped__ = original   # NB: inspect.signature reads the function's
        self.__doc__ = getattr(original, "__doc__", None)
        for attr in ("__module__", "__name__", "__qualname__"):
            if hasattr(original, attr):
                setattr(self, attr, getattr(original, attr))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        entry = self.entry
        if torch.compiler.is_compiling():
            if GRAPH.active and entry.target.graph == "call":
                return entry.twin(*args, **kwargs)
            if GRAPH.active and entry.target.graph == "tensors":
                try:
                    call = entry.target.binder(entry.spec)(*args, **kwargs)
                except Unsupported:
                    call = None
                if call is not None and call.params == dict(entry.target.fixed) \
                        and all(isinstance(t, torch.Tensor) for t in call.inputs):
                    return entry.tensor_twin(*call.inputs)
            return entry.original(*args, **kwargs)
        handlers = _HANDLERS.get(entry.spec.name)
        if handlers:
            for handler in reversed(tuple(handlers)):   # NB: a copy: another thread may pop meanwhile
                result = handler(entry, args, kwargs)
                if result is not PASS:
                    return result
        return entry.original(*args, **kwargs)

    def __reduce__(self) -> tuple:
        return _function_at, (self.entry.target.module, self.entry.target.name)

    def __repr__(self) -> str:
        return f"<kforge hook of {self.entry.target.path}>"


def _get(owner: Any, name: str) -> Any:
    """``owner.name``, or ``owner[name]`` where the place is a lookup table (a dict)."""
    return owner.get(name) if isinstance(owner, dict) else getattr(owner, name, None)


def _set(owner: Any, name: str, value: Any) -> None:
    if isinstance(owner, dict):
        owner[name] = value
    else:
        setattr(owner, name, value)


def _make_hook(entry: FunctionEntry) -> Callable:
    return FunctionHook(entry)


def _places(target: FunctionTarget, model: Any) -> list[tuple[Any, str, Callable]]:
    """Where ``model`` reaches ``target``: the module's global, the keys of its lookup tables (``mappings``) that
    hold it, and submodules holding the function (or a hook kforge put there) as an attribute of their own."""
    fn = target.resolve()
    if fn is None:
        return []
    original = getattr(fn, "kforge_original", fn)   # a hook of kforge's is there already
    out = [(sys.modules[target.module], target.name, original)]
    for table in target.lookup_tables():
        for key, value in list(table.items()):
            if isinstance(key, str) and (value is original or getattr(value, "kforge_original", None) is original):
                out.append((table, key, original))
    if isinstance(model, torch.nn.Module):
        for sub in model.modules():
            for name, value in list(vars(sub).items()):
                if value is original or getattr(value, "kforge_original", None) is original:
                    out.append((sub, name, original))
    return out


class Hooks:
    """The hook points one user (a capture, a deployment, a compiled model) holds; ``release`` gives them back."""

    def __init__(self, points: list[HookPoint]):
        self.points = points
        self.released = False

    @property
    def ops(self) -> set[str]:
        return {p.spec.name for p in self.points}

    def release(self) -> None:
        with _LOCK:
            if self.released:
                return
            self.released = True
            for point in self.points:
                point.users -= 1
                if point.users > 0:
                    continue
                key = (id(point.owner), point.name)
                if _POINTS.get(key) is point:
                    del _POINTS[key]
                if _get(point.owner, point.name) is point.entry.hook:
                    if point.owned:
                        _set(point.owner, point.name, point.original)
                    else:
                        delattr(point.owner, point.name)


def hook_functions(specs: Sequence["OpSpec"], model: Any = None) -> Hooks:
    """Put a hook at every place ``model`` (and any caller of the module's global) reaches the functions of
    ``specs``; the returned ``Hooks`` holds them until released."""
    held: list[HookPoint] = []
    with _LOCK:
        for spec in specs:
            for target in spec.functions:
                for owner, name, original in _places(target, model):
                    key = (id(owner), name)
                    point = _POINTS.get(key)
                    if point is None or point.owner is not owner:
                        d = owner if isinstance(owner, dict) else owner.__dict__ if isinstance(owner, type) \
                            else vars(owner)
                        point = HookPoint(owner, name, _entry(original, spec, target), owned=name in d)
                        _POINTS[key] = point
                        _set(owner, name, point.entry.hook)
                    elif _get(owner, name) is not point.entry.hook:
                        # NB: someone put the original back while the point was held (a test's finally, a library's
                        # reload): hook it again, else this user would be counted and never see a call
                        _set(owner, name, point.entry.hook)
                    point.users += 1
                    held.append(point)
    return Hooks(held)


def push_handler(op: str, handler: Handler) -> None:
    with _LOCK:
        _HANDLERS.setdefault(op, []).append(handler)


def pop_handler(op: str, handler: Handler) -> None:
    with _LOCK:
        stack = _HANDLERS.get(op, [])
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] == handler:   # NB: ==: a bound method is a new object at each attribute read
                del stack[i]
                break
        if not stack:
            _HANDLERS.pop(op, None)


_FUNCTION_SPECS: list[OpSpec] = []   # the registered specs that name functions, in the registry's order


def note_spec(spec: OpSpec) -> None:
    """Called by the registry for each spec it registers (the registry imports this module, not the other way)."""
    if spec.functions:
        with _LOCK:
            _FUNCTION_SPECS.append(spec)


def function_specs() -> list[OpSpec]:
    """The registered operators that name functions of libraries."""
    with _LOCK:
        return list(_FUNCTION_SPECS)
