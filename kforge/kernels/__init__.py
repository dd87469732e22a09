"""The kernel contract and its backends (CUDA through nvcc, C/OpenMP on the CPU)."""
from __future__ import annotations

from ._compile import CONTRACT_VERSION, INCLUDE_DIR, CompiledKernel, CompileError, cache_dir, compile_source, find_nvcc
from ._device import DeviceInfo, backend_of, device_info
from ._library import Kernel, KfTensor, LaunchError, LaunchFrame
from ._params import param_vector

__all__ = [
    "CONTRACT_VERSION", "INCLUDE_DIR", "CompiledKernel", "CompileError", "DeviceInfo", "Kernel", "KfTensor",
    "LaunchError", "LaunchFrame", "backend_of", "cache_dir", "compile_source", "device_info",
    "find_nvcc", "param_vector",
]
