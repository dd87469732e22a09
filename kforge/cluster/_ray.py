"""Evaluators on a Ray cluster: one actor per GPU (or CPU core group), driven from the user's process.

The search, the proposers and the store stay in the driver; only judging leaves it. Each actor
holds an ordinary ``Evaluator`` (the trusted judge and its sandboxed runners), so a verdict made
on the cluster is made exactly as a local one; the driver's ``RayEvaluator`` stands where a local
evaluator would, so the search runs one search thread per actor as it does per local device.
"""
from __future__ import annotations

import os
import platform
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..evaluate import Evaluation, Evaluator, Status
from ..kernels import compile_source

_PLACE_TIMEOUT_S = 300.0
_CALLS = 16     # calls an actor serves at once: evaluations (one judged at a time) and compiles


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError('cluster="ray" needs Ray: pip install "kforge[ray]" (on the driver and on every node '
                          'of the cluster), or leave cluster= out to search on this machine') from None
    return ray


def _hardware(backend: str) -> str:
    """What timings are comparable across: the GPU's name and architecture, or the CPU's model."""
    if backend == "cuda":
        import torch

        major, minor = torch.cuda.get_device_capability(0)
        return f"{torch.cuda.get_device_name(0)} (sm_{major}{minor})"
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    return f"cpu: {model}"


@dataclass(frozen=True)
class WorkerInfo:
    """Where an actor runs and what it judges on."""

    node_id: str
    hardware: str
    arch: str
    device: str
    pid: int


class EvaluatorWorker:
    """The body of an evaluator actor: the same judge + runner as a local ``Evaluator``.

    Example tensors come from the driver's store once per node (content-named files), so a node
    needs no shared disk.
    """

    def __init__(self, backend: str, timeout_s: float = 60.0, random_sets: int = 3, budget_ms: float | None = None):
        # NB: Ray shows an actor only its own GPU (CUDA_VISIBLE_DEVICES), so it is always cuda:0.
        self.evaluator = Evaluator("cuda:0" if backend == "cuda" else "cpu", timeout_s=timeout_s,
                                   random_sets=random_sets, budget_ms=budget_ms)
        self.examples_dir = Path(tempfile.gettempdir()) / "kforge-ray-examples"
        self.examples_dir.mkdir(exist_ok=True)

    def info(self) -> WorkerInfo:
        ray = _ray()
        return WorkerInfo(ray.get_runtime_context().get_node_id(), _hardware(self.evaluator.backend),
                          self.evaluator.arch, self.evaluator.device, os.getpid())

    def _local(self, examples: Sequence, blobs_ref: list) -> list:
        """The driver's example paths mapped to files on this node, fetched when missing."""
        names = {Path(p).name for ins, outs in examples for p in [*ins, *outs] if p is not None}
        if any(not (self.examples_dir / n).exists() for n in names):
            ray = _ray()
            for name, data in ray.get(blobs_ref[0]).items():
                path = self.examples_dir / name
                if not path.exists():
                    tmp = path.with_suffix(f".{os.getpid()}.tmp")
                    tmp.write_bytes(data)
                    os.replace(tmp, path)

        def local(p: str | None) -> str | None:
            return None if p is None else str(self.examples_dir / Path(p).name)

        return [([local(p) for p in ins], [local(p) for p in outs]) for ins, outs in examples]

    def evaluate(self, variant: Any, source: str, examples: Sequence, blobs_ref: list, seed: int) -> Evaluation:
        """The frozen verdict on ``source`` for ``variant``, as a local evaluator gives it."""
        return self.evaluator.evaluate_variant(variant, source, self._local(examples, blobs_ref), seed=seed)

    def compile(self, source: str) -> None:
        """Compile into this node's cache (for its architecture) while another call is being judged."""
        compile_source(source, self.evaluator.backend, self.evaluator.arch)

    def close(self) -> None:
        self.evaluator.close()


@dataclass
class _Actor:
    handle: Any
    info: WorkerInfo
    busy: int = 0
    lost: str | None = None     # why Ray says it died


