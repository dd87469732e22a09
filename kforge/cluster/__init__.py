"""Scale-out: evaluator actors on a Ray cluster, driven by the search in the user's process."""
from __future__ import annotations

from ._ray import EvaluatorWorker, RayCluster, RayEvaluator, WorkerInfo

__all__ = ["EvaluatorWorker", "RayCluster", "RayEvaluator", "WorkerInfo"]
