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
