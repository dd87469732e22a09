"""Graph mode: kforge kernels inside torch.compile, as ``torch.ops.kforge.run`` nodes Inductor keeps.

kforge compiles through its own backend: dynamo traces the model exactly as plain
``torch.compile`` would (kforge's eager wrappers step aside while dynamo traces, so the graphs,
guards and graph breaks are those of plain compile), then ``replace_calls`` rewrites each FX node
whose operator and exact signature (read from the node's fake tensors) has a kernel into a call of
the custom op, and the graph goes to Inductor with the options of the chosen ``mode``. Everything
else is compiled by Inductor as usual. Region winners and fused operators' need the ATen graph (they
are found in the graph capture saw, AOTAutograd's forward, with its layouts): where any kernel is one, the backend runs
AOTAutograd itself, lets the registered ATen passes (``register_aten_pass``; kforge.regions
registers its own) rewrite the forward graph, and compiles that graph with the chosen compiler.
"""
from __future__ import annotations

import contextvars
import functools
import inspect
import itertools
import logging
import operator
import types
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx

from ..ops import (Epilogue, Unsupported, all_families, family_of, found_in_graph, get_spec, inplace_binder, is_fused,
                   placed_in_aten_graph, spec_for, without_prologue)
from ..ops._functions import enter_graph_calls, graph_calls, hook_functions, leave_graph_calls
from ..rewrites import Rewritten, as_rewrites, get_rewrite
from ._dispatch import _eager_only, _fast_key, _param_values, variant_key
from ._launch import DeployedKernel
from ._runop import RUN_TABLE

log = logging.getLogger("kforge.deploy")

GraphPass = Callable[[torch.fx.GraphModule], Sequence[str]]   # rewrites in place, returns what it replaced
# Given a compile's kernels, a pass over AOTAutograd's ATen forward graph, or None when none of them needs one.
AtenPassMaker = Callable[[Sequence[DeployedKernel]], "GraphPass | None"]
_ATEN_PASS_MAKERS: list[AtenPassMaker] = []


# Whether the ATen graph the registered passes rewrite goes to Inductor next (True) or to another compiler.
_INDUCTOR_LOWERS: contextvars.ContextVar[bool] = contextvars.ContextVar("kforge_inductor_lowers", default=False)


def inductor_lowers() -> bool:
    """In an ATen pass: whether Inductor compiles the graph next (an Inductor-only prim, such as its layout
    request ``prims.inductor_force_stride_order``, is then lowered away rather than run as it is eagerly)."""
    return _INDUCTOR_LOWERS.get()


# Whether the ATen graph the registered passes rewrite runs with the layouts it was traced with (an eager
# deployment's graph: no Inductor lays its convolutions out channels-last).
_TRACED_LAYOUT: contextvars.ContextVar[bool] = contextvars.ContextVar("kforge_traced_layout", default=False)


def keeps_traced_layout() -> bool:
    """In an ATen pass: whether the graph runs in the layouts it was traced with (``GraphForward``'s graph, run
    op by op), so that no call is a channels-last twin of Inductor's layout."""
    return _TRACED_LAYOUT.get()


def register_aten_pass(maker: AtenPassMaker) -> AtenPassMaker:
    """Register a maker of ATen-graph passes for graph mode (kforge.regions registers the region pass)."""
    if maker not in _ATEN_PASS_MAKERS:
        _ATEN_PASS_MAKERS.append(maker)
    return maker


def _callable_of(node: torch.fx.Node) -> Any:
    if node.op == "call_function":
        return node.target
    if node.op == "call_method":
        fn = getattr(torch.Tensor, node.target, None)  # type: ignore[arg-type]
        return getattr(fn, "__wrapped__", fn)  # NB: while eager kernels are applied, the method is kforge's wrapper
    return None


def _fake(value: Any) -> Any:
    """A node argument as the value it had while dynamo traced (fake tensors), recursively."""
    if isinstance(value, torch.fx.Node):
        return value.meta.get("example_value", value.meta.get("val"))
    if isinstance(value, (list, tuple)):
        return type(value)(_fake(v) for v in value)
    if isinstance(value, dict):
        return {k: _fake(v) for k, v in value.items()}
    return value


