"""Host cost of a dispatched call: eager vs a kforge kernel vs a guard miss (falls back to eager).

    python benchmarks/deploy_overhead.py --device cuda     (or --device cpu)

A small softmax keeps the GPU time negligible, so the loop measures what the host pays per call
(launches are asynchronous; the device is synchronised once at the end of each loop). The kforge
hit is measured through both paths (the C dispatch front and launcher, and the pure-Python guard
with a ctypes launch, as with KFORGE_FASTPATH=0), and once more with a kernel whose kf_launch
returns at once: that row is kforge's own machinery (guard, allocation, launch call) with no
kernel launch at all. Rounds interleave every row, so drift hits all alike.

Then the dispatch cost that ``apply()``, ``export()`` and ``kforge.load()`` filter winners with, as
they measure it in the user's process (``kforge.deploy.measure_dispatch_cost``), through each path.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kforge.deploy import DeployedKernel, Deployment, measure_dispatch_cost  # noqa: E402
from kforge.deploy._select import FALLBACK  # noqa: E402
from kforge.deploy._fast import unavailable_reason  # noqa: E402
from kforge.kernels import Kernel, compile_source, device_info  # noqa: E402
from kforge.ops import get_spec  # noqa: E402

NULL_KERNEL = """#include "kforge.h"
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) { return 0; }
"""


def _loop_us(fn, device: str, n: int) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e6


def measure(rows: dict, device: str, n: int = 2000, rounds: int = 9) -> dict[str, float]:
    """Median per-call microseconds of each row; a row is (setup, call, teardown)."""
    samples: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(rounds):
        for name, (setup, call, teardown) in rows.items():
            setup()
            try:
                call()  # warm
                samples[name].append(_loop_us(call, device, n))
            finally:
                teardown()
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = args.device
    backend = "cuda" if device.startswith("cuda") else "cpu"
    ext = "cu" if backend == "cuda" else "c"
    src = (ROOT / "tests" / "kernels" / backend / f"softmax_rows.{ext}").read_text()
    arch = device_info(device).arch if backend == "cuda" else "native"
    x = torch.randn(4, 64, device=device)
    other = torch.randn(4, 32, device=device)  # another shape: the guard misses
    spec = get_spec("softmax")
    call = spec.bind(x, -1)
    variant = spec.variant(call, [spec.reference(call.inputs, call.params)])
    kernel = Kernel(compile_source(src, backend, arch).path)
    null = Kernel(compile_source(NULL_KERNEL, backend, arch).path)

    deps = {"c": Deployment([DeployedKernel(variant, kernel)]),
            "python": Deployment([DeployedKernel(variant, kernel, fast=False)]),
            "null": Deployment([DeployedKernel(variant, null)])}

    def install_python():  # the guard in Python and the launch through ctypes: no C at all
        os.environ["KFORGE_FASTPATH"] = "0"
        try:
            deps["python"].install()
        finally:
            del os.environ["KFORGE_FASTPATH"]

    expected = torch.softmax(x.double(), -1).float()
    with deps["c"]:
        torch.testing.assert_close(x.softmax(-1), expected)
    install_python()
    try:
        torch.testing.assert_close(x.softmax(-1), expected)
    finally:
        deps["python"].remove()
    nothing = lambda: None  # noqa: E731
    rows = {"eager": (nothing, lambda: x.softmax(-1), nothing),
            "eager_other": (nothing, lambda: other.softmax(-1), nothing),
            "alloc": (nothing, lambda: torch.empty_strided((4, 64), (64, 1), device=device), nothing)}
    for name, dep in deps.items():
        rows[f"hit_{name}"] = (install_python if name == "python" else dep.install, lambda: x.softmax(-1), dep.remove)
    rows["miss"] = (deps["c"].install, lambda: other.softmax(-1), deps["c"].remove)
    # graph mode: what a compiled graph's call of the kernel costs (Inductor's wrapper code calls the op)
    from kforge.deploy._runop import RUN_TABLE
    run = torch.ops.kforge.run.default
    graph_c, graph_null = DeployedKernel(variant, kernel), DeployedKernel(variant, null)
    for dk in (graph_c, graph_null):
        RUN_TABLE.register(dk)
    torch.testing.assert_close(run(graph_c.run_name, [x])[0], expected)
    aten_softmax = torch.ops.aten._softmax.default
    rows["graph_aten"] = (nothing, lambda: aten_softmax(x, -1, False), nothing)
    rows["graph_kforge"] = (nothing, lambda: run(graph_c.run_name, [x]), nothing)
    rows["graph_kforge_null"] = (nothing, lambda: run(graph_null.run_name, [x]), nothing)
    rows["direct_null"] = (nothing, lambda: graph_null((x,)), nothing)
    us = measure(rows, device)
    fast = deps["c"].kernels[0].fast
    print(f"\n== host cost per call on {device_info(device).name}, softmax {tuple(x.shape)} "
          f"(median of 9 interleaved rounds x 2000 calls)")
    print(f"eager x.softmax(-1):                          {us['eager']:6.2f} us")
    if not fast:
        print(f"(the C fast path is unavailable here: {unavailable_reason()})")
    print(f"kforge hit, C front and launcher:             {us['hit_c']:6.2f} us")
    print(f"kforge hit, Python guard and ctypes launch:   {us['hit_python']:6.2f} us")
    print(f"kforge hit, kernel that returns at once:      {us['hit_null']:6.2f} us  (machinery only)")
    print(f"kforge guard miss -> eager:                   {us['miss']:6.2f} us  (eager for that shape: "
          f"{us['eager_other']:.2f} us)")
    print(f"torch.empty_strided alone:                    {us['alloc']:6.2f} us")
    print("graph mode (the calls a compiled graph makes):")
    print(f"  aten._softmax.default:                      {us['graph_aten']:6.2f} us")
    print(f"  kforge::run, the kernel:                    {us['graph_kforge']:6.2f} us")
    print(f"  kforge::run, kernel that returns at once:   {us['graph_kforge_null']:6.2f} us  (op + table + launcher)")
    print(f"  the launcher alone, kernel returns at once:  {us['direct_null']:6.2f} us")
    print(f"kernel calls: C {deps['c'].kernels[0].calls}, Python {deps['python'].kernels[0].calls}")
    print("operators without a winner are not patched: they cost exactly eager")
    print_measured_costs(device, fast)


def print_measured_costs(device: str, fast: bool) -> None:
    """The cost apply()/load() use, measured as they measure it, through each dispatch path."""
    print(f"\n== dispatch cost as apply()/export()/load() measure it on {device} (extra host us per call "
          "over eager; probe: softmax (3, 7))")
    paths = [("1", "C front and launcher")] if fast else []
    paths.append(("0", "Python guard and ctypes"))
    for flag, name in paths:
        os.environ["KFORGE_FASTPATH"] = flag
        try:
            start = time.perf_counter()
            cost = measure_dispatch_cost(device)
            took = time.perf_counter() - start
        finally:
            del os.environ["KFORGE_FASTPATH"]
        print(f"{name + ':':45s}hit {cost.hit_us:6.2f} us, miss {cost.miss_us:6.2f} us  "
              f"({cost.source}; measured in {took:.2f} s)")
    old = FALLBACK["cuda" if device.startswith("cuda") else "cpu"]
    print(f"{'fallback when it cannot be measured:':45s}hit {old.hit_us:6.2f} us, miss {old.miss_us:6.2f} us  "
          f"({old.source})")


if __name__ == "__main__":
    main()
