"""What dispatching a kernel costs the host, which the deployment plan weighs each operator's winners against
(``_deployment_plan.choose``: a kernel's saving must exceed it).

The cost is measured where it is paid: in this process, on the device in use, through the
dispatch path in use (the C front and launcher, or the Python guard and ctypes), once per process,
device and path (``measure_dispatch_cost``). ``KFORGE_DISPATCH_COST="hit_us,miss_us"`` or a
``dispatch_cost=`` argument (``Session.apply``/``export``, ``kforge.load``) replaces it.
"""
from __future__ import annotations

import os
import struct
import threading
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING
from pathlib import Path

import torch

from ..ops import get_spec
from ..timing import bench_many
from ._fast import dispatch_type

if TYPE_CHECKING:
    from ..kernels._plan import LaunchPlan

ENV = "KFORGE_DISPATCH_COST"


@dataclass(frozen=True)
class DispatchCost:
    """Extra host time per call over eager's own, for a dispatched kernel (hit) and for a call of a
    patched operator that has no kernel (miss); ``source`` says where the figures come from."""

    hit_us: float
    miss_us: float
    source: str = "given"

    def describe(self) -> str:
        return f"{self.hit_us:.2f} us per kernel call, {self.miss_us:.2f} us per other call ({self.source})"


# NB: only where the probe kernel cannot be built or run (no compiler on a machine that loads an
# artifact, a torch function mode around apply): CUDA, the H200 with the old Python path
# (2026-11-30: eager 9.2 us, dispatched 18.7, miss 11.8); CPU, the 2-core AMD EPYC of docs/benchmarks.md, a call
# served by its worker (benchmarks/worker_round_trip.py: ~40 us a round trip, 2026-12-06).
FALLBACK = {"cuda": DispatchCost(9.5, 2.5, "fallback: H200, old Python path"),
            "cpu": DispatchCost(40.0, 0.5, "fallback: 2-core AMD EPYC, C path, served by a worker")}

# The probe: softmax over the rows of a tiny float32 matrix, computed in one plain loop (the
# device's work is negligible, so the rows measure the host's).
_PROBE_SHAPE = (3, 7)
_PROBE_OTHER = (5, 7)   # another shape: a miss
_PROBE_C = r"""
#include "kforge.h"
KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    const float* x = (const float*)in[0].data;
    float* y = (float*)out[0].data;
    int64_t cols = in[0].sizes[1];
    for (int64_t r = 0; r < in[0].sizes[0]; ++r) {
        float m = KF_NEG_INF, s = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = x[r * cols + c] > m ? x[r * cols + c] : m;
        for (int64_t c = 0; c < cols; ++c) { y[r * cols + c] = expf(x[r * cols + c] - m); s += y[r * cols + c]; }
        for (int64_t c = 0; c < cols; ++c) y[r * cols + c] /= s;
    }
    return 0;
}
"""
_PROBE_CUDA = r"""
#include "kforge.h"
extern "C" __global__ void probe_softmax(const float* x, float* y, int64_t rows, int64_t cols) {
    int64_t r = threadIdx.x;
    if (r >= rows) return;
    float m = KF_NEG_INF, s = 0.f;
    for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, x[r * cols + c]);
    for (int64_t c = 0; c < cols; ++c) { y[r * cols + c] = __expf(x[r * cols + c] - m); s += y[r * cols + c]; }
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] /= s;
}
KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    probe_softmax<<<1, 32, 0, (cudaStream_t)stream>>>((const float*)in[0].data, (float*)out[0].data,
                                                      in[0].sizes[0], in[0].sizes[1]);
    return (int)cudaGetLastError();
}
"""
_EAGER = torch._C.TensorBase.softmax   # NB: the unpatched method, whatever kforge has installed


class _Probe(torch.nn.Module):
    """``calls`` softmax calls per forward, through the patched method or eager's own."""

    def __init__(self, calls: int, eager: bool):
        super().__init__()
        self.calls, self.eager = calls, eager

    def forward(self, x: torch.Tensor) -> None:
        if self.eager:
            for _ in range(self.calls):
                _EAGER(x, -1)
        else:
            for _ in range(self.calls):
                x.softmax(-1)


_lock = threading.Lock()
_MEASURED: dict[tuple[str, str], DispatchCost] = {}


def _normalised(device: str) -> str:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return str(dev)


def _path() -> str:
    return "C path" if dispatch_type() is not None else "Python path"


def _where(device: str) -> str:
    """How a deployed kernel's call is served on ``device``: through its worker on the CPU."""
    if not device.startswith("cuda"):
        return _path() + ", served by a worker"
    from ._replay import replay_enabled

    return _path() + (", replayed plan" if replay_enabled() else ", loaded in process")


def measure_dispatch_cost(device: str = "cpu", *, calls: int = 200, reps: int = 15) -> DispatchCost:
    """The host cost of kforge's dispatch in this process on ``device``, through the path in use.

    A tiny softmax is timed by the host's clock (``kforge.timing``, each repetition ``calls`` calls
    and, on CUDA, a synchronisation), interleaved: eager, the same call dispatched to a registered
    kernel for its exact signature (hit), and a call of another shape (miss) with eager at that
    shape. The fastest repetition of each counts (a busy machine only adds time). Cached per
    process, device and dispatch path; where the probe kernel cannot be built or run, ``FALLBACK``
    with a warning that says why.
    """
    device = _normalised(device)
    key = (device, _where(device))
    with _lock:
        if key not in _MEASURED:
            try:
                _MEASURED[key] = _measure(device, calls, reps)
            except Exception as exc:   # no compiler, a mode that keeps every call eager, ...
                cost = FALLBACK["cuda" if device.startswith("cuda") else "cpu"]
                warnings.warn(f"kforge: could not measure the dispatch cost on {device} ({exc}); using "
                              f"{cost.describe()}. Set {ENV}=hit_us,miss_us to give it", stacklevel=3)
                _MEASURED[key] = cost
        return _MEASURED[key]