def _input_nodes(node: torch.fx.Node, inputs: tuple) -> list[torch.fx.Node | None] | None:
    """The graph node of each bound input (None for an absent one), or None when an input is not
    one of the call's own arguments (the binder built it) or one value comes from two nodes."""
    candidates = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, torch.fx.Node)]
    out: list[torch.fx.Node | None] = []
    for t in inputs:
        if t is None:
            out.append(None)
            continue
        hits = [a for a in candidates if _fake(a) is t]
        if len({id(h) for h in hits}) != 1:
            return None
        out.append(hits[0])
    return out


def replace_calls(gm: torch.fx.GraphModule, kernels: Sequence[DeployedKernel],
                  missed: list | None = None) -> list[str]:
    """Rewrite every call in ``gm`` that has a kernel for its exact signature into
    ``torch.ops.kforge.run``; returns the signatures replaced, one per node. Calls with symbolic
    shapes, inputs that need gradients (where the graph is traced with grad mode on: dynamo traces a
    call under ``torch.no_grad()`` with it off, and guards on it), or forms the operator's binder does
    not take stay as they are. ``missed`` (when given) gets the variant of each call of a kernel's
    operator that stayed, as the graph has it: what a kernel that was never placed is compared with."""
    # NB: fused operators (``Family.fused``) are placed in the ATen graph, where capture found them, with
    # the layouts Inductor gives the call (kforge.regions' ATen pass); not here
    table = {(dk.variant.op, variant_key(dk.variant)): dk for dk in kernels if not is_fused(dk.variant.op)}
    if not table:
        return []
    ops = {op for op, _ in table}
    # a call a fused kernel will take in the ATen graph (its first operator, read only by the epilogue,
    # with the fused variant's shapes) is left for it: a plain kernel here would leave no pair there
    # (strides aside: the fused kernel's are the ATen graph's, or its channels-last twin's)
    fused = {(epilogue.of, _loose(without_prologue(dk.variant))): epilogue
             for dk in kernels if (epilogue := _epilogue_of(dk.variant.op)) is not None}
    # likewise a call an operator's channels-last twin will take there (one its epilogue does not alone read)
    twins = {(dk.variant.op, _loose(dk.variant)) for dk in kernels if _is_twin(dk.variant)}
    # NB: a model's parameters require grad whatever the mode; in a graph traced under no_grad nothing
    # records gradients, so a kernel (which has no backward) may take them. Before this, no operator
    # kernel reading a parameter (group_norm, layer_norm with weights) was put into a compiled model
    # whose parameters require grad, e.g. the SD3.5 VAE's group_norm winners (inferred from this code)
    grad = torch.is_grad_enabled()
    replaced: list[str] = []
    for node in list(gm.graph.nodes):
        fn = _callable_of(node)
        spec = spec_for(fn) if fn is not None else None
        if spec is None or spec.name not in ops:
            continue
        args, kwargs = _fake(node.args), _fake(node.kwargs)
        try:
            call = inplace_binder(spec, fn)(*args, **kwargs)
            inputs = tuple(call.inputs)
            if any(t is not None and (not isinstance(t, torch.Tensor) or (grad and t.requires_grad)
                                      or any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride())))
                   for t in inputs):
                continue
            key = _fast_key(inputs, _param_values(spec.params, call.params))
            dk = table.get((spec.name, key))
            if fused or twins:
                loose = (spec.name, _loose(spec.variant(call, ())))
                if loose in fused and _epilogue(node, fused[loose]) is not None:
                    continue
                if loose in twins and not _read_by_an_epilogue(node, spec.name) \
                        and not (dk is not None and _is_twin(dk.variant)):
                    continue
            if dk is None and missed is not None:
                missed.append(spec.variant(call, ()))
        except (Unsupported, TypeError, ValueError, AttributeError, RuntimeError):
            continue
        if dk is None:
            continue
        sources = _input_nodes(node, inputs)
        if sources is None:
            continue
        n_out = len(dk.variant.outputs)
        # NB: a function's graph twin returns what the function does: a tuple, even of one tensor
        # (a twin of bound tensors returns the function's value too: one tensor for the experts)
        as_tuple = not dk.inplace and (n_out > 1 or (bool(getattr(fn, "kforge_function", None))
                                                     and not getattr(fn, "kforge_bound", False)))
        if as_tuple and any(u.op == "call_function" and u.target is operator.getitem and not 0 <= u.args[1] < n_out
                            for u in node.users):
            # NB: a function's value may hold more than the kernel's outputs (the gated delta rule's None state
            # when no final state is asked): a use of those leaves the original call in place
            continue
        RUN_TABLE.register(dk)
        with gm.graph.inserting_before(node):
            run = gm.graph.call_function(torch.ops.kforge.run.default, (dk.run_name, sources))
            outs = [gm.graph.call_function(operator.getitem, (run, i)) for i in range(n_out)]
            if dk.inplace:
                result: Any = gm.graph.call_method("copy_", (sources[0], outs[0]))
            else:
                result = tuple(outs) if as_tuple else outs[0]
        if isinstance(result, tuple):
            for user in list(node.users):
                if user.op == "call_function" and user.target is operator.getitem:
                    user.replace_all_uses_with(result[user.args[1]])
                    gm.graph.erase_node(user)
            if node.users:  # the tuple itself is used: leave the original call in place
                continue
        else:
            result.meta.update(node.meta)
            node.replace_all_uses_with(result)
        gm.graph.erase_node(node)
        replaced.append(dk.variant.signature)
    if replaced:
        gm.graph.lint()
        gm.recompile()
    return replaced