@dataclass
class RayCluster:
    """A Ray cluster's evaluator actors: one per GPU (CUDA) or per ``cores_per_worker`` cores (CPU).

    ``address``: a running cluster ("auto", "ray://host:10001", ...); None connects to the one
    ``ray.init()`` finds or starts a local one. ``workers`` caps the number of actors (default: every
    GPU, or every core group). ``runtime_env`` goes to ``ray.init`` (e.g. to install kforge on the
    nodes). ``worker_class`` is the actor's body (an ``EvaluatorWorker``; tests subclass it).
    """

    address: str | None = None
    workers: int | None = None
    cores_per_worker: int = 1
    runtime_env: dict | None = None
    worker_class: type = EvaluatorWorker
    actors: list[_Actor] = field(default_factory=list, init=False)
    backend: str | None = field(default=None, init=False)
    _started_ray: bool = field(default=False, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _blobs: dict = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def from_spec(cls, spec: str) -> "RayCluster":
        """``"ray"`` (find or start a cluster) or ``"ray:ADDRESS"`` (connect to that one); Ray must import."""
        kind, _, address = spec.partition(":")
        if kind != "ray":
            raise ValueError(f"cluster={spec!r}: kforge runs on Ray clusters only; write 'ray' or 'ray:ADDRESS' "
                             "(e.g. 'ray:auto', 'ray:ray://head:10001')")
        _ray()
        return cls(address=address or None)

    def evaluators(self, backend: str, *, timeout_s: float = 60.0, random_sets: int = 3,
                   budget_ms: float | None = None) -> list["RayEvaluator"]:
        """One driver-side evaluator per actor, starting the actors on first use."""
        if self.backend is not None and self.backend != backend:
            raise ValueError(f"this cluster's actors judge on {self.backend}; the session runs on {backend}: "
                             "use a RayCluster per backend")
        if not self.actors:
            self._start(backend, dict(timeout_s=timeout_s, random_sets=random_sets, budget_ms=budget_ms))
        live = [a for a in self.actors if a.lost is None]
        if not live:
            raise RuntimeError("every evaluator actor of this Ray cluster is gone; close it and use a new one")
        return [RayEvaluator(self, a) for a in live]

    def _start(self, backend: str, options: dict) -> None:
        ray = _ray()
        if not ray.is_initialized():
            ray.init(address=self.address, runtime_env=self.runtime_env, include_dashboard=False,
                     log_to_driver=False)
            self._started_ray = True
        total = ray.cluster_resources()
        if backend == "cuda":
            n, resources = int(total.get("GPU", 0)), dict(num_gpus=1, num_cpus=1)
            if n == 0:
                raise RuntimeError("the Ray cluster has no GPU: start its nodes with GPUs (`ray start --num-gpus`), "
                                   "or run the session on the CPU")
        else:
            n, resources = int(total.get("CPU", 0)) // self.cores_per_worker, dict(num_cpus=self.cores_per_worker)
            if n == 0:
                raise RuntimeError(f"the Ray cluster has fewer than {self.cores_per_worker} CPUs: lower "
                                   "cores_per_worker")
        n = min(n, self.workers) if self.workers else n
        # NB: no restarts: an actor that dies stays dead, and its evaluations go to the others. Calls run
        # in threads (compiles beside an evaluation); the evaluator's own lock serialises the judging.
        remote = ray.remote(max_restarts=0, max_task_retries=0, max_concurrency=_CALLS, **resources)(self.worker_class)
        handles = [remote.remote(backend, **options) for _ in range(n)]
        try:
            infos = ray.get([h.info.remote() for h in handles], timeout=_PLACE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            for h in handles:
                ray.kill(h)
            raise RuntimeError(f"Ray placed fewer than {n} evaluator actors ({resources} each) within "
                               f"{_PLACE_TIMEOUT_S:.0f} s; free resources: {ray.available_resources()}; "
                               "pass workers= to ask for fewer") from None
        self.backend = backend
        self.actors = [_Actor(h, i) for h, i in zip(handles, infos)]

    # ------------------------------------------------------------------ what the driver's evaluators share

    def blobs(self, examples: Sequence) -> Any:
        """A Ray object holding the example files of one card (put once, fetched once per node)."""
        paths = tuple(sorted({p for ins, outs in examples for p in [*ins, *outs] if p is not None}))
        with self._lock:
            ref = self._blobs.get(paths)
            if ref is None:
                ref = self._blobs[paths] = _ray().put({Path(p).name: Path(p).read_bytes() for p in paths})
        return ref

    def take(self, actor: _Actor | None, hardware: str) -> _Actor | None:
        """``actor`` if it lives, else the least busy live actor of the same hardware; marked busy."""
        with self._lock:
            if actor is None or actor.lost is not None:
                live = [a for a in self.actors if a.lost is None and a.info.hardware == hardware]
                actor = min(live, key=lambda a: a.busy) if live else None
            if actor is not None:
                actor.busy += 1
            return actor

    def release(self, actor: _Actor, lost: str | None = None) -> None:
        with self._lock:
            actor.busy -= 1
            if lost is not None and actor.lost is None:
                actor.lost = lost

    @property
    def lost(self) -> list[WorkerInfo]:
        """The actors that died (with their node) since the cluster started."""
        return [a.info for a in self.actors if a.lost is not None]

    def close(self) -> None:
        """Stop the actors (their judges exit with them); shut Ray down if this object started it."""
        if not self.actors and not self._started_ray:
            return
        ray = _ray()
        for a in self.actors:
            if a.lost is None:
                try:
                    ray.get(a.handle.close.remote(), timeout=30)
                except Exception:  # a dying actor is being stopped anyway
                    pass
                ray.kill(a.handle)
        self.actors = []
        self.backend = None
        self._blobs.clear()
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False


class RayEvaluator:
    """Stands where a local ``Evaluator`` would: same ``evaluate_variant``; the verdict comes from an actor.

    An actor or node that dies mid-evaluation costs that evaluation a retry on another live actor
    of the same hardware; when none is left the evaluation is an ``INFRA_ERROR`` (not the
    candidate's fault: the search evaluates it again on resume). ``hardware`` pins the cards it
    starts: the run gives a card to evaluators of one hardware only, so timings from different
    GPUs are never compared.
    """

    def __init__(self, cluster: RayCluster, actor: _Actor):
        self.cluster, self.actor = cluster, actor
        self.backend = cluster.backend
        self.arch = actor.info.arch
        self.hardware = actor.info.hardware
        self.device = f"ray:{actor.info.node_id[:8]}/{actor.info.device}#{actor.info.pid}"

    def evaluate_variant(self, variant: Any, source: str, examples: Sequence = (), *, seed: int = 0) -> Evaluation:
        ray = _ray()
        blobs, deaths = self.cluster.blobs(examples), []
        while True:
            actor = self.cluster.take(self.actor, self.hardware)
            if actor is None:
                return Evaluation(Status.INFRA_ERROR, f"no live Ray evaluator actor on {self.hardware}: "
                                  + "; ".join(deaths or ["none was started"]))
            self.actor = actor
            try:
                ev = ray.get(actor.handle.evaluate.remote(variant, source, examples, [blobs], seed))
            except ray.exceptions.RayActorError as exc:
                why = f"actor {actor.info.pid} on node {actor.info.node_id[:8]} died: {type(exc).__name__}"
                deaths.append(why)
                self.cluster.release(actor, lost=why)
                continue
            except BaseException:
                self.cluster.release(actor)
                raise
            self.cluster.release(actor)
            return ev

    def build(self, source: str) -> None:
        """Compile on the actor that will judge ``source``, into its node's cache, beside its evaluation.

        NB: an actor call, not a plain Ray task: a task needs a worker process, and Ray stops idle
        workers beyond the node's CPU count after a second, so each compile paid a Python start
        (6-7 s on the loaded 2-core machine, measured).
        """
        ray = _ray()
        ray.get(self.actor.handle.compile.remote(source))

    def close(self) -> None:
        """The actors belong to the cluster: ``RayCluster.close`` stops them."""

    def __repr__(self) -> str:
        return f"<RayEvaluator {self.device} on {self.hardware}>"
