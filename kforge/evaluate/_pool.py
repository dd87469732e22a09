"""The parent side of evaluation: one worker process per device, restarted after any failure."""
from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..kernels import backend_of, device_info
from ._result import Evaluation, Status
from multiprocessing.connection import Connection

import torch

from ._worker import Job

if TYPE_CHECKING:
    from ..capture import Card
    from ..store import Store

_START_TIMEOUT_S = 180.0


class _Worker:
    """A ``python -c "...worker main()"`` child talking over a socket pair.

    NB: a plain subprocess, not multiprocessing's spawn: spawn re-imports the user's __main__,
    which breaks scripts without a main guard and code piped on stdin. OMP_WAIT_POLICY=PASSIVE:
    torch's wheel ships its own OpenMP runtime and CPU candidates link the system one; two pools
    that spin after each parallel region would steal the cores the other is being timed on.
    """

    def __init__(self, device: str):
        fd, self.stderr_path = tempfile.mkstemp(prefix="kforge-worker-", suffix=".log")
        os.close(fd)
        parent_sock, child_sock = socket.socketpair()
        self.conn = Connection(parent_sock.detach())
        child_fd = child_sock.fileno()
        with open(self.stderr_path, "ab") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from kforge.evaluate._worker import main; main()", str(child_fd), device],
                pass_fds=(child_fd,), stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                env={"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "PYTHONUNBUFFERED": "1"})
        child_sock.close()
        try:
            if not self.conn.poll(_START_TIMEOUT_S):
                raise EOFError
            tag, _ = self.conn.recv()
        except (EOFError, OSError):
            self.kill()
            raise RuntimeError(f"the evaluator worker for {device} did not start; its output:\n"
                               f"{self.stderr_tail()}") from None
        assert tag == "ready"

    def stderr_tail(self, n: int = 4000) -> str:
        try:
            return Path(self.stderr_path).read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def join(self, timeout: float) -> None:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
        self.join(5)
        self.conn.close()

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, BrokenPipeError):
            pass
        self.join(5)
        self.kill()
        try:
            os.unlink(self.stderr_path)
        except OSError:
            pass


def _death_message(worker: _Worker) -> str:
    code = worker.process.returncode
    if code is not None and code < 0:
        import signal

        try:
            what = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            what = f"killed by signal {-code}"
    else:
        what = f"exited with code {code}"
    tail = worker.stderr_tail(1500).strip()
    return f"the worker process {what}" + (f"; its last output:\n{tail}" if tail else "")


class Evaluator:
    """Compile, validate and time candidates for one device, in a disposable worker process.

    Evaluations on one device are serialised (timing needs the device alone); a crash, hang or
    CUDA fault costs only the worker, which is restarted for the next candidate.
    """

    def __init__(self, device: str = "cpu", *, timeout_s: float = 60.0, random_sets: int = 3,
                 budget_ms: float | None = None):
        self.backend = backend_of(device)
        if self.backend == "cuda" and ":" not in device:
            device = f"cuda:{torch.cuda.current_device()}"
        self.device = device
        self.timeout_s = timeout_s
        self.random_sets = random_sets
        # NB: CPU kernels are timed for the loop's sake, not for reports: a shorter budget.
        self.budget_ms = budget_ms if budget_ms is not None else (300.0 if self.backend == "cuda" else 100.0)
        info = device_info(device) if self.backend == "cuda" else None
        self.arch = info.arch if info else os.environ.get("KFORGE_CPU_ARCH", "native")
        self._worker: _Worker | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.restarts = 0

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.close()
                self._worker = None

    def job_for(self, card: "Card", source: str, store: "Store | None" = None, seed: int = 0) -> Job:
        examples = []
        if store is not None:
            for ref in store.example_refs(card.key):
                examples.append(([str(store.blobs / f"{d}.pt") if d else None for d in ref["inputs"]],
                                 [str(store.blobs / f"{d}.pt") for d in ref["outputs"]]))
        return Job(next(self._ids), card.variant.to_json(), source, self.backend, self.device, self.arch,
                   examples, self.random_sets, seed, self.budget_ms)

    def evaluate(self, card: "Card", source: str, store: "Store | None" = None, *, seed: int = 0) -> Evaluation:
        """The verdict on ``source`` as a kernel for ``card``. Never raises for a bad candidate."""
        return self.run_job(self.job_for(card, source, store, seed))

    def run_job(self, job: Job) -> Evaluation:
        with self._lock:
            start = time.perf_counter()
            if self._worker is None or not self._worker.alive():
                self._worker = _Worker(self.device)
            worker = self._worker
            try:
                worker.conn.send(job)
                ready = worker.conn.poll(self.timeout_s)
                if not ready:
                    worker.kill()
                    self._worker = None
                    self.restarts += 1
                    return Evaluation(Status.TIMED_OUT, f"no result within {self.timeout_s:.0f} s; the worker was "
                                      "killed (an endless loop or a deadlock?)", wall_s=time.perf_counter() - start)
                tag, payload = worker.conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                worker.join(5)
                message = _death_message(worker)
                worker.kill()
                self._worker = None
                self.restarts += 1
                return Evaluation(Status.CRASHED, message, wall_s=time.perf_counter() - start)
            if tag == "done":
                return Evaluation.from_json(payload)
            if tag == "fatal":
                worker.join(10)
                worker.kill()
                self._worker = None
                self.restarts += 1
                return Evaluation.from_json(payload)
            raise RuntimeError(f"the evaluator failed on a candidate (a kforge bug, please report it): {payload}")