def nearest_miss(variant: Any, missed: Sequence[Any]) -> str | None:
    """Why no call in a graph took ``variant``'s kernel, from the variants of its operator's calls that
    stayed: the nearest one (same input shapes first) and what differs, or None when the graphs have
    no call of that operator at all."""
    same_op = [m for m in missed if m.op == variant.op]
    if not same_op:
        return None
    shapes = lambda v: [s.shape if s is not None else None for s in v.inputs]  # noqa: E731
    near = [m for m in same_op if shapes(m) == shapes(variant)] or same_op
    m = near[0]
    why = []
    if shapes(m) != shapes(variant):
        why.append("shapes")
    else:
        if [s.dtype for s in m.inputs if s] != [s.dtype for s in variant.inputs if s]:
            why.append("dtypes")
        if [s.stride for s in m.inputs if s] != [s.stride for s in variant.inputs if s]:
            why.append("strides")
        if [p for p in m.params if p[0] != "inplace"] != [p for p in variant.params if p[0] != "inplace"]:
            why.append("parameters")
    return (f"nearest call: {m.signature}" + (f" (differs in {', '.join(why)})" if why else "")
            + (f"; {len(near) - 1} more like it" if len(near) > 1 else ""))


def _is_twin(variant: Any) -> bool:
    """An operator's channels-last twin, which the ATen pass places (kforge.regions)."""
    return not is_fused(variant.op) and not found_in_graph(variant.op) and placed_in_aten_graph(variant)


def _loose(variant: Any) -> tuple:
    """A variant's identity without strides: its inputs' shapes and dtypes, and its parameters."""
    return (tuple(None if s is None else (tuple(s.shape), s.dtype) for s in variant.inputs),
            tuple(sorted((k, str(v)) for k, v in variant.params if k != "inplace")))


def _epilogue_of(op: str) -> Epilogue | None:
    family = family_of(op)
    return family.epilogue if family is not None else None


def _epilogue(node: torch.fx.Node, epilogue: Epilogue) -> torch.fx.Node | None:
    """The node applying ``epilogue`` to ``node``'s value when it is that value's only reader, as the fused family
    tells it in dynamo's graph (``Epilogue.reads``; None where it does not)."""
    if epilogue.reads is None or len(node.users) != 1:
        return None
    (user,) = node.users
    if not user.args or user.args[0] is not node or not epilogue.reads(_callable_of(user), user):
        return None
    return user


def _read_by_an_epilogue(node: torch.fx.Node, op: str) -> bool:
    """Whether ``node`` (a call of ``op``) is read only by the epilogue of a fused family of ``op``: the ATen graph
    then holds that fused operator's call, not a lone one a twin may take."""
    return any(_epilogue(node, f.epilogue) is not None for f in all_families()
               if f.epilogue is not None and f.epilogue.of == op)


