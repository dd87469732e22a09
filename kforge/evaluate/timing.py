"""One honest way to time a callable; every latency and speedup kforge reports comes from here.

CUDA: warm-up, then per-repetition CUDA events around the call with the L2 cache flushed before
each repetition, median of the repetitions. CPU: the same structure with a monotonic clock and
caches flushed by writing a buffer. ``bench_pair`` interleaves two callables
repetition by repetition so that both see the same clocks and the same neighbours.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

_FLUSH: dict[str, torch.Tensor] = {}


@dataclass(frozen=True)
class Timing:
    median_us: float
    mean_us: float
    min_us: float
    spread: float      # coefficient of variation (stdev / mean)
    reps: int

    @classmethod
    def of(cls, samples_us: Sequence[float]) -> "Timing":
        mean = statistics.fmean(samples_us)
        stdev = statistics.pstdev(samples_us) if len(samples_us) > 1 else 0.0
        return cls(statistics.median(samples_us), mean, min(samples_us), stdev / mean if mean else 0.0,
                   len(samples_us))


def _flush_buffer(device: str) -> torch.Tensor:
    if device not in _FLUSH:
        if device.startswith("cuda"):
            l2 = getattr(torch.cuda.get_device_properties(torch.device(device)), "L2_cache_size", 0) or (64 << 20)
            nbytes = max(2 * l2, 64 << 20)
        else:
            # NB: 8 MB flushes the per-core L2 of current CPUs, not a whole shared last-level
            # cache; writing more costs more time per repetition than the kernels being timed.
            nbytes = 8 << 20
        _FLUSH[device] = torch.empty(nbytes // 4, dtype=torch.int32, device=device)
    return _FLUSH[device]


def _cuda_samples(fns: Sequence[Callable[[], object]], device: str, reps: int, flush_l2: bool) -> list[list[float]]:
    buf = _flush_buffer(device) if flush_l2 else None
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
               for _ in range(reps)] for _ in fns]
    for r in range(reps):
        for fn, ev in zip(fns, events):
            if buf is not None:
                buf.zero_()
            ev[r][0].record()
            fn()
            ev[r][1].record()
    # NB: synchronise the whole device, not one stream: work a candidate moved to another stream
    # must finish before any clock is read.
    torch.cuda.synchronize(device)
    return [[s.elapsed_time(e) * 1e3 for s, e in ev] for ev in events]


def _cpu_samples(fns: Sequence[Callable[[], object]], device: str, reps: int, flush_l2: bool) -> list[list[float]]:
    buf = _flush_buffer(device) if flush_l2 else None
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for fn, samples in zip(fns, out):
            if buf is not None:
                buf.fill_(_)
            start = time.perf_counter_ns()
            fn()
            samples.append((time.perf_counter_ns() - start) / 1e3)
    return out


def _reps_for(fns: Sequence[Callable[[], object]], device: str, budget_ms: float, min_reps: int,
              max_reps: int, flush_l2: bool) -> int:
    """As many repetitions as fit the budget, counting the flushes (wall clock over a few reps)."""
    start = time.perf_counter()
    _samples(fns, device, 3, flush_l2)
    per_rep_us = (time.perf_counter() - start) / 3 * 1e6
    return int(min(max_reps, max(min_reps, budget_ms * 1e3 / max(per_rep_us, 1e-3))))


def _samples(fns, device, reps, flush_l2):
    if device.startswith("cuda"):
        return _cuda_samples(fns, device, reps, flush_l2)
    return _cpu_samples(fns, device, reps, flush_l2)


def bench_many(fns: Sequence[Callable[[], object]], *, device: str = "cpu", warmup: int = 3,
               reps: int | None = None, budget_ms: float = 200.0, min_reps: int = 20,
               max_reps: int = 2000, flush_l2: bool = True) -> list[Timing]:
    """Time several callables interleaved, repetition by repetition."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    if reps is None:
        reps = _reps_for(fns, device, budget_ms, min_reps, max_reps, flush_l2)
    return [Timing.of(s) for s in _samples(fns, device, reps, flush_l2)]


def bench(fn: Callable[[], object], *, device: str = "cpu", **kwargs) -> Timing:
    """Time one callable (see bench_many)."""
    return bench_many([fn], device=device, **kwargs)[0]


def bench_pair(candidate: Callable[[], object], eager: Callable[[], object], *, device: str = "cpu",
               **kwargs) -> tuple[Timing, Timing]:
    a, b = bench_many([candidate, eager], device=device, **kwargs)
    return a, b
