"""Deciding whether a candidate is correct and how fast it is: a trusted judge, an untrusted runner."""
from __future__ import annotations

from ._pool import Evaluator, Recording
from ._result import Evaluation, Status
from ._frames import Sandbox
from ._judge import Job, runner_sandbox
from .timing import Timing, bench, bench_many, bench_pair

__all__ = ["Evaluation", "Evaluator", "Job", "Recording", "Sandbox", "Status", "Timing", "bench", "bench_many", "bench_pair",
           "runner_sandbox"]
