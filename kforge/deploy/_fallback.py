"""The model-level check: a kernel is kept only if the model's own forward gets measurably faster.

A kernel faster than eager in isolation can still slow the model: its dispatch costs host time,
it replaces an operator Inductor had fused with its neighbours, it is slower than the code
Inductor generates for the same operator. So the whole forward is timed with and without kernels,
interleaved in one process, in the mode the model will run in (eager against eager, compiled
against plain compile in the same mode). Greedy removal over groups (``weighed_together``: the kernels
of one operator are one group, each region kernel a group of its own), at most g + 2 forwards built
(compiled, in compile modes) for g groups: start from all kernels; try leaving out each group, smallest
expected gain first, and drop it when the model is not measurably slower without it; finally keep what
is left only if it beats no kernels at all beyond the noise. Kernels of one operator are weighed
together because each alone may save less than the noise while together they save more (the same
design at several shapes), and because every group costs a compilation of the whole model.

In compile modes every arm is a compilation of its own, and two compilations of one graph need not
run alike (on the H200 two arms that ran the same Qwen graph read 2% apart): the check times a second
plain compilation, made afresh, against the first (the A/A control), and a saving must exceed the
noise plus the gap between those two (``margin_us``). A saving over half that bar but not over it is
timed again, its rounds pooled with the first (``settle``): a real saving near the bar is then claimed
on more evidence instead of left out, and one that is not real stays within the narrowed noise. The pooled
noise is never narrower than the timings' disagreement (the spread of their own paired medians).
"""
from __future__ import annotations

import enum
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch

from ._launch import DeployedKernel


class Outcome(str, enum.Enum):
    """A comparison's reading of the difference between its two forwards, with its noise."""

    FASTER = "faster"
    SLOWER = "slower"
    WITHIN_NOISE = "within noise"


# The least noise a comparison reports, as a fraction of the slower arm: smaller differences are not claimed.
NOISE_FLOOR = 0.005


