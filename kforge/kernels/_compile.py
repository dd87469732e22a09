"""Compile a candidate's source into a shared library, cached by source hash and target."""
from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

INCLUDE_DIR = Path(__file__).parent / "include"
CONTRACT_VERSION = 1


class CompileError(RuntimeError):
    def __init__(self, message: str, log: str):
        super().__init__(message)
        self.log = log


@dataclass(frozen=True)
class CompiledKernel:
    path: Path
    log: str
    seconds: float
    cached: bool


def cache_dir() -> Path:
    root = os.environ.get("KFORGE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "kforge")
    path = Path(root) / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "bin", "nvcc")):
            return os.path.join(root, "bin", "nvcc")
    return None


def _command(backend: str, arch: str, src: Path, out: Path) -> list[str]:
    if backend == "cuda":
        nvcc = find_nvcc()
        if nvcc is None:
            raise CompileError("nvcc was not found: install the CUDA toolkit or set CUDA_HOME", "")
        return [nvcc, "-O3", "-std=c++17", f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC",
                "-lineinfo", f"-I{INCLUDE_DIR}", "-o", str(out), str(src)]
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise CompileError("no C compiler was found: install gcc or set CC", "")
    try:
        cc_args = shlex.split(cc)  # CC may carry a launcher or flags ("ccache gcc")
    except ValueError as exc:
        raise CompileError(f"CC={cc!r} cannot be parsed ({exc}): fix or unset CC", "") from None
    if not cc_args:
        raise CompileError("CC is set but empty: unset it or name a C compiler", "")
    march = [] if arch == "generic" else ["-march=native"]
    return [*cc_args, "-O3", *march, "-std=gnu11", "-fopenmp", "-shared", "-fPIC", f"-I{INCLUDE_DIR}",
            "-o", str(out), str(src), "-lm"]


def compile_source(source: str, backend: str, arch: str, *, timeout_s: float = 120.0) -> CompiledKernel:
    """Build ``source`` for ``backend`` ("cuda": arch like "sm_90"; "cpu": "native").

    Returns the cached library when the same source was built for the same target before.
    """
    digest = hashlib.sha256(f"{CONTRACT_VERSION}|{backend}|{arch}|{source}".encode()).hexdigest()[:24]
    out = cache_dir() / f"{backend}-{arch}-{digest}.so"
    if out.exists():
        return CompiledKernel(out, "", 0.0, True)
    suffix = ".cu" if backend == "cuda" else ".c"
    with tempfile.TemporaryDirectory(prefix="kforge-build-") as tmp:
        src = Path(tmp) / f"kernel{suffix}"
        src.write_text(source)
        tmp_out = Path(tmp) / "kernel.so"
        start = time.perf_counter()
        try:
            proc = subprocess.run(_command(backend, arch, src, tmp_out), capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise CompileError(f"compilation took longer than {timeout_s:.0f} s", "") from None
        except OSError as exc:  # the compiler named by CC/CUDA_HOME is not there or cannot run
            if backend == "cuda":
                what = "install the CUDA toolkit or set CUDA_HOME"
            elif os.environ.get("CC"):
                what = f"CC={os.environ['CC']!r} names a compiler that cannot run: fix or unset CC"
            else:
                what = "install gcc or set CC"
            raise CompileError(f"could not run the compiler ({exc}): {what}", "") from None
        seconds = time.perf_counter() - start
        log = (proc.stdout + proc.stderr).replace(str(src), suffix.lstrip(".") and f"kernel{suffix}")
        if proc.returncode != 0:
            raise CompileError(f"compilation failed (exit {proc.returncode})", log[-20000:])
        # NB: rename is atomic, so concurrent builders of one source never see a partial file.
        staged = out.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(tmp_out, staged)
        os.replace(staged, out)
    return CompiledKernel(out, log[-20000:], seconds, False)
