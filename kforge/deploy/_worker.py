"""Deployed CPU kernels run in a sandboxed worker, never in the user's process.

Code running in a process can reach any function of it (docs/security.md, the eighth pass: a kernel walked libc's
symbol table from an allowed import's address and sent the API key out); no check of a binary closes that. So a
deployed CPU kernel is served by a long-lived runner, the judge's own binary and sandbox
(kforge/evaluate/runner/runner.c: no secrets in its environment, no network, Landlock, seccomp, limits): its
library is loaded there only, from the bytes the binary wall checked. Its inputs and outputs live in a shared
arena of one set (the inputs mapped read-only there, guard pages around the outputs); a call copies the inputs
in, sends one RUN frame, waits for the answer and copies the outputs out into fresh tensors.

A worker that cannot start, dies, hangs past its call's deadline, breaks the protocol, faults, returns a launch
error, holds more memory than its limit or burns CPU between calls fails its kernel for good: that call and every
later one run the operator eagerly, with one warning naming the kernel (the re-check before install calls it
strictly instead: a failure there refuses the kernel).
"""
from __future__ import annotations

import enum
import os
import queue
import threading
import time
import warnings
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..evaluate._arena import Arenas, ArenaLayout
from ..evaluate._frames import Code, Op, ProtocolError
from ..evaluate._judge import RunnerStartError, start_runner
from ..evaluate._runner import RunnerGone, RunnerProcess, RunnerTimeout
from ..kernels import param_vector
from ..ops import Variant, get_spec, torch_dtype

#: a call's deadline: this many times the kernel's judged time, and never less than the floor (a loaded machine, a
#: first call that faults its pages in)
CALL_TIMEOUT_RATIO = 100.0
CALL_TIMEOUT_FLOOR_S = 10.0
#: CPU time a worker may use between its calls: this share of the wall time between them, checked over windows
#: of at least IDLE_WINDOW_S (an honest kernel's threads sleep between calls: OMP_WAIT_POLICY=PASSIVE)
IDLE_CPU_SHARE = 0.1
IDLE_WINDOW_S = 1.0
_START_TIMEOUT_S = 60.0


class WorkerError(RuntimeError):
    """A deployed CPU kernel's worker failed (it could not start or load the kernel, died, hung, broke the
    protocol, faulted, or the kernel returned an error)."""


@dataclass(frozen=True, eq=False)
class CheckedLibrary:
    """A kernel library that passed its hash check and the binary wall, held as the bytes that were checked: it is
    loaded by a worker only (``ServedKernel``), never into this process."""

    path: Path
    sha256: str
    data: bytes = field(repr=False)