@dataclass(frozen=True)
class Comparison:
    """Forward latency with and without a set of kernels, timed interleaved (medians, us).

    ``paired_us``: the median of the per-round differences (without - with; positive: faster with
    the kernels), where the two arms were timed next to each other. It is what the verdict reads
    when present: a forward whose time drifts during the run (both arms alike) moves the two
    medians apart by chance, but not the paired differences."""

    with_us: float
    without_us: float
    noise_us: float     # a difference within this is not a measurement
    paired_us: float | None = None
    rounds: tuple[tuple[float, float], ...] = field(default=(), repr=False)   # (with, without) per round, in order
    margin_us: float = 0.0   # a systematic gap a saving must exceed too (two plain compilations' A/A difference)
    timings: tuple[float, ...] = ()   # pooled: each timing's own paired median, in order

    @property
    def saved_us(self) -> float:
        """Time a forward saves with the kernels (negative: costs)."""
        return self.paired_us if self.paired_us is not None else self.without_us - self.with_us

    @property
    def with_paired_us(self) -> float:
        """The forward with the kernels as the paired rounds put it: the baseline's median less the
        saving (what the ratio and the verdict read; ``with_us`` is that arm's own median)."""
        return self.without_us - self.saved_us

    @property
    def within_noise(self) -> bool:
        return abs(self.saved_us) <= self.noise_us + self.margin_us

    @property
    def faster(self) -> bool:
        """Measurably faster with the kernels than without (beyond the noise and the margin)."""
        return self.saved_us > self.noise_us + self.margin_us

    @property
    def undecided(self) -> bool:
        """A saving too small to claim but large enough that more rounds may claim it: within the noise and
        the margin, and more than half of them. Timed rounds only (a Comparison without them cannot pool)."""
        bar = self.noise_us + self.margin_us
        # NB: more rounds narrow the noise only down to its floor: a saving within margin + floor never passes
        reachable = self.saved_us > self.margin_us + NOISE_FLOOR * max(self.with_us, self.without_us)
        return bool(self.rounds) and reachable and 0.5 * bar < self.saved_us <= bar

    def pooled(self, more: Comparison) -> Comparison:
        """This comparison's rounds and ``more``'s (the same two arms timed again) as one comparison.

        Its noise is never less than the spread between the timings' own paired medians: rounds of one timing
        share its conditions, so pooled rounds narrow the noise only as far as the timings agree."""
        rounds = (*self.rounds, *more.rounds)
        meds = (self.timings or (self.saved_us,)) + (more.timings or (more.saved_us,))
        pooled = comparison_of([a for a, _ in rounds], [b for _, b in rounds])
        return replace(pooled, noise_us=max(pooled.noise_us, max(meds) - min(meds)), margin_us=self.margin_us,
                       timings=meds)

    @property
    def slower(self) -> bool:
        """Measurably slower with the kernels than without (beyond the noise and the margin)."""
        return self.saved_us < -(self.noise_us + self.margin_us)

    @property
    def outcome(self) -> Outcome:
        """What the difference says, read with its noise: the label every table prints beside the ratio."""
        if self.faster:
            return Outcome.FASTER
        return Outcome.SLOWER if self.slower else Outcome.WITHIN_NOISE

    @property
    def speedup(self) -> float:
        spent = self.with_paired_us
        return self.without_us / spent if spent > 0 else 1.0

    @property
    def speedup_range(self) -> tuple[float, float]:
        """The ratios the saving's noise (and margin) allows: above 1 only when ``faster``, below 1 only when
        ``slower``; the upper end is infinite where the noise exceeds the time with the kernels."""
        bar, spent = self.noise_us + self.margin_us, self.with_paired_us
        low = self.without_us / (spent + bar) if spent + bar > 0 else 0.0
        high = self.without_us / (spent - bar) if spent - bar > 0 else float("inf")
        return low, high

    @property
    def speedup_noise(self) -> float:
        """The ratio's ``±``, read on the side its label rests on: ``speedup - speedup_noise`` is the range's
        low end when faster, ``speedup + speedup_noise`` its high end when slower, and within noise the
        ``±`` reaches both ends (so 1 lies inside it). Infinite where the noise exceeds the time itself."""
        low, high = self.speedup_range
        s = self.speedup
        if self.faster:
            return max(s - low, 0.0)
        if self.slower:
            return max(high - s, 0.0)
        return max(s - low, high - s, 0.0)

    def ratio(self) -> str:
        """The ratio with its noise and its label, e.g. "1.092x ± 0.031, faster"."""
        pm = self.speedup_noise
        if pm == float("inf") or pm >= 10.0:
            # NB: seen on this CPU: compile default 1.386x with +/-3818.5 us of noise on a 3.4 ms forward
            noise = f"(from {self.speedup_range[0]:.2f}x up: the noise exceeds the time)"
        else:
            noise = f"± {pm:.3f}"
        return f"{self.speedup:.3f}x {noise}, {self.outcome.value}"

    def describe(self) -> str:
        if self.within_noise:
            if self.margin_us:
                return (f"{self.ratio()} (+/-{self.noise_us:.1f} us) and the {self.margin_us:.1f} us "
                        "that two plain compilations differ by")
            return f"{self.ratio()} (+/-{self.noise_us:.1f} us)"
        if self.paired_us is None:
            return f"{self.ratio()} ({self.with_us:.1f} us against {self.without_us:.1f} us)"
        verb = "saves" if self.paired_us > 0 else "costs"
        return (f"{self.ratio()} ({verb} {abs(self.paired_us):.1f} us a forward, paired per round; "
                f"medians {self.with_us:.1f} us against {self.without_us:.1f} us)")


@dataclass(frozen=True)
class LeftOut:
    signature: str
    comparison: Comparison   # the model with the kernel against the model without it
    together: int = 1        # how many kernels were weighed with it, itself included (``weighed_together``)

    @property
    def reason(self) -> str:
        who = "it" if self.together == 1 else f"it and the {self.together - 1} other kernel(s) weighed with it"
        return f"the model is not measurably faster with {who}: {self.comparison.describe()}"


