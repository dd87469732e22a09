"""Putting kernels back into an unmodified model: guarded dispatch by exact signature.

Only the torch callables of operators that have a winner are replaced. The replacement binds the
call, builds a key from exactly what defines a variant (shapes, dtypes, strides, device of every
tensor, every static parameter) and looks it up; any miss, autograd, or symbolic shape runs the
original function. Everything else in the model never passes through kforge.
"""
from __future__ import annotations

import ctypes
import json
import functools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch.autograd import forward_ad

from ..kernels import Kernel, param_vector
from ..kernels._library import KfTensor
from ._fast import dispatch_type, launcher_type
from ..ops import DTYPE_CODES, OpSpec, TensorSig, Unsupported, Variant, get_spec, inplace_binder, torch_dtype

_OWNERS: tuple[Any, ...] = (torch, F, torch._C._nn, torch.special, torch.Tensor)


def _fast_key(inputs: Iterable[torch.Tensor | None], params: tuple) -> tuple:
    return (tuple([None if t is None else (t.shape, t.dtype, t.stride(), t.device) for t in inputs]), params)


def _typed(value: Any) -> Any:
    """A parameter as it enters a key: numbers with their type (2, 2.0 and True are equal in
    Python but give different results: an int64 tensor times 2 stays int64, times 2.0 does not)."""
    if type(value) in (bool, int, float):
        return (type(value), value)
    if isinstance(value, (tuple, list)):
        return tuple(_typed(v) for v in value)
    return value


def _device(name: str) -> torch.device:
    return torch.device(name)


def variant_key(variant: Variant) -> tuple:
    """The dispatch key of a variant, in the same form ``_fast_key`` builds from a live call."""
    ins = tuple(None if s is None else (torch.Size(s.shape), torch_dtype(s.dtype), s.stride, _device(s.device))
                for s in variant.inputs)
    return (ins, tuple(_typed(v) for _, v in variant.params))


def _param_values(names: tuple[str, ...], params: dict) -> tuple:
    return tuple([_typed(params[n]) for n in names])


