"""The end-to-end report: the model's forward with and without kforge, eager and in each torch.compile mode."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol, Sequence

import torch

from ..evaluate import bench
from ._deployment import Deployment, in_graph, not_in_eager
from ._deployment_plan import LeftBy, LeftOut
from ._fallback import (
    Arm,
    Compare,
    Comparison,
    FallbackReport,
    Outcome,
    RewriteVerdict,
    interleaved,
    keep_faster,
)
from ._graph import compile_with, nearest_miss, no_recompile_limit
from ._launch import DeployedKernel
# NB: output_tolerance is read from here too (tests, benchmarks)
from ._outputs import first_tensor, output_tolerance, relative_difference, wrong_output  # noqa: F401
from ._ready import ReadyKernels

MODES = ("default", "max-autotune", "reduce-overhead")
log = logging.getLogger("kforge")


@dataclass(frozen=True)
class Row:
    """One line of the table: a way of running the model, its latency against its baseline."""

    label: str                       # "eager", "compile default", "compile default + kforge", ...
    us: float | None                 # median forward latency (None: not timed: see error or no_kernel)
    baseline: str | None = None      # the row it is compared with
    comparison: Comparison | None = None
    output_rel_diff: float | None = None   # against eager's output
    kernels: int = 0
    error: str | None = None
    float64_rel_diff: float | None = None  # against the model's output computed in float64 (None: not computed)
    no_kernel: str | None = None     # a "+ kforge" row whose mode kept no kernel: why (it runs as its baseline)
    # a row that adds an inference rewrite to its baseline: the check's verdict (not kept: no time, and why)
    rewrite: RewriteVerdict | None = None

    @property
    def runs_as_baseline(self) -> bool:
        """Whether this row kept nothing (no kernel, or its rewrite left out): it shows no time of its own."""
        return self.no_kernel is not None or (self.rewrite is not None and not self.rewrite.kept)

    def cell(self) -> str:
        if self.error:
            return f"failed: {self.error}"
        if self.no_kernel is not None:
            return f"no kernel kept ({self.no_kernel})"
        if self.rewrite is not None and not self.rewrite.kept:
            return f"not kept ({self.rewrite.why})"
        if self.comparison is None:
            return ""
        # NB: the baseline's time from the same interleaved run: on this CPU eager read 0.27 ms in its own row
        # and 0.73 ms while timed against compiled code, so a ratio read against the other row's time looked
        # inverted (0.56 ms "1.29x over eager")
        return (f"{self.comparison.describe()} over {self.baseline} "
                f"({self.baseline} {self.comparison.without_us / 1e3:.3f} ms in the same run)")


@dataclass(frozen=True)
class EndToEnd:
    """Forward latencies (median, us) of one batch, all measured in one run, and the output checks.

    ``kforge_us`` and ``compile_kforge_us`` are what the model gets with kforge in eager and in the first
    compile mode: the baseline's own time where that mode kept no kernel (its row then says so and shows
    no time)."""

    eager_us: float
    kforge_us: float
    compile_us: float | None
    compile_kforge_us: float | None
    output_rel_diff: float | None          # ||kforge - eager|| / ||eager|| on the first output tensor
    kernels_installed: int
    skipped: list[tuple[str, str]] = field(default_factory=list)
    dispatch: str | None = None            # how applied kernels were called (``launch_paths``)
    rows: tuple[Row, ...] = ()
    fallback: tuple[FallbackReport, ...] = ()

    @property
    def speedup(self) -> float:
        return self.eager_us / self.kforge_us

    def headline(self) -> list[str]:
        """The model-level result, one line per mode: the mode against eager, and kforge in it against the
        mode alone (or why no kernel was kept), each ratio with its noise and label."""
        rows = {r.label: r for r in self.rows}
        read = lambda c: c.ratio() + (" against" if c.outcome is Outcome.WITHIN_NOISE else " than")  # noqa: E731
        lines = []
        for r in self.rows:
            if r.label.endswith(" + kforge") or r.rewrite is not None:
                continue
            parts = []
            if r.error:
                parts.append(f"failed: {r.error}")
            elif r.comparison is not None:
                parts.append(f"{read(r.comparison)} {r.baseline}")
            plus = rows.get(f"{r.label} + kforge")
            if plus is not None and not r.error:
                if plus.no_kernel is not None:
                    parts.append(f"+ kforge: no kernel kept ({plus.no_kernel})")
                elif plus.comparison is not None:
                    parts.append(f"+ kforge ({plus.kernels} kernel(s)): {read(plus.comparison)} {plus.baseline}")
            for w in (w for w in self.rows if w.rewrite is not None and not r.error
                      and _mode_label(w.rewrite.mode) == r.label):
                if w.error:
                    parts.append(f"+ {w.rewrite.rewrite}: failed: {w.error}")
                elif not w.rewrite.kept:
                    parts.append(f"+ {w.rewrite.rewrite}: not kept ({w.rewrite.why})")
                elif w.comparison is not None:
                    parts.append(f"+ {w.rewrite.rewrite} ({len(w.rewrite.sites)} site(s)): {read(w.comparison)} "
                                 f"{w.baseline}")
            lines.append(f"{r.label}: " + "; ".join(parts) if parts else f"{r.label}: {ms(r.us).strip()}")
        return lines

    def table(self) -> str:
        if not self.rows:
            return "\n".join([f"eager              {ms(self.eager_us)}",
                              f"eager + kforge     {ms(self.kforge_us)}  ({self.speedup:.3f}x)"])
        width = max(len(r.label) for r in self.rows) + 2
        lines = []
        for r in self.rows:
            extra = r.cell()
            if r.kernels:
                extra += f"; {r.kernels} kernel(s)" + (f", {self.dispatch} dispatch" if r.label == "eager + kforge"
                                                       and self.dispatch else "")
            if r.rewrite is not None and r.rewrite.kept and not r.error:
                extra += f"; {len(r.rewrite.sites)} site(s)"
            if r.output_rel_diff is not None and not r.runs_as_baseline:
                extra += f"; output rel. diff {r.output_rel_diff:.1e}"
            if r.float64_rel_diff is not None and not r.runs_as_baseline:
                extra += f"; from float64 {r.float64_rel_diff:.1e}"
            lines.append(f"{r.label:<{width}}{ms(r.us)}  {extra}".rstrip())
        if any(r.comparison is not None for r in self.rows):
            # NB: on the H200 the same compiled VAE read 34.75 ms in one run and 37.27 ms in the next
            lines.append("(each ratio is from one interleaved run of the two forwards it compares, against the "
                         "baseline's time in that run; the times of different rows come from different runs)")
        drift = self.baseline_drift()
        if drift:
            lines.append(drift)
        for report in self.fallback:
            lines.extend(report.lines())
        return "\n".join(lines)

    def baseline_drift(self) -> str | None:
        """A note where eager's forward read very differently in the runs of this table (a busy machine, or
        the compiled code's threads slowing eager's when the two alternate): compare each row with the
        baseline time beside it, not with the eager row."""
        eager = [("its own row", self.eager_us)] + [(f"the run against {r.label}", r.comparison.without_us)
                                                    for r in self.rows if r.baseline == "eager" and r.comparison
                                                    and r.label != "eager + kforge" and r.comparison.without_us > 0]
        lo, hi = min(eager, key=lambda e: e[1]), max(eager, key=lambda e: e[1])
        if lo[1] <= 0 or hi[1] / lo[1] < 1.5:
            return None
        return (f"note: eager read {lo[1] / 1e3:.3f} ms in {lo[0]} and {hi[1] / 1e3:.3f} ms in {hi[0]}: the machine's "
                "load changed, or the forwards slowed each other while alternating; each ratio holds only for its "
                "own run")

    def __str__(self) -> str:   # NB: print(session.end_to_end()) prints the table, not the dataclass
        return self.table()

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.table())

    def to_json(self) -> dict:
        def cmp(c: Comparison | None) -> dict | None:
            return None if c is None else {"with_us": c.with_us, "without_us": c.without_us, "noise_us": c.noise_us,
                                           "speedup": c.speedup, "speedup_noise": c.speedup_noise,
                                           "outcome": c.outcome.value, "within_noise": c.within_noise,
                                           "paired_us": c.paired_us, "margin_us": c.margin_us,
                                           "rounds": [list(r) for r in c.rounds]}
        return {"rows": [{"label": r.label, "us": r.us, "baseline": r.baseline, "comparison": cmp(r.comparison),
                          "output_rel_diff": r.output_rel_diff, "float64_rel_diff": r.float64_rel_diff,
                          "kernels": r.kernels, "error": r.error, "no_kernel_kept": r.no_kernel,
                          "rewrite": None if r.rewrite is None else {
                              "name": r.rewrite.rewrite, "kept": r.rewrite.kept, "sites": len(r.rewrite.sites),
                              "why": r.rewrite.why}}
                         for r in self.rows],
                "headline": self.headline(),
                "fallback": [{"mode": f.mode, "kept": list(f.kept), "forwards_built": f.forwards_built,
                              "model": cmp(f.model) if f.forwards_built else None,
                              "not_in_mode": list(f.not_in_mode), "not_placed": list(f.not_placed),
                              "nearest": list(f.nearest), "copied": [list(c) for c in f.copied],
                              "wrong_output": f.wrong_output, "control": cmp(f.control),
                              "left_out": [{"signature": lo.signature, "comparison": cmp(lo.comparison)}
                                           for lo in f.left_out]} for f in self.fallback],
                "skipped": [list(s) for s in self.skipped], "dispatch": self.dispatch}


def _mode_label(mode: str) -> str:
    """The table's label of the mode a rewrite verdict was made in ("eager", else a compile mode)."""
    return mode if mode == "eager" else f"compile {mode}"


