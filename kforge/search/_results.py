"""Per-card outcome of the search: what won, by how much, at what cost, or why eager stays."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ..ops import Cards, CardStatus, CardVerdict
from ..store import Store


@dataclass(frozen=True)
class CardResult:
    """A card with its verdict. ``eager_us`` and ``kernel_us`` come from one evaluation of the winner
    (the evaluator's eager timing, not capture's ``captured_us``); both are None without a winner."""

    key: str
    op: str
    signature: str
    share: float
    captured_us: float          # one call's eager time as capture measured it
    status: CardStatus
    reason: str
    winner_id: int | None
    speedup: float              # the winner's speedup (its confirmation's when confirmed); 1.0 on eager
    confirmed: bool
    first_speedup: float | None  # the winner's first timing during the search (history)
    eager_us: float | None
    kernel_us: float | None
    candidates: int
    dollars: float
    roofline_fraction: float | None = None

    @property
    def speedup_label(self) -> str:
        if not self.status.has_winner:
            return "-"
        return f"{self.speedup:.2f}x {'confirmed' if self.confirmed else 'single timing'}"


class Results:
    """The search outcome of every card of a session, read from the store."""

    def __init__(self, cards: Cards, store: Store):
        verdicts = store.results()
        counts: dict[str, int] = {}
        for c in store.candidates():
            counts[c.card_key] = counts.get(c.card_key, 0) + 1
        self.items: list[CardResult] = []
        for card in cards:
            v = verdicts.get(card.key) or CardVerdict(CardStatus.NOT_SEARCHED, "")
            self.items.append(CardResult(
                card.key, card.op, card.signature, card.share, card.eager_us, v.status, v.reason, v.winner_id,
                v.speedup, v.confirmed, v.first_speedup, v.eager_us if v.status.has_winner else None,
                v.kernel_us if v.status.has_winner else None, counts.get(card.key, 0), store.dollars(card.key),
                v.roofline_fraction))

    def __iter__(self) -> Iterator[CardResult]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    @property
    def winners(self) -> list[CardResult]:
        return [r for r in self.items if r.status.has_winner]

    def to_records(self) -> list[dict]:
        out = []
        for r in self.items:
            d = r.__dict__.copy()
            d["status"] = r.status.value
            out.append(d)
        return out

    def to_frame(self):
        import pandas as pd

        cols = ["key", "op", "signature", "share", "captured_us", "status", "speedup", "confirmed", "first_speedup",
                "eager_us", "kernel_us", "candidates", "dollars", "roofline_fraction", "winner_id", "reason"]
        rows = [{c: (getattr(r, c).value if c == "status" else getattr(r, c)) for c in cols} for r in self.items]
        return pd.DataFrame(rows, columns=cols)

    def table(self) -> str:
        """Eager and kernel times come from the same evaluation of the winner; speedup says how it was timed."""
        def us(x: float | None) -> str:
            return f"{x:9.2f}" if x else f"{'-':>9}"

        lines = [f"{'share':>6}  {'eager us':>9}  {'kernel us':>9}  {'speedup':<19}  {'tried':>5}  {'status':<12}  "
                 "signature"]
        for r in self.items:
            lines.append(f"{r.share * 100:5.1f}%  {us(r.eager_us)}  {us(r.kernel_us)}  {r.speedup_label:<19}  "
                         f"{r.candidates:5d}  {r.status.value:<12}  {r.signature}")
        total = sum(r.dollars for r in self.items)
        lines.append(f"{len(self.winners)} of {sum(r.status.is_searched for r in self.items)} searched cards "
                     f"have a winner; LLM cost ${total:.2f}")
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.table())
