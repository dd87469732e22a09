"""Search: MCTS (and the policies it is measured against) over candidate kernels, per card."""
from __future__ import annotations

from .._events import Event, EventKind, Progress, print_progress
from ._ledger import TRANSITIONS, CardTally, IllegalTransition, RunLedger, RunState
from ._planner import PlannedCard, plan
from ._results import CardResult, Results
from ._run import OptimizationRun
from ._settings import Budget, RunSettings
from ._tree import MCTS, POLICIES, BestOfN, LinearRefinement, SearchPolicy, Tree, TreeNode, make_policy

__all__ = ["MCTS", "POLICIES", "TRANSITIONS", "BestOfN", "Budget", "CardResult", "CardTally", "Event", "EventKind",
           "IllegalTransition", "LinearRefinement", "OptimizationRun", "PlannedCard", "Progress", "Results",
           "RunLedger", "RunSettings", "RunState", "SearchPolicy", "Tree", "TreeNode", "make_policy", "plan",
           "print_progress"]
