"""What an evaluation says about a candidate."""
from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class Status(str, enum.Enum):
    """Outcome of evaluating one candidate. Exactly one per evaluation."""

    COMPILE_ERROR = "compile_error"   # the compiler rejected the source
    REJECTED = "rejected"             # the static screen refused the source before compiling (kernels/_screen.py)
    LAUNCH_ERROR = "launch_error"     # kf_launch returned an error (bad config, too much shared memory)
    CRASHED = "crashed"               # the runner died: segfault, illegal address, abort, broken protocol
    TIMED_OUT = "timed_out"           # no answer within the time limit; the runner was killed
    WRONG_RESULT = "wrong_result"     # ran, but an output disagreed with eager (or inputs changed)
    TIMING_MISMATCH = "timing_mismatch"  # the runner's clock disagrees with the judge's wall clock
    INFRA_ERROR = "infra_error"       # failed twice for reasons outside the candidate: evaluate it again later
    SLOWER = "slower"                 # correct, and slower than eager beyond the noise
    NO_GAIN = "no_gain"               # correct, within the timing noise of eager
    FASTER = "faster"                 # correct, and faster than eager beyond the noise

    @property
    def is_correct(self) -> bool:
        return self in (Status.SLOWER, Status.NO_GAIN, Status.FASTER)

    @property
    def is_failure(self) -> bool:
        return not self.is_correct

    @property
    def blames_candidate(self) -> bool:
        """False only for INFRA_ERROR: a search should not count it and should evaluate it again."""
        return self is not Status.INFRA_ERROR

    @property
    def is_win(self) -> bool:
        return self is Status.FASTER


@dataclass(frozen=True)
class Evaluation:
    """The evaluator's verdict on one candidate for one card, with everything a proposer needs."""

    status: Status
    message: str = ""
    compile_log: str = ""
    compile_s: float = 0.0
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    mismatch_fraction: float | None = None
    candidate_us: float | None = None
    eager_us: float | None = None
    candidate_spread: float | None = None   # coefficient of variation of the candidate's timings
    eager_spread: float | None = None
    speedup: float = 0.0                     # eager median / candidate median; 0 for failures
    roofline_fraction: float | None = None   # fewest bytes / candidate time, over measured bandwidth
    checks: tuple[str, ...] = field(default=())
    wall_s: float = 0.0
    sandbox: str = ""                        # what held in the runner (docs/security.md)
    phases: tuple[tuple[str, float], ...] = field(default=())  # (phase, judge's seconds) in order, for benchmarks
    threads: int | None = None               # CPU: the intra-op threads eager and the candidate both ran with
    idle_cores: int | None = None            # CPU: the cores other processes left idle around the timing (None: unknown)

    @property
    def contended(self) -> bool:
        """CPU: whether other processes held cores the timing's threads needed (fewer idle cores than threads):
        eager's parallel regions then wait at their barriers for a preempted thread, and its time says more of
        the load than of eager (a group_norm read 7.8 ms instead of ~80 us so, 2026-12-07)."""
        return bool(self.threads and self.idle_cores is not None and self.idle_cores < self.threads)

    @property
    def score(self) -> float:
        """Search value: the speedup if correct, 0 for every failure."""
        return self.speedup if self.status.is_correct else 0.0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        d["checks"] = list(self.checks)
        d["phases"] = [list(p) for p in self.phases]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Evaluation":
        d = dict(d)
        d["status"] = Status(d["status"])
        d["checks"] = tuple(d.get("checks", ()))
        d["phases"] = tuple((str(name), float(s)) for name, s in d.get("phases", ()))
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})

    def summary(self) -> str:
        if self.status.is_correct:
            return (f"{self.status.value}: {self.candidate_us:.2f} us vs eager {self.eager_us:.2f} us "
                    f"({self.speedup:.2f}x)")
        return f"{self.status.value}: {self.message}"
