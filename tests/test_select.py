"""The deploy filter: winners whose saving is below the dispatch cost stay on eager."""
from __future__ import annotations

import torch

from kforge.capture import Card
from kforge.deploy._select import DispatchCost, Winner, select_winners
from kforge.ops import get_spec


def _card(op, calls, *args):
    spec = get_spec(op)
    call = spec.bind(*args)
    return Card(spec.variant(call, [spec.reference(call.inputs, call.params)]), calls, 10.0, 0.1, None)


def test_frequent_small_winner_is_skipped_and_big_one_kept():
    small = _card("mul", 4, torch.randn(8, 8), torch.randn(8, 8))
    other_muls = _card("mul", 300, torch.randn(4, 4), 2.0)
    big = _card("group_norm", 2, torch.randn(1, 8, 4, 4), 4)
    cost = DispatchCost(hit_us=9.5, miss_us=2.5)
    kept, skipped = select_winners([small, other_muls, big],
                                   [Winner(small, 20.0, 11.0), Winner(big, 3000.0, 200.0)], cost)
    assert [w.card for w in kept] == [big]
    (sig, why), = skipped
    assert sig == small.signature and "304 calls" in why and "all_winners=True" in why


def test_no_cost_keeps_everything():
    c = _card("relu", 10, torch.randn(3))
    kept, skipped = select_winners([c], [Winner(c, 5.0, 4.9)], DispatchCost(0.0, 0.0))
    assert kept and not skipped