@dataclass
class CompiledGraph:
    """One graph the backend compiled: how many nodes it had and which calls became kforge kernels."""

    nodes: int
    replaced: list[str]
    missed: list = field(default_factory=list)   # calls of a kernel's operator that stayed
    rewritten: list[Rewritten] = field(default_factory=list)   # what each inference rewrite did to its ATen graph


@dataclass
class KforgeBackend:
    """A torch.compile backend: kforge's passes over dynamo's graph, then Inductor in ``mode``.

    ``inner``: another dynamo backend by name ("eager", "aot_eager": debugging and fast tests).
    ``graphs`` lists what each compiled graph got.
    """

    kernels: Sequence[DeployedKernel]
    mode: str | None = None
    options: dict | None = None
    dynamic: bool | None = None
    inner: str = "inductor"
    passes: list[GraphPass] = field(default_factory=list)
    graphs: list[CompiledGraph] = field(default_factory=list)
    enabled: bool = True   # False: graphs compiled from now on (recompilations) get no kernels
    function_hooks: Any = field(default=None, repr=False)   # hooks of functions whose graph twins it places
    traced_layout: bool = False   # the graph runs as traced (an eager deployment's): no channels-last twins
    rewrites: tuple[str, ...] = ()   # inference rewrites (kforge.rewrites) for the ATen graphs that record no gradients

    def __post_init__(self):
        self._inductor = None
        self._other = None
        self.aten_passes = [p for make in _ATEN_PASS_MAKERS if (p := make(self.kernels)) is not None]
        # NB: in the registry's order whatever order they were named in: a rewrite reads what the earlier ones left
        self._rewrites = [get_rewrite(name) for name in as_rewrites(self.rewrites)]
        if self.inner == "inductor":
            # NB: Inductor's own wrapper turns mode/options into config exactly as plain torch.compile does.
            self._inductor = torch._TorchCompileInductorWrapper(self.mode, self.options, self.dynamic)
        else:
            if self.mode is not None or self.options:
                raise ValueError(f"mode= and options= are Inductor's; backend={self.inner!r} takes neither")
            self._other = torch._dynamo.lookup_backend(self.inner)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        missed: list = []
        replaced = replace_calls(gm, self.kernels, missed) if self.enabled else []
        for graph_pass in self.passes if self.enabled else ():
            replaced.extend(graph_pass(gm))
        record = CompiledGraph(len(gm.graph.nodes), replaced, missed)
        self.graphs.append(record)
        compiler = self._other if self._inductor is None else self._inductor
        # NB: a rewrite's constants have no gradient: only a graph that records none is rewritten
        rewrites = self._rewrites if self.enabled and not (torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)) else []
        if not (self.enabled and (self.aten_passes or rewrites)):
            return compiler(gm, example_inputs)
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.aot_autograd import make_boxed_func

        def compile_aten(aten_gm: torch.fx.GraphModule, aten_inputs: list, forward: bool) -> Callable:
            # NB: under the mode's Inductor options, so that the passes' questions to Inductor (its layout
            # decision: regions._layout) get the answers the compile will (options={"layout_optimization": False})
            token = _INDUCTOR_LOWERS.set(compiler is self._inductor)
            traced = _TRACED_LAYOUT.set(self.traced_layout)
            try:
                with self._inductor_config():
                    for aten_pass in self.aten_passes:
                        record.replaced.extend(aten_pass(aten_gm))
                        record.missed.extend(getattr(aten_pass, "missed", ()))
                    # NB: after the kernels' passes, which were searched on the graph as traced: a rewrite takes
                    # what they left. With Inductor's freezing on, Inductor folds constants itself
                    values = _placeholder_values(aten_gm, example_inputs) if forward else None
                    freezing = compiler is self._inductor and torch._inductor.config.freezing
                    for rewrite in rewrites if values is not None and not freezing else ():
                        # NB: AOTAutograd compiles under its fake mode; a rewrite's constants are real tensors
                        with torch._subclasses.fake_tensor.unset_fake_temporarily():
                            done = rewrite.apply(aten_gm, values)
                        if done is not None:
                            record.replaced.extend(done.sites)
                            record.rewritten.append(done)
            finally:
                _TRACED_LAYOUT.reset(traced)
                _INDUCTOR_LOWERS.reset(token)
            # NB: the rewritten ATen graph goes to the compiler as dynamo's graph would (Inductor runs
            # its own AOTAutograd over it again: a re-trace of a functional graph, apart from the copy_
            # into inputs an inference graph keeps; so do the aot_* backends). What they return takes its arguments unpacked, which
            # AOTAutograd's runtime does not do for a compiler's result: box it (tests/test_regions.py).
            if compiler is not self._inductor:
                run = make_boxed_func(compiler(aten_gm, aten_inputs))
            else:
                run = make_boxed_func(_inductor_keeping_static_inputs(dict(self._inductor.config), aten_gm,
                                                                      aten_inputs, static=forward))
            return _refreshing(run, record.rewritten) if forward and record.rewritten else run

        # NB: a backward graph's inputs are saved activations and gradients: no parameter index applies.
        # keep_inference_input_mutations as Inductor's own pass has it: a buffer written in place (a
        # static KV cache) stays a copy_ inside the graph instead of an extra output the runtime copies
        # back into the whole buffer after every call (tests/test_regions.py)
        return aot_autograd(fw_compiler=lambda g, i: compile_aten(g, i, True),
                            bw_compiler=lambda g, i: compile_aten(g, i, False),
                            keep_inference_input_mutations=True)(gm, example_inputs)

    def _inductor_config(self):
        """Inductor's config patched with this mode's options (a no-op without Inductor)."""
        import contextlib

        if self._inductor is None or not self._inductor.config:
            return contextlib.nullcontext()
        return torch._inductor.config.patch(dict(self._inductor.config))

    def get_compiler_config(self) -> dict | None:
        return self._inductor.get_compiler_config() if self._inductor is not None else None

    def reset(self) -> None:
        if self._inductor is not None:
            self._inductor.reset()

    @property
    def replaced(self) -> list[str]:
        return [s for g in self.graphs for s in g.replaced]

    @property
    def missed(self) -> list:
        return [m for g in self.graphs for m in g.missed]

    @property
    def rewritten(self) -> list[Rewritten]:
        """What the inference rewrites did, one record per rewrite and graph."""
        return [r for g in self.graphs for r in g.rewritten]