def _measure(device: str, calls: int, reps: int) -> DispatchCost:
    from ..kernels import Kernel, compile_source, device_info
    from ._deployment import Deployment
    from ._dispatch import DISPATCHER, variant_key
    from ._launch import DeployedKernel
    from ._replay import RecordedKernel, replay_enabled

    cuda = device.startswith("cuda")
    backend = "cuda" if cuda else "cpu"
    built = compile_source(_PROBE_CUDA if cuda else _PROBE_C, backend, device_info(device).arch if cuda else "native")
    spec = get_spec("softmax")
    rows = _PROBE_SHAPE[0]
    while True:   # NB: a shape no installed kernel has: installing must not replace one of the user's
        x = torch.randn(rows, _PROBE_SHAPE[1], device=device)
        call = spec.bind(x, -1)
        variant = spec.variant(call, [spec.reference(call.inputs, call.params)])
        if variant_key(variant) not in DISPATCHER.tables.get("softmax", {}):
            break
        rows += 1
    other = torch.randn(*_PROBE_OTHER, device=device)
    # NB: on the CPU served by a worker, as every deployed CPU kernel is: the hit cost includes its round trip
    # and on CUDA through the path a winner takes: its launch plan replayed by kforge's launcher, or (replay off) the
    # library loaded in this process
    if not cuda:
        kernel = DeployedKernel.from_binary(variant, built.path)
    elif replay_enabled():
        kernel = DeployedKernel(variant, RecordedKernel(_probe_plan(built.path, x.shape)))
    else:
        kernel = DeployedKernel(variant, Kernel(built.path))
    probe, eager = _Probe(calls, eager=False), _Probe(calls, eager=True)
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)

    def row(module: _Probe, t: torch.Tensor):
        def run() -> None:
            module(t)
            sync()
        return run

    warmup = 2
    with Deployment([kernel], probe):   # scoped to the probe: nothing else in the process sees it
        # NB: device "cpu" selects the host's clock: the cost is host time, and each repetition
        # ends synchronised, so a CUDA repetition also waits for its launches. One intra-op thread
        # on the CPU: eager's softmax would otherwise open a parallel region that the probe kernel
        # does not, and the rows would compare threading, not dispatch.
        t_eager, t_hit, t_eager_other, t_miss = bench_many(
            [row(eager, x), row(probe, x), row(eager, other), row(probe, other)], device="cpu", warmup=warmup,
            reps=reps, flush_l2=False, threads=None if cuda else 1)
    expected = (warmup + reps) * calls
    if kernel.calls != expected:
        raise RuntimeError(f"the probe kernel ran {kernel.calls} of {expected} calls: something around this call "
                           "(a torch function mode, autocast, a functorch transform) keeps calls eager")
    torch.testing.assert_close(_probe_output(kernel, x), _EAGER(x, -1))
    kernel.close()
    per_call = [t.min_us / calls for t in (t_eager, t_hit, t_eager_other, t_miss)]
    return DispatchCost(max(0.0, per_call[1] - per_call[0]), max(0.0, per_call[3] - per_call[2]),
                        f"measured on {device}, {_where(device)}")


def _probe_plan(library: "Path | str", shape: "tuple[int, ...] | torch.Size") -> "LaunchPlan":
    """The CUDA probe's launch plan, written here rather than recorded (kforge's own kernel: one launch of
    ``probe_softmax`` with its two pointers filled in per call); the replay checks the layout against the driver's."""
    from ..kernels._plan import LaunchPlan, PlanStep
    from ._replay import fatbin_of

    rows, cols = shape
    step = PlanStep("launch", 0, (1, 1, 1), (32, 1, 1), 0, False, ((0, 8), (8, 8), (16, 8), (24, 8)),
                    struct.pack("<QQqq", 0, 0, rows, cols), ((0, ("input", 0), 0), (8, ("output", 0), 0)))
    return LaunchPlan((fatbin_of(Path(library).read_bytes()),), ((0, "probe_softmax"),), (step,), 1, 1)


def _probe_output(kernel, x: torch.Tensor) -> torch.Tensor:
    """The probe kernel's own result for ``x`` (it must compute the softmax it stands in for)."""
    out = kernel((x,))[0]
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
    return out


def dispatch_cost(device: str, override: DispatchCost | None = None) -> DispatchCost:
    """The cost the filter uses: ``override``, else ``KFORGE_DISPATCH_COST``, else measured here."""
    if override is not None:
        return override
    text = os.environ.get(ENV, "").strip()
    if text:
        try:
            hit, miss = (float(v) for v in text.split(","))
        except ValueError:
            raise ValueError(f"{ENV}={text!r}: give two numbers, the extra host microseconds per kernel call "
                             "and per other call of a patched operator, e.g. 9.5,2.5") from None
        return DispatchCost(hit, miss, ENV)
    return measure_dispatch_cost(device)


def _patched_eagerly(op: str) -> bool:
    """Whether installing a winner of ``op`` patches torch callables or hooks a library's function (a region's
    does neither: it runs in the model's graph, and costs no eager dispatch)."""
    try:
        spec = get_spec(op)
        return any(t is not None for t in spec.targets) or bool(spec.functions)
    except KeyError:
        return True
