"""Inference rewrites (kforge.rewrites) checked like kernels: one is kept only where the model's output with it is
eager's to rounding, on the session's inputs and on fresh ones, and where the whole model measures faster with it,
timed interleaved in the mode it will run in (eagerly through the captured forward, or compiled against the same
compile without it). A rewrite nothing in the model's graph matches is left out, saying so."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..rewrites import as_rewrites
from ._artifact_rewrites import TRAINING, in_training
from ._deployment import Deployment
from ._fallback import Arm, Comparison, RewriteVerdict
from ._graph import compile_with, no_recompile_limit
from ._launch import DeployedKernel
from ._report import relative_difference, wrong_output

FRESH_BATCHES = 2   # fresh input sets the output check runs beside the session's own


def fresh_inputs(args: tuple, kwargs: dict, seed: int) -> tuple[tuple, dict]:
    """The model's inputs with every floating tensor drawn afresh at its shape, dtype, device and layout, with its
    mean and spread (others as they are): values the rewrite was never made on."""
    gen = torch.Generator().manual_seed(seed)

    def fresh(v: Any) -> Any:
        if not isinstance(v, torch.Tensor) or not v.is_floating_point() or v.numel() == 0:
            return v
        wide = v.detach().double()
        spread = float(wide.std()) if v.numel() > 1 else 1.0
        noise = torch.randn(v.shape, generator=gen, dtype=torch.float64)
        out = torch.empty_like(v)
        return out.copy_((noise * (spread or 1.0) + float(wide.mean())).to(v.dtype))

    return torch.utils._pytree.tree_map(fresh, (args, kwargs))


def _batches(args: tuple, kwargs: dict) -> list[tuple[tuple, dict]]:
    return [(args, kwargs)] + [fresh_inputs(args, kwargs, seed) for seed in range(FRESH_BATCHES)]


def _wrong(run: Callable[[tuple, dict], Any], reference: Callable[[tuple, dict], Any],
           baseline: Callable[[tuple, dict], Any] | None, batches: Sequence[tuple[tuple, dict]], model: Any,
           baseline_name: str) -> str | None:
    """Why ``run``'s output is not ``reference``'s on some batch beyond what ``baseline``'s differs by and the dtype's
    tolerance (None: it is, on every batch)."""
    for i, (args, kwargs) in enumerate(batches):
        with torch.no_grad():
            ref = reference(args, kwargs)
            diff = relative_difference(ref, run(args, kwargs), model)
            plain = relative_difference(ref, baseline(args, kwargs), model) if baseline is not None else 0.0
        why = wrong_output(diff, plain, ref, baseline_name, model=model)
        if why is not None:
            where = "the session's inputs" if i == 0 else f"fresh inputs ({i})"
            return f"on {where}: {why}"
    return None


def check_rewrites_eager(names: Sequence[str], kernels: Sequence[DeployedKernel], model: torch.nn.Module,
                         args: tuple, kwargs: dict, device: str, compare: Callable[[Arm, Arm], Comparison]
                         ) -> list[RewriteVerdict]:
    """Each rewrite of ``names`` judged for an eager deployment of ``kernels`` into ``model``: the model with it
    (its forward captured as a graph, the rewrite made there) against the model with the kernels alone."""
    if in_training(model):   # NB: no forward at all: one in training mode updates the batch norms' statistics
        return [RewriteVerdict(name, "eager", False, (), TRAINING) for name in as_rewrites(names)]
    verdicts = []
    plain = Deployment(list(kernels), model, stops_workers=False)
    for name in as_rewrites(names):
        dep = Deployment(list(kernels), model, stops_workers=False, rewrites=(name,))

        def under(d: Deployment) -> Callable[[tuple, dict], Any]:
            def run(a: tuple, kw: dict) -> Any:
                with d:
                    return model(*a, **kw)
            return run

        with no_recompile_limit(), torch.no_grad():
            under(dep)(args, kwargs)   # captures the forward and makes the rewrite
            sites = tuple(dep.rewritten)
            if dep.graph is not None and dep.graph.failure is not None:
                verdicts.append(RewriteVerdict(name, "eager", False, sites, dep.graph.failure))
                continue
            if not sites:
                verdicts.append(RewriteVerdict(name, "eager", False, (), "nothing in the model's graph matches it"))
                continue
            why = _wrong(under(dep), under(plain), None, _batches(args, kwargs), model, "eager")
            if why is not None:
                verdicts.append(RewriteVerdict(name, "eager", False, sites, why))
                continue
            cmp = compare(_labelled(Arm(lambda: model(*args, **kwargs), (), dep.install, dep.remove), name),
                          _labelled(Arm(lambda: model(*args, **kwargs), (), plain.install, plain.remove)))
        verdicts.append(_timed(name, "eager", sites, cmp))
    return verdicts


def check_rewrites_compiled(names: Sequence[str], kernels: Sequence[DeployedKernel], model: Any, compiled: Any,
                            args: tuple, kwargs: dict, compare: Callable[[Arm, Arm], Comparison], *,
                            backend: str = "inductor", mode: str | None = None, **torch_compile_kwargs: Any
                            ) -> tuple[Any, list[RewriteVerdict]]:
    """Each rewrite of ``names`` judged for ``model`` compiled with ``kernels`` (``compiled``, made without
    rewrites): the model compiled with it against ``compiled``; outputs held to eager's as plain compile's are.
    Returns the compiled model to use (with the rewrites kept: each kept one is added to what the next is
    compiled with) and the verdicts."""
    verdicts: list[RewriteVerdict] = []
    kept: list[str] = []
    label = mode or "default"
    if in_training(model):
        return compiled, [RewriteVerdict(name, label, False, (), TRAINING) for name in as_rewrites(names)]
    for name in as_rewrites(names):
        candidate = compile_with(model, kernels, backend=backend, mode=mode, rewrites=(*kept, name),
                                 **torch_compile_kwargs)
        current = compiled
        with no_recompile_limit(), torch.no_grad():
            try:
                candidate(*args, **kwargs)   # compiles and makes the rewrite
            except Exception as e:   # NB: the user's compile goes on without this rewrite, never ends here
                verdicts.append(RewriteVerdict(name, label, False, (), f"compiling the model with it failed: "
                                               f"{type(e).__name__}: {_first_line(e)}"))
                continue
            sites = tuple(line for r in candidate.kforge_backend.rewritten if r.rewrite == name for line in r.sites)
            if not sites:
                verdicts.append(RewriteVerdict(name, label, False, (), "nothing in the model's graphs matches it"))
                continue
            try:
                why = _wrong(lambda a, kw: candidate(*a, **kw), lambda a, kw: model(*a, **kw),
                             lambda a, kw: current(*a, **kw), _batches(args, kwargs), model, f"compile {label}")
            except Exception as e:
                why = f"running the model compiled with it failed: {type(e).__name__}: {_first_line(e)}"
            if why is not None:
                verdicts.append(RewriteVerdict(name, label, False, sites, why))
                continue
            cmp = compare(_labelled(Arm(lambda: candidate(*args, **kwargs)), *kept, name),
                          _labelled(Arm(lambda: current(*args, **kwargs)), *kept))
        verdict = _timed(name, label, sites, cmp)
        verdicts.append(verdict)
        if verdict.kept:
            kept.append(name)
            compiled = candidate
    return compiled, verdicts


@dataclass(frozen=True)
class RewriteRows:
    """The rewrites ``names`` checked for the end-to-end table (``deploy._report.measure``, which reads them through its
    ``RewriteChecks`` protocol: this module imports that one): eagerly as ``apply`` checks them, compiled as
    ``compile`` does, each verdict with the comparison its row shows."""

    names: tuple[str, ...]

    def eager(self, kernels: Sequence[DeployedKernel], model: torch.nn.Module, args: tuple, kwargs: dict,
              device: str, compare: Callable[[Arm, Arm], Comparison]) -> list[RewriteVerdict]:
        return check_rewrites_eager(self.names, kernels, model, args, kwargs, device, compare)

    def compiled(self, kernels: Sequence[DeployedKernel], model: Any, compiled: Any, args: tuple, kwargs: dict,
                 compare: Callable[[Arm, Arm], Comparison], **torch_compile_kwargs: Any
                 ) -> tuple[Any, list[RewriteVerdict]]:
        return check_rewrites_compiled(self.names, kernels, model, compiled, args, kwargs, compare,
                                       **torch_compile_kwargs)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else "(no message)"


def _labelled(arm: Arm, *rewrites: str) -> Arm:
    arm.rewrites = rewrites   # type: ignore[attr-defined]   # NB: which rewrites the arm runs (read by a test's timer)
    return arm


def _timed(name: str, mode: str, sites: tuple[str, ...], cmp: Comparison) -> RewriteVerdict:
    if cmp.faster:
        return RewriteVerdict(name, mode, True, sites, f"the model ran {cmp.ratio()} with it", cmp)
    return RewriteVerdict(name, mode, False, sites,
                          f"the model ran {cmp.ratio()} with it against without, timed on the session's inputs", cmp)


def add_rewrites(deployment: Deployment, names: Sequence[str], *, model: Any, inputs: tuple[tuple, dict] | None,
                 device: str, checked: bool = True) -> Deployment:
    """``deployment`` (not yet installed) with the rewrites of ``names`` that pass the eager check on ``inputs``
    (``checked=False``: all of them, unchecked); those that do not, in its ``skipped`` with why."""
    # NB: the timer is looked up at the call (a test puts its own in its place)
    from . import _fallback

    names = as_rewrites(names)
    if not names:
        return deployment
    if not checked or not isinstance(model, torch.nn.Module):
        deployment.rewrites = names   # NB: a deployment that is not for a module lists them in skipped as it installs
        return deployment
    if inputs is None:
        for name in names:
            deployment.skipped.append((name, "nothing to check it on (the session's own model and inputs are what it "
                                             "is timed on); apply(all_winners=True) makes it unchecked"))
        return deployment
    verdicts = check_rewrites_eager(names, deployment.kernels, model, *inputs, device,
                                    _fallback.interleaved(device))
    deployment.rewrites = tuple(v.rewrite for v in verdicts if v.kept)
    deployment.rewrite_checks = verdicts
    deployment.skipped.extend((v.rewrite, v.line()) for v in verdicts if not v.kept)
    return deployment


def compile_rewritten(model: Any, ready: Any, forward: Callable[[Any], Any] | None, *, device: str,
                      guard: bool = True, backend: str = "inductor", rewrites: Sequence[str] = (),
                      inputs: tuple[tuple, dict] | None = None, **torch_compile_kwargs: Any) -> Any:
    """``compile_checked`` (``Session.compile``), then each rewrite of ``rewrites`` kept only where the model compiled
    with it is faster still and its output eager's on ``inputs`` and fresh ones (``check_rewrites_compiled``; the
    result's ``kforge_rewrites`` lists the verdicts). Without ``guard`` the rewrites are made unchecked; with it and
    no inputs to check them on, none is."""
    # NB: the timer is looked up at the call (a test puts its own in its place)
    from . import _fallback
    from ._report import compile_checked

    rewrites = as_rewrites(rewrites)
    if rewrites and not guard:
        return compile_with(model, list(ready.kernels), backend=backend, rewrites=rewrites, **torch_compile_kwargs)
    compiled = compile_checked(model, ready, forward, device=device, guard=guard, backend=backend,
                               **torch_compile_kwargs)
    if not rewrites:
        return compiled
    if inputs is None:
        warnings.warn("kforge: rewrites are checked on the session's own model and inputs; this compile has none, "
                      "so they are left out (guard=False makes them unchecked)", stacklevel=3)
        return compiled
    result, verdicts = check_rewrites_compiled(rewrites, list(compiled.kforge_backend.kernels), model, compiled,
                                               *inputs, _fallback.interleaved(device), backend=backend,
                                               **torch_compile_kwargs)
    if result is not compiled and hasattr(compiled, "kforge_fallback"):
        object.__setattr__(result, "kforge_fallback", compiled.kforge_fallback)
    object.__setattr__(result, "kforge_rewrites", verdicts)
    return result
