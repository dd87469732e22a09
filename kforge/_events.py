"""Progress events a run publishes: views, progress bars and logs subscribe to them."""
from __future__ import annotations

import enum
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence


class EventKind(str, enum.Enum):
    RUN_STARTED = "run_started"
    CARD_STARTED = "card_started"
    PROPOSED = "proposed"
    EVALUATED = "evaluated"
    NEW_BEST = "new_best"
    PROPOSER_FAILED = "proposer_failed"
    EXHAUSTED = "exhausted"          # the proposer has nothing new for the card: its search ends (not a failure)
    CARD_FINISHED = "card_finished"
    BUDGET_REACHED = "budget_reached"
    PAUSED = "paused"
    RESUMED = "resumed"
    ERROR = "error"
    RUN_FINISHED = "run_finished"


@dataclass(frozen=True)
class Event:
    kind: EventKind
    card_key: str | None = None
    candidate_id: int | None = None
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)


# An ETA is given only once this many evaluations and this fraction of the planned work are done: before, a
# rate says little (the first ETA of one CPU run said 5 s for a run of 30 s: compiles and first timings).
ETA_AFTER_EVALUATIONS = 3
ETA_AFTER_FRACTION = 0.1


@dataclass(frozen=True)
class Released:
    """Budget a card (or the run) did not use, taken out of the run's total, and why."""

    card_key: str | None
    units: int
    why: str


@dataclass(frozen=True)
class Progress:
    """How far a run has got, counted from its events: the one record that the command line's progress line
    and the notebook's progress view read.

    Budget units are what a card's ``iterations`` counts: candidates judged and proposer failures (a failed
    or repeated proposal). The total is planned once, when the run starts (``RUN_STARTED``'s ``planned``),
    and only shrinks, by what a finished card left unused or a run that ended early never started, each
    with its reason (``released``)."""

    evaluated: int                  # candidates judged (evaluations that count)
    proposer_failures: int          # proposals that failed or repeated a source: budget used, nothing judged
    planned: int                    # budget units planned when the run started
    total: int                      # planned, less ``released``
    released: tuple[Released, ...]
    cards_done: int
    cards_total: int
    elapsed_s: float                # since the run started, pauses left out
    eta_s: float | None             # None until the rate means something (see ETA_AFTER_*), and once done
    finished: bool = False

    @property
    def used(self) -> int:
        """Budget units used: evaluations and proposer failures."""
        return self.evaluated + self.proposer_failures

    def line(self) -> str:
        """E.g. "37 evaluated, 27 proposer failures: 64 of 84 budget units · 2 / 5 cards · 41 s · ETA 13 s"."""
        fails = f", {self.proposer_failures} proposer failure{'s' * (self.proposer_failures != 1)}"
        shrunk = f" (planned {self.planned}; {self.planned - self.total} unused)" if self.total != self.planned else ""
        eta = "" if self.finished else " · ETA " + ("—" if self.eta_s is None else duration(self.eta_s))
        return (f"{self.evaluated} evaluated{fails if self.proposer_failures else ''}: {self.used} of {self.total} "
                f"budget units{shrunk} · {self.cards_done} / {self.cards_total} cards · "
                f"{duration(self.elapsed_s)}{eta}")

    @classmethod
    def of(cls, events: Sequence[Event], *, cards_total: int, iterations: int, now: float | None = None
           ) -> "Progress":
        """The progress the events of one run say (``now``: the time the elapsed time and ETA are read at)."""
        planned: dict[str, int] | None = None
        used: dict[str | None, int] = {}
        evaluated = failures = cards_done = 0
        released: list[Released] = []
        finished: set[str] = set()
        started = ended = paused_at = None
        run_ended = ""
        paused = 0.0
        for e in events:
            kind = e.kind
            if kind is EventKind.RUN_STARTED:
                started = e.time
                if isinstance(e.data.get("planned"), dict):
                    planned = {str(k): int(v) for k, v in e.data["planned"].items()}
            elif kind is EventKind.EVALUATED and e.data.get("counts", True) or kind is EventKind.PROPOSER_FAILED:
                evaluated += kind is EventKind.EVALUATED
                failures += kind is EventKind.PROPOSER_FAILED
                used[e.card_key] = used.get(e.card_key, 0) + 1
            elif kind is EventKind.CARD_FINISHED and e.card_key not in finished:
                cards_done += 1
                finished.add(e.card_key)
                left = (planned or {}).get(e.card_key, iterations) - used.get(e.card_key, 0)
                if left > 0:
                    released.append(Released(e.card_key, left, str(e.data.get("ended") or e.message)))
            elif kind is EventKind.PAUSED:
                paused_at = e.time
            elif kind is EventKind.RESUMED and paused_at is not None:
                paused += e.time - paused_at
                paused_at = None
            elif kind is EventKind.BUDGET_REACHED:
                run_ended = e.message
            elif kind is EventKind.RUN_FINISHED:
                ended = e.time
                why = dict((k, w) for k, w in e.data.get("left_out", ()))
                for key in (planned or {}):
                    if key not in finished and planned[key] - used.get(key, 0) > 0:
                        released.append(Released(key, planned[key] - used.get(key, 0),
                                                 why.get(key, f"not searched: {run_ended or 'the run ' + e.message}")))
        total_planned = sum(planned.values()) if planned is not None else cards_total * iterations
        total = max(total_planned - sum(r.units for r in released), 0)
        now = time.time() if now is None else now
        elapsed = 0.0 if started is None else max(
            (ended or paused_at or now) - started - paused, 0.0)
        done = evaluated + failures
        eta = None
        if (ended is None and elapsed > 0 and evaluated >= ETA_AFTER_EVALUATIONS and total > done
                and done >= ETA_AFTER_FRACTION * total):
            eta = (total - done) * elapsed / done
        return cls(evaluated, failures, total_planned, total, tuple(released), cards_done, cards_total, elapsed,
                   eta, ended is not None)


def duration(seconds: float) -> str:
    """"41 s", "3 min 20 s", "1 h 05 min"."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def print_progress(event: Event, stream=None) -> None:
    """A plain-text progress line per event, for the command line."""
    stream = stream or sys.stderr
    if event.kind in (EventKind.PROPOSED,):
        return
    card = f"[{event.card_key[:8]}] " if event.card_key else ""
    print(f"{event.kind.value:>15}  {card}{event.message}", file=stream, flush=True)
