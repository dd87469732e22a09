"""What serving a deployed CPU kernel from its sandboxed worker costs a call (kforge/deploy/_worker.py).

    python benchmarks/worker_round_trip.py [--calls 2000] [--rounds 9] [--json-out PATH]

Per call, median over interleaved rounds (each round runs every row ``--calls`` times, so drift hits all alike):
eager's softmax, the same kernel loaded into this process (``DeployedKernel(variant, Kernel(...))``, the C launcher:
how kernels ran before issue 42's fix) and served by its worker (``DeployedKernel.from_binary``: the inputs copied
into the shared arena, one frame each way, the outputs copied out), for a kernel whose kf_launch returns at once
(the round trip alone) and for a softmax kernel, at a tiny and a mid-size shape; and the runner's bare PING round
trip (one frame each way, no copies, no Python around the call). served - in process is the worker's overhead.
One thread everywhere (``OMP_NUM_THREADS=1`` unless set).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

# NB: one thread in this process and in the worker (runner_env passes OMP_*), so that the rows compare the round trip,
# not thread counts (torch.set_num_threads would set the in-process kernel's OpenMP threads only)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from kforge.capture import Card  # noqa: E402
from kforge.deploy import DeployedKernel  # noqa: E402
from kforge.evaluate._frames import Op  # noqa: E402
from kforge.kernels import Kernel, compile_source  # noqa: E402
from kernel_files import kernel_source  # noqa: E402

NULL_KERNEL = """#include "kforge.h"
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) { return 0; }
"""


def _per_call_us(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()
    null = compile_source(NULL_KERNEL, "cpu", "native").path
    softmax = compile_source(kernel_source("cpu", "softmax_rows"), "cpu", "native").path
    rows: dict[str, object] = {}
    kernels = []
    for shape in ((3, 7), (64, 1024)):
        x = torch.randn(*shape)
        variant = Card.for_call("softmax", x, -1).variant
        tag = "x".join(map(str, shape))
        rows[f"eager softmax {tag}"] = lambda x=x: x.softmax(-1)
        for name, path in (("null kernel", null), ("softmax kernel", softmax)):
            here = DeployedKernel(variant, Kernel(path))
            served = DeployedKernel.from_binary(variant, path)
            kernels.append(served)
            rows[f"{name} {tag}, in process"] = lambda dk=here, x=x: dk((x,))
            rows[f"{name} {tag}, served"] = lambda dk=served, x=x: dk((x,))
    runner = kernels[0].served._worker
    if runner is None:
        kernels[0]((torch.randn(3, 7),))
        runner = kernels[0].served._worker
    rows["runner PING (one frame each way)"] = lambda r=runner.runner: r.request(Op.PING, time.monotonic() + 10)
    samples: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(args.rounds):
        for name, fn in rows.items():
            fn()
            samples[name].append(_per_call_us(fn, args.calls))
    result = {name: statistics.median(v) for name, v in samples.items()}
    load = os.getloadavg()
    print(f"per call, median of {args.rounds} interleaved rounds of {args.calls} calls; load average "
          f"{load[0]:.2f} on {os.cpu_count()} cores")
    for name, us in result.items():
        print(f"  {name:45s} {us:8.2f} us")
    for shape in ("3x7", "64x1024"):
        for name in ("null kernel", "softmax kernel"):
            print(f"  overhead {name} {shape}: {result[f'{name} {shape}, served'] - result[f'{name} {shape}, in process']:.2f} us")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"per_call_us": result, "load": load}, indent=1))
    for dk in kernels:
        dk.close()


if __name__ == "__main__":
    main()
