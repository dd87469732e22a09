"""A card's verdict: a winner only if correct and faster than the judge's eager beyond the noise of
timings taken after it was chosen, which agree.

The search's own timing of a candidate chose it as the best of several, so noise that flattered it is
part of why it was chosen (the winner's curse: a first timing of 2.29x against a confirmation of
1.21x on the loaded 2-core CPU). The figure a verdict states is therefore read from confirmations
only: timings taken after the candidate was chosen, pooled (``kforge.ops._verdict.pool_timings``)
within an interval that spans each widened by its own noise. One confirmation, and a second where
the first disagrees with the search's timing beyond the noise; the verdict is noisy when the
confirmations themselves disagree. At most ``CONFIRMATIONS_PER_CARD`` confirmations a card.

A winner's interval must clear the least gain, and its gain per call (eager's time less the kernel's)
must exceed how far eager's own time moved between the card's evaluations: where the timer cannot
hold eager still to within the gain, the card is "noisy", on eager, whatever the ratio says.

Confirmations are timed in another process than the search's (``elsewhere``: the first in the evaluator's
second judge, a second one back in the search's judge), and a verdict states only what a fresh process
also saw. Measured on the loaded 2-core CPU (2026-12-07, docs/benchmarks.md; one session run again and
again, the same 16 cards and the same candidates in every run, so the search is not what differs): with
every timing of a run in one judge, the same kernel's speedup in two timings of one run differed by a
median 1.06-1.07x, in two runs by 1.10-1.12x, so a verdict's interval, read from one process, was
narrower than what the next run saw. With the first confirmation in a second judge, two timings of one
run differed by 1.11x, as much as two runs' (1.09x). So the movement between a candidate's two
processes (``process_movement``: its two confirmations, or its one confirmation and the search's timing)
is a measure, taken on this card in this run, of how far the next run's figure may fall: the stated
interval reaches at least that far on either side of the figure (``across_processes``), and a candidate
whose figure over that movement does not clear ``LEAST_GAIN`` is "noisy", not a winner. No new
threshold comes with it: the movement is measured, and the other rules read the second process's
timings as they read any other (eager's movement between the two processes widens the span a gain must
exceed; two confirmations further apart than ``TIMINGS_AGREE`` leave the card noisy). On a GPU
confirmations stay in the search's judge (not measured there yet), and the rule is off.

A stored verdict changes only when new evidence is measured: a search that evaluated nothing new
keeps the stored verdict; confirmations are stored, and are the candidate's speedup from then on.
"""
from __future__ import annotations

import enum
import math
import statistics
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from ..kernels import backend_of
from ..ops import CardStatus, CardVerdict
from ..ops._verdict import SPREAD_FLOOR, SpeedupEstimate, pool_timings
from ..store import is_infra_failure, timing_noise

if TYPE_CHECKING:
    from ..evaluate import Evaluation
    from ..ops import Card
    from ..store import Candidate, Store
    from ._ledger import RunLedger
    from ._settings import Budget
    from ._tree import Tree


class CardSearch(Protocol):
    """What a decision reads of a card's search (``_card_search.CardSearch`` is the one kforge runs): typed here so
    that this module does not import the search that imports it."""

    card: "Card"
    store: "Store"
    tree: "Tree"
    budget: "Budget"
    ledger: "RunLedger"
    evaluator: Any
    examples: Any
    evaluated: int
    reason: str

    def judge(self, source: str, seed: int) -> "Evaluation": ...

CONFIRM_TOP = 3             # the best candidates tried, in order, until one is confirmed faster
CONFIRMATIONS_PER_CARD = 3  # confirmations one decision may take, over all the candidates it tries
CONFIRMATIONS_PER_CANDIDATE = 2
BASELINE_MOVED = 3.0  # eager's times across evaluations differ by more than this many of its spreads: it moved
LEAST_GAIN = 0.02     # a winner's speedup interval starts above 1 + this (the judge's least noise margin)
# NB: two timings of one kernel further apart than this ratio cannot support a verdict (a card's speedup
# must repeat within it across runs: issue 41); a group_norm kernel's two timings agreed within 1.2x in 5 of
# 7 pairs on the loaded 2-core CPU (docs/benchmarks.md, 2026-12-06).
TIMINGS_AGREE = 1.3


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