@dataclass(frozen=True)
class FallbackReport:
    """What the model-level check kept and left out, in one mode ("eager" or a compile mode)."""

    mode: str
    kept: tuple[str, ...]
    left_out: tuple[LeftOut, ...]
    model: Comparison        # the kept set against no kernels (when nothing is kept: all of them)
    forwards_built: int
    not_in_mode: tuple[str, ...] = ()   # kernels this mode cannot run (region kernels in eager), not timed
    not_placed: tuple[str, ...] = ()    # kernels no call in this mode's graphs matched: never ran, not timed
    nearest: tuple[str, ...] = ()       # for each of not_placed: the nearest call the graphs have ("" if none)
    copied: tuple[tuple[str, int], ...] = ()   # placed kernels whose calls got another layout (copied): how many
    wrong_output: str | None = None     # why the set that was faster was dropped: it changed the model's output
    control: Comparison | None = None   # compile modes: a second plain compilation against the first (A/A)

    def __str__(self) -> str:   # NB: print(compiled.kforge_fallback) prints what was kept and left out, and why
        return "\n".join(self.lines())

    def lines(self) -> list[str]:
        out = [f"{self.mode}: kept {len(self.kept)} kernel(s), model {self.model.describe()}" if self.forwards_built
               else f"{self.mode}: no kernel this mode can run, nothing timed"]
        if self.control is not None:
            out.append(f"  A/A control: a second plain compilation against the first, {abs(self.control.saved_us):.1f} us "
                       f"apart (noise +/-{self.control.noise_us:.1f} us); a saving must exceed noise and that gap")
        if self.wrong_output:
            out.append(f"  dropped every kernel: {self.wrong_output}")
        out += [f"  left out {lo.signature}: {lo.reason}" for lo in self.left_out]
        out += [f"  copied inputs {sig}: {n} call(s) of one forward got another layout than the kernel's and paid a copy"
                for sig, n in self.copied]
        out += [f"  not run {sig}: runs in graph mode only (torch.compile)" for sig in self.not_in_mode]
        near = (*self.nearest, *[""] * (len(self.not_placed) - len(self.nearest)))
        out += [f"  not run {sig}: no call in this mode's compiled graphs has its signature" + (f"; {n}" if n else "")
                for sig, n in zip(self.not_placed, near)]
        return out


@dataclass(frozen=True)
class RewriteVerdict:
    """What the check decided for one inference rewrite (``kforge.rewrites``) in one mode ("eager" or a compile
    mode): kept or left out, where it changed the model's graphs, why, and the timing it was decided on. An exported
    artifact's manifest holds one per rewrite (``to_json``), and ``kforge.load`` reads it back (``from_json``)."""

    rewrite: str
    mode: str
    kept: bool
    sites: tuple[str, ...]   # where the rewrite changed the model's graphs
    why: str                 # the ratio where timed, or why it was left out
    comparison: Comparison | None = None

    def line(self) -> str:
        verdict = "kept" if self.kept else "left out"
        return f"{self.rewrite} ({self.mode}, {len(self.sites)} site(s)): {verdict}: {self.why}"

    def to_json(self) -> dict:
        c = self.comparison
        timing = None if c is None else {
            "speedup": c.speedup, "speedup_noise": c.speedup_noise, "outcome": c.outcome.value, "with_us": c.with_us,
            "without_us": c.without_us, "noise_us": c.noise_us, "paired_us": c.paired_us, "margin_us": c.margin_us}
        return {"name": self.rewrite, "mode": self.mode, "kept": self.kept, "sites": list(self.sites), "why": self.why,
                "comparison": timing}

    @classmethod
    def from_json(cls, data: dict) -> "RewriteVerdict":
        """The inverse of ``to_json`` (the comparison without its rounds: its ratio, noise and outcome are the
        same)."""
        c = data.get("comparison")
        comparison = None if c is None else Comparison(float(c["with_us"]), float(c["without_us"]),
                                                       float(c["noise_us"]), c.get("paired_us"),
                                                       margin_us=float(c.get("margin_us") or 0.0))
        return cls(str(data["name"]), str(data.get("mode") or "eager"), bool(data["kept"]),
                   tuple(str(s) for s in data.get("sites") or ()), str(data.get("why") or ""), comparison)