class DeployedKernel:
    """A validated kernel for one variant, with its launch arguments prepared once.

    Calls go through the C launcher of ``_fastpath.c`` where it can be built (``fast``), else
    through ctypes (``fast=False`` forces that); both fill the same descriptors the same way.
    """

    def __init__(self, variant: Variant, kernel: Kernel, candidate_id: int | None = None, speedup: float | None = None,
                 fast: bool = True):
        self.variant = variant
        self.kernel = kernel
        self.candidate_id = candidate_id
        self.speedup = speedup
        self.inplace = bool(variant.param_dict.get("inplace"))
        # NB: the name compiled graphs call kforge::run with. A plain attribute, computed here
        # (dynamo reads it as a constant); the same in every process for the same kernel binary
        # and variant (a graph cached on disk by another process names it); and it carries the
        # variant, so that a process without this kernel can still run the call eagerly.
        self.run_name = f"{kernel.path.stem}|{json.dumps(variant.to_json(), sort_keys=True, separators=(',', ':'))}"
        self._cuda = variant.device.startswith("cuda")
        self._index = torch.device(variant.device).index or 0 if self._cuda else 0
        self._outs = [(s.shape, s.stride, torch_dtype(s.dtype), _device(s.device)) for s in variant.outputs]
        self._lock = threading.Lock()
        n_in, n_out = len(variant.inputs), len(variant.outputs)
        self._ins = (KfTensor * max(n_in, 1))()
        self._out_structs = (KfTensor * max(n_out, 1))()
        for slot, sig in zip(self._ins, variant.inputs):
            _prefill(slot, sig)
        for slot, sig in zip(self._out_structs, variant.outputs):
            _prefill(slot, sig)
        pv = param_vector(variant)
        self._params = (ctypes.c_double * max(len(pv), 1))(*pv)
        self._n = (n_in, n_out, len(pv))
        # NB: on CUDA each call takes its workspace from the caching allocator, which orders its
        # reuse on the calling stream: launches on several streams (or graphs) never share one. On
        # the CPU the kernel runs inside the call, so one workspace, used one call at a time.
        self._ws_alloc = (functools.partial(torch.empty, (kernel.workspace_bytes,), dtype=torch.uint8,
                                            device=variant.device)
                          if kernel.workspace_bytes and self._cuda else None)
        self._workspace = (torch.empty(kernel.workspace_bytes, dtype=torch.uint8, device=variant.device)
                           if kernel.workspace_bytes and not self._cuda else None)
        self._fn = kernel._launch
        self._in_slots = list(self._ins)[:n_in]   # NB: indexing a ctypes array builds a proxy each time
        self._out_slots = list(self._out_structs)[:n_out]
        self._ws_ptr = self._workspace.data_ptr() if self._workspace is not None else None

        fast = self._fast_launcher() if fast else None
        self.fast = fast is not None   # calls go through the C launcher (else through ctypes)
        self.launch = fast if fast is not None else self._launch_py
        self._py_calls = 0

    def _fast_launcher(self) -> Any:
        """The C launcher for this kernel (kforge/deploy/_fastpath.c), or None without one."""
        launcher = launcher_type()
        if launcher is None or max(self._n[0], self._n[1]) > 16:
            return None
        allocs = tuple(functools.partial(torch.empty_strided, shape, stride, dtype=dtype, device=dev)
                       for shape, stride, dtype, dev in self._outs)
        stream_fn = (_GET_RAW_STREAM or _raw_stream) if self._cuda else None
        return launcher(
            ctypes.cast(self._fn, ctypes.c_void_p).value, bytes(self._ins)[:ctypes.sizeof(KfTensor) * self._n[0]],
            self._n[0], bytes(self._out_structs)[:ctypes.sizeof(KfTensor) * self._n[1]], self._n[1],
            bytes(self._params)[:ctypes.sizeof(ctypes.c_double) * self._n[2]], self._ws_alloc or self._ws_ptr, allocs,
            stream_fn, self._index, self.variant.signature, (self.kernel, self._workspace),
            not self._cuda)  # a CPU kernel runs inside the call: let other threads go meanwhile

    @property
    def calls(self) -> int:
        return self._py_calls + (self.launch.calls if self.fast else 0)

    def __call__(self, inputs: tuple) -> list[torch.Tensor]:
        return self.launch(inputs)

    def _launch_py(self, inputs: tuple) -> list[torch.Tensor]:
        if len(inputs) != self._n[0]:
            raise TypeError(f"expected {self._n[0]} inputs, got {len(inputs)}")
        outs = [torch.empty_strided(shape, stride, dtype=dtype, device=dev) for shape, stride, dtype, dev in self._outs]
        stream = _raw_stream(self._index) if self._cuda else None
        ws = self._ws_alloc() if self._ws_alloc is not None else None
        ws_ptr = ws.data_ptr() if ws is not None else self._ws_ptr
        # NB: the structs are shared, so two threads must not fill them at once.
        with self._lock:
            for slot, t in zip(self._in_slots, inputs):
                slot.data = t.data_ptr() if t is not None else None
            for slot, t in zip(self._out_slots, outs):
                slot.data = t.data_ptr()
            code = self._fn(self._ins, self._n[0], self._out_structs, self._n[1], self._params, self._n[2],
                            ws_ptr, stream)
            if code == 0:
                self._py_calls += 1
        if code != 0:
            raise RuntimeError(f"kforge kernel for {self.variant.signature} failed to launch (error {code})")
        return outs


def _raw_stream(index: int) -> int:
    """The current CUDA stream of a device as an integer handle, without building a Stream object."""
    return _GET_RAW_STREAM(index) if _GET_RAW_STREAM else torch.cuda.current_stream(index).cuda_stream


