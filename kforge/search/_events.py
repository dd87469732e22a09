"""Progress events a run publishes: views, progress bars and logs subscribe to them."""
from __future__ import annotations

import enum
import sys
import time
from dataclasses import dataclass, field
from typing import Any


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


def print_progress(event: Event, stream=None) -> None:
    """A plain-text progress line per event, for the command line."""
    stream = stream or sys.stderr
    if event.kind in (EventKind.PROPOSED,):
        return
    card = f"[{event.card_key[:8]}] " if event.card_key else ""
    print(f"{event.kind.value:>15}  {card}{event.message}", file=stream, flush=True)
