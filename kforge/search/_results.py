"""Per-card outcome of the search: what won, by how much, at what cost, or why eager stays."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ..capture import Cards
from ..store import Store


@dataclass(frozen=True)
class CardResult:
    key: str
    op: str
    signature: str
    share: float
    eager_us: float
    status: str                 # "winner", "eager" (searched, fallback) or "not searched"
    reason: str
    winner_id: int | None
    speedup: float              # the winner's confirmed speedup; 1.0 on eager
    kernel_us: float | None
    candidates: int
    dollars: float
    roofline_fraction: float | None = None


class Results:
    """The search outcome of every card of a session, read from the store."""

    def __init__(self, cards: Cards, store: Store):
        verdicts = store.results()
        counts: dict[str, int] = {}
        for c in store.candidates():
            counts[c.card_key] = counts.get(c.card_key, 0) + 1
        self.items: list[CardResult] = []
        for card in cards:
            v = verdicts.get(card.key)
            self.items.append(CardResult(
                card.key, card.op, card.signature, card.share, card.eager_us,
                v["status"] if v else "not searched", v["reason"] if v else "", v["winner_id"] if v else None,
                v["speedup"] if v else 1.0, v.get("kernel_us") if v else None, counts.get(card.key, 0),
                store.dollars(card.key), v.get("roofline_fraction") if v else None))

    def __iter__(self) -> Iterator[CardResult]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    @property
    def winners(self) -> list[CardResult]:
        return [r for r in self.items if r.status == "winner"]

    def to_records(self) -> list[dict]:
        return [r.__dict__.copy() for r in self.items]

    def to_frame(self):
        import pandas as pd

        cols = ["key", "op", "signature", "share", "eager_us", "status", "speedup", "kernel_us", "candidates",
                "dollars", "roofline_fraction", "winner_id", "reason"]
        return pd.DataFrame([{c: getattr(r, c) for c in cols} for r in self.items], columns=cols)

    def table(self) -> str:
        lines = [f"{'share':>6}  {'eager us':>9}  {'best us':>9}  {'speedup':>7}  {'tried':>5}  {'status':<12}  signature"]
        for r in self.items:
            best = f"{r.kernel_us:9.2f}" if r.kernel_us else f"{'-':>9}"
            lines.append(f"{r.share * 100:5.1f}%  {r.eager_us:9.2f}  {best}  {r.speedup:6.2f}x  {r.candidates:5d}  "
                         f"{r.status:<12}  {r.signature}")
        total = sum(r.dollars for r in self.items)
        lines.append(f"{len(self.winners)} of {sum(r.status != 'not searched' for r in self.items)} searched cards "
                     f"have a winner; LLM cost ${total:.2f}")
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.table())
