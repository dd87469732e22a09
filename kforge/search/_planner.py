"""Which cards to search first, and which to leave alone."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..ops import Card, Cards
from ..kernels import DeviceInfo


@dataclass(frozen=True)
class PlannedCard:
    card: Card
    headroom: float         # eager time over the bytes floor: how much faster it could get
    expected_gain: float    # share x (1 - 1/expected speedup): fraction of the model's time to win
    reason: str = ""


def plan(cards: Cards | Sequence[Card], device: DeviceInfo, *, ops: Sequence[str] | None = None,
         keys: Sequence[str] | None = None, include_vendor: bool = False, max_cards: int | None = None,
         ) -> tuple[list[PlannedCard], list[PlannedCard]]:
    """Rank cards by expected end-to-end gain. Returns (chosen, skipped with a reason each).

    The expected speedup is the headroom to the bandwidth floor, capped at 4x: a card already near
    the floor has little to give however large its share.
    """
    chosen, skipped = [], []
    for card in cards:
        floor = card.roofline_us(device.bandwidth_gbs)
        headroom = card.eager_us / floor if floor > 0 else 1.0
        expected = min(max(headroom, 1.0), 4.0)
        pc = PlannedCard(card, headroom, card.share * (1 - 1 / expected))
        if keys is not None and not any(card.key.startswith(k) for k in keys):
            skipped.append(PlannedCard(pc.card, pc.headroom, pc.expected_gain, "not picked"))
        elif ops is not None and card.op not in ops:
            skipped.append(PlannedCard(pc.card, pc.headroom, pc.expected_gain, f"op {card.op} not picked"))
        elif card.vendor and not include_vendor and keys is None and ops is None:
            skipped.append(PlannedCard(pc.card, pc.headroom, pc.expected_gain,
                                       f"eager uses {card.vendor}; pass include_vendor=True to search it"))
        else:
            chosen.append(pc)
    chosen.sort(key=lambda p: -p.expected_gain)
    if max_cards is not None:
        for pc in chosen[max_cards:]:
            skipped.append(PlannedCard(pc.card, pc.headroom, pc.expected_gain, "beyond max_cards"))
        chosen = chosen[:max_cards]
    return chosen, skipped