class RewriteChecks(Protocol):
    """The inference rewrites the table times (``deploy._rewrites.RewriteRows``, which imports this module): each
    checked against the model without it, eagerly (``eager``, with the kernels eager kept installed) and compiled
    (``compiled``: ``compiled`` is the model compiled with the kernels the mode kept; returns the model compiled with
    the rewrites kept too), each verdict with the comparison it was decided on."""

    names: tuple[str, ...]

    def eager(self, kernels: Sequence[DeployedKernel], model: Any, args: tuple, kwargs: dict, device: str,
              compare: Compare) -> list[RewriteVerdict]: ...

    def compiled(self, kernels: Sequence[DeployedKernel], model: Any, compiled: Any, args: tuple, kwargs: dict,
                 compare: Compare, **torch_compile_kwargs: Any) -> tuple[Any, list[RewriteVerdict]]: ...


def rewrite_rows(verdicts: Sequence[RewriteVerdict], base: str, cumulative: bool) -> list[Row]:
    """A row per rewrite verdict: the model with it against ``base`` (the mode's row, or its "+ kforge" row where the
    mode kept kernels). ``cumulative``: each kept rewrite stays in the rows after it (compiled: each is checked with
    those kept before it); else each is checked alone against ``base``. A rewrite not kept shows no time."""
    rows, kept = [], []
    for v in verdicts:
        baseline = " + ".join([base, *kept])
        label = f"{baseline} + {v.rewrite}"
        cmp = v.comparison if v.kept else None
        rows.append(Row(label, cmp.with_paired_us if cmp is not None else None, baseline, cmp, rewrite=v))
        if v.kept and cumulative:
            kept.append(v.rewrite)
    return rows


