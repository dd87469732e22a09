"""kforge.timing: outliers are detected, noise is flagged, a speedup past the bandwidth floor is flagged."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kforge import timing
from kforge.timing import Timing, beyond_bandwidth_floor, bench, bandwidth_floor_us


def test_outliers_do_not_move_the_median_or_the_spread():
    samples = [10.0, 10.2, 9.9, 10.1, 10.0] * 4 + [900.0, 2000.0]  # two repetitions that waited for the scheduler
    t = Timing.of(samples)
    assert t.median_us == pytest.approx(10.0, abs=0.1)
    assert t.outliers == 2 and t.reps == 22
    assert t.mean_us == pytest.approx(10.04, abs=0.1) and t.spread < 0.05
    assert not t.noisy


def test_a_spread_too_wide_is_noisy():
    assert Timing.of([10, 30, 5, 60, 12, 90, 8, 40]).noisy
    assert Timing.of([10, 10, 10, 10], converged=False).noisy  # rounds that never agreed
    many_outliers = [10.0] * 6 + [500.0] * 4
    assert Timing.of(many_outliers).noisy


def test_rounds_run_until_two_agree():
    steady = iter(range(0, 10**9, 1000))
    t = bench(lambda: None, device="cpu", reps=5, warmup=0, flush_l2=False, max_rounds=4,
              clock=lambda: next(steady))
    assert t.rounds == 2 and not t.noisy and t.median_us == pytest.approx(1.0)


def test_bandwidth_floor():
    assert bandwidth_floor_us(1_000_000, 1000.0) == pytest.approx(1.0)
    msg = beyond_bandwidth_floor(1_000_000, 0.2, 1000.0)
    assert msg and "faster than moving" in msg and "1 MB" in msg
    assert beyond_bandwidth_floor(1_000_000, 1.5, 1000.0) is None


def test_timing_is_a_leaf_module():
    tree = ast.parse((Path(__file__).resolve().parents[1] / "kforge" / "timing.py").read_text())
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(n.level for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert not {m for m in imported if m.split(".")[0] not in {"__future__", "contextlib", "os", "statistics", "time",
                                                               "dataclasses", "typing", "torch"}}


def test_the_settled_time_ignores_a_busy_stretch_but_not_the_work():
    quiet = [100.0, 101.0, 99.0, 102.0, 100.5, 98.5]
    assert timing.settled_us(quiet) == 99.0                       # the second lowest of 6
    busy = quiet[:2] + [600.0, 900.0, 400.0] + quiet[5:]          # three batches slowed 4-9x
    assert timing.settled_us(busy) == 100.0
    assert timing.settled_us([250.0] * 5 + [1.0]) == 250.0       # one lucky or faked batch does not set it
    assert timing.Timing.of(busy).settled_us == timing.settled_us(busy)


def test_busy_window_takes_out_this_process_and_its_children(monkeypatch):
    stats = iter([(1000, 400), (1200, 450)])                      # 2 s of all cores, 1.5 s of it busy
    own = iter([10.0, 11.0])                                      # 1 s of it was this process
    monkeypatch.setattr(timing.BusyWindow, "_snapshot", staticmethod(lambda: next(stats)))
    monkeypatch.setattr(timing, "_own_cpu_s", lambda: next(own))
    monkeypatch.setattr(timing.os, "sysconf", lambda name: 100)
    with timing.BusyWindow() as busy:
        pass
    assert busy.busy_fraction == pytest.approx(0.25)
    monkeypatch.setattr(timing.os, "cpu_count", lambda: 4)
    assert busy.threads(8) == 3 and busy.threads(2) == 2


def test_busy_window_without_proc_stat_leaves_the_threads(monkeypatch):
    monkeypatch.setattr(timing.BusyWindow, "_snapshot", staticmethod(lambda: None))
    with timing.BusyWindow() as busy:
        pass
    assert busy.busy_fraction is None and busy.threads(5) == 5