def eager_range(candidates: list["Candidate"]) -> tuple[float, float] | None:
    """The least and the largest of the judge's eager times over these candidates' correct timings."""
    times = [e.eager_us for c in candidates for e in c.timings if e.eager_us]
    return (min(times), max(times)) if times else None


def judge_eager_us(candidates: list["Candidate"]) -> float | None:
    """The judge's eager time over these candidates' correct timings (their median): the baseline the
    search timed against."""
    times = [e.eager_us for c in candidates for e in c.timings if e.eager_us]
    return statistics.median(times) if times else None


def eager_movement(candidates: list["Candidate"], decided: "Candidate") -> tuple[float, float] | None:
    """The least and the largest eager time over a card's correct timings (every candidate's first timing and
    confirmations), leaving out the first timing of ``decided`` once it is confirmed: that timing made it the
    best of several, and a load spike that slowed eager is one way to become best."""
    times = [e.eager_us for c in candidates
             for e in ((c.evaluation,) if c.id != decided.id or not c.confirmations else ()) + c.confirmations
             if e is not None and not is_infra_failure(e) and e.status.is_correct and e.eager_us]
    return (min(times), max(times)) if times else None


def wants_confirmation(cand: "Candidate") -> bool:
    """Whether a candidate needs another timing before its card is decided: it has none; or its one
    confirmation disagrees with the search's timing beyond the noise (further apart than ``TIMINGS_AGREE``,
    or faster by its figure but within its own noise of eager), so a second decides."""
    if not cand.confirmations:
        return True
    if len(cand.confirmations) >= CONFIRMATIONS_PER_CANDIDATE:
        return False
    first, conf = cand.evaluation, cand.confirmations[0]
    if not conf.status.is_correct or first is None or is_infra_failure(first) or not first.status.is_correct:
        return False
    if conf.speedup <= 0 or first.speedup <= 0:
        return False
    apart = max(first.speedup, conf.speedup) / min(first.speedup, conf.speedup) > TIMINGS_AGREE
    alone = pool_timings([(conf.speedup, timing_noise(conf))])
    return apart or (alone is not None and call(alone) is Call.NOISY)


def elsewhere(search: "CardSearch", index: int):
    """Where a candidate's confirmation number ``index`` (from 0) is timed: the evaluator's second judge process
    (``Evaluator.evaluate_elsewhere``) for the first, the search's own judge for the second, so that two
    confirmations come from two processes; None (the search's judge) where the evaluator has no second process
    or the card is timed on a GPU (not measured there yet: docs/architecture.md, "Verdicts")."""
    other = getattr(search.evaluator, "evaluate_elsewhere", None)
    if other is None or index % 2 or backend_of(search.card.variant.device) == "cuda":
        return None
    return other


def confirm(search: "CardSearch", cand: "Candidate", allowed: int) -> tuple["Candidate", int]:
    """Time ``cand`` again as ``wants_confirmation`` asks, at most ``allowed`` times, the first in another judge
    process than the search's (``elsewhere``); store each timing. Returns the candidate with its confirmations and
    how many of ``allowed`` are left."""
    while allowed > 0 and wants_confirmation(cand):
        seed = cand.id + 7919 * (len(cand.confirmations) + 1)
        other = elsewhere(search, len(cand.confirmations))
        ev = (other(search.card.variant, cand.source, search.examples, seed=seed) if other is not None
              else search.judge(cand.source, seed=seed))
        allowed -= 1
        if is_infra_failure(ev):
            break
        search.store.add_confirmation(cand.id, ev)
        cand = replace(cand, confirmations=cand.confirmations + (ev,))
        search.tree.nodes[cand.id].candidate = cand
    return cand, allowed


