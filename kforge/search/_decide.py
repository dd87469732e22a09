"""A card's verdict: a winner only if correct and faster than the judge's eager beyond the noise of
its timings, which agree.

The figure a verdict states is the winner's speedup with both of its timings pooled (the one that
made it a candidate and its confirmation, ``kforge.ops._verdict.pool_timings``), within an interval
that spans each timing widened by its own noise. A winner is declared only when the interval's low
end clears the least gain; a kernel whose timings say faster but cannot tell it apart from eager, or
whose two timings disagree, leaves the card "noisy", on eager.

A stored verdict changes only when new evidence is measured: a search that evaluated nothing new
keeps the stored verdict, and a candidate is confirmed (timed a second time) once; that timing is
stored and pooled into its speedup from then on.
"""
from __future__ import annotations

import enum
import math
import statistics
from dataclasses import replace
from typing import TYPE_CHECKING

from ..kernels import backend_of
from ..ops import CardStatus, CardVerdict
from ..ops._verdict import SPREAD_FLOOR, SpeedupEstimate
from ..store import is_infra_failure

if TYPE_CHECKING:
    from ..store import Candidate
    from ._card_search import CardSearch

CONFIRM_TOP = 3  # the best candidates tried, in order, until one is confirmed faster
BASELINE_MOVED = 3.0  # eager's times across evaluations differ by more than this many of its spreads: it moved
LEAST_GAIN = 0.02     # a winner's speedup interval starts above 1 + this (the judge's least noise margin)
# NB: two timings of one kernel further apart than this ratio cannot support a verdict (a card's speedup
# must repeat within it across runs: issue 41); a group_norm kernel's two timings agreed within 1.2x in 5 of
# 7 pairs on the loaded 2-core CPU (docs/benchmarks.md, 2026-12-06).
TIMINGS_AGREE = 1.3
# NB: eager's own time moving by more than this between a card's evaluations leaves no baseline to state a
# speedup against: an add on 256 floats read 4.2 to 30.4 us within one run on the loaded CPU (its kernel
# 0.9-2.6 us), and its "confirmed" speedups ranged 2.0-9.7x across runs; every other card's eager stayed within 1.5x.
EAGER_MOVED = 2.0


class Call(enum.Enum):
    """What a candidate's timings support."""

    FASTER = "faster"     # its whole interval is above 1 + LEAST_GAIN: a winner
    NOISY = "noisy"       # faster by its figure, but its interval reaches eager, or its timings disagree
    NOT_FASTER = "not faster"


def call(estimate: SpeedupEstimate) -> Call:
    """What ``estimate`` (a candidate's pooled timings) supports."""
    if estimate.agreement > TIMINGS_AGREE:
        return Call.NOISY
    if estimate.low >= 1.0 + LEAST_GAIN:
        return Call.FASTER
    if estimate.speedup >= 1.0 + LEAST_GAIN:
        return Call.NOISY
    return Call.NOT_FASTER


def baseline_moved(evaluations) -> bool:
    """Whether eager's own time moved between these evaluations by more than its noise, so their speedups
    were taken against different baselines."""
    timed = [e for e in evaluations if e is not None and e.eager_us]
    if len(timed) < 2:
        return False
    lo, hi = min(e.eager_us for e in timed), max(e.eager_us for e in timed)
    spread = max([SPREAD_FLOOR] + [e.eager_spread or 0.0 for e in timed])
    return hi / lo - 1.0 > BASELINE_MOVED * spread


def rank_winners(nodes: list, backend: str) -> list:
    """The winning nodes of a card, best first.

    By speedup, each taken against eager in its own interleaved run, so a drift both share cancels.
    On a GPU, once eager's time moved between the evaluations by more than its noise, by the kernels'
    own times instead: CUDA events time a candidate's kernels on the device, where the host's pace does
    not reach them, but an eager baseline of many small launches follows the host. Its ratios then rank
    the baselines as much as the candidates (H200, 2026-12-04c: the gated delta rule's 514.7 us candidate
    ranked above its 344.6 us one, 5.41x against 5.20x, over eager timings of 2785.4 and 1790.4 us).
    On a CPU both are host time, and the ratio stays the measure.
    """
    by_ratio = sorted(nodes, key=lambda n: (-n.score, n.id))
    if backend != "cuda" or not baseline_moved([n.candidate.measured for n in nodes]):
        return by_ratio
    return sorted(by_ratio, key=lambda n: (n.candidate.measured.candidate_us or float("inf"), n.id))


def _timings(cand: "Candidate") -> list:
    return [e for e in (cand.evaluation, cand.confirmation)
            if e is not None and not is_infra_failure(e) and e.status.is_correct]


