"""The worker process: compiles, validates and times candidates. Candidates never run in the parent.

A CUDA error that leaves the context unusable (illegal address, launch failure) is reported and
the worker exits, so the next candidate gets a fresh process and a fresh context.
"""
from __future__ import annotations

import faulthandler
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from ..kernels import CompileError, Kernel, LaunchError, compile_source, device_info, param_vector
from ..ops import Variant, get_spec
from ._checks import compare, guarded_copy, guarded_empty, reference_outputs, same_bits
from ._result import Evaluation, Status
from .timing import bench_many


@dataclass
class Job:
    """One candidate to evaluate for one variant. Plain data: it crosses the process boundary."""

    job_id: int
    variant: dict                                 # Variant.to_json()
    source: str
    backend: str
    device: str
    arch: str
    examples: list[tuple[list[str | None], list[str]]] = field(default_factory=list)  # blob paths
    random_sets: int = 3
    seed: int = 0
    budget_ms: float = 300.0
    min_margin: float = 0.02


class _Fatal(Exception):
    """The device context is no longer usable: report, then exit the worker."""


def _load(path: str | None, device: str) -> torch.Tensor | None:
    if path is None:
        return None
    t = torch.load(path, map_location="cpu", weights_only=True)
    return t.to(device)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _check_cuda(device: str) -> None:
    if not device.startswith("cuda"):
        return
    try:
        torch.cuda.synchronize(device)
    except Exception as exc:  # NB: torch raises RuntimeError/AcceleratorError for sticky CUDA errors
        raise _Fatal(f"CUDA error after launch: {str(exc).splitlines()[0]}") from exc


def evaluate_job(job: Job) -> Evaluation:
    start = time.perf_counter()
    try:
        if job.backend == "cuda":
            # NB: candidates run on a stream of their own, so one that launches elsewhere is
            # caught by the timing check instead of hiding behind the default stream.
            with torch.cuda.stream(torch.cuda.Stream(job.device)):
                ev = _evaluate(job)
        else:
            ev = _evaluate(job)
    except _Fatal as exc:
        raise _FatalResult(_with_wall(Evaluation(Status.CRASHED, str(exc)), start)) from exc
    except RuntimeError as exc:
        # A candidate that swallowed a launch error or corrupted the context makes the next
        # torch call fail: that is the candidate's fault, and the context must be replaced.
        text = str(exc)
        if job.backend == "cuda" and ("CUDA" in text or "cuda" in text):
            raise _FatalResult(_with_wall(Evaluation(Status.CRASHED, f"CUDA error after the kernel ran: "
                                                     f"{text.splitlines()[0]}"), start)) from exc
        raise
    return _with_wall(ev, start)


class _FatalResult(Exception):
    def __init__(self, evaluation: Evaluation):
        super().__init__(evaluation.message)
        self.evaluation = evaluation


def _with_wall(ev: Evaluation, start: float) -> Evaluation:
    from dataclasses import replace

    return replace(ev, wall_s=time.perf_counter() - start)


