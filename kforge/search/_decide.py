"""A card's verdict: a winner only if correct and faster than eager beyond the noise, confirmed.

A stored verdict changes only when new evidence is measured: a search that evaluated nothing new
keeps the stored verdict, and a candidate is confirmed (timed a second time) once; that timing is
stored and is its speedup from then on.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..ops import CardStatus, CardVerdict
from ..store import is_infra_failure

if TYPE_CHECKING:
    from ._card_search import CardSearch

CONFIRM_TOP = 3  # the best candidates tried, in order, until one is confirmed faster


def decide(search: "CardSearch") -> CardVerdict:
    """Decide the card of ``search``, store the verdict, and return it."""
    store, card, tree = search.store, search.card, search.tree
    stored = store.result(card.key)
    can_confirm = search.budget.confirm and not search.owner.stopping
    if stored is not None and search.evaluated == 0 and not (
            can_confirm and stored.status.has_winner and not stored.confirmed):
        return stored
    winners = sorted((n for n in tree.evaluated if n.candidate.status.is_win), key=lambda n: (-n.score, n.id))
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
