"""What one run's card searches share and never change: the budget, and where to store, whom to ask, how to choose."""
from __future__ import annotations

from dataclasses import dataclass

from ..kernels import DeviceInfo
from ..proposers._base import Proposer
from ..store import Store
from ._tree import SearchPolicy


@dataclass(frozen=True)
class Budget:
    iterations: int = 50               # candidates per card (proposer failures count too)
    dollars: float | None = None       # LLM spending for the whole run
    seconds_per_card: float | None = None
    parallel: int = 1                  # proposals in flight at once
    max_proposer_failures: int = 3     # consecutive failures before a card gives up
    confirm: bool = True               # re-time the best candidate before declaring it the winner


@dataclass(frozen=True)
class RunSettings:
    """What every card's search in one run shares and never changes: where to store, whom to ask, how to
    choose, how much to spend."""

    store: Store
    proposer: Proposer
    policy: SearchPolicy
    budget: Budget
    device: DeviceInfo
    seed: int
    dollars_at_start: float     # the store's LLM spending when the run began

    def dollars(self) -> float:
        """What the run has spent on LLM calls so far."""
        return self.store.dollars() - self.dollars_at_start

    def over_dollars(self) -> bool:
        return self.budget.dollars is not None and self.dollars() >= self.budget.dollars