_GET_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _prefill(slot: KfTensor, sig: TensorSig | None) -> None:
    if sig is None:
        slot.data = None
        slot.ndim = 0
        slot.dtype = -1
        return
    slot.ndim = len(sig.shape)
    slot.dtype = DTYPE_CODES[sig.dtype]
    for i, (s, st) in enumerate(zip(sig.shape, sig.stride)):
        slot.sizes[i] = s
        slot.strides[i] = st


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
        self.tables: dict[str, dict[tuple, tuple[DeployedKernel, "Deployment"]]] = {}
        # The first input's shapes per operator: a call whose first argument is a plain tensor of
        # another shape cannot hit, and goes to eager without binding (a false miss only costs speed).
        self.first_shapes: dict[str, set[torch.Size]] = {}
        self.generation = 0  # bumped whenever the installed kernels change: cached decisions expire
        self.patches: dict[tuple[int, str], _Patch] = {}
        self.lock = threading.RLock()

    def install(self, deployment: "Deployment") -> None:
        with self.lock:
            for dk in deployment.kernels:
                spec = get_spec(dk.variant.op)
                self.tables.setdefault(spec.name, {})[variant_key(dk.variant)] = (dk, deployment)
                self._patch_op(spec)
            self._index_shapes()

    def uninstall(self, deployment: "Deployment") -> None:
        with self.lock:
            for op, table in list(self.tables.items()):
                for key, (dk, dep) in list(table.items()):
                    if dep is deployment:
                        del table[key]
                if not table:
                    del self.tables[op]
                    self._unpatch_op(op)
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
        grad = torch.is_grad_enabled()
        for t in inputs:
            if t is not None and (grad and t.requires_grad or type(t) not in _PLAIN or t.is_neg() or t.is_conj()):
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

    def traced(args: tuple, kwargs: dict) -> Any:
        """The call as dynamo traces it: the kernel becomes the opaque custom op kforge::run.

        The decision is taken once, at trace time, by a function dynamo treats as a constant, so
        the compiled graph does not guard on kforge's tables (which made every call of a compiled
        model re-check each key). A graph compiled while a kernel was installed keeps calling it
        through kforge::run, which runs eager once the kernel is removed; kernels installed later
        reach graphs compiled later. The model scope is not checked here: forward hooks are not a
        reliable signal inside a traced graph."""
        try:
            call = bind(*args, **kwargs)
            inputs = call.inputs
            params = _param_values(names, call.params)
        except (Unsupported, TypeError, ValueError, AttributeError):
            return original(*args, **kwargs)
        for t in inputs:
            # NB: dynamic shapes (SymInts) are not constants to decide on; eager there.
            if t is not None and (t._has_symbolic_sizes_strides or torch.is_grad_enabled() and t.requires_grad):
                return original(*args, **kwargs)
        first = next((t for t in inputs if t is not None), None)
        if torch._C._are_functorch_transforms_active() or (first is not None and _autocast_on(first.device.type)):
            return original(*args, **kwargs)
        metas = tuple(None if t is None else (tuple(t.shape), t.dtype, tuple(t.stride()), t.device) for t in inputs)
        decision = _decide_traced(spec.name, metas, params)
        if decision is None:
            return original(*args, **kwargs)
        name, inplace = decision
        outs = torch.ops.kforge.run(name, list(inputs))
        if inplace:
            return inputs[0].copy_(outs[0])
        return outs[0] if len(outs) == 1 else tuple(outs)

    front_type = dispatch_type()
    front = None
    if front_type is not None:
        front = front_type(cache, _MISS, lambda *a, **k: guard(a, k, front), original, torch.is_grad_enabled,
                           _PLAIN, _KEY_VALUE_TYPES, _CONTEXT_CHECKS, forward_ad)
        run = front.run

    def kforge_dispatch(*args, **kwargs):
        # NB: first, so that dynamo never traces (and guards on) what follows.
        if torch.compiler.is_compiling():
            return traced(args, kwargs)
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


_KEY_VALUE_TYPES = (torch.dtype, torch.device, torch.memory_format, torch.layout)


