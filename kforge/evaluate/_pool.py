"""The user's side of evaluation: one judge process per device, replaced if it ever fails."""
from __future__ import annotations

import itertools
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import torch

from ..kernels import backend_of, compile_timeout, device_info
from ._judge import Job
from ._result import Evaluation, Status

if TYPE_CHECKING:
    from ..kernels._plan import LaunchPlan
    from ..ops import Card, Variant


class ExampleSource(Protocol):
    """What the evaluator needs of a store: the example files of a card (``kforge.store.Store`` is one)."""

    def example_paths(self, key: str) -> list[tuple[list, list]]: ...

_START_TIMEOUT_S = 180.0
_COMPILE_ALLOWANCE_S = 150.0
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)


def judge_env() -> dict[str, str]:
    """The user's environment without secrets or config paths: the judge needs neither."""
    return {k: v for k, v in os.environ.items()
            if not _SECRET.search(k) and not k.upper().startswith("KFORGE_CONFIG")}


class _Judge:
    """A ``python -c "...judge main()"`` child talking over a socket pair.

    NB: a plain subprocess, not multiprocessing's spawn: spawn re-imports the user's __main__,
    which breaks scripts without a main guard and code piped on stdin. No OMP_WAIT_POLICY here:
    the judge times eager the way a user's process runs it; runners get PASSIVE instead.
    """

    def __init__(self, device: str):
        fd, self.stderr_path = tempfile.mkstemp(prefix="kforge-judge-", suffix=".log")
        os.close(fd)
        parent_sock, child_sock = socket.socketpair()
        self.conn = Connection(parent_sock.detach())
        child_fd = child_sock.fileno()
        with open(self.stderr_path, "ab") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from kforge.evaluate._judge import main; main()", str(child_fd), device],
                pass_fds=(child_fd,), stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                env={**judge_env(), "PYTHONUNBUFFERED": "1"})
        child_sock.close()
        try:
            if not self.conn.poll(_START_TIMEOUT_S):
                raise EOFError
            tag, _ = self.conn.recv()
        except (EOFError, OSError):
            self.kill()
            raise RuntimeError(f"the evaluator's judge process for {device} did not start; its output:\n"
                               f"{self.stderr_tail()}") from None
        assert tag == "ready"

    def stderr_tail(self, n: int = 4000) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read(n).decode(errors="replace")
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


def _death_message(judge: _Judge) -> str:
    code = judge.process.returncode
    if code is not None and code < 0:
        import signal

        try:
            what = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            what = f"killed by signal {-code}"
    else:
        what = f"exited with code {code}"
    tail = judge.stderr_tail(1500).strip()
    return f"the judge process {what}" + (f"; its last output:\n{tail}" if tail else "")


@dataclass(frozen=True)
class Recording:
    """A CUDA kernel's launch plan (``kernels._plan.LaunchPlan``), or None with the reason it has none."""

    plan: "LaunchPlan | None"
    reason: str = ""
    infra: bool = False   # not the kernel's doing: the machine's trouble, twice