def ms(us: float | None) -> str:
    return "       -   " if us is None else f"{us / 1e3:8.3f} ms"


def no_kernel_kept(offered: int, report: FallbackReport | None) -> str:
    """Why a mode runs with no kernel of kforge's: the words of its "+ kforge" row."""
    if not offered:
        return "no winner to install"
    if report is None:
        return "none placed in this mode's graphs, or the output moved (guard=False: the log says which)"
    if report.wrong_output:
        return f"dropped: {report.wrong_output}"
    if not report.forwards_built:
        if report.not_in_mode:
            return f"its {len(report.not_in_mode)} kernel(s) run in graph mode only"
        if report.not_placed:
            return f"no call in this mode's graphs has the signature of its {len(report.not_placed)} kernel(s)"
        return "none of them runs in this mode"
    return f"the model is not measurably faster with them: {report.model.ratio()}"


def forward_us(fn: Callable[[], Any], device: str) -> float:
    """Median latency of a whole forward pass (warm caches: the model's own steady state)."""
    with torch.no_grad():
        return bench(fn, device=device, flush_l2=False, warmup=3, budget_ms=1000, min_reps=10, max_reps=200).median_us


def launch_paths(kernels: Sequence[DeployedKernel]) -> str:
    """How these kernels' calls reach them, as the end-to-end table says it: "sandboxed worker" (a CPU candidate,
    served by a worker process: a round trip a call), "replayed plan" (a CUDA candidate's recorded launches, from
    kforge's launcher), "C" or "Python" (a kernel loaded in this process: kforge's own, never a candidate's);
    several joined by " + "."""
    from ._replay import PlanReplay

    def path(k: DeployedKernel) -> str:
        if k.served is not None:
            return "replayed plan" if isinstance(k.served, PlanReplay) else "sandboxed worker"
        return "C" if k.fast else "Python"
    return " + ".join(sorted({path(k) for k in kernels}))


