"""The deploy filter: winners whose saving is below the dispatch cost stay on eager."""
from __future__ import annotations

import torch

from kforge.capture import Card
from kforge.deploy._select import DispatchCost, Winner, select_winners




def test_frequent_small_winner_is_skipped_and_big_one_kept():
    small = Card.for_call("mul", torch.randn(8, 8), torch.randn(8, 8), calls=4)
    other_muls = Card.for_call("mul", torch.randn(4, 4), 2.0, calls=300)
    big = Card.for_call("group_norm", torch.randn(1, 8, 4, 4), 4, calls=2)
    cost = DispatchCost(hit_us=9.5, miss_us=2.5)
    kept, skipped = select_winners([small, other_muls, big],
                                   [Winner(small, 20.0, 11.0), Winner(big, 3000.0, 200.0)], cost)
    assert [w.card for w in kept] == [big]
    (sig, why), = skipped
    assert sig == small.signature and "304 calls" in why and "all_winners=True" in why


def test_no_cost_keeps_everything():
    c = Card.for_call("relu", torch.randn(3), calls=10)
    kept, skipped = select_winners([c], [Winner(c, 5.0, 4.9)], DispatchCost(0.0, 0.0))
    assert kept and not skipped
