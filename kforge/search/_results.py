"""Per-card outcome of the search: what won, by how much, at what cost, or why eager stays."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ..ops import Cards, CardStatus, CardVerdict
from ..ops._verdict import speedup_label
from ..store import Store


@dataclass(frozen=True)
class CardResult:
    """A card with its verdict.

    ``winner_speedup`` is the card's speedup, the figure every view shows: the winner against the
    judge's eager time (``judge_eager_us``, the search's baseline), both timings pooled, within
    ``speedup_low`` .. ``speedup_high``; None without a winner. ``in_model_us`` and ``replayed_us`` are
    capture's figures for one call: inside the model's forward, and replayed alone in the user's process.
    """

    key: str
    op: str
    signature: str
    share: float
    status: CardStatus
    reason: str
    winner_id: int | None
    winner_speedup: float | None        # the card's speedup over the judge's eager; None without a winner
    speedup_low: float | None
    speedup_high: float | None
    confirmed: bool
    first_speedup: float | None          # the winner's first timing during the search (history)
    best_candidate_speedup: float | None  # no winner: the best correct candidate's speedup, unconfirmed
    judge_eager_us: float | None         # the judge's eager time: the baseline the search timed against
    kernel_us: float | None              # the winner's time, pooled like winner_speedup
    in_model_us: float                   # capture: one call's time inside the model's forward
    replayed_us: float                   # capture: one call replayed alone in the user's process
    candidates: int
    dollars: float
    roofline_fraction: float | None = None

    @property
    def speedup(self) -> float:
        """``winner_speedup``, 1.0 without a winner (what code written before the rename reads)."""
        return self.winner_speedup if self.status.has_winner and self.winner_speedup else 1.0

    @property
    def eager_us(self) -> float | None:
        """The judge's eager time (``judge_eager_us``)."""
        return self.judge_eager_us

    @property
    def speedup_label(self) -> str:
        return speedup_label(self.status, self.winner_speedup, self.speedup_low, self.speedup_high, self.confirmed)


class Results:
    """The search outcome of every card of a session, read from the store."""

    COLUMNS = ("key", "op", "signature", "share", "status", "winner_speedup", "speedup_low", "speedup_high",
               "confirmed", "first_speedup", "best_candidate_speedup", "judge_eager_us", "kernel_us", "in_model_us",
               "replayed_us", "candidates", "dollars", "roofline_fraction", "winner_id", "reason")

    def __init__(self, cards: Cards, store: Store):
        verdicts = store.results()
        counts: dict[str, int] = {}
        for c in store.candidates():
            counts[c.card_key] = counts.get(c.card_key, 0) + 1
        self.items: list[CardResult] = []
        for card in cards:
            v = verdicts.get(card.key) or CardVerdict(CardStatus.NOT_SEARCHED, "")
            won = v.status.has_winner
            self.items.append(CardResult(
                card.key, card.op, card.signature, card.share, v.status, v.reason, v.winner_id,
                v.winner_speedup if won else None, v.speedup_low if won else None, v.speedup_high if won else None,
                v.confirmed, v.first_speedup, None if won else v.best_candidate_speedup, v.eager_us,
                v.kernel_us if won else None, card.in_model_us, card.eager_us, counts.get(card.key, 0),
                store.dollars(card.key), v.roofline_fraction))

    def __iter__(self) -> Iterator[CardResult]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    @property
    def winners(self) -> list[CardResult]:
        return [r for r in self.items if r.status.has_winner]

    @property
    def noisy(self) -> list[CardResult]:
        """Cards whose timings could not support a verdict: they stay on eager."""
        return [r for r in self.items if r.status is CardStatus.NOISY]

    def to_records(self) -> list[dict]:
        return [{c: (getattr(r, c).value if c == "status" else getattr(r, c)) for c in self.COLUMNS}
                for r in self.items]

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.to_records(), columns=list(self.COLUMNS))

    def table(self) -> str:
        """The judge's eager time (the search's baseline) and the winner's time, the card's speedup, and
        where eager stays the best candidate's unconfirmed speedup in a column of its own."""
        def us(x: float | None) -> str:
            return f"{x:9.2f}" if x else f"{'-':>9}"

        def cand(r: CardResult) -> str:
            return f"{r.best_candidate_speedup:.2f}x" if r.best_candidate_speedup else "-"

        lines = [f"{'share':>6}  {'eager us (judge)':>16}  {'kernel us':>9}  {'in model us':>11}  "
                 f"{'speedup':<28}  {'best candidate (unconfirmed)':>28}  {'tried':>5}  {'status':<12}  signature"]
        for r in self.items:
            lines.append(f"{r.share * 100:5.1f}%  {us(r.judge_eager_us):>16}  {us(r.kernel_us)}  "
                         f"{us(r.in_model_us):>11}  {r.speedup_label:<28}  {cand(r):>28}  {r.candidates:5d}  "
                         f"{r.status.value:<12}  {r.signature}")
        total = sum(r.dollars for r in self.items)
        lines.append(f"{len(self.winners)} of {sum(r.status.is_searched for r in self.items)} searched cards "
                     f"have a winner; LLM cost ${total:.2f}")
        lines.append("speedup: the winner over the judge's eager time (its timings pooled, with their range); "
                     "eager us (judge): the baseline the search timed against; in model us: one call inside the "
                     "model's forward")
        if self.noisy:
            lines.append(f"noisy: {len(self.noisy)} card(s) whose timings could not support a verdict stay on eager "
                         "(search them again on a quieter machine)")
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.table())