def eager_arms(model: Any, forward: Callable[[Any], Any]) -> Callable[[Sequence[DeployedKernel]], Arm]:
    """Build: the model run eagerly with exactly these kernels installed (scoped to it) per block."""
    def build(kernels: Sequence[DeployedKernel]) -> Arm:
        if not kernels:
            return Arm(lambda: forward(model))
        dep = Deployment(list(kernels), model if isinstance(model, torch.nn.Module) else None, stops_workers=False)
        return Arm(lambda: forward(model), kernels, dep.install, dep.remove)
    return build


def compiled_arms(model: Any, forward: Callable[[Any], Any], mode: str | None, backend: str = "inductor",
                  **torch_compile_kwargs: Any) -> tuple[Callable[[Sequence[DeployedKernel]], Arm], dict]:
    """Build: the model compiled in ``mode`` with exactly these kernels in its graphs. Also returns
    the compiled models by kernel set (keyed by run names)."""
    made: dict[tuple[str, ...], Any] = {}

    def timed_first(arm: Arm, what: str) -> Arm:
        """``arm`` whose first forward (the one that compiles) logs its time (INFO), then gives way to the plain
        forward: nothing is added to the forwards the check times."""
        # NB: so a run cut while it compiles says how far it got (two H200 calls on Gemma 4 at 35 layers were cut
        # inside reduce-overhead's compiles with nothing printed for 470 s, 2026-12-04o)
        plain = arm.forward

        def first() -> Any:
            start = time.perf_counter()
            out = plain()
            arm.forward = plain
            log.info("kforge: %s: compiled %s in %.1f s (its first forward)", mode, what, time.perf_counter() - start)
            return out
        arm.forward = first
        return arm

    def build(kernels: Sequence[DeployedKernel]) -> Arm:
        key = tuple(sorted(dk.run_name for dk in kernels))
        if key in made:
            return Arm(lambda: forward(made[key]), kernels)
        compiled = compile_with(model, kernels, backend=backend, mode=None if backend != "inductor" else mode,
                                **torch_compile_kwargs)
        made[key] = compiled
        return timed_first(Arm(lambda: forward(compiled), kernels), f"the model with {len(kernels)} kernel(s)")

    def control() -> Arm:
        """A second plain compilation of the model, made afresh (Inductor's caches off while it
        compiles, so its code and its tuning choices are its own): the A/A control."""
        compiled = compile_with(model, [], backend=backend, mode=None if backend != "inductor" else mode,
                                **torch_compile_kwargs)
        arm = timed_first(Arm(lambda: forward(compiled)), "the A/A control (a second plain compilation, caches off)")
        with torch._inductor.config.patch(force_disable_caches=True), torch.no_grad():
            arm.forward()   # compiles
        return arm

    build.control = control  # type: ignore[attr-defined]
    return build, made