def process_movement(search: "CardSearch", cand: "Candidate") -> float | None:
    """How far apart ``cand``'s timings in two judge processes are (the larger over the smaller), or None where they
    do not come from two (``elsewhere``: no second process, or a GPU card). With two confirmations, the first timed
    in the second judge and the second in the search's: their ratio. With one (it agreed with the search's timing
    within ``TIMINGS_AGREE``): its ratio to the search's own timing, which selection flattered, so this can only
    overstate the movement, never hide it."""
    if elsewhere(search, 0) is None or not cand.confirmations:
        return None
    pair = _process_pair(cand)
    if any(e is None or not e.status.is_correct or e.speedup <= 0 for e in pair):
        return None
    a, b = pair[0].speedup, pair[1].speedup
    return max(a, b) / min(a, b)


def across_processes(est: SpeedupEstimate, moved: float) -> SpeedupEstimate:
    """``est`` with its interval reaching at least as far as ``moved`` (``process_movement``) on either side of its
    figure: another run, a fresh process, may state a figure as far from this one as this run's two processes were
    from each other."""
    return replace(est, low=min(est.low, est.speedup / moved), high=max(est.high, est.speedup * moved))


def _processes_disagree(cand: "Candidate", est: SpeedupEstimate, moved: float) -> str:
    return (f"candidate {cand.id}: {est.speedup:.2f}x, but its timings in two judge processes differ by {moved:.2f}x "
            f"({_speeds(_process_pair(cand))}), and {est.speedup:.2f}x / {moved:.2f} = {est.speedup / moved:.2f}x does "
            "not clear eager: another run could state eager, so eager stays (search again on a quieter machine)")


def _process_pair(cand: "Candidate") -> tuple:
    return tuple(cand.confirmations[:2]) if len(cand.confirmations) >= 2 else (cand.evaluation, cand.confirmations[0])


def _speeds(evaluations) -> str:
    return " and ".join(f"{e.speedup:.2f}x" for e in evaluations)


def _disagreement(cand: "Candidate", est: SpeedupEstimate) -> str:
    first = f"; the search's timing {cand.first_speedup:.2f}x" if cand.confirmations else ""
    if est.agreement > TIMINGS_AGREE:
        return (f"candidate {cand.id}: its confirmations ({_speeds(cand.timings)}{first}) disagree by more than "
                f"{TIMINGS_AGREE:g}x: the timing cannot support a verdict, so eager stays (search again on a "
                "quieter machine)")
    return (f"candidate {cand.id}: {est.speedup:.2f}x ({est.low:.2f}-{est.high:.2f}{first}) is within the noise of "
            "eager: eager stays (search again on a quieter machine)")


def unresolved(cand: "Candidate", est: SpeedupEstimate, moved: tuple[float, float] | None) -> str | None:
    """Why a candidate's gain cannot be told apart from eager's own movement, or None when it can: the time it
    saves a call (the least eager time over the card's timings, since load only adds time, less the kernel's
    pooled over its own timings) is no more than the span of eager's times over the card's timings
    (``eager_movement``). Eager's time is the same work each time it is timed,
    so that span is noise the timer showed on this card; a gain inside it could be that noise."""
    eager = _pooled_eager(cand)
    if eager is None or moved is None:
        return None
    kernel = eager / est.speedup
    gain, span = moved[0] - kernel, moved[1] - moved[0]
    if gain > span:
        return None
    moves = (f"eager's own time moved between the card's evaluations ({moved[0]:.1f} to {moved[1]:.1f} us): below "
             "what the timer resolves here, so eager stays (search again on a quieter machine)")
    if gain <= 0:
        # NB: the ratio is taken against the eager of the kernel's own timings; eager read faster elsewhere on the card
        return (f"candidate {cand.id}: {est.speedup:.2f}x over the eager of its own timings, but its {kernel:.1f} us a "
                f"call is no faster than eager's least time on this card, and {moves}")
    return f"candidate {cand.id}: {est.speedup:.2f}x saves {gain:.1f} us a call, no more than {moves}"


