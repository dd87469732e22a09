"""A card's verdict: what its search decided, as a frozen record (optuna's FrozenTrial/TrialState).

Defined beside ``Card`` so that the store, the search, the session and the views read one type
rather than a dict by string keys.
"""
from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any


class CardStatus(str, enum.Enum):
    """Where a card stands. The values are the words the tables and views show."""

    NOT_SEARCHED = "not searched"
    SEARCHING = "searching"       # only shown by views while a run is on the card; never stored
    WINNER = "winner"             # a kernel was confirmed faster than eager
    EAGER = "eager"               # searched; eager stays (the verdict says why)

    @property
    def is_searched(self) -> bool:
        return self in (CardStatus.WINNER, CardStatus.EAGER)

    @property
    def has_winner(self) -> bool:
        return self is CardStatus.WINNER


@dataclass(frozen=True)
class CardVerdict:
    """The outcome of a card's search.

    ``speedup``, ``kernel_us`` and ``eager_us`` come from one evaluation of the winner: its
    confirmation (a second timing) when ``confirmed``, else the search's timing. The search's
    first timing of the winner is kept as history in ``first_speedup``.
    """

    status: CardStatus
    reason: str
    winner_id: int | None = None
    speedup: float = 1.0                  # the winner's speedup over eager; 1.0 on eager
    kernel_us: float | None = None        # the winner's time, from the same evaluation as eager_us
    eager_us: float | None = None         # eager's time as the evaluator measured it in that evaluation
    confirmed: bool = False               # speedup is from a second timing (False: confirm off, or stopping)
    first_speedup: float | None = None    # the winner's speedup when the search first timed it
    roofline_fraction: float | None = None
    candidates: int = 0                   # candidates in the card's tree when it was decided
    evaluations: int = 0                  # evaluations that count (failures outside the candidate's control do not)
    search_ended: str = ""                # why the search of the card ended

    @property
    def speedup_label(self) -> str:
        """The speedup with how it was measured, e.g. "1.52x confirmed"."""
        if not self.status.has_winner:
            return "-"
        return f"{self.speedup:.2f}x {'confirmed' if self.confirmed else 'single timing'}"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "CardVerdict":
        """Read a stored verdict (also the dicts of stores written before verdicts were records)."""
        names = set(cls.__dataclass_fields__)
        d = {k: v for k, v in d.items() if k in names}
        d["status"] = CardStatus(d.get("status", CardStatus.EAGER.value))
        d.setdefault("reason", "")
        return cls(**d)
