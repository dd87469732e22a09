"""Search: MCTS (and the strategies it is measured against) over candidate kernels, per card."""
from __future__ import annotations

from ._events import Event, EventKind, print_progress
from ._planner import PlannedCard, plan
from ._results import CardResult, Results
from ._run import Budget, OptimizationRun, RunState
from ._tree import MCTS, BestOfN, LinearRefinement, Node, Strategy, Tree, make_strategy

__all__ = ["MCTS", "BestOfN", "Budget", "CardResult", "Event", "EventKind", "LinearRefinement", "Node",
           "OptimizationRun", "PlannedCard", "Results", "RunState", "Strategy", "Tree", "make_strategy", "plan",
           "print_progress"]
