"""A card's verdict: a winner only if correct and faster than eager beyond the noise, confirmed.

A stored verdict changes only when new evidence is measured: a search that evaluated nothing new
keeps the stored verdict, and a candidate is confirmed (timed a second time) once; that timing is
stored and is its speedup from then on.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..kernels import backend_of
from ..ops import CardStatus, CardVerdict
from ..store import is_infra_failure

if TYPE_CHECKING:
    from ._card_search import CardSearch

CONFIRM_TOP = 3  # the best candidates tried, in order, until one is confirmed faster
BASELINE_MOVED = 3.0  # eager's times across evaluations differ by more than this many of its spreads: it moved
SPREAD_FLOOR = 0.02   # the least relative spread assumed of a timing (a reported 0 is luck, not precision)


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


def decide(search: "CardSearch") -> CardVerdict:
    """Decide the card of ``search``, store the verdict, and return it."""
    store, card, tree = search.store, search.card, search.tree
    stored = store.result(card.key)
    can_confirm = search.budget.confirm and not search.owner.stopping
    if stored is not None and search.evaluated == 0 and not (
            can_confirm and stored.status.has_winner and not stored.confirmed):
        return stored
    winners = rank_winners([n for n in tree.evaluated if n.candidate.status.is_win],
                           backend_of(card.variant.device))
    common = dict(candidates=len(tree), search_ended=search.reason,
                  evaluations=sum(1 for n in tree.evaluated))
    verdict = None
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
        ev = cand.measured
        if ev is not None and ev.status.is_win:
            verdict = CardVerdict(CardStatus.WINNER, f"candidate {cand.id}: {ev.speedup:.2f}x over eager"
                                  + ("" if confirmed else " (timed once: not confirmed)"),
                                  winner_id=cand.id, speedup=ev.speedup, kernel_us=ev.candidate_us,
                                  eager_us=ev.eager_us, confirmed=confirmed, first_speedup=cand.first_speedup,
                                  roofline_fraction=ev.roofline_fraction, **common)
            break
    if verdict is None:
        best = tree.best()
        if not tree.evaluated:
            why = "no candidate was evaluated"
        elif best is None:
            why = "no candidate was correct"
        elif winners:
            why = "the best candidates were not faster when timed again (noise)"
        else:
            why = f"no correct candidate beat eager beyond the noise (best {best.score:.2f}x)"
        verdict = CardVerdict(CardStatus.EAGER, why, **common)
    store.save_result(card.key, verdict)
    return verdict
