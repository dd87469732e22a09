"""The kernel contract and its backends (CUDA through nvcc, C/OpenMP on the CPU)."""
from __future__ import annotations

from ._compile import (CONTRACT_VERSION, INCLUDE_DIR, BinaryRejected, CacheTamperedWarning, CompiledKernel,
                       CompileError, KernelIntegrityError, SourceRejected, ToolLimits, cache_dir, check_binary,
                       compile_source, compile_timeout, find_nvcc, load_verified, verify_binary)
from ._screen import Finding, screen
from ._device import DeviceInfo, backend_of, device_info
from ._library import Kernel, KfTensor, LaunchError, LaunchFrame
from ._params import param_vector

__all__ = [
    "CONTRACT_VERSION", "INCLUDE_DIR", "BinaryRejected", "CacheTamperedWarning", "CompiledKernel", "CompileError", "DeviceInfo",
    "Finding", "Kernel", "KernelIntegrityError", "KfTensor", "LaunchError", "LaunchFrame", "SourceRejected",
    "ToolLimits", "backend_of", "cache_dir", "check_binary", "compile_source", "compile_timeout", "device_info", "find_nvcc", "load_verified", "param_vector",
    "screen", "verify_binary",
]