def eager_outputs(variant: Variant, inputs: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
    """The operator's own outputs for ``inputs`` (eager's call), laid out as ``variant``'s outputs are (what a
    caller of the kernel, a compiled graph traced with its fake, reads)."""
    out = get_spec(variant.op).run_eager(list(inputs), variant.param_dict)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [_as_variant(o, sig) for o, sig in zip(outs, variant.outputs)] + outs[len(variant.outputs):]


def _as_variant(t: Any, sig) -> Any:
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(sig.shape) or tuple(t.stride()) == tuple(sig.stride):
        return t
    return torch.empty_strided(sig.shape, sig.stride, dtype=t.dtype, device=t.device).copy_(t)


class _Spawner:
    """Starts workers from one thread that lives as long as the process.

    NB: a runner dies with the thread that started it (its PR_SET_PDEATHSIG names the parent thread, not the
    process): a worker started from a short-lived thread (a DataLoader's, a notebook's background cell) would be
    killed when that thread ends, and its kernel fall back to eager for no reason of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def run(self, fn: Callable[[], Any]) -> Any:
        with self._lock:
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(target=self._serve, args=(self._jobs,), name="kforge-workers",
                                                daemon=True)
                self._pid = os.getpid()
                self._thread.start()
            jobs = self._jobs
        done: Future = Future()
        jobs.put((fn, done))
        return done.result()

    @staticmethod
    def _serve(jobs: queue.SimpleQueue) -> None:
        while True:
            fn, done = jobs.get()
            try:
                done.set_result(fn())
            except BaseException as exc:  # NB: handed to the caller's thread
                done.set_exception(exc)
            del fn, done   # NB: held until the next job, the last one would keep what it refers to alive


_SPAWNER = _Spawner()


class KernelWorker:
    """One sandboxed runner process serving one kernel for one variant; ``call`` is one launch. Raises WorkerError
    for every failure, after which the worker is dead (``close`` it)."""

    def __init__(self, variant: Variant, library: CheckedLibrary, timeout_s: float):
        if variant.device != "cpu":
            raise ValueError(f"a worker serves CPU kernels; {variant.signature} is on {variant.device}")
        self.variant = variant
        self.timeout_s = timeout_s
        self.owner = os.getpid()
        plan = ArenaLayout(variant.inputs, variant.outputs)
        group = plan.add_group(1)
        self._arenas = Arenas(plan, "cpu", param_vector(variant), torch.Generator().manual_seed(0))
        self._ins = [None if sig is None else self._arenas.inputs(group, i)[0] for i, sig in enumerate(variant.inputs)]
        self._outs = [self._arenas.outputs(group, o)[0] for o in range(len(variant.outputs))]
        self._out_layouts = [(s.shape, s.stride, torch_dtype(s.dtype)) for s in variant.outputs]
        self.runner: RunnerProcess | None = None
        self._stop = weakref.finalize(self, _stop, self._arenas, [], self.owner)   # NB: also at exit, and when collected
        try:
            arenas = self._arenas
            self.runner, self.sandbox = _SPAWNER.run(lambda: start_runner("cpu", arenas, 0, judged=False))
            self._stop.detach()
            self._stop = weakref.finalize(self, _stop, self._arenas, [self.runner], self.owner)
            self._install(library)
            self._load()
        except (RunnerStartError, OSError) as exc:
            self.close()
            raise WorkerError(f"its worker could not start: {exc}") from None
        except BaseException:
            self.close()
            raise
        self.pid = self.runner.pid
        self._window = (time.monotonic(), self._cpu_s(), 0.0)   # start, CPU seconds then, call wall time since

    def _install(self, library: CheckedLibrary) -> None:
        """The checked bytes into the runner's private folder, where it loads them: what loads is what was checked."""
        fd = os.open(self.runner.library_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o500)
        with os.fdopen(fd, "wb") as f:
            f.write(library.data)

    def _load(self) -> None:
        frame, _ = self._ask(Op.LOAD, time.monotonic() + _START_TIMEOUT_S, "loading the kernel")
        if frame.status == Code.LOAD and frame.c:
            raise WorkerError(f"its workspace of {frame.c} bytes (kf_workspace_bytes) could not be allocated within "
                              f"the worker's memory limit")
        if frame.status == Code.NO_ENTRY:
            raise WorkerError("the library does not export kf_launch")
        if frame.status != Code.OK:
            raise WorkerError(f"the library does not load in its worker: {self.runner.output_tail(1000).strip()}")

    def _ask(self, op: Op, deadline: float, what: str, a: int = 0, b: int = 0):
        runner = self.runner
        try:
            frame, wall = runner.request(op, deadline, a, b)
        except RunnerTimeout:
            runner.kill()
            raise WorkerError(f"its worker gave no answer within {self.timeout_s:.0f} s {what} and was killed "
                              "(an endless loop or a deadlock?)") from None
        except RunnerGone:
            raise WorkerError(f"its worker died {what}: {self._death()}") from None
        except ProtocolError as exc:
            runner.kill()
            raise WorkerError(f"its worker broke the protocol {what} ({exc}) and was killed") from None
        if frame.op == Op.FAULT:
            ex = runner.wait(5.0)
            runner.kill()
            where = {1: "writing its input; ", 2: "writing outside its output; "}.get(frame.a, "")
            raise WorkerError(f"its kernel crashed {what} ({where}the worker "
                              f"{ex.describe() if ex is not None else 'did not die of it and was killed'})")
        return frame, wall

    def _death(self) -> str:
        runner = self.runner
        if runner.over_memory:
            return f"it held {runner.over_memory >> 20} MiB, over its limit of {runner.memory_limit >> 20} MiB"
        ex = runner.wait(5.0)
        if ex is None:
            runner.kill()
            return "it closed its channel and kept running (killed)"
        tail = runner.output_tail(600).strip()
        return ex.describe() + (f"; its last output: {tail}" if tail else "")

    def _cpu_s(self) -> float:
        try:
            return time.clock_gettime_ns((~self.runner.pid << 3) | 2) / 1e9   # NB: its process CPU clock
        except OSError:
            return 0.0

    def _idle_check(self, now: float) -> None:
        """WorkerError when the worker used more CPU between its calls than an idle process does (threads a kernel
        left running); checked once a window, so a call pays for it rarely."""
        start, cpu, busy = self._window
        if now - start < IDLE_WINDOW_S:
            return
        used = self._cpu_s() - cpu
        allowed = busy * max(self.runner.threads, 1) * 1.5 + IDLE_CPU_SHARE * (now - start - busy) + 0.05
        if used > allowed:
            self.runner.kill()
            raise WorkerError(f"its worker used {used:.2f} s of CPU in {now - start:.1f} s while its calls took "
                              f"{busy:.3f} s: threads of the kernel keep running between calls; it was killed")
        self._window = (now, cpu + used, 0.0)

    def call(self, inputs: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        """One launch: ``inputs`` (in the variant's layouts) copied in, fresh outputs copied out. Not thread-safe:
        the caller holds a lock."""
        for view, t in zip(self._ins, inputs):
            if view is not None:
                view.copy_(t)
        start = time.monotonic()
        self._idle_check(start)
        frame, _ = self._ask(Op.RUN, start + self.timeout_s, "during a call", 0, 1)
        if frame.status == Code.LAUNCH:
            code = frame.c if frame.c < (1 << 63) else frame.c - (1 << 64)
            raise WorkerError(f"kf_launch returned error code {code}")
        if frame.status != Code.OK or frame.a != 1:
            self.runner.kill()
            raise WorkerError(f"its worker answered status {frame.status} after {frame.a} of 1 call")
        outs = [torch.empty_strided(shape, stride, dtype=dtype).copy_(view)
                for (shape, stride, dtype), view in zip(self._out_layouts, self._outs)]
        s, c, busy = self._window
        self._window = (s, c, busy + time.monotonic() - start)
        return outs

    def close(self) -> None:
        """Stop the worker (its whole process group) and free its folder and arenas; safe to call twice."""
        self.runner = None
        self._ins, self._outs = [], []
        self._stop()


def _stop(arenas: Arenas, runners: list[RunnerProcess], owner: int) -> None:
    if owner != os.getpid():   # NB: a forked child's copy: the worker and its folder are its parent's
        return
    for runner in runners:
        runner.close(graceful=runner.exit is None)
        runner.remove_private_dir()
    arenas.close()


class State(enum.Enum):
    """Where a served kernel stands: no worker now (one starts at the next call), one serving it, or failed for
    good (its calls run eagerly)."""

    IDLE = "idle"
    SERVING = "serving"
    FAILED = "failed"


class ServedKernel:
    """A deployed CPU kernel's calls, served by its worker (started at the first call, started again after
    ``close``), one call at a time; after a failure every call runs the operator eagerly."""

    def __init__(self, variant: Variant, library: CheckedLibrary, kernel_us: float | None = None):
        self.variant = variant
        self.library = library
        self.timeout_s = max(CALL_TIMEOUT_FLOOR_S, CALL_TIMEOUT_RATIO * (kernel_us or 0.0) / 1e6)
        self.calls = 0              # launches that the worker answered
        self.state = State.IDLE
        self.failure = ""           # why it failed (State.FAILED)
        self._worker: KernelWorker | None = None
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        """The worker's process id (None without one)."""
        worker = self._worker
        return worker.pid if worker is not None and self.state is State.SERVING else None

    def checked(self, inputs: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        """One launch by the worker; WorkerError (and the kernel failed for good) where it fails."""
        if len(inputs) != len(self.variant.inputs):
            raise TypeError(f"expected {len(self.variant.inputs)} inputs, got {len(inputs)}")
        with self._lock:
            if self.state is State.FAILED:
                raise WorkerError(self.failure)
            try:
                worker = self._worker
                if worker is None or worker.owner != os.getpid():   # NB: a forked child starts its own
                    self._worker = worker = KernelWorker(self.variant, self.library, self.timeout_s)
                    self.state = State.SERVING
                outs = worker.call(inputs)
            except WorkerError as exc:
                self._fail(str(exc))
                raise
            self.calls += 1
            return outs

    def __call__(self, inputs: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        """One launch by the worker, or eager's call once the worker failed (warned about once)."""
        if self.state is not State.FAILED:
            try:
                return self.checked(inputs)
            except WorkerError as exc:
                warnings.warn(f"kforge: {self.variant.signature} ({self.library.path.name}) runs eagerly from now on: "
                              f"{exc}", stacklevel=3)
        return eager_outputs(self.variant, inputs)

    def _fail(self, why: str) -> None:
        self.state, self.failure = State.FAILED, why
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()

    def close(self) -> None:
        """Stop the worker (a later call starts another, unless the kernel failed)."""
        with self._lock:
            worker, self._worker = self._worker, None
            if self.state is State.SERVING:
                self.state = State.IDLE
        if worker is not None:
            worker.close()


