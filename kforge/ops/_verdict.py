"""A card's verdict: what its search decided, as a frozen record (optuna's FrozenTrial/TrialState).

Defined beside ``Card`` so that the store, the search, the session and the views read one type
rather than a dict by string keys. ``pool_timings`` is the one rule that turns a candidate's
timings into the speedup that every table, view, export and summary shows.
"""
from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

# The least relative uncertainty assumed of one timing of a speedup: a reported spread of 0 is
# luck, not precision.
SPREAD_FLOOR = 0.02


class CardStatus(str, enum.Enum):
    """Where a card stands. The values are the words the tables and views show."""

    NOT_SEARCHED = "not searched"
    SEARCHING = "searching"       # only shown by views while a run is on the card; never stored
    WINNER = "winner"             # a kernel's timings put it faster than the judge's eager beyond their noise
    NOISY = "noisy"               # searched; the timings could not support a verdict, so eager stays
    EAGER = "eager"               # searched; eager stays (the verdict says why)

    @property
    def is_searched(self) -> bool:
        return self in (CardStatus.WINNER, CardStatus.NOISY, CardStatus.EAGER)

    @property
    def has_winner(self) -> bool:
        return self is CardStatus.WINNER


@dataclass(frozen=True)
class SpeedupEstimate:
    """A speedup over the judge's eager time, pooled from one or more timings, with its noise.

    ``speedup`` is the geometric mean of the timings' speedups. ``low`` .. ``high`` is that mean
    divided and multiplied by one plus its noise (the timings' own noise, root mean square, over the
    square root of their number), and always spans the timings themselves. ``agreement`` is the
    largest timing over the smallest (1.0 for one timing).
    """

    speedup: float
    low: float
    high: float
    timings: int
    agreement: float = 1.0


def pool_timings(timings: Sequence[tuple[float, float]]) -> SpeedupEstimate | None:
    """Pool ``(speedup, relative uncertainty)`` pairs, one per timing of the same kernel against eager;
    None when there is none or one is not a positive speedup."""
    if not timings or any(s <= 0 or not math.isfinite(s) for s, _ in timings):
        return None
    noise = [max(SPREAD_FLOOR, u if math.isfinite(u) else 1.0) for _, u in timings]
    speeds = [s for s, _ in timings]
    pooled = math.exp(sum(math.log(s) for s in speeds) / len(speeds))
    u = math.sqrt(sum(x * x for x in noise) / len(noise) / len(noise))
    low, high = min(pooled / (1.0 + u), min(speeds)), max(pooled * (1.0 + u), max(speeds))
    return SpeedupEstimate(pooled, low, high, len(speeds), max(speeds) / min(speeds))


@dataclass(frozen=True)
class CardVerdict:
    """The outcome of a card's search.

    ``winner_speedup`` is the card's speedup, the one figure every table, view, export and summary
    shows: the winner's confirmations (timings taken after the search chose it) against the judge's eager
    time, pooled, within ``speedup_low`` .. ``speedup_high``; None where eager stays. ``eager_us``
    is the judge's eager time (the baseline the search timed against), ``kernel_us`` the winner's at
    the same pooling. On a card without a winner, ``best_candidate_speedup`` is the best correct
    candidate's single timing, unconfirmed: a hint, never the card's speedup.
    """

    status: CardStatus
    reason: str
    winner_id: int | None = None
    winner_speedup: float | None = None   # the card's speedup over the judge's eager; None without a winner
    speedup_low: float | None = None      # the winner's speedup interval (its timings, each with its noise)
    speedup_high: float | None = None
    kernel_us: float | None = None        # the winner's time, pooled like winner_speedup
    eager_us: float | None = None         # the judge's eager time: the search's baseline (any searched card)
    confirmed: bool = False               # the figure is from confirmations (False: confirm off, or stopping)
    first_speedup: float | None = None    # the winner's speedup when the search first timed it (history)
    best_candidate_speedup: float | None = None  # no winner: the best correct candidate's one timing (unconfirmed)
    roofline_fraction: float | None = None
    candidates: int = 0                   # candidates in the card's tree when it was decided
    evaluations: int = 0                  # evaluations that count (failures outside the candidate's control do not)
    search_ended: str = ""                # why the search of the card ended

    @property
    def speedup_label(self) -> str:
        """The card's speedup with how it was measured, e.g. "1.52x confirmed (1.41-1.63)"."""
        return speedup_label(self.status, self.winner_speedup, self.speedup_low, self.speedup_high, self.confirmed)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "CardVerdict":
        """Read a stored verdict (also those of stores written before the card's speedup had its own name,
        and the dicts of stores written before verdicts were records)."""
        d = dict(d)
        status = CardStatus(d.get("status", CardStatus.EAGER.value))
        if "winner_speedup" not in d and status.has_winner:
            d["winner_speedup"] = d.get("speedup")
        names = set(cls.__dataclass_fields__)
        d = {k: v for k, v in d.items() if k in names}
        d["status"] = status
        d.setdefault("reason", "")
        return cls(**d)


def speedup_label(status: CardStatus, speedup: float | None, low: float | None, high: float | None,
                  confirmed: bool) -> str:
    """How a card's speedup reads in the tables: "-" without a winner."""
    if not status.has_winner or not speedup:
        return "-"
    interval = f" ({low:.2f}-{high:.2f})" if low and high else ""
    return f"{speedup:.2f}x {'confirmed' if confirmed else 'single timing'}{interval}"