def contended(cand: "Candidate") -> str | None:
    """Why a CPU candidate's timings cannot decide its card because other processes held cores they needed
    (``Evaluation.contended``: fewer idle cores than the run's threads), or None. Eager's parallel regions then
    wait at their barriers for a preempted thread: a group_norm read 7.8 ms instead of ~80 us, and its kernel
    "won" at 101x in two judge processes (the loaded 2-core CPU, 2026-12-07)."""
    held = [e for e in cand.timings if e.contended]
    if not held:
        return None
    e = held[0]
    return (f"candidate {cand.id}: {len(held)} of its {len(cand.timings)} timings ran at {e.threads} threads while "
            f"other processes left {e.idle_cores} core{'s' * (e.idle_cores != 1)} idle: eager's time then says more "
            "of the load than of eager, so eager stays (search again on a quieter machine, or with fewer threads: "
            "Evaluator(cpu_threads=...))")


def _pooled_eager(cand: "Candidate") -> float | None:
    timed = cand.timings
    if not timed or not all(e.eager_us for e in timed):
        return None
    return math.exp(statistics.fmean(math.log(e.eager_us) for e in timed))


def decide(search: "CardSearch") -> CardVerdict:
    """Decide the card of ``search``, store the verdict, and return it."""
    store, card, tree = search.store, search.card, search.tree
    stored = store.result(card.key)
    can_confirm = search.budget.confirm and not search.ledger.stopping
    if stored is not None and search.evaluated == 0 and not (
            can_confirm and stored.status.has_winner and not stored.confirmed):
        return stored
    # NB: by the search's timing: the candidates it called faster are the ones worth confirming
    first_faster = [n for n in tree.evaluated if n.candidate.evaluation is not None
                    and n.candidate.evaluation.status.is_win and n.candidate.status.is_correct]
    backend = backend_of(card.variant.device)
    winners = rank_winners(first_faster, backend)
    common = dict(candidates=len(tree), search_ended=search.reason,
                  evaluations=sum(1 for n in tree.evaluated))
    verdict = None
    noisy: list[str] = []
    allowed = CONFIRMATIONS_PER_CARD if can_confirm else 0
    for node in winners[:CONFIRM_TOP]:
        cand, allowed = confirm(search, node.candidate, allowed)
        est = cand.estimate
        if est is None:   # a confirmation was not correct
            continue
        moved = process_movement(search, cand)
        if moved is not None and call(est) is Call.FASTER and call(across_processes(est, moved)) is not Call.FASTER:
            noisy.append(_processes_disagree(cand, est, moved))
            continue
        if moved is not None:
            est = across_processes(est, moved)
        what = call(est)
        # NB: host time only: on a GPU, CUDA events time the kernel on the device and eager's moves follow the host's
        # pace (``rank_winners``), so a move there is no measure of the timer's noise on the kernel
        if what is Call.FASTER and backend != "cuda":
            why = contended(cand) or unresolved(cand, est, eager_movement([n.candidate for n in tree.evaluated], cand))
            if why is not None:
                noisy.append(why)
                continue
        if what is Call.NOISY:
            noisy.append(_disagreement(cand, est))
            continue
        if what is Call.NOT_FASTER:
            continue
        confirmed = bool(cand.confirmations)
        eager = _pooled_eager(cand)
        measured = cand.measured
        timings = f"{est.timings} confirmation{'s' * (est.timings > 1)}" if confirmed else "timed once: not confirmed"
        # NB: a CPU verdict holds for the threads both sides got (the run's count, Evaluator.cpu_threads): at 2
        # threads on the 2-core CPU eager beat kernels that won at 1 (2026-12-07), so the verdict says which
        threads = sorted({e.threads for e in cand.timings if e.threads})
        span = f"{threads[0]}" + (f"-{threads[-1]}" if len(threads) > 1 else "") if threads else ""
        threads_note = f", {span} thread{'s' * (threads[-1] > 1)}" if threads else ""
        verdict = CardVerdict(
            CardStatus.WINNER, f"candidate {cand.id}: {est.speedup:.2f}x over the judge's eager "
            f"({est.low:.2f}-{est.high:.2f}, {timings}{threads_note}"
            + (f"; the search's timing {cand.first_speedup:.2f}x)" if confirmed else ")"),
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
