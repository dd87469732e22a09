"""The hand-written kernels and the fault corpus under tests/kernels/."""
from __future__ import annotations

from pathlib import Path

KERNELS = Path(__file__).parent / "kernels"


def kernel_source(backend: str, name: str) -> str:
    ext = "cu" if backend == "cuda" else "c"
    return (KERNELS / backend / f"{name}.{ext}").read_text()