def float64_output(model: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The model's first output tensor computed in float64 (a copy of the model and of its floating
    inputs), the yardstick the output checks measure distances from; None where the model does not run
    in float64 (an operator without a float64 kernel, memory) or is not a module."""
    import copy

    if not isinstance(model, torch.nn.Module):
        return None
    cast = lambda v: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v  # noqa: E731
    twin = None
    try:
        twin = copy.deepcopy(model).double()
        args64, kwargs64 = torch.utils._pytree.tree_map(cast, args), torch.utils._pytree.tree_map(cast, kwargs)
        with torch.no_grad():
            try:
                out = first_tensor(twin(*args64, **kwargs64))
            except (RuntimeError, NotImplementedError):
                # NB: transformers' MoE experts as one grouped_mm (Qwen 3.5's default) have no float64
                # kernel; the same experts as plain linear calls compute the same function
                # (the model itself, or a module inside it: a decoding's wrapper, kforge.models.Generate)
                owners = [m for m in twin.modules() if hasattr(m, "set_experts_implementation")]
                if not owners:
                    raise
                owners[0].set_experts_implementation("eager")
                out = first_tensor(twin(*args64, **kwargs64))
        return None if out is None else out.detach().clone()
    except Exception as exc:  # noqa: BLE001 -- any failure only means no float64 yardstick
        log.info("kforge: no float64 reference (%s: %s); outputs are compared with eager's",
                 type(exc).__name__, str(exc)[:200])
        return None
    finally:
        del twin
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def placed(make: Callable[[Sequence[DeployedKernel]], Arm], made: dict, kernels: Sequence[DeployedKernel]
           ) -> tuple[list[DeployedKernel], tuple[str, ...], tuple[str, ...], tuple[tuple[str, int], ...]]:
    """The kernels some compiled graph of the model really calls, the signatures of those it does
    not (no call in the graph has their shapes, e.g. a call on a path compile does not take), for
    each of those the nearest call of its operator the graphs have (``nearest_miss``; "" when they
    have none), and the placed kernels whose calls got an input in another layout (copied into the
    kernel's, ``DeployedKernel.conform``) with how many calls did: a forward compiled with all of them
    runs once, and its graphs say what they got. A kernel that never runs cannot make the model
    faster, and timing it would credit it with the noise."""
    if not kernels:
        return [], (), (), ()
    before = {id(k): k.relayouts for k in kernels}
    arm = make(kernels)
    with torch.no_grad():
        arm.forward()   # compiles
    backend = made[tuple(sorted(dk.run_name for dk in kernels))].kforge_backend
    got = set(backend.replaced)
    inside = [k for k in kernels if k.variant.signature in got]
    outside = [k for k in kernels if k.variant.signature not in got]
    missed = backend.missed
    copied = tuple((k.variant.signature, k.relayouts - before[id(k)]) for k in inside if k.relayouts > before[id(k)])
    return (inside, tuple(k.variant.signature for k in outside),
            tuple(nearest_miss(k.variant, missed) or "" for k in outside), copied)


@dataclass(frozen=True)
class CompiledCheck:
    """One compile mode's model-level check (``check_compiled``): the kernels kept, their comparison with plain
    compile (None: nothing timed), the report (None with ``guard=False``), and the kept set's output difference from
    eager's and from the float64 model's (None: nothing kept, or not computed)."""

    kept: tuple[DeployedKernel, ...]
    comparison: Comparison | None
    report: FallbackReport | None
    output_rel_diff: float | None
    float64_rel_diff: float | None


def check_compiled(kernels: Sequence[DeployedKernel], gains: Sequence[float], make: Callable, made: dict,
                   compare: Compare, mode: str, none: Arm, forward: Callable[[Any], Any], reference: Any,
                   plain_diff: float | None, guard: bool = True, reference64: torch.Tensor | None = None,
                   plain_err64: float | None = None, model: Any = None) -> CompiledCheck:
    """One compile mode's model-level check. Kernels no compiled graph calls are left out
    untimed; where some are placed, a second plain compilation (``make.control``, when the builder has
    one) is the A/A control whose gap every saving must exceed; the set the timing keeps is dropped if it
    changes the model's output (``wrong_output``)."""
    inside, missing, nearest, copied = placed(make, made, kernels)
    gains = [g for k, g in zip(kernels, gains) if k in inside]
    if guard:
        control = make.control() if inside and hasattr(make, "control") else None
        kept, report = keep_faster(inside, gains, make, compare, mode, none, control)
        report = replace(report, not_placed=missing, nearest=nearest, copied=copied)
        cmp = report.model
    else:
        kept, report = list(inside), None
        cmp = compare(make(kept), none) if kept else None
    diff = err64 = None
    if kept:
        with torch.no_grad():
            out = forward(made[tuple(sorted(dk.run_name for dk in kept))])
        diff = relative_difference(reference, out, model)
        err64 = relative_difference(reference64, out, model) if reference64 is not None else None
        why = wrong_output(diff, plain_diff, reference, f"plain compile ({mode})", err64, plain_err64, model)
        if why is not None:
            log.warning("kforge: %s: %s", mode, why)
            if report is not None:
                report = replace(report, kept=(), wrong_output=why)
            kept, diff, err64 = [], None, None
    return CompiledCheck(tuple(kept), cmp, report, diff, err64)


def graph_forward_pays(ready: ReadyKernels, model: Any, forward: Callable[[Any], Any], device: str) -> ReadyKernels:
    """``ready`` less its region and fused-operator kernels when ``model``, timed with all of them and with the
    operator kernels alone (``forward(model)``, interleaved, in this process), is not measurably faster with them:
    the forward captured as a graph that runs them costs something of its own (guards, the graph run op by op),
    which can exceed what they save. Each one left out says by how much."""
    # NB: the timer is looked up at the call (a test puts its own in its place)
    from . import _fallback

    kernels = list(ready.kernels)
    graphed = [k for k in kernels if in_graph(k.variant)]
    if not graphed:
        return ready
    operators = [k for k in kernels if k not in graphed]
    build = eager_arms(model, forward)
    with no_recompile_limit(), torch.no_grad():
        cmp = _fallback.interleaved(device)(build(kernels), build(operators))
    for k in kernels:
        k.reset_calls()
    if cmp.faster:
        return ready
    why = (f"the model with its {len(graphed)} region/fused kernel(s) in the captured forward ran "
           f"{cmp.ratio()} against without them, timed on the session's inputs: left out "
           "(apply(all_winners=True) installs them anyway)")
    return ready.leaving_out(LeftOut(k.variant.signature, LeftBy.GRAPH_FORWARD, why) for k in graphed)


def compile_checked(model: Any, ready: ReadyKernels, forward: Callable[[Any], Any] | None, *, device: str,
                    guard: bool = True, backend: str = "inductor", **torch_compile_kwargs: Any) -> Any:
    """``model`` compiled with ``ready``'s kernels in its graphs (``Session.compile``). With ``guard`` (and kernels)
    the compiled forward (``forward(compiled)``) keeps only the kernels that make it measurably faster than plain
    compile in the same mode and leave its output where plain compile's is (``check_compiled``); the result's
    ``kforge_fallback`` is that check's report."""
    # NB: the timer is looked up at the call (a test puts its own in its place)
    from . import _fallback

    kernels = list(ready.kernels)
    if not guard or not kernels:
        return compile_with(model, kernels, backend=backend, **torch_compile_kwargs)
    if forward is None:
        raise ValueError("the guarded compile times the model's forward: pass forward= (or guard=False)")
    mode = torch_compile_kwargs.pop("mode", None)
    make, made = compiled_arms(model, forward, mode, backend, **torch_compile_kwargs)
    with no_recompile_limit(), torch.no_grad():  # NB: one dynamo cache entry per kernel set tried (and the A/A control)
        reference = forward(model)
        none = make([])
        plain_diff = relative_difference(reference, forward(made[()]), model)
        checked = check_compiled(kernels, ready.expected_savings_us, make, made, _fallback.interleaved(device),
                                 mode or "default", none, forward, reference, plain_diff, model=model)
    compiled = made.get(tuple(sorted(dk.run_name for dk in checked.kept)))
    if compiled is None:
        compiled = compile_with(model, list(checked.kept), backend=backend, mode=mode, **torch_compile_kwargs)
    object.__setattr__(compiled, "kforge_fallback", checked.report)
    return compiled


def measure(model: Any, args: tuple, kwargs: dict, kernels: Sequence[DeployedKernel], gains: Sequence[float], *,
            device: str, modes: Sequence[str] = MODES, compile: bool = True, guard: bool = True,
            backend: str = "inductor", compare: Compare | None = None, skipped: Sequence[tuple[str, str]] = (),
            dynamic: bool | None = False, on_mode: Callable[[EndToEnd], None] | None = None,
            progress: Callable[[str], None] | None = None, rewrites: RewriteChecks | None = None) -> EndToEnd:
    """The end-to-end table in one run (see ``Session.end_to_end``). ``on_mode`` gets the table so far after
    eager and after each compile mode (what a run cut later still has); ``progress`` gets a line as each step
    starts (which mode is compiled or timed) and each mode's result as it ends. ``rewrites``: each mode gets a row
    per inference rewrite, the model with what the mode kept and the rewrite against the model with what it kept."""
    compare = compare or interleaved(device)
    forward = lambda m: m(*args, **kwargs)  # noqa: E731
    started = time.perf_counter()

    def say(line: str) -> None:
        if progress is None:
            return
        try:
            progress(f"[{time.perf_counter() - started:5.0f} s] {line}")
        except Exception as exc:  # NB: like on_mode: a failing progress hook costs its line, not the run
            log.warning("kforge: end_to_end's progress failed: %s: %s", type(exc).__name__, exc)

    steps = 1 + (len(modes) if compile else 0)
    with torch.no_grad():
        reference = forward(model)
    reference64 = float64_output(model, args, kwargs)
    err64 = lambda out: None if reference64 is None else relative_difference(reference64, out, model)  # noqa: E731
    eager_err64 = err64(reference)
    kernels = list(kernels)
    rows: list[Row] = []
    reports: list[FallbackReport] = []

    def check(ks: Sequence[DeployedKernel], gs: Sequence[float], make: Callable[[Sequence[DeployedKernel]], Arm],
              mode: str, none: Arm) -> tuple[list[DeployedKernel], Comparison]:
        if guard:
            kept, report = keep_faster(ks, gs, make, compare, mode, none)
            reports.append(report)
            return list(kept), report.model
        return list(ks), compare(make(ks), none)

    build = eager_arms(model, forward)
    eager = build([])
    # NB: region and fused-operator kernels run in eager through the model's forward captured as a graph, as
    # apply() installs them (``Deployment``); those an eager deployment cannot run (a model that is no nn.Module,
    # a channels-last twin) are not timed: the eager model "with" them is the model without them
    in_eager = [k for k in kernels if not_in_eager(k.variant, model) is None]
    graph_only = tuple(k.variant.signature for k in kernels if k not in in_eager)
    say(f"eager (1 of {steps}): timing the model" + (f" with and without {len(in_eager)} kernel(s)" if in_eager
                                                      else ""))
    kept, cmp = [], None
    if in_eager:
        with no_recompile_limit():   # NB: each kernel set's graph forward is a compile of its own
            kept, cmp = check(in_eager, [g for k, g in zip(kernels, gains) if k in in_eager], build, "eager", eager)
    if guard and graph_only:
        if in_eager:
            reports[-1] = replace(reports[-1], not_in_mode=graph_only)
        else:
            reports.append(FallbackReport("eager", (), (), Comparison(0.0, 0.0, 0.0), 0, graph_only))
    kforge_err64 = eager_err64
    if kept:
        with Deployment(kept, model if isinstance(model, torch.nn.Module) else None) as dep, torch.no_grad():
            out = forward(model)
        diff, kforge_err64 = relative_difference(reference, out, model), err64(out)
        dispatch = launch_paths(dep.kernels)
        why = wrong_output(diff, 0.0, reference, "eager itself", kforge_err64, eager_err64, model)
        if why is not None:
            log.warning("kforge: eager: %s", why)
            if guard:
                reports[0] = replace(reports[0], kept=(), wrong_output=why)
            kept, diff, dispatch, kforge_err64 = [], 0.0, None, eager_err64
    else:
        diff, dispatch = 0.0, None
    eager_us = cmp.without_us if cmp is not None else compare(eager, eager).without_us
    kforge_us = cmp.with_paired_us if kept else eager_us
    # NB: with nothing kept the row shows no time: eager's again would read as a measurement of kforge
    if kept or not kernels or guard:
        eager_none = None if kept else no_kernel_kept(len(kernels), reports[0] if reports else None)
    else:
        eager_none = ("their output moved from eager's (see the log)" if in_eager else
                      f"its {len(graph_only)} kernel(s) run in graph mode only")
    rows.append(Row("eager", eager_us, float64_rel_diff=eager_err64))
    compile_us = compile_kforge_us = None
    compiled_rows: list[Row] = []
    rewritten_rows: list[Row] = []

    def with_output(row: Row, out: Any) -> Row:
        return replace(row, output_rel_diff=relative_difference(reference, out, model), float64_rel_diff=err64(out))

    def rewrites_failed(mode: str, base: str, exc: Exception) -> list[Row]:
        """The rows of a rewrite check that raised: each says so; the mode's own rows stay."""
        why = f"{type(exc).__name__}: {str(exc)[:200]}"
        log.warning("kforge: %s: the rewrites' check failed: %s", mode, why)
        return [Row(f"{base} + {name}", None, base, error=why, rewrite=RewriteVerdict(name, mode, False, (), why))
                for name in rewrites.names]

    if rewrites is not None:
        base = "eager + kforge" if kept else "eager"
        say(f"eager: timing the model with and without {', '.join(rewrites.names)}"
            + (f" (and its {len(kept)} kept kernel(s))" if kept else ""))
        try:
            if isinstance(model, torch.nn.Module):
                with no_recompile_limit():
                    verdicts = rewrites.eager(kept, model, args, kwargs, device, compare)
            else:
                verdicts = [RewriteVerdict(name, "eager", False, (), "a rewrite runs in the model's forward captured "
                                           "as a graph, and the model is no nn.Module") for name in rewrites.names]
            for row in rewrite_rows(verdicts, base, cumulative=False):
                if row.rewrite.kept:   # NB: each was checked alone, with eager's kept kernels
                    with no_recompile_limit(), torch.no_grad(), Deployment(kept, model, stops_workers=False,
                                                                           rewrites=(row.rewrite.rewrite,)):
                        row = with_output(row, forward(model))
                rewritten_rows.append(row)
        except Exception as exc:  # noqa: BLE001 - the table keeps what it timed; the rewrites' rows say why not
            rewritten_rows.extend(rewrites_failed("eager", base, exc))

    def compiled_rewrites(mode: str, label: str, ckept: Sequence[DeployedKernel], made: dict) -> list[Row]:
        """One compile mode's rewrite rows: the model compiled with the kernels it kept and each rewrite, against it
        without the rewrite (each kept one stays in what the next is checked with)."""
        base = f"{label} + kforge" if ckept else label
        say(f"{label}: compiling the model with {', '.join(rewrites.names)}, then timing it against {base}")
        mode_kw = {"backend": backend, "mode": None if backend != "inductor" else mode, "dynamic": dynamic}
        try:
            key = tuple(sorted(dk.run_name for dk in ckept))
            current = made[key] if key in made else compile_with(model, list(ckept), **mode_kw)
            with no_recompile_limit():
                final, verdicts = rewrites.compiled(list(ckept), model, current, args, kwargs, compare, **mode_kw)
            out = rewrite_rows([replace(v, mode=mode) for v in verdicts], base, cumulative=True)
            if final is not current:   # NB: the last kept rewrite's row runs what the mode ends with
                with torch.no_grad():
                    last = max(i for i, r in enumerate(out) if r.rewrite.kept)
                    out[last] = with_output(out[last], forward(final))
            return out
        except Exception as exc:  # noqa: BLE001 - the mode's own rows stay
            return rewrites_failed(mode, base, exc)

    def table() -> EndToEnd:
        out = rows + [Row("eager + kforge", kforge_us if kept else None, "eager", cmp if kept else None, diff,
                          len(kept), float64_rel_diff=kforge_err64, no_kernel=eager_none)] + compiled_rows
        out += rewritten_rows
        return EndToEnd(eager_us, kforge_us, compile_us, compile_kforge_us, diff, len(kept), list(skipped), dispatch,
                        tuple(out), tuple(reports))

    def report_so_far(mode: str) -> None:
        so_far = table()
        for line in so_far.headline():
            if line.startswith(f"{mode}:"):
                say(line)
        if on_mode is None:
            return
        try:
            on_mode(so_far)
        except Exception as exc:  # NB: the caller's progress hook failing (a full disk) costs its call, not the run
            log.warning("kforge: end_to_end's on_mode failed: %s: %s", type(exc).__name__, exc)

    report_so_far("eager")
    if compile:
        for step, mode in enumerate(modes, start=2):
            label = f"compile {mode}"
            torch._dynamo.reset()
            marks = (len(rows), len(reports), len(compiled_rows))
            try:
                with no_recompile_limit():
                    make, made = compiled_arms(model, forward, mode, backend, dynamic=dynamic)
                    say(f"{label} ({step} of {steps}): compiling the model, then timing it against eager")
                    plain = make([])
                    vs_eager = compare(plain, eager)
                    with torch.no_grad():
                        plain_out = forward(made[()])
                    plain_diff, plain_err64 = relative_difference(reference, plain_out, model), err64(plain_out)
                    del plain_out
                    rows.append(Row(label, vs_eager.with_paired_us, "eager", vs_eager, plain_diff,
                                    float64_rel_diff=plain_err64))
                    if kernels:
                        say(f"{label}: compiling the model with {len(kernels)} kernel(s), then timing it against "
                            f"plain {label}" + (" (and an A/A control)" if guard else ""))
                    checked = CompiledCheck((), None, None, None, None) if not kernels else check_compiled(
                        kernels, gains, make, made, compare, mode, plain, forward, reference, plain_diff, guard,
                        reference64, plain_err64, model)
                    if checked.report is not None:
                        reports.append(checked.report)
                    ckept, ccmp = checked.kept, checked.comparison
                    none = None if ckept else no_kernel_kept(len(kernels), checked.report)
                    compiled_rows.append(Row(f"{label} + kforge", ccmp.with_paired_us if ckept else None,
                                             label, ccmp if ckept else None, checked.output_rel_diff, len(ckept),
                                             float64_rel_diff=checked.float64_rel_diff if ckept else plain_err64,
                                             no_kernel=none))
                    if compile_us is None:
                        compile_us = vs_eager.with_paired_us
                        compile_kforge_us = ccmp.with_paired_us if ckept else compile_us
                    if rewrites is not None:
                        rewritten_rows.extend(compiled_rewrites(mode, label, ckept, made))
            except Exception as exc:  # one mode that does not compile here does not lose the others
                # NB: what the mode got before it failed goes (its check's report, a plain row), else the
                # report would show a kept set that never ran and two rows of one label
                del rows[marks[0]:], reports[marks[1]:], compiled_rows[marks[2]:]
                rows.append(Row(label, None, error=f"{type(exc).__name__}: {str(exc)[:200]}"))
            finally:
                torch._dynamo.reset()
            report_so_far(label)
    say(f"done in {time.perf_counter() - started:.0f} s")
    return table()
