"""A set of kernels put into the process: eagerly (patched callables, scoped to a model or not; region and
fused-operator kernels through the model's forward captured as a graph, ``GraphForward``) and into compiled
graphs (``compile``)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from ..ops import Variant, is_fused, is_layout_twin, placed_in_aten_graph
from ._dispatch import DISPATCHER
from ._graph import GraphForward
from ._launch import DeployedKernel
from ._runop import RUN_TABLE


def _layout_twin(variant: Variant) -> bool:
    """An operator's or a fused operator's channels-last twin: the layout Inductor gives a compiled graph."""
    return is_layout_twin(variant)


def in_graph(variant: Variant) -> bool:
    """Whether an eager deployment runs ``variant``'s kernel in the model's forward captured as a graph (a region,
    a fused operator), where the eager dispatcher, which sees one torch call at a time, cannot put it. Not a
    channels-last twin: that graph keeps the traced layouts (an operator's twin is dispatched like any operator
    kernel, a call of that layout taking it)."""
    return placed_in_aten_graph(variant) and not _layout_twin(variant)


def not_in_eager(variant: Variant, model: Any) -> str | None:
    """Why an eager deployment for ``model`` cannot run ``variant``'s kernel (None: it can)."""
    if is_fused(variant.op) and _layout_twin(variant):
        return ("laid out channels-last, as Inductor lays out the compiled graph; the eager model keeps the traced "
                "layout, so it runs under torch.compile only (session.compile, Deployment.compile)")
    if in_graph(variant) and not isinstance(model, torch.nn.Module):
        return ("runs inside the model's forward captured as a graph: install it for an nn.Module "
                "(apply(scope='model'), kforge.load(model, ...)), or compile the model (Deployment.compile)")
    return None


class _NoScope:
    """What a copy of a model gets for a deployment's scope hook: nothing to do (kforge is applied to a copy
    on its own)."""

    def __call__(self, *_: Any) -> None:
        return None


class _ScopeHook:
    """A model's forward (pre) hook that counts its deployment's scope. A deep copy or a pickle of the model
    holds a ``_NoScope`` in its place: a bound method dragged the deployment and its kernels (ctypes handles
    that cannot be copied) into ``copy.deepcopy(model)`` and ``torch.save(model)``, which then failed."""

    def __init__(self, deployment: "Deployment", step: int):
        self.deployment, self.step = deployment, step

    def __call__(self, *_: Any) -> None:
        scope = self.deployment._scope
        scope.depth = max(getattr(scope, "depth", 0) + self.step, 0)

    def __reduce__(self) -> tuple:
        return _NoScope, ()