class Evaluator:
    """Compile, validate and time candidates for one device.

    The user's process talks to one judge process per device; the judge runs every candidate in a
    fresh, sandboxed runner process and decides the verdict itself (docs/evaluator.md,
    docs/security.md). Evaluations on one device are serialised (timing needs the device alone).
    """

    def __init__(self, device: str = "cpu", *, timeout_s: float = 60.0, random_sets: int = 3,
                 budget_ms: float | None = None, cpu_threads: int | None = None):
        self.backend = backend_of(device)
        if cpu_threads is not None and (not isinstance(cpu_threads, int) or isinstance(cpu_threads, bool)
                                        or cpu_threads < 0):
            raise ValueError(f"cpu_threads must be a count of threads (>= 1), 0 (as many as the cores other "
                             f"processes leave idle, measured per evaluation) or None, not {cpu_threads!r}")
        # NB: CPU verdicts hold for one thread count, fixed for the evaluator's life (kforge.evaluate._judge.
        # _fixed_cpu_threads): by default the count this process runs torch with when the first job is made, which
        # is the count the user's model runs at. Not bounded by the load: two runs of one session on a machine whose
        # load differed at their starts were judged at 1 and 2 threads, and disagreed (2026-12-07)
        self._cpu_threads = cpu_threads
        if self.backend == "cuda" and ":" not in device:
            device = f"cuda:{torch.cuda.current_device()}"
        self.device = device
        self.timeout_s = timeout_s
        self.random_sets = random_sets
        # NB: CPU kernels are timed for the loop's sake, not for reports: a shorter budget.
        self.budget_ms = budget_ms if budget_ms is not None else (300.0 if self.backend == "cuda" else 100.0)
        info = device_info(device) if self.backend == "cuda" else None
        self.arch = info.arch if info else os.environ.get("KFORGE_CPU_ARCH", "native")
        self._judge: _Judge | None = None
        self._other: _Judge | None = None   # NB: started on the first ``evaluate_elsewhere``; see there
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.restarts = 0   # judge processes replaced after a failure (never a candidate's doing)

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            for judge in (self._judge, self._other):
                if judge is not None:
                    judge.close()
            self._judge = self._other = None

    @property
    def judge_pid(self) -> int | None:
        return self._judge.process.pid if self._judge is not None and self._judge.alive() else None

    def examples_for(self, card: "Card", store: "ExampleSource | None") -> list[tuple[list[str | None], list[str]]]:
        if store is None:
            return []
        return [([str(p) if p is not None else None for p in ins], [str(p) for p in outs])
                for ins, outs in store.example_paths(card.key)]

    def job_for(self, card: "Card", source: str, store: "ExampleSource | None" = None, seed: int = 0) -> Job:
        return self._job(card.variant, source, self.examples_for(card, store), seed)

    @property
    def cpu_threads(self) -> int:
        """The intra-op threads every CPU job of this evaluator runs eager and the candidate with (0: each job's
        count follows the idle cores), decided on first use and kept."""
        if self._cpu_threads is None:
            self._cpu_threads = torch.get_num_threads()
        return self._cpu_threads

    def _job(self, variant: "Variant", source: str, examples: Sequence, seed: int) -> Job:
        return Job(next(self._ids), variant.to_json(), source, self.backend, self.device, self.arch,
                   [(list(i), list(o)) for i, o in examples], self.random_sets, seed, self.budget_ms,
                   timeout_s=self.timeout_s, cpu_threads=self.cpu_threads if self.backend == "cpu" else 0)

    def evaluate(self, card: "Card", source: str, store: "ExampleSource | None" = None, *, seed: int = 0) -> Evaluation:
        """The verdict on ``source`` as a kernel for ``card``. Never raises for a bad candidate."""
        return self.run_job(self.job_for(card, source, store, seed))

    def evaluate_variant(self, variant: "Variant", source: str, examples: Sequence = (), *,
                         seed: int = 0) -> Evaluation:
        """The verdict on ``source`` for ``variant``; ``examples`` are ``(input_paths, output_paths)``
        pairs of saved tensors (``None`` for an absent input)."""
        return self.run_job(self._job(variant, source, examples, seed))

    def evaluate_elsewhere(self, variant: "Variant", source: str, examples: Sequence = (), *,
                           seed: int = 0) -> Evaluation:
        """As ``evaluate_variant``, in a second judge process of this evaluator, not the one the search's timings
        came from: a verdict's confirmation (``search._decide``).

        NB: eager is timed in the judge, and its time moves between judge processes more than within one (the
        loaded 2-core CPU, 2026-12-07: the same kernel's speedup in two timings of one run differed by a median
        1.07x, in two runs by 1.12x; eager's own time by 1.04x and 1.11x). A confirmation timed in the search's
        judge shares that process's eager with the search, so its agreement says nothing of what the next run,
        a fresh process, will see; timed here, the movement between processes is in the timings a verdict reads.
        The process is started on the first call and kept for the next ones."""
        return self.run_job(self._job(variant, source, examples, seed), other=True)

    def run_job(self, job: Job, *, other: bool = False) -> Evaluation:
        """Run ``job`` in the judge (``other``: the second judge, ``evaluate_elsewhere``); a judge that dies or
        hangs is replaced and the job retried once."""
        start = time.perf_counter()
        payload, reason = self._ask(job, "done", "verdict", other=other)
        if payload is not None:
            return Evaluation.from_json(payload)
        return Evaluation(Status.INFRA_ERROR, f"not the candidate's fault, twice: {reason}",
                          wall_s=time.perf_counter() - start)

    def record_variant(self, variant: "Variant", source: str, examples: Sequence = ()) -> "Recording":
        """``source``'s launches for ``variant``, recorded in a sandboxed runner (``_record.py``): the plan kforge's
        own launcher replays in place of the kernel's host code, or why there is none. Never raises for a bad
        kernel; the machine's trouble, twice, is a Recording with ``infra`` set."""
        from ..kernels._plan import LaunchPlan

        payload, reason = self._ask(replace(self._job(variant, source, examples, 0), record=True), "recorded", "record")
        if payload is None:
            return Recording(None, f"it could not be recorded (not the kernel's fault, twice): {reason}", infra=True)
        if "refused" in payload:
            return Recording(None, str(payload["refused"]))
        try:
            return Recording(LaunchPlan.from_json(payload["plan"], payload["modules"]), "")
        except (KeyError, TypeError, ValueError) as exc:
            return Recording(None, f"its recorded plan is malformed ({exc})")

    def _ask(self, job: Job, answer: str, noun: str, other: bool = False) -> tuple[Any, str]:
        """``job`` sent to the judge and its ``answer`` payload, or (None, why) after two tries: a judge that dies,
        hangs or fails is replaced and the job tried once more (never raised into the user's process: a search would
        end there)."""
        with self._lock:
            reason = ""
            slot = "_other" if other else "_judge"
            for _attempt in range(2):
                try:
                    judge = getattr(self, slot)
                    if judge is None or not judge.alive():
                        setattr(self, slot, _Judge(self.device))
                except RuntimeError as exc:
                    reason = str(exc)
                    setattr(self, slot, None)
                    continue
                judge = getattr(self, slot)
                # NB: a CUTLASS build may take its compile limit (900 s, not a plain kernel's 120 s): the judge is
                # waited for that long, not replaced as hung mid-build
                wait_s = max(_COMPILE_ALLOWANCE_S, compile_timeout(job.source, job.backend) + 30.0) \
                    + 2 * (job.timeout_s + 60.0)
                try:
                    judge.conn.send(job)
                    if not judge.conn.poll(wait_s):
                        reason = f"the judge gave no {noun} within {wait_s:.0f} s and was replaced"
                        self._replace(judge)
                        continue
                    tag, payload = judge.conn.recv()
                except (EOFError, OSError, BrokenPipeError):
                    judge.join(5)
                    reason = _death_message(judge)
                    self._replace(judge)
                    continue
                if tag == answer and not (isinstance(payload, dict) and "error" in payload):
                    return payload, ""
                error = payload.get("error") if isinstance(payload, dict) and "error" in payload else payload
                reason = f"the judge failed on this job (a kforge bug, please report it): {error}"
                self._replace(judge)
            return None, reason

    def _replace(self, judge: _Judge) -> None:
        judge.kill()
        if judge is self._judge:
            self._judge = None
        if judge is self._other:
            self._other = None
        self.restarts += 1