def _evaluate(job: Job) -> Evaluation:
    device = job.device
    variant = Variant.from_json(job.variant).on(device)
    spec = get_spec(variant.op)
    try:
        built = compile_source(job.source, job.backend, job.arch)
    except CompileError as exc:
        return Evaluation(Status.COMPILE_ERROR, str(exc), compile_log=exc.log)
    try:
        kernel = Kernel(built.path)
    except (OSError, RuntimeError) as exc:
        return Evaluation(Status.COMPILE_ERROR, f"the library does not load: {exc}", compile_log=built.log,
                          compile_s=built.seconds)
    params = variant.param_dict
    pvec = param_vector(variant)
    frame = kernel.prepare(len(variant.inputs), len(variant.outputs), pvec)
    workspace = torch.empty(max(kernel.workspace_bytes, 1), dtype=torch.uint8, device=device) \
        if kernel.workspace_bytes else None
    stream = (lambda: torch.cuda.current_stream(device).cuda_stream) if device.startswith("cuda") else (lambda: 0)
    gen = torch.Generator().manual_seed(job.seed ^ 0x5EED)
    base = dict(compile_log=built.log, compile_s=built.seconds)

    input_sets = [[_load(p, device) for p in ins] for ins, _ in job.examples]
    input_sets += [spec.random_inputs(variant, seed=job.seed * 1000 + i + 1) for i in range(job.random_sets)]
    checks: list[str] = []
    worst_abs = worst_rel = worst_frac = 0.0

    def run(inputs: list, round_: int):
        outs = [guarded_empty(s, device, round_, gen) for s in variant.outputs]
        try:
            frame.launch(inputs, [o.tensor for o in outs], workspace, stream())
        finally:
            _check_cuda(device)
        return outs

    for set_idx, raw_inputs in enumerate(input_sets):
        label = f"example {set_idx}" if set_idx < len(job.examples) else f"random set {set_idx - len(job.examples)}"
        refs = reference_outputs(spec, raw_inputs, params)
        guarded = [guarded_copy(t, gen) if t is not None else None for t in raw_inputs]
        inputs = [g.tensor if g is not None else None for g in guarded]
        try:
            first = run(inputs, 0)
            fresh = [guarded_copy(t, gen) if t is not None else None for t in raw_inputs]
            second = run([g.tensor if g is not None else None for g in fresh], 1)
        except LaunchError as exc:
            return Evaluation(Status.LAUNCH_ERROR, f"{label}: {exc}", **base)
        for g, raw in zip(guarded, raw_inputs):
            if g is not None and (not same_bits(g.tensor, raw) or not g.guards_intact()):
                return Evaluation(Status.WRONG_RESULT, f"{label}: the kernel modified an input", **base)
        for i, (o, ref) in enumerate(zip(first, refs)):
            if not o.guards_intact():
                return Evaluation(Status.WRONG_RESULT, f"{label}: the kernel wrote outside output {i}", **base)
            m = compare(spec, o.tensor, ref, f"{label}, output {i}")
            worst_abs, worst_rel = max(worst_abs, m.max_abs), max(worst_rel, m.max_rel)
            worst_frac = max(worst_frac, m.fraction)
            if not m.ok:
                return Evaluation(Status.WRONG_RESULT, m.message, max_abs_error=m.max_abs, max_rel_error=m.max_rel,
                                  mismatch_fraction=m.fraction, **base)
        # NB: the second run (fresh copies at new addresses, differently poisoned outputs) must agree
        # too: catches results cached by pointer or call count, stale memory and races.
        for i, (a, b, ref) in enumerate(zip(first, second, refs)):
            m = compare(spec, b.tensor, ref, f"{label}, second run, output {i}")
            if not m.ok or not b.guards_intact():
                return Evaluation(Status.WRONG_RESULT, m.message or f"{label}: second run wrote outside output {i}",
                                  max_abs_error=m.max_abs, max_rel_error=m.max_rel, mismatch_fraction=m.fraction,
                                  **base)
        checks.append(label)
    checks += ["poisoned outputs", "guard canaries", "inputs unchanged", "second run at new addresses"]

    # ---- timing: candidate and eager interleaved, same inputs, same process
    inputs = input_sets[-1]
    outs = [torch.empty_strided(s.shape, s.stride, dtype=o.dtype, device=device)
            for s, o in zip(variant.outputs, reference_outputs(spec, inputs, params))]

    def candidate() -> None:
        frame.launch(inputs, outs, workspace, stream())

    def eager() -> None:
        spec.reference(inputs, params)

    with torch.no_grad():
        t_cand, t_eager = bench_many([candidate, eager], device=device, budget_ms=job.budget_ms)
    _check_cuda(device)
    if device.startswith("cuda"):
        # NB: events only see the given stream; work moved to another stream would look free. Wall
        # time over back-to-back calls with a device-wide sync must agree with the event time.
        n = 20
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            candidate()
        _sync(device)
        wall_us = (time.perf_counter() - t0) / n * 1e6
        if wall_us > 2 * t_cand.median_us + 25.0:
            return Evaluation(Status.WRONG_RESULT, f"events say {t_cand.median_us:.1f} us per call but the device "
                              f"stays busy {wall_us:.1f} us: work ran outside the given stream", **base)
    speedup = t_eager.median_us / t_cand.median_us if t_cand.median_us > 0 else 0.0
    margin = min(0.15, max(job.min_margin, t_cand.spread, t_eager.spread))
    if speedup >= 1 + margin:
        status = Status.FASTER
    elif speedup <= 1 - margin:
        status = Status.SLOWER
    else:
        status = Status.NO_GAIN
    bw = device_info(device).bandwidth_gbs
    roofline = (variant.io_bytes / (bw * 1e9) * 1e6) / t_cand.median_us if t_cand.median_us > 0 else None
    return Evaluation(status, f"{speedup:.3f}x over eager (noise margin {margin:.1%})", max_abs_error=worst_abs,
                      max_rel_error=worst_rel, mismatch_fraction=worst_frac, candidate_us=t_cand.median_us,
                      eager_us=t_eager.median_us, candidate_spread=t_cand.spread, eager_spread=t_eager.spread,
                      speedup=speedup, roofline_fraction=roofline, checks=tuple(checks), **base)


def worker_main(conn: Any, device: str) -> None:
    """Serve jobs from ``conn`` until it closes. Runs in its own process; stderr goes to a log."""
    faulthandler.enable()
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
        torch.cuda.init()
    conn.send(("ready", os.getpid()))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        try:
            ev = evaluate_job(job)
            conn.send(("done", ev.to_json()))
        except _FatalResult as fatal:
            conn.send(("fatal", fatal.evaluation.to_json()))
            return
        except Exception as exc:  # a bug in kforge or torch, not in the candidate
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-4000:]}"))


def main() -> None:
    """Entry point of the worker process: ``argv = [fd of the socket, device]``."""
    from multiprocessing.connection import Connection

    worker_main(Connection(int(sys.argv[1])), sys.argv[2])
