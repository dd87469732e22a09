"""Host cost of a dispatched call: eager vs a kforge kernel vs a guard miss (falls back to eager).

    python benchmarks/deploy_overhead.py --device cuda

A small softmax keeps the GPU time negligible, so the loop measures what the host pays per call
(launches are asynchronous; the device is synchronised once at the end of each loop).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kforge.deploy import DeployedKernel, Deployment  # noqa: E402
from kforge.kernels import Kernel, compile_source, device_info  # noqa: E402
from kforge.ops import get_spec  # noqa: E402


def _per_call_us(fn, device: str, n: int = 2000, rounds: int = 7) -> float:
    samples = []
    for _ in range(rounds):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(samples)


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

    eager = _per_call_us(lambda: x.softmax(-1), device)
    eager_other = _per_call_us(lambda: other.softmax(-1), device)
    dep = Deployment([DeployedKernel(variant, kernel)]).install()
    try:
        torch.testing.assert_close(x.softmax(-1), torch.softmax(x.double(), -1).float())
        dispatched = _per_call_us(lambda: x.softmax(-1), device)
        miss = _per_call_us(lambda: other.softmax(-1), device)
        calls = dep.kernels[0].calls
    finally:
        dep.remove()
    print(f"\n== host cost per call on {device_info(device).name}, softmax {tuple(x.shape)} (median of 7 x 2000 calls)")
    print(f"eager x.softmax(-1):                 {eager:6.2f} us")
    print(f"kforge kernel (exact-signature hit):  {dispatched:6.2f} us  ({calls} kernel calls)")
    print(f"kforge guard miss -> eager:           {miss:6.2f} us  (eager for that shape: {eager_other:.2f} us)")
    print("operators without a winner are not patched: they cost exactly eager")


if __name__ == "__main__":
    main()
