"""What every part of the kernel build shares and nothing of it imports back: the compile errors and where nvcc is.
``_compile`` (the build) and ``_cutlass`` (what a CUTLASS source adds to it) both read these."""
from __future__ import annotations

import os
import shutil


class CompileError(RuntimeError):
    def __init__(self, message: str, log: str):
        super().__init__(message)
        self.log = log


class SourceRejected(CompileError):
    """The static screen refused the source (``log`` lists every finding); it was not compiled."""


class BinaryRejected(SourceRejected):
    """The built library imports, links or executes what a kernel may not (``log`` lists why); it never loads."""


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "bin", "nvcc")):
            return os.path.join(root, "bin", "nvcc")
    return None


__all__ = ["BinaryRejected", "CompileError", "SourceRejected", "find_nvcc"]
