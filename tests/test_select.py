"""The deploy filter: winners whose saving is below the dispatch cost stay on eager; the cost is
measured in this process, on this device, through the dispatch path in use."""
from __future__ import annotations

import pytest
import torch

from kforge.capture import Card
from kforge.deploy import LeftBy, PlannedKernel, _select, choose
from kforge.deploy._select import DispatchCost, dispatch_cost, measure_dispatch_cost


def _winner(card: Card, eager_us: float, kernel_us: float, op_calls: int) -> PlannedKernel:
    return PlannedKernel(card.variant, "", None, eager_us / kernel_us, card.calls, op_calls, eager_us, kernel_us)


def test_frequent_small_winner_is_skipped_and_big_one_kept():
    small = Card.for_call("mul", torch.randn(8, 8), torch.randn(8, 8), calls=4)
    other_muls = Card.for_call("mul", torch.randn(4, 4), 2.0, calls=300)
    big = Card.for_call("group_norm", torch.randn(1, 8, 4, 4), 4, calls=2)
    cost = DispatchCost(hit_us=9.5, miss_us=2.5)
    plan = choose([_winner(small, 20.0, 11.0, small.calls + other_muls.calls), _winner(big, 3000.0, 200.0, big.calls)],
                  device="cpu", dispatch_cost_given=cost)
    assert [k.variant for k in plan.kernels] == [big.variant] and plan.dispatch_cost == cost
    (left,) = plan.left_out
    assert left.signature == small.signature and left.by is LeftBy.DISPATCH_COST
    assert left.reason == ("saves 36.0 us per forward but dispatching mul costs about 788.0 us "
                           "(304 calls); apply(all_winners=True) installs it anyway")


def test_no_cost_keeps_everything():
    c = Card.for_call("relu", torch.randn(3), calls=10)
    plan = choose([_winner(c, 5.0, 4.9, c.calls)], device="cpu", dispatch_cost_given=DispatchCost(0.0, 0.0))
    assert plan.kernels and not plan.left_out


def test_region_winners_cost_no_eager_dispatch():
    """A region's kernel runs in compiled graphs only: no torch callable is patched for it."""
    import kforge  # noqa: F401  (registers the region spec)
    from kforge.ops import get_spec

    assert not any(t is not None for t in get_spec("region").targets)
    assert _select._patched_eagerly("softmax") and not _select._patched_eagerly("region")


def _untouched():
    from kforge.deploy._dispatch import DISPATCHER

    return "softmax" not in torch.Tensor.__dict__ and "softmax" not in DISPATCHER.tables


@pytest.fixture
def fresh(monkeypatch):
    """An empty measurement cache, so that the test measures (and the session's cache is untouched)."""
    monkeypatch.setattr(_select, "_MEASURED", {})


@pytest.mark.parametrize("path", ["C path", "Python path"])
def test_the_measured_cost_is_the_extra_over_eager_per_path_and_cached(fresh, monkeypatch, path):
    from kforge.deploy._fast import dispatch_type

    if path == "Python path":
        monkeypatch.setenv("KFORGE_FASTPATH", "0")
    elif dispatch_type() is None:
        pytest.skip("the C dispatch path cannot be built here")
    real, rows = _select.bench_many, []

    def recorded(*args, **kwargs):
        rows[:] = real(*args, **kwargs)
        return rows

    monkeypatch.setattr(_select, "bench_many", recorded)
    cost = measure_dispatch_cost("cpu", calls=200)
    assert cost.source == f"measured on cpu, {path}, served by a worker"   # the probe's calls go to its worker too
    # every row timed real calls, a microsecond-scale figure each: eager, hit, eager at the other shape, miss
    eager, hit, eager_other, miss = (t.min_us / 200 for t in rows)
    assert all(0 < us < 1000 for us in (eager, hit, eager_other, miss)), rows
    # the costs are the dispatched calls' extra time over eager's, none where dispatch was the quicker
    assert cost.hit_us == pytest.approx(max(0.0, hit - eager))
    assert cost.miss_us == pytest.approx(max(0.0, miss - eager_other))
    assert measure_dispatch_cost("cpu") is cost                  # cached per process, device and path
    assert _untouched()                                        # the probe's patch is gone again


def test_the_probe_never_replaces_an_installed_kernel(fresh):
    from kforge.deploy import DeployedKernel, Deployment
    from kforge.deploy._dispatch import DISPATCHER, variant_key
    from kforge.kernels import Kernel, compile_source
    from kforge.ops import get_spec

    spec = get_spec("softmax")
    x = torch.randn(*_select._PROBE_SHAPE)          # the very signature the probe would use first
    call = spec.bind(x, -1)
    variant = spec.variant(call, [spec.reference(call.inputs, call.params)])
    mine = DeployedKernel(variant, Kernel(compile_source(_select._PROBE_C, "cpu", "native").path))
    with Deployment([mine]) as dep:
        measure_dispatch_cost("cpu")
        assert DISPATCHER.tables["softmax"][variant_key(variant)] == (mine, dep)
        before = mine.calls
        torch.testing.assert_close(x.softmax(-1), torch._C.TensorBase.softmax(x, -1))
        assert mine.calls == before + 1
    assert _untouched()


def test_a_cost_that_cannot_be_measured_falls_back_with_a_warning(fresh, monkeypatch):
    import kforge.kernels

    def no_compiler(*a, **k):
        raise RuntimeError("no C compiler was found")

    monkeypatch.setattr(kforge.kernels, "compile_source", no_compiler)
    with pytest.warns(UserWarning, match="could not measure the dispatch cost on cpu .*no C compiler.*"
                                         "KFORGE_DISPATCH_COST"):
        cost = measure_dispatch_cost("cpu")
    assert cost is _select.FALLBACK["cpu"] and cost.source.startswith("fallback")


def test_the_cost_is_given_by_argument_or_environment(monkeypatch):
    given = DispatchCost(hit_us=1.0, miss_us=2.0)
    monkeypatch.setenv("KFORGE_DISPATCH_COST", "3.5, 0.25")
    assert dispatch_cost("cpu", given) is given
    assert dispatch_cost("cpu") == DispatchCost(3.5, 0.25, "KFORGE_DISPATCH_COST")
    monkeypatch.setenv("KFORGE_DISPATCH_COST", "fast")
    with pytest.raises(ValueError, match="two numbers"):
        dispatch_cost("cpu")
    monkeypatch.setattr(_select, "_MEASURED", {("cpu", _select._where("cpu")): given})
    monkeypatch.delenv("KFORGE_DISPATCH_COST")
    assert dispatch_cost("cpu") is given                       # neither: the measurement (cached)
