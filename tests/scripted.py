"""A proposer that replays a fixed list of sources: deterministic search tests."""
from __future__ import annotations

import threading

from kforge.proposers import Proposal, ProposalRequest, ProposerError, Usage


class ScriptedProposer:
    name = "scripted"

    def __init__(self, sources, dollars_per_call: float = 0.0, delay_s: float = 0.0):
        self.sources = list(sources)
        self.requests: list[ProposalRequest] = []
        self.dollars_per_call = dollars_per_call
        self.delay_s = delay_s
        self._lock = threading.Lock()

    def propose(self, request: ProposalRequest) -> Proposal:
        import time

        if self.delay_s:
            time.sleep(self.delay_s)
        with self._lock:
            i = len(self.requests)
            self.requests.append(request)
        if i >= len(self.sources):
            raise ProposerError("script exhausted")
        usage = Usage("scripted-model", 100, 50, 0, 0, self.dollars_per_call, 0.01)
        return Proposal(self.sources[i], f"scripted candidate {i}", usage=usage, prompt=f"prompt {i}",
                        response=f"response {i}")


def search_until_correct(session, keys, *, iterations: int, rounds: int = 3) -> dict:
    """Search ``keys`` with the built-in library until each card has a correct candidate (at most ``rounds`` runs:
    a judge that a loaded machine timed out may leave a card without one), then store the first correct candidate as
    the winner of each card whose timing gave none (tests of deployment, not of which kernel is faster). Returns each
    key's correct candidates, first first."""
    from kforge.ops import CardStatus, CardVerdict

    def correct(key):
        return [c for c in session.store.candidates(key) if c.status is not None and c.status.is_correct]

    for _ in range(rounds):
        todo = [k for k in keys if not correct(k)]
        if not todo:
            break
        session.optimize(proposer="builtin", iterations=iterations, cards=todo, confirm=False)
    verdicts = session.store.results()
    found = {}
    for key in keys:
        found[key] = correct(key)
        assert found[key], [(c.strategy, c.status) for c in session.store.candidates(key)]
        v = verdicts.get(key)
        if v is None or not v.status.has_winner:
            card = session.cards[key]
            session.store.save_result(key, CardVerdict(
                CardStatus.WINNER, "test: the search's first correct candidate", winner_id=found[key][0].id,
                winner_speedup=1.5, kernel_us=card.eager_us / 1.5, eager_us=card.eager_us,
                candidates=len(found[key])))
    return found