class Arm:
    """One way to run the model's forward: ``enter``/``exit`` around a block of calls (installing
    and removing eager kernels), ``forward`` one call; ``kernels``: the signatures it runs."""

    def __init__(self, forward: Callable[[], Any], kernels: Sequence[DeployedKernel] = (),
                 enter: Callable[[], Any] | None = None, exit: Callable[[], Any] | None = None):
        self.forward = forward
        self.kernels = tuple(dk.variant.signature for dk in kernels)
        self._enter, self._exit = enter, exit

    @property
    def installs(self) -> bool:
        """Whether entering the arm installs something (eager kernels): its forwards then need a warm-up."""
        return self._enter is not None

    def enter(self) -> None:
        if self._enter is not None:
            self._enter()

    def exit(self) -> None:
        if self._exit is not None:
            self._exit()


Build = Callable[[Sequence[DeployedKernel]], Arm]
Compare = Callable[[Arm, Arm], Comparison]


def weighed_together(dk: Any) -> str:
    """Which kernels the model-level check keeps or leaves out as one: those of one operator (one design at
    several shapes, each of which may save less than the noise while together they save more); a region
    kernel alone (each is its own chain's code, a vendor-headed chain's too), as is a kernel whose operator is not
    known."""
    from ..ops import found_in_graph

    op = getattr(dk.variant, "op", None)
    return dk.variant.signature if op is None or found_in_graph(op) else f"op:{op}"


def keep_faster(kernels: Sequence[DeployedKernel], expected_gain_us: Sequence[float], build: Build,
                compare: Compare, mode: str, none: Arm | None = None, control: Arm | None = None,
                settle: int = 2) -> tuple[list[DeployedKernel], FallbackReport]:
    """The kernels worth keeping for the model in ``mode``, and the report.

    ``build(subset)`` gives an Arm running the model with exactly those kernels (built once per
    subset); ``compare(with, without)`` times two arms interleaved; ``none``: the arm without
    kernels when the caller has it already; ``control``: another arm without kernels, made the way
    ``none`` was but separately (a second compilation): timed against ``none`` first, and every
    saving must exceed the gap between the two as well as the noise. A saving that is undecided
    (``Comparison.undecided``: over half that bar, not over it) is timed again, up to ``settle``
    times, its rounds pooled: more rounds narrow the noise, and the verdict reads them all.
    """
    # NB: kernels of one operator are weighed together (``weighed_together``): on the H200 Gemma 4's four fused
    # q/k RMSNorm + rotary kernels each save under the noise of a 61 ms forward while together they save more, and a
    # 35-layer compile costs over a minute an arm (leave-one-out over the four ran past ten minutes, 2026-12-04o)
    groups: dict[str, list[int]] = {}
    for i, dk in enumerate(kernels):
        groups.setdefault(weighed_together(dk), []).append(i)
    gain = {key: sum(expected_gain_us[i] for i in idx) for key, idx in groups.items()}
    order = sorted(groups, key=lambda key: -gain[key])
    current = {key: [kernels[i] for i in groups[key]] for key in order}
    if not current:
        empty = Comparison(0.0, 0.0, 0.0)
        return [], FallbackReport(mode, (), (), empty, 0)
    built = 1 if none is not None else 2
    none = none if none is not None else build([])
    aa, margin = None, 0.0
    if control is not None:
        aa = compare(control, none)
        margin = abs(aa.saved_us)
        built += 1
    timed = compare

    def compare(a: Arm, b: Arm) -> Comparison:
        # NB: a saving between half the bar and the bar is timed again, its rounds pooled, up to `settle` times: on
        # the H200 two VAE twins saved 240 and 298 us a forward against a bar of 259 and 306 us (24 rounds each)
        cmp = replace(timed(a, b), margin_us=margin)
        for _ in range(settle):
            if not cmp.undecided:
                break
            cmp = cmp.pooled(timed(a, b))
        return cmp

    flat = lambda gs: [dk for key in gs for dk in gs[key]]  # noqa: E731
    arm = build(flat(current))
    left_out: list[LeftOut] = []
    for key in reversed(order):
        if len(current) == 1:
            break
        rest = {k: ks for k, ks in current.items() if k != key}
        without = build(flat(rest))
        built += 1
        cmp = compare(arm, without)
        if not cmp.faster:
            together = len(current[key])
            left_out.extend(LeftOut(dk.variant.signature, cmp, together) for dk in current[key])
            current, arm = rest, without
    current = flat(current)
    final = compare(arm, none)
    if not final.faster:
        left_out.extend(LeftOut(k.variant.signature, final, len(current)) for k in current)
        current = []
    kept = tuple(k.variant.signature for k in current)
    return current, FallbackReport(mode, kept, tuple(left_out), final, built, control=aa)