def _autocast_on(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # an older torch: one flag for CUDA
        return torch.is_autocast_enabled()


@torch.compiler.assume_constant_result
def _decide_traced(op: str, metas: tuple, params: tuple) -> tuple[str, bool] | None:
    """At trace time: the installed kernel for this exact signature, as (run name, inplace)."""
    key = (tuple(None if m is None else (torch.Size(m[0]), m[1], tuple(m[2]), m[3]) for m in metas), params)
    entry = DISPATCHER.tables.get(op, {}).get(key)
    if entry is None or not entry[1].installed:
        return None
    dk = entry[0]
    return dk.run_name, dk.inplace


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


@dataclass
class Deployment:
    """Kernels installed into the process, optionally scoped to one model's forward.

    Use as a context manager, or call ``remove()`` to undo.
    """

    kernels: list[DeployedKernel]
    model: Any = None
    skipped: list[tuple[str, str]] = field(default_factory=list)   # (signature, reason)
    _hooks: list = field(default_factory=list)
    installed: bool = False
    # NB: per thread: another thread's calls made while this model runs forward stay on eager.
    _scope: threading.local = field(default_factory=threading.local, repr=False)

    @property
    def active(self) -> bool:
        return self.installed and (self.model is None or getattr(self._scope, "depth", 0) > 0)

    def install(self) -> "Deployment":
        if self.installed:
            return self
        DISPATCHER.install(self)
        if isinstance(self.model, torch.nn.Module):
            self._hooks.append(self.model.register_forward_pre_hook(self._enter))
            self._hooks.append(self.model.register_forward_hook(self._exit, always_call=True))
        for dk in self.kernels:
            _RUN_TABLE[dk.run_name] = (dk, dk.variant)
        self.installed = True
        return self

    def _enter(self, *_):
        self._scope.depth = getattr(self._scope, "depth", 0) + 1

    def _exit(self, *_):
        self._scope.depth = getattr(self._scope, "depth", 1) - 1

    def remove(self) -> None:
        """Undo: the model (and torch) run exactly as before."""
        if not self.installed:
            return
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        DISPATCHER.uninstall(self)
        for dk in self.kernels:
            # NB: graphs compiled meanwhile still call kforge::run with this name: from now on it
            # runs eager, and the kernel (its library, its workspace) is no longer held here.
            _RUN_TABLE[dk.run_name] = (None, dk.variant)
        self.installed = False

    def __enter__(self) -> "Deployment":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.remove()

    @property
    def calls(self) -> dict[str, int]:
        return {dk.variant.signature: dk.calls for dk in self.kernels}

    def __repr__(self) -> str:
        state = "installed" if self.installed else "removed"
        return f"<kforge Deployment {state}: {len(self.kernels)} kernels, {len(self.skipped)} kept on eager>"


_RUN_TABLE: dict[str, tuple[DeployedKernel | None, Variant]] = {}  # kernel None once removed


def _run_entry(key: str) -> tuple[DeployedKernel | None, Variant]:
    entry = _RUN_TABLE.get(key)
    if entry is None:  # a graph compiled elsewhere (an on-disk cache) names a kernel not loaded here
        entry = (None, Variant.from_json(json.loads(key.split("|", 1)[1])))
    return entry


def _run_impl(key: str, inputs: list[torch.Tensor | None]) -> list[torch.Tensor]:
    dk, variant = _run_entry(key)
    if dk is None:  # removed since the graph was compiled, or never loaded here: eager
        out = get_spec(variant.op).reference(list(inputs), variant.param_dict)
        return list(out) if isinstance(out, (tuple, list)) else [out]
    return dk(tuple(inputs))


def _run_fake(key: str, inputs: list[torch.Tensor | None]) -> list[torch.Tensor]:
    _, variant = _run_entry(key)
    return [torch.empty_strided(s.shape, s.stride, dtype=torch_dtype(s.dtype), device=_device(s.device))
            for s in variant.outputs]


def _register_custom_op() -> None:
    # NB: under torch.compile the dispatched call is a custom op, so the graph keeps the kernel
    # as one opaque node instead of breaking at a ctypes call.
    lib = torch.library.Library("kforge", "FRAGMENT")
    lib.define("run(str key, Tensor?[] inputs) -> Tensor[]")
    lib.impl("run", _run_impl, "CompositeExplicitAutograd")
    torch.library.register_fake("kforge::run", _run_fake, lib=lib)
    _register_custom_op.lib = lib  # type: ignore[attr-defined]


_register_custom_op()
