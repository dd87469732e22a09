"""Eager mode: patched torch callables and the guard that picks a kernel by exact signature.

Only the torch callables of operators that have a winner are replaced. The replacement binds the
call, builds a key from exactly what defines a variant (shapes, dtypes, strides, device of every
tensor, every static parameter) and looks it up; any miss, autograd, or symbolic shape runs the
original function. Everything else in the model never passes through kforge. While dynamo traces,
the replacement is the original (graph mode is ``_graph.py``'s backend).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol, Sequence

import torch
import torch.nn.functional as F
from torch.autograd import forward_ad

from ._fast import dispatch_type
from ._launch import DeployedKernel, _device
from ..ops import OpSpec, Unsupported, Variant, get_spec, inplace_binder, torch_dtype
from ..ops._functions import PASS, FunctionEntry, Hooks, hook_functions, pop_handler, push_handler



class Deployment(Protocol):
    """What the dispatcher reads of a deployment (``_deployment.Deployment`` is the one kforge makes): typed here so
    that the dispatcher does not import the module that imports it."""

    kernels: Sequence[DeployedKernel]
    model: Any
    _scope: threading.local

    @property
    def active(self) -> bool: ...

_OWNERS: tuple[Any, ...] = (torch, F, torch._C._nn, torch.special, torch.Tensor)


def _fast_key(inputs: Iterable[torch.Tensor | None], params: tuple) -> tuple:
    return (tuple([None if t is None else (t.shape, t.dtype, _strides(t.shape, t.stride()), t.device)
                   for t in inputs]), params)


def _strides(shape: Sequence[int], stride: Sequence[int]) -> tuple:
    """Strides as a key has them: a dimension of size 1 is never stepped along, so its stride is 0 whatever
    the tensor says (dynamo's fake value of Qwen 3.5's value had 4194304 where eager's had 512, and the kernel
    was not placed: H200, 2026-12-04)."""
    if 1 not in shape:
        return tuple(stride)
    return tuple(0 if n == 1 else s for n, s in zip(shape, stride))


def _typed(value: Any) -> Any:
    """A parameter as it enters a key: numbers with their type (2, 2.0 and True are equal in
    Python but give different results: an int64 tensor times 2 stays int64, times 2.0 does not)."""
    if type(value) in (bool, int, float):
        return (type(value), value)
    if isinstance(value, (tuple, list)):
        return tuple(_typed(v) for v in value)
    return value


def variant_key(variant: Variant) -> tuple:
    """The dispatch key of a variant, in the same form ``_fast_key`` builds from a live call."""
    ins = tuple(None if s is None else (torch.Size(s.shape), torch_dtype(s.dtype), _strides(s.shape, s.stride),
                                        _device(s.device)) for s in variant.inputs)
    return (ins, tuple(_typed(v) for _, v in variant.params))


def _param_values(names: tuple[str, ...], params: dict) -> tuple:
    return tuple([_typed(params[n]) for n in names])


@dataclass
class _Patch:
    owner: Any
    name: str
    original: Callable
    spec: OpSpec
    owned: bool   # the attribute was in owner's own __dict__ (else it was inherited: delete to undo)
    cache: dict = field(default_factory=dict)   # the wrapper's decisions per distinct call


class Dispatcher:
    """Process-wide: which callables are patched and the active kernels per operator."""

    def __init__(self):
        self.tables: dict[str, dict[tuple, tuple[DeployedKernel, Deployment]]] = {}
        # entries a newer deployment's kernel for the same signature displaced, oldest first: back when it goes
        self.shadowed: dict[tuple[str, tuple], list[tuple[DeployedKernel, Deployment]]] = {}
        # The first input's shapes per operator: a call whose first argument is a plain tensor of
        # another shape cannot hit, and goes to eager without binding (a false miss only costs speed).
        self.first_shapes: dict[str, set[torch.Size]] = {}
        self.generation = 0  # bumped whenever the installed kernels change: cached decisions expire
        self.patches: dict[tuple[int, str], _Patch] = {}
        # operators computed by a library's function: the hooks each deployment holds, the handler per operator
        self.function_hooks: dict[int, Hooks] = {}
        self.function_handlers: dict[str, Callable] = {}
        self.lock = threading.RLock()

    def install(self, deployment: "Deployment") -> None:
        with self.lock:
            functions: dict[str, OpSpec] = {}
            for dk in deployment.kernels:
                spec = get_spec(dk.variant.op)
                table, key = self.tables.setdefault(spec.name, {}), variant_key(dk.variant)
                if key in table and table[key][1] is not deployment:
                    self.shadowed.setdefault((spec.name, key), []).append(table[key])
                table[key] = (dk, deployment)
                self._patch_op(spec)
                if spec.functions:
                    functions[spec.name] = spec
            if functions:
                self.function_hooks[id(deployment)] = hook_functions(list(functions.values()), deployment.model)
                for name, spec in functions.items():
                    if name not in self.function_handlers:
                        self.function_handlers[name] = _function_handler(self, spec)
                        push_handler(name, self.function_handlers[name])
            self._index_shapes()

    def uninstall(self, deployment: "Deployment") -> None:
        with self.lock:
            for where, stack in list(self.shadowed.items()):
                stack[:] = [e for e in stack if e[1] is not deployment]
                if not stack:
                    del self.shadowed[where]
            for op, table in list(self.tables.items()):
                for key, (dk, dep) in list(table.items()):
                    if dep is deployment:
                        stack = self.shadowed.get((op, key))
                        if stack:   # an older deployment's kernel for this signature takes over again
                            table[key] = stack.pop()
                            if not stack:
                                del self.shadowed[(op, key)]
                        else:
                            del table[key]
                if not table:
                    del self.tables[op]
                    self._unpatch_op(op)
                    if op in self.function_handlers:
                        pop_handler(op, self.function_handlers.pop(op))
            hooks = self.function_hooks.pop(id(deployment), None)
            if hooks is not None:
                hooks.release()
            self._index_shapes()

    def _index_shapes(self) -> None:
        self.generation += 1
        for patch in self.patches.values():
            patch.cache.clear()  # decisions were taken against the old tables
        for op, table in self.tables.items():
            shapes = self.first_shapes.setdefault(op, set())
            shapes.clear()  # in place: the wrappers hold this set
            for dk, _ in table.values():
                first = dk.variant.inputs[0]
                shapes.add(torch.Size(first.shape) if first is not None else None)

    def _patch_op(self, spec: OpSpec) -> None:
        _prime_dynamo()
        for target in spec.targets:
            if target is None:
                continue
            for owner, name in _locations(target):
                key = (id(owner), name)
                if key in self.patches:
                    continue
                owned = name in (owner.__dict__ if isinstance(owner, type) else vars(owner))
                patch = self.patches[key] = _Patch(owner, name, target, spec, owned)
                setattr(owner, name, _make_wrapper(self, spec, target, inplace_binder(spec, target), patch.cache))

    def _unpatch_op(self, op: str) -> None:
        for key, patch in list(self.patches.items()):
            if patch.spec.name == op:
                self.generation += 1
                patch.cache.clear()  # a wrapper someone kept a reference to decides afresh
                if patch.owned:
                    setattr(patch.owner, patch.name, patch.original)
                else:
                    delattr(patch.owner, patch.name)
                del self.patches[key]


_PRIMED = False


def _prime_dynamo() -> None:
    """Have dynamo index torch's functions before the first patch, never after.

    Dynamo builds its table of known torch functions once, by looking names up on the torch
    modules. Built while a kforge wrapper stands in for ``torch.softmax``, the table would hold the
    wrapper and not the original, and a compiled model that falls back to the original (a guard
    miss) would fail to trace. Built first, the original is known and the wrapper is traced as
    the Python function it is."""
    global _PRIMED
    if _PRIMED:
        return
    _PRIMED = True
    try:
        from torch._dynamo import trace_rules

        trace_rules.get_torch_obj_rule_map()
    except Exception:  # another torch: compile support degrades, dispatch does not
        pass


def _locations(target: Any) -> list[tuple[Any, str]]:
    """Every (owner, attribute) through which user code reaches ``target``."""
    out = []
    for owner in _OWNERS:
        d = owner.__dict__ if isinstance(owner, type) else vars(owner)
        for name, value in list(d.items()):
            if value is target:
                out.append((owner, name))
    name = getattr(target, "__name__", None)
    if not out and name and getattr(torch.Tensor, name, None) is target:
        out.append((torch.Tensor, name))  # a TensorBase method: shadowed on Tensor, deleted to undo
    return out


# Zero-argument callables, each truthy when a call must run eagerly whatever its signature:
# functorch transforms (vmap, grad), a dispatch or function mode (tracing, make_fx, a user's mode),
# autocast (eager would change the dtype). Forward-mode AD (a dual tensor's tangent) is the fifth
# condition, read from forward_ad._current_level.
_CONTEXT_CHECKS = tuple(getattr(torch._C, n) for n in (
    "_are_functorch_transforms_active", "_len_torch_dispatch_stack", "_is_torch_function_mode_enabled",
    "_is_any_autocast_enabled") if hasattr(torch._C, n))


def _eager_only() -> bool:
    for check in _CONTEXT_CHECKS:
        if check():
            return True
    return forward_ad._current_level >= 0


_MISS = object()      # a cached decision: this call runs the original
_CACHE_LIMIT = 1024   # distinct calls remembered per patched callable


def _make_wrapper(dispatcher: Dispatcher, spec: OpSpec, original: Callable, bind: Callable, cache: dict) -> Callable:
    table = dispatcher.tables.setdefault(spec.name, {})
    shapes = dispatcher.first_shapes.setdefault(spec.name, set())
    names = spec.params

    def guard(args: tuple, kwargs: dict, front: Any) -> Any:
        """The whole decision in Python; with ``front``, deterministic outcomes are cached by call."""
        if not table:
            return original(*args, **kwargs)
        generation = dispatcher.generation
        try:
            call = bind(*args, **kwargs)
            inputs = call.inputs
            key = _fast_key(inputs, _param_values(names, call.params))
            entry = table.get(key)
        except (Unsupported, TypeError, ValueError, AttributeError):
            _remember(front, cache, args, kwargs, _MISS, dispatcher, generation)
            return original(*args, **kwargs)
        if entry is None:
            _remember(front, cache, args, kwargs, _MISS, dispatcher, generation)
            return original(*args, **kwargs)
        dk, dep = entry
        if not _plain(inputs):
            return original(*args, **kwargs)  # autograd, a tensor subclass, a lazily negated view
        positions = _positions(inputs, args, kwargs) if front is not None else None
        if positions is not None:
            scope = dep._scope if dep.model is not None else None
            _remember(front, cache, args, kwargs, (dk.launch, positions, dep, dk.inplace, scope), dispatcher,
                      generation)
        if not dep.active:
            return original(*args, **kwargs)
        outs = dk.launch(inputs)
        if dk.inplace:
            return inputs[0].copy_(outs[0])
        return outs[0] if len(outs) == 1 else tuple(outs)

    front_type = dispatch_type()
    front = None
    if front_type is not None:
        front = front_type(cache, _MISS, lambda *a, **k: guard(a, k, front), original, torch.is_grad_enabled,
                           _PLAIN, _KEY_VALUE_TYPES, _CONTEXT_CHECKS, forward_ad)
        run = front.run

    def kforge_dispatch(*args, **kwargs):
        # NB: first, so that dynamo traces the original alone: the graph, its guards and graph
        # breaks are plain compile's (kforge's graph mode rewrites the graph in its backend).
        if torch.compiler.is_compiling():
            return original(*args, **kwargs)
        if args and type(args[0]) in _PLAIN and args[0].shape not in shapes:
            return original(*args, **kwargs)  # cannot hit: the cheapest way out
        if front is not None:
            return run(args, kwargs or None)  # checks the eager-only contexts itself
        if _eager_only():
            return original(*args, **kwargs)
        return guard(args, kwargs, None)

    kforge_dispatch.__wrapped__ = original  # type: ignore[attr-defined]
    kforge_dispatch.__name__ = getattr(original, "__name__", spec.name)
    kforge_dispatch.__doc__ = getattr(original, "__doc__", None)
    return kforge_dispatch


def _function_handler(dispatcher: Dispatcher, spec: OpSpec) -> Callable:
    """The eager decision for an operator computed by a library's function, taken at its hooks: the kernel for
    the call's exact signature, handed back as the function returns its value, or ``PASS`` (the handler below,
    or the function itself)."""
    table = dispatcher.tables.setdefault(spec.name, {})
    names = spec.params

    # NB: a call it does not take is PASSed to the handler below (a capture that started before this deployment
    # was installed), not run here: that capture lost every call of the function (found by review)
    def handle(point: FunctionEntry, args: tuple, kwargs: dict) -> Any:
        if not table or _eager_only():
            return PASS
        try:
            call = point.target.binder(spec)(*args, **kwargs)
            entry = table.get(_fast_key(call.inputs, _param_values(names, call.params)))
        except (Unsupported, TypeError, ValueError, AttributeError):
            return PASS
        if entry is None:
            return PASS
        dk, dep = entry
        if not _plain(call.inputs) or not dep.active:
            return PASS
        return point.target.result(dk.launch(call.inputs), call.params)

    return handle


def _plain(inputs: Iterable[torch.Tensor | None]) -> bool:
    """Whether a kernel may take these inputs: plain tensors, none recording autograd (grad mode on and
    ``requires_grad``), none a lazily negated or conjugated view."""
    grad = torch.is_grad_enabled()
    for t in inputs:   # NB: a loop, not any() over a generator: this runs on every dispatched call
        if t is not None and (grad and t.requires_grad or type(t) not in _PLAIN or t.is_neg() or t.is_conj()):
            return False
    return True


_KEY_VALUE_TYPES = (torch.dtype, torch.device, torch.memory_format, torch.layout)


def _remember(front: Any, cache: dict, args: tuple, kwargs: dict, decision: Any, dispatcher: "Dispatcher",
              generation: int) -> None:
    """Cache ``decision`` for calls identical to this one (a no-op without the C front), unless the
    installed kernels changed since the decision was taken (another thread may have done so)."""
    if front is None or dispatcher.generation != generation:
        return
    key = front.key(args, kwargs or None)
    if key is None:
        return
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()  # many distinct calls (e.g. a varying scalar): start over rather than freeze
    cache[key] = decision
    if dispatcher.generation != generation:  # changed meanwhile: the clear may have come first
        cache.pop(key, None)


def _positions(inputs: tuple, args: tuple, kwargs: dict) -> tuple | None:
    """Where each bound input sits in the raw call (index or keyword), or None when that is not
    unambiguous: an input built by the binder, or one tensor object passed twice."""
    tensors = [id(a) for a in args if isinstance(a, torch.Tensor)]
    tensors += [id(v) for v in kwargs.values() if isinstance(v, torch.Tensor)]
    if len(tensors) != len(set(tensors)):
        return None
    out: list[int | str | None] = []
    for t in inputs:
        if t is None:
            out.append(None)
            continue
        where = next((i for i, a in enumerate(args) if a is t), None)
        if where is None:
            where = next((k for k, v in kwargs.items() if v is t), None)
        if where is None:
            return None
        out.append(where)
    return tuple(out)


DISPATCHER = Dispatcher()
_PLAIN = (torch.Tensor, torch.nn.Parameter)