def interleaved(device: str, *, budget_s: float = 2.0, block_s: float = 0.02, min_rounds: int = 24,
                max_rounds: int = 60, max_s: float = 30.0, warm_blocks: bool | None = None) -> Compare:
    """A Compare that times blocks of forwards of two arms alternately (ABBA order), wall clock
    with the device synchronised around each block, for ``budget_s`` and at least ``min_rounds``
    rounds (unless that takes over ``max_s``: then at least 6), at most ``max_rounds``.

    The noise is three standard errors of the median of the paired differences (a robust spread),
    and never less than 0.5% of the slower arm: smaller differences are not claimed. A model whose
    forward is long gets few rounds in the budget, and so a wide noise band: on the H200 the SD3.5
    VAE (35 ms) got 15 rounds in 2 s and a saving that 14 of them showed was called noise; the
    rounds it is owed come from ``min_rounds``.

    Where an arm installs kernels (eager mode), each block starts with an untimed forward (the dispatch
    caches fill there after the install); so does every block where ``warm_blocks`` (default: on the CPU,
    where the first forward after the other arm's block can stall). Elsewhere arms that install nothing
    (compiled models) are timed from their block's first forward, which halves a round's cost for a long
    forward."""
    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)

    def block(arm: Arm, reps: int, warm: bool) -> float:
        arm.enter()
        try:
            with torch.no_grad():
                if warm:
                    arm.forward()  # after (re)installing: the dispatch caches fill here, untimed
                sync()
                start = time.perf_counter()
                for _ in range(reps):
                    arm.forward()
                sync()
                return (time.perf_counter() - start) / reps * 1e6
        finally:
            arm.exit()

    def compare(a: Arm, b: Arm) -> Comparison:
        first = max(block(a, 1, True), block(b, 1, True))
        # NB: on the CPU the first forward after the other arm's block can stall for tens of ms (measured here,
        # tiny_chains: 10-45 ms against 0.25 ms; an eager forward alternating with compiled code read 3.2 ms
        # against 0.27 ms alone), so every CPU block starts untimed
        warm = a.installs or b.installs or (not device.startswith("cuda") if warm_blocks is None else warm_blocks)
        reps = max(1, int(block_s * 1e6 / max(first, 1.0)))
        ta: list[float] = []
        tb: list[float] = []
        start = time.perf_counter()
        r = 0
        while r < max_rounds:
            spent = time.perf_counter() - start
            if (r >= min_rounds and spent >= budget_s) or (r >= 6 and spent >= max(max_s, budget_s)):
                break
            pair = (a, b) if r % 2 == 0 else (b, a)
            got = {id(arm): block(arm, reps, warm) for arm in pair}
            ta.append(got[id(a)])
            tb.append(got[id(b)])
            r += 1
        return comparison_of(ta, tb)

    return compare


def comparison_of(with_us: Sequence[float], without_us: Sequence[float]) -> Comparison:
    """A Comparison from paired samples (one per round, the two arms timed next to each other)."""
    diffs = [b - a for a, b in zip(with_us, without_us)]
    med = statistics.median(diffs)
    mad = statistics.median([abs(d - med) for d in diffs]) * 1.4826
    se = 1.2533 * mad / max(len(diffs), 1) ** 0.5
    wa, wb = statistics.median(with_us), statistics.median(without_us)
    return Comparison(wa, wb, max(3.0 * se, NOISE_FLOOR * max(wa, wb)), med, tuple(zip(with_us, without_us)))
