"""Which winners are worth installing: a kernel's saving must exceed what dispatch costs the host."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from ..ops import Card


@dataclass(frozen=True)
class DispatchCost:
    """Extra host time per call over eager's own, for a dispatched kernel and for a guard miss."""

    hit_us: float
    miss_us: float


# NB: measured on the H200 machine, 2026-11-30 (benchmarks/deploy_overhead.py): eager 9.2 us,
# dispatched 18.7 us, guard miss 11.8 us per call. The CPU backend is for tests: no filter.
DISPATCH_COST = {"cuda": DispatchCost(hit_us=9.5, miss_us=2.5), "cpu": DispatchCost(hit_us=0.0, miss_us=0.0)}


@dataclass(frozen=True)
class Winner:
    card: Card
    eager_us: float     # eager and kernel time of one call, measured in the same evaluation
    kernel_us: float


def select_winners(cards: Iterable[Card], winners: Sequence[Winner], cost: DispatchCost
                   ) -> tuple[list[Winner], list[tuple[str, str]]]:
    """Keep an operator's winners only if, per forward, they save more than patching it costs.

    Patching an operator puts every call of it behind the guard, so the cost counts all its
    calls (misses) plus the extra of the dispatched ones. Returns (kept, skipped with a reason).
    """
    calls_by_op: dict[str, int] = {}
    for card in cards:
        calls_by_op[card.op] = calls_by_op.get(card.op, 0) + card.calls
    by_op: dict[str, list[Winner]] = {}
    for w in winners:
        by_op.setdefault(w.card.op, []).append(w)
    kept, skipped = [], []
    for op, ws in by_op.items():
        hits = sum(w.card.calls for w in ws)
        saving = sum(w.card.calls * (w.eager_us - w.kernel_us) for w in ws)
        overhead = hits * cost.hit_us + (calls_by_op.get(op, hits) - hits) * cost.miss_us
        if saving > overhead:
            kept.extend(ws)
        else:
            why = (f"saves {saving:.1f} us per forward but dispatching {op} costs the host about "
                   f"{overhead:.1f} us ({calls_by_op.get(op, hits)} calls); apply(all_winners=True) installs it anyway")
            skipped.extend((w.card.signature, why) for w in ws)
    return kept, skipped
