"""What kforge knows about the device a kernel runs on (given to proposers and the roofline)."""
from __future__ import annotations

import functools
import os
import platform
from dataclasses import asdict, dataclass

import torch

# NB: measured device-to-device copy bandwidth (bytes read + written), GB/s. The roofline uses
# these when the name matches; other devices are measured once with a large copy.
_MEASURED_BANDWIDTH_GBS = {"NVIDIA H200": 4250.0}


@dataclass(frozen=True)
class DeviceInfo:
    backend: str          # "cuda" | "cpu"
    name: str
    arch: str             # "sm_90" on CUDA, the machine type on the CPU
    sm_count: int         # multiprocessors on CUDA, cores on the CPU
    bandwidth_gbs: float  # memory bandwidth the roofline uses
    l2_bytes: int = 0
    max_shared_per_block: int = 0

    def to_json(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        if self.backend == "cuda":
            return (f"{self.name} ({self.arch}, {self.sm_count} SMs, L2 {self.l2_bytes >> 20} MB, "
                    f"{self.bandwidth_gbs:.0f} GB/s measured copy bandwidth, "
                    f"{self.max_shared_per_block >> 10} KB opt-in shared memory per block)")
        return f"{self.name} ({self.sm_count} cores, {self.bandwidth_gbs:.0f} GB/s measured copy bandwidth)"


def backend_of(device: str) -> str:
    return "cuda" if str(device).startswith("cuda") else "cpu"


@functools.lru_cache(maxsize=None)
def device_info(device: str = "cpu") -> DeviceInfo:
    """Describe ``device`` ("cpu", "cuda", "cuda:1")."""
    if backend_of(device) == "cuda":
        dev = torch.device(device)
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        bw = _MEASURED_BANDWIDTH_GBS.get(props.name) or _measure_copy_bandwidth(f"cuda:{idx}")
        shared = getattr(props, "shared_memory_per_block_optin", 0) or 0
        return DeviceInfo("cuda", props.name, f"sm_{props.major}{props.minor}",
                          props.multi_processor_count, bw, getattr(props, "L2_cache_size", 0), shared)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return DeviceInfo("cpu", name, platform.machine(), cores, _measure_copy_bandwidth("cpu"))


def _measure_copy_bandwidth(device: str) -> float:
    n = (256 << 20) // 4
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    from ..timing import bench

    t = bench(lambda: dst.copy_(src), device=device, reps=10, flush_l2=False)
    return 2 * src.numel() * 4 / (t.median_us * 1e-6) / 1e9