@dataclass
class Deployment:
    """Kernels installed into the process, optionally scoped to one model's forward.

    Use as a context manager, or call ``remove()`` to undo. ``compile()`` returns the model
    compiled by torch.compile with these kernels inside its graphs (no patching needed).
    """

    kernels: list[DeployedKernel]
    model: Any = None
    skipped: list[tuple[str, str]] = field(default_factory=list)   # (signature, reason)
    _hooks: list = field(default_factory=list)
    installed: bool = False
    # NB: per thread: another thread's calls made while this model runs forward stay on eager.
    _scope: threading.local = field(default_factory=threading.local, repr=False)
    _backends: list = field(default_factory=list, repr=False)   # of the models compile() returned
    # the model's forward as a graph holding the region and fused-operator kernels (None without any)
    graph: GraphForward | None = field(default=None, repr=False)
    # remove() stops the workers of served CPU kernels no other installed deployment holds (not for the model-level
    # check's arms, installed and removed for every block they time: each would start the workers again)
    stops_workers: bool = field(default=True, repr=False)
    # inference rewrites (kforge.rewrites' names) made in the model's graph: eagerly in the captured forward, and in
    # the graphs compile() makes
    rewrites: tuple[str, ...] = ()
    rewrite_checks: list = field(default_factory=list, repr=False)   # the check's RewriteVerdicts, where it ran

    @property
    def active(self) -> bool:
        return self.installed and (self.model is None or getattr(self._scope, "depth", 0) > 0)

    def install(self) -> "Deployment":
        """The one place kernels enter the process for eager calls."""
        if self.installed:
            return self
        DISPATCHER.install(self)
        if isinstance(self.model, torch.nn.Module):
            self._hooks.append(self.model.register_forward_pre_hook(_ScopeHook(self, 1)))
            self._hooks.append(self.model.register_forward_hook(_ScopeHook(self, -1), always_call=True))
        for dk in self.kernels:
            RUN_TABLE.register(dk)
            dk.installs += 1
        for dk in self.kernels:
            why = not_in_eager(dk.variant, self.model)
            if why is not None and (dk.variant.signature, why) not in self.skipped:
                self.skipped.append((dk.variant.signature, why))
        if self.rewrites and not isinstance(self.model, torch.nn.Module):
            for name in self.rewrites:
                why = "a rewrite runs in the model's forward captured as a graph: install it for an nn.Module"
                if (name, why) not in self.skipped:
                    self.skipped.append((name, why))
        if isinstance(self.model, torch.nn.Module) and (self.graph_kernels or self.rewrites):
            if self.graph is None:
                # NB: no twin: this graph keeps the traced layouts, and the calls a twin would take (a group_norm
                # read by a SiLU) are left for it in dynamo's graph, where a plain kernel would have taken them
                self.graph = GraphForward(self.model, [dk for dk in self.kernels if not _layout_twin(dk.variant)],
                                          self._graph_failed, rewrites=self.rewrites)
            self.graph.attach()
        self.installed = True
        return self

    def _graph_failed(self, why: str) -> None:
        for sig in [dk.variant.signature for dk in self.kernels if in_graph(dk.variant)] + list(self.rewrites):
            if (sig, why) not in self.skipped:
                self.skipped.append((sig, why))

    def remove(self) -> None:
        """Undo: the model (and torch) run exactly as before; graphs compiled with these kernels
        run their operators eagerly from now on, unless another holder (a model compiled by the
        session, another deployment) still holds the same kernel: those graphs keep running it.
        The workers serving CPU kernels that no other installed deployment holds are stopped (the
        next call of such a kernel, from a compiled graph, starts its worker again)."""
        if self.graph is not None:
            self.graph.detach()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if self.installed:
            DISPATCHER.uninstall(self)
        for dk in self.kernels:
            RUN_TABLE.release(dk)
            if self.installed:
                dk.installs -= 1
            if dk.installs <= 0 and self.stops_workers:
                dk.close()   # NB: a served CPU kernel's worker stops here; a later call (a compiled graph) starts another
        for backend in self._backends:
            backend.enabled = False   # a recompilation after this gets no kernels either
            if backend.function_hooks is not None:   # the library functions' hooks go back (kforge.ops._functions)
                backend.function_hooks.release()
        self.installed = False

    def compile(self, model: Any = None, *, kernels: list[DeployedKernel] | None = None,
                backend: str = "inductor", **torch_compile_kwargs: Any) -> Any:
        """``torch.compile(model, **torch_compile_kwargs)`` with this deployment's kernels (or
        ``kernels``, a subset) as ``torch.ops.kforge.run`` nodes in the graph; Inductor compiles
        the rest in the given ``mode``. The result's ``kforge_backend.graphs`` says what each
        graph got. The deployment's rewrites are made there too (``rewrites=()`` for none).
        ``backend="eager"`` skips Inductor (debugging)."""
        from ._graph import compile_with

        model = model if model is not None else self.model
        if model is None:
            raise ValueError("no model to compile: pass model= (this deployment is not scoped to one)")
        torch_compile_kwargs.setdefault("rewrites", self.rewrites)
        compiled = compile_with(model, self.kernels if kernels is None else kernels, backend=backend,
                                **torch_compile_kwargs)
        self._backends.append(compiled.kforge_backend)
        return compiled

    def __enter__(self) -> "Deployment":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.remove()

    @property
    def calls(self) -> dict[str, int]:
        """Per kernel (by signature): the calls it ran, dispatched eagerly or from the model's graph."""
        return {dk.variant.signature: dk.calls for dk in self.kernels}

    @property
    def rewritten(self) -> list[str]:
        """Where the inference rewrites changed the model's captured graphs, a line per site (after a forward)."""
        return [] if self.graph is None else [line for r in self.graph.backend.rewritten for line in r.sites]

    @property
    def graph_kernels(self) -> list[DeployedKernel]:
        """The region and fused-operator kernels, which run in the model's forward captured as a graph."""
        return [dk for dk in self.kernels if in_graph(dk.variant)]

    def __repr__(self) -> str:
        state = "installed" if self.installed else "removed"
        graph = len(self.graph_kernels)
        where = ""
        if graph:
            off = self.graph is None or self.graph.failure is not None
            where = (f" ({len(self.kernels) - graph} operator, {graph} region/fused in the model's graph"
                     + (": not running, see skipped" if off else "") + ")")
        rewrites = f", rewrites {', '.join(self.rewrites)}" if self.rewrites else ""
        return (f"<kforge Deployment {state}: {len(self.kernels)} kernels{where}{rewrites}, "
                f"{len(self.skipped)} kept on eager>")
