"""Deciding whether a candidate is correct and how fast it is, in worker processes."""
from __future__ import annotations

from ._pool import Evaluator
from ._result import Evaluation, Status
from ._worker import Job
from .timing import Timing, bench, bench_many, bench_pair

__all__ = ["Evaluation", "Evaluator", "Job", "Status", "Timing", "bench", "bench_many", "bench_pair"]