def eager_range(candidates: list["Candidate"]) -> tuple[float, float] | None:
    """The least and the largest of the judge's eager times over these candidates' correct timings."""
    times = [e.eager_us for c in candidates for e in _timings(c) if e.eager_us]
    return (min(times), max(times)) if times else None


def judge_eager_us(candidates: list["Candidate"]) -> float | None:
    """The judge's eager time over these candidates' correct timings (their median): the baseline the
    search timed against."""
    times = [e.eager_us for c in candidates for e in _timings(c) if e.eager_us]
    return statistics.median(times) if times else None


def _disagreement(cand: "Candidate", est: SpeedupEstimate) -> str:
    speeds = " and ".join(f"{e.speedup:.2f}x" for e in _timings(cand))
    if est.agreement > TIMINGS_AGREE:
        return (f"candidate {cand.id}: its timings ({speeds}) disagree by more than {TIMINGS_AGREE:g}x: the timing "
                "cannot support a verdict, so eager stays (search again on a quieter machine)")
    return (f"candidate {cand.id}: {est.speedup:.2f}x ({est.low:.2f}-{est.high:.2f}) is within the noise of eager: "
            "eager stays (search again on a quieter machine)")


def decide(search: "CardSearch") -> CardVerdict:
    """Decide the card of ``search``, store the verdict, and return it."""
    store, card, tree = search.store, search.card, search.tree
    stored = store.result(card.key)
    can_confirm = search.budget.confirm and not search.owner.stopping
    if stored is not None and search.evaluated == 0 and not (
            can_confirm and stored.status.has_winner and not stored.confirmed):
        return stored
    # NB: by the first timing's status: a candidate whose confirmation then said "no gain" is still one whose
    # timings disagree (noisy), not a card where nothing was ever faster
    first_faster = [n for n in tree.evaluated if n.candidate.evaluation is not None
                    and n.candidate.evaluation.status.is_win and n.candidate.status.is_correct]
    winners = rank_winners(first_faster, backend_of(card.variant.device))
    common = dict(candidates=len(tree), search_ended=search.reason,
                  evaluations=sum(1 for n in tree.evaluated))
    verdict = None
    noisy: list[str] = []
    moved = eager_range([n.candidate for n in tree.evaluated])
    if winners and moved and moved[1] > EAGER_MOVED * moved[0]:
        noisy.append(f"eager's own time moved from {moved[0]:.1f} to {moved[1]:.1f} us between the card's evaluations "
                     f"(more than {EAGER_MOVED:g}x): no baseline to state a speedup against, so eager stays (a busy "
                     "machine? search again on a quieter one)")
        winners = []
    for node in winners[:CONFIRM_TOP]:
        cand = node.candidate
        confirmed = cand.confirmation is not None
        if not confirmed and can_confirm:
            ev = search.judge(cand.source, seed=cand.id + 7919)
            if not is_infra_failure(ev):
                store.set_confirmation(cand.id, ev)
                cand = replace(cand, confirmation=ev)
                tree.nodes[cand.id].candidate = cand
                confirmed = True
        est = cand.estimate
        if est is None:   # the second run was not correct
            continue
        what = call(est)
        if what is Call.NOISY:
            noisy.append(_disagreement(cand, est))
        if what is not Call.FASTER:
            continue
        timed = _timings(cand)
        eager = math.exp(statistics.fmean(math.log(e.eager_us) for e in timed)) if all(
            e.eager_us for e in timed) else None
        measured = cand.measured
        verdict = CardVerdict(
            CardStatus.WINNER, f"candidate {cand.id}: {est.speedup:.2f}x over the judge's eager "
            f"({est.low:.2f}-{est.high:.2f}, {est.timings} timing{'s' * (est.timings > 1)})"
            + ("" if confirmed else "; timed once: not confirmed"),
            winner_id=cand.id, winner_speedup=est.speedup, speedup_low=est.low, speedup_high=est.high,
            kernel_us=eager / est.speedup if eager else None, eager_us=eager, confirmed=confirmed,
            first_speedup=cand.first_speedup, roofline_fraction=measured.roofline_fraction if measured else None,
            **common)
        break
    if verdict is None:
        best = tree.best()
        eager = judge_eager_us([n.candidate for n in tree.evaluated])
        best_speedup = best.score if best is not None and best.score > 0 else None
        status = CardStatus.NOISY if noisy else CardStatus.EAGER
        if not tree.evaluated:
            why = "no candidate was evaluated"
        elif best is None:
            why = "no candidate was correct"
        elif noisy:
            why = noisy[0]
        elif winners:
            why = "the best candidates were not faster when timed again"
        else:
            why = f"no correct candidate beat eager beyond the noise (best candidate {best.score:.2f}x, unconfirmed)"
        verdict = CardVerdict(status, why, eager_us=eager, best_candidate_speedup=best_speedup, **common)
    store.save_result(card.key, verdict)
    return verdict
