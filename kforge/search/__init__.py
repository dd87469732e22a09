"""Search: MCTS (and the policies it is measured against) over candidate kernels, per card."""
from __future__ import annotations

from ._events import Event, EventKind, Progress, print_progress
from ._planner import PlannedCard, plan
from ._results import CardResult, Results
from ._run import Budget, OptimizationRun, RunState
from ._tree import (MCTS, POLICIES, BestOfN, LinearRefinement, Node, SearchPolicy, Strategy, Tree, make_policy,
                    make_strategy)

__all__ = ["MCTS", "POLICIES", "BestOfN", "Budget", "CardResult", "Event", "EventKind", "LinearRefinement", "Node",
           "OptimizationRun", "PlannedCard", "Progress", "Results", "RunState", "SearchPolicy", "Strategy", "Tree",
           "make_policy", "make_strategy", "plan", "print_progress"]