def _placeholder_values(aten_gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> list | None:
    """The real values of an inference ATen graph's placeholders: dynamo's example inputs, which AOTAutograd hands
    on one for one (its own are fake), or None where they do not line up (an effect token, another count, shapes
    or dtypes that differ)."""
    places = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
    if len(places) != len(example_inputs):
        return None
    for node, value in zip(places, example_inputs):
        fake = node.meta.get("val")
        if isinstance(value, torch.Tensor) != isinstance(fake, torch.Tensor):
            return None
        if isinstance(value, torch.Tensor) and (tuple(fake.shape) != tuple(value.shape) or fake.dtype != value.dtype):
            return None
    return list(example_inputs)


def _refreshing(run: Callable, rewritten: Sequence[Rewritten]) -> Callable:
    """``run`` (a boxed compiled graph) that first lets each rewrite bring its constants up to date with the
    arguments (the model's parameters and buffers as they are now)."""
    refreshes = [r.refresh for r in rewritten]

    def run_rewritten(args: list) -> Any:
        for refresh in refreshes:
            refresh(args)
        return run(args)
    run_rewritten._boxed_call = True  # type: ignore[attr-defined]
    return run_rewritten


def _inductor_keeping_static_inputs(config: dict, aten_gm: torch.fx.GraphModule, aten_inputs: list, *,
                                    static: bool = True) -> Callable:
    """Inductor (with ``config``, a mode's options) over an ATen graph that AOTAutograd, run by
    kforge's backend, made, with the model's parameters and buffers still known as static inputs.

    Inductor runs AOTAutograd over the graph again, and that second pass sees a graph dynamo did not
    make, so it marks no input static; in ``reduce-overhead`` mode CUDA graphs then copy every
    parameter into the graph's memory on each replay (all of the model's weights, every forward).
    The first pass knows which inputs are static (this compiler runs inside it): with ``static``
    (a forward graph) those indices are handed to Inductor's inner compile, shifted past the tensors
    the second pass lifts in front of the graph's inputs.

    The second pass keeps AOTAutograd's cache: a hit skips the inner compile, but the compiled graph it loads
    is the one the miss compiled, with the indices given here (Inductor keys and stores its graphs with their
    inner-compile arguments, and its CUDA graphs read the indices from there). A process that compiles the
    same model again (a server's restart) pays no second trace: Gemma 4 E2B, 4 layers, on the CPU, 7.7 s
    through kforge against 1.9 s plain with the cache off, 3.6 s with it (benchmarks/compile_overhead.py --warm).
    """
    from torch._inductor import compile_fx as cfx

    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None) if context is not None else None
    indices = tuple(getattr(metadata, "static_input_indices", None) or ()) if static else ()

    # NB: the second pass lifts the ATen graph's own tensors (AOTAutograd's tensor constants, which torch
    # 2.11 registers as buffers, e.g. Gemma's ``torch.tensor(hidden_size ** 0.5)``) in front of its inputs:
    # they are static too, and shift every index by their number (tests/test_regions.py)
    lifted = (sum(1 for _ in aten_gm.named_parameters(remove_duplicate=False))
              + sum(1 for _ in aten_gm.named_buffers(remove_duplicate=False)))   # as that pass counts them

    def inner(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
        forward = bool(indices) and not kwargs.get("is_backward")
        if forward and len(example_inputs) == len(aten_inputs) + lifted:
            kwargs["static_input_idxs"] = sorted(set(kwargs.get("static_input_idxs") or ()) | set(range(lifted))
                                                 | {i + lifted for i in indices})
        elif forward and bool(kwargs.get("cudagraphs", True)) and any(isinstance(t, torch.Tensor) and t.is_cuda
                                                                      for t in example_inputs):
            log.warning("kforge: Inductor's inner compile got %d inputs where %d + %d were expected; its CUDA "
                        "graphs (mode='reduce-overhead') will copy the model's weights on each replay",
                        len(example_inputs), len(aten_inputs), lifted)
        return cfx.compile_fx_inner(gm, example_inputs, **kwargs)

    return cfx.compile_fx(aten_gm, aten_inputs, inner_compile=inner, config_patches=config)


def compile_with(model: Any, kernels: Sequence[DeployedKernel], *, backend: str = "inductor",
                 mode: str | None = None, options: dict | None = None, dynamic: bool | None = None,
                 passes: Sequence[GraphPass] = (), rewrites: Sequence[str] = (), **torch_compile_kwargs: Any) -> Any:
    """``torch.compile(model, mode=..., ...)`` with ``kernels`` inside its graphs (and ``rewrites``, kforge.rewrites'
    names, made in its ATen graphs that record no gradients).

    The returned object is what torch.compile returns, with ``kforge_backend`` (a KforgeBackend:
    what each compiled graph got) set on it.
    """
    if mode is not None and options is not None:
        raise ValueError("pass mode= or options=, not both (as with torch.compile)")
    kb = KforgeBackend(list(kernels), mode, options, dynamic, inner=backend, passes=list(passes),
                       rewrites=tuple(rewrites))
    compiled = torch.compile(model, backend=kb, dynamic=dynamic, **torch_compile_kwargs)
    specs = {spec.name: spec for spec in (get_spec(dk.variant.op) for dk in kernels) if spec.functions}
    if specs:
        compiled = _with_graph_twins(compiled, model, list(specs.values()), kb)
    object.__setattr__(compiled, "kforge_backend", kb) if isinstance(compiled, torch.nn.Module) else \
        setattr(compiled, "kforge_backend", kb)
    return compiled


def _with_graph_twins(compiled: Any, model: Any, specs: list, kb: KforgeBackend) -> Any:
    """``compiled`` whose calls trace the functions of ``specs`` as their graph twins (one node each, which
    ``replace_calls`` gives a kernel): hooks at the places ``model`` reaches them, and ``graph_calls`` around each
    of its calls (outside the compiled frame: forward hooks of the wrapper torch.compile returns, or a wrapping
    function). The hooks are given back when the compiled model is collected or its Deployment removed
    (``Deployment.remove``); a recompilation after that traces the function as plain compile does."""
    hooks = hook_functions(specs, model)
    kb.function_hooks = hooks
    if isinstance(compiled, torch.nn.Module):
        compiled.register_forward_pre_hook(lambda *_: enter_graph_calls())
        compiled.register_forward_hook(lambda *_: leave_graph_calls(), always_call=True)
        weakref.finalize(compiled, hooks.release)
        return compiled

    @functools.wraps(compiled)
    def run(*args: Any, **kwargs: Any) -> Any:
        with graph_calls():
            return compiled(*args, **kwargs)

    weakref.finalize(run, hooks.release)
    return run


_COMPILE_KEYWORDS = frozenset(inspect.signature(torch.compile).parameters)


class GraphForward:
    """A model's forward as an eager deployment runs it when it holds region or fused-operator kernels.

    The eager dispatcher sees one torch call at a time; a region is several. So the forward is captured once
    through dynamo and AOTAutograd (``torch.compile`` with ``KforgeBackend``, ``inner="eager"``: no Inductor,
    the layouts as traced): each region and fused operator with a kernel becomes a ``kforge::run`` call, and
    so does each call with an operator kernel (the dispatcher steps aside while dynamo traces); every other
    node runs eagerly, op by op. Installed as the model instance's ``forward`` while its Deployment is. The
    deployment's inference rewrites (``rewrites``, kforge.rewrites) are made in that graph too.

    The plain forward runs instead, as without kforge: while dynamo traces (a compile of the user's own) or
    torch.jit traces; where the dispatcher runs calls eagerly (a torch function or dispatch mode, functorch
    transforms, autocast, forward AD); with grad mode on and a parameter or input that needs gradients (a
    kernel has no backward); and for good once the forward cannot be captured (``failure``). Dynamo's guards
    decide the rest: another shape, dtype, stride or device recompiles, and a region whose key no longer
    matches stays as traced; past dynamo's recompile limit the forward runs as it is.
    """

    def __init__(self, model: torch.nn.Module, kernels: Sequence[DeployedKernel],
                 on_failure: Callable[[str], None] = lambda why: None, rewrites: Sequence[str] = ()):
        self.model = model
        self.kernels = list(kernels)
        self.backend = KforgeBackend(self.kernels, inner="eager", traced_layout=True, rewrites=tuple(rewrites))
        # NB: the library functions' hooks are the dispatcher's (held while the deployment is installed);
        # graph_calls around the call makes dynamo trace their graph twins, which replace_calls takes
        self.functions = any(get_spec(dk.variant.op).functions for dk in self.kernels)
        self.failure: str | None = None
        self.attached = False
        self.prior: Any = None   # the instance's own forward before this one (accelerate's hooks set one)
        self.plain: Callable | None = None
        self.compiled: Callable | None = None
        self._on_failure = on_failure

    def attach(self) -> None:
        """Make this the model's forward."""
        current = self.model.__dict__.get("forward")
        if current is self:
            self.attached = True
            return
        plain = _own_forward(self.model, current)
        if self.compiled is None or plain != self.plain:
            # NB: its own recompilations, where this torch can keep them apart: each deployment (and the model-level
            # check builds one per kernel set) would otherwise count against every compile of the model's forward
            options = {"isolate_recompiles": True} if "isolate_recompiles" in _COMPILE_KEYWORDS else {}
            self.compiled = torch.compile(_own_frame(plain), backend=self.backend, dynamic=False, **options)
        self.prior, self.plain = current, plain
        self.model.__dict__["forward"] = self
        self.attached = True

    def detach(self) -> None:
        """Give the model its forward back (the one it had when this was attached)."""
        self.attached = False
        if self.model.__dict__.get("forward") is self:
            prior = self.prior
            while isinstance(prior, GraphForward) and not prior.attached:
                prior = prior.prior
            if prior is None:
                del self.model.__dict__["forward"]
            else:
                self.model.__dict__["forward"] = prior

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # NB: first, so that dynamo tracing the model for a compile of the user's own traces the plain forward
        if torch.compiler.is_compiling() or not self.attached or self.failure is not None or _eager_only() \
                or torch._C._get_tracing_state() is not None \
                or (torch.is_grad_enabled() and self._records_grad(args, kwargs)):
            return self.plain(*args, **kwargs)
        try:
            if self.functions:
                with graph_calls():
                    return self.compiled(*args, **kwargs)
            return self.compiled(*args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as exc:
            out = self.plain(*args, **kwargs)   # NB: the user's own error (a bad input) raises here, as in eager
            self._fail(exc)
            return out

    def _records_grad(self, args: tuple, kwargs: dict) -> bool:
        if any(p.requires_grad for p in self.model.parameters()):
            return True
        return any(isinstance(t, torch.Tensor) and t.requires_grad
                   for t in torch.utils._pytree.tree_leaves((args, kwargs)))

    def _fail(self, exc: BaseException) -> None:
        cause = getattr(exc, "inner_exception", None) or exc   # NB: a backend's own error, not dynamo's wrapper
        first = (str(cause).strip().splitlines() or [""])[0][:200]
        self.failure = (f"the model's forward could not be captured as a graph ({type(cause).__name__}: {first}); "
                        "region and fused-operator kernels stay off, operator kernels still dispatch eagerly")
        warnings.warn(f"kforge: {self.failure}", stacklevel=3)
        self._on_failure(self.failure)

    @property
    def replaced(self) -> list[str]:
        """The signatures of the kernels each captured graph calls, one per call site."""
        return self.backend.replaced

    def __reduce__(self) -> tuple:
        # NB: a copy of the model (copy.deepcopy, torch.save) is a plain model: it gets the forward it had
        return _own_forward, (self.model, self.prior)


def no_recompile_limit():
    """Dynamo's recompile limits lifted while kforge compiles for itself: region capture, Inductor baselines, and
    the model-level checks' arms (one compile per kernel set tried, a number kforge bounds itself).

    NB: past the limit (8 entries for one code object) dynamo runs the frame eagerly without calling
    the backend, saying so only in a log: a model whose forward the process had already compiled 8 times gave no
    regions at all; Inductor baselines, compiled through one shared wrapper frame on torch 2.11, stopped after the
    eighth region; and an arm of end_to_end's checks past it would time the plain model under the kernels' label
    (on the H100, torch 2.11, 2026-12-06). Inductor's timed call is a CUDA-graph replay: the guards never count.
    """
    cfg = torch._dynamo.config
    names = [n for n in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                         "accumulated_cache_size_limit") if hasattr(cfg, n)]
    return cfg.patch({n: 1 << 20 for n in names})


def _own_frame(forward: Callable) -> Callable:
    """A function that calls ``forward``, with a code object of its own: what dynamo compiles for a GraphForward.

    NB: dynamo keeps compiled variants on the code object of the frame it compiles, at most its recompile limit (8)
    of them, then runs that frame as it is, saying so only in a log. Compiled on the model's own forward, a captured
    forward shares that room with every other compile of it in the process (region capture's, the model-level
    checks' one per kernel set, the user's), and torch 2.11 has no ``isolate_recompiles``: on the H100 a capture
    past the limit ran the plain forward while apply() said its kernels were installed. Its own frame, inlining the
    forward, keeps its variants apart: the limit then counts only its own recompiles (a new shape or dtype)."""
    def forward_in_graph(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)
    code = forward_in_graph.__code__
    # NB: a copy, so that no two GraphForwards share it
    fresh = code.replace(co_name=f"{code.co_name}_{next(_FRAMES)}")
    return types.FunctionType(fresh, forward_in_graph.__globals__, fresh.co_name, None, forward_in_graph.__closure__)


_FRAMES = itertools.count()


def _own_forward(model: Any, prior: Any) -> Callable:
    """The forward ``model`` runs without kforge: ``prior`` (an instance's own forward) or its class's."""
    while isinstance(prior, GraphForward):
        prior = prior.prior
    return prior if prior is not None else types.MethodType(type(model).forward, model)
