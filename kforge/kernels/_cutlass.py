"""What a CUTLASS (or CuTe) source needs from the compile path, and only such a source.

A candidate that includes ``cutlass/...`` or ``cute/...`` headers is built by ``compile_source`` like any other (screen,
jail, binary wall, cache by content), with four differences, each named here:

- its include folders: the CUTLASS tree's ``include`` and ``tools/util/include`` (``cutlass_root``), read by the
  compiler's jail;
- its target: Hopper's architecture-specific one (``sm_90a``, for TMA and wgmma) where the device is ``sm_90``
  (``target_arch``);
- its flags: ``--expt-relaxed-constexpr`` (CuTe's constexpr host functions in device code) and
  ``CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL``, so that CUTLASS calls the driver's TMA descriptor functions by name
  (imports the binary wall can list) instead of looking them up with ``cudaGetDriverEntryPoint``, which reaches any
  driver function; linked against the driver (``driver_library``) where one is here;
- its limits: a Hopper CUTLASS build takes ~50 s of CPU and ~3.4 GB resident here (cicc), 60-340 s on other
  machines: ``CUTLASS_LIMITS`` and ``CUTLASS_TIMEOUT_S`` instead of a plain kernel's 120 s and 4 GiB.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from ._toolchain import CompileError, find_nvcc

# NB: measured here (nvcc 13.0, gcc 12, 2 cores): a TMA warp-specialised GEMM with an epilogue visitor tree and an
# implicit-GEMM convolution each built in 47 s of wall (34 s of CPU), cicc at 3.2-3.4 GB resident; 60-340 s were seen
# for larger tiles and designs. The limits leave 2.5x of the time seen and 4x of the memory.
CUTLASS_TIMEOUT_S = 900.0
CUTLASS_ADDRESS_SPACE = 16 << 30
CUTLASS_FILE_BYTES = 1 << 30

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"](?:cutlass|cute)/', re.MULTILINE)
# NB: Hopper's warpgroup matrix instructions (CuTe's GMMA atoms) exist only on the architecture-specific target
_ARCH_SPECIFIC = re.compile(r"\bwgmma|\bGMMA\b")
_FLAGS = ("--expt-relaxed-constexpr", "-DCUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL=1")


def uses_cutlass(source: str) -> bool:
    """Whether a source includes CUTLASS's or CuTe's headers (read as the screen reads it: comments removed, spliced
    lines joined)."""
    from ._screen import _join_splices, _strip_comments

    return bool(_INCLUDE.search(_strip_comments(_join_splices(source))))


def target_arch(source: str, arch: str) -> str:
    """The architecture a CUDA source is built for: ``arch`` (the device's, e.g. ``sm_90``), or its
    architecture-specific variant (``sm_90a``) where the source needs it (CUTLASS or CuTe headers, wgmma): TMA
    warp-specialised kernels and wgmma are not in ``sm_90``'s instruction set. Devices before Hopper have no such
    variant; an arch that already names one is kept."""
    m = re.fullmatch(r"sm_(\d+)", arch)
    if m is None or int(m.group(1)) < 90:
        return arch
    from ._screen import _join_splices, _strip_comments

    text = _strip_comments(_join_splices(source))
    return f"{arch}a" if _INCLUDE.search(text) or _ARCH_SPECIFIC.search(text) else arch


def cutlass_root() -> Path | None:
    """The CUTLASS source tree the ``nvidia-cutlass`` wheel ships (``include/cutlass/cutlass.h`` inside), or the one
    ``CUTLASS_PATH`` names; None where neither is there."""
    env = os.environ.get("CUTLASS_PATH")
    roots = [Path(env)] if env else []
    try:
        import importlib.util

        spec = importlib.util.find_spec("cutlass_library")
        for base in (spec.submodule_search_locations or []) if spec is not None else []:
            roots.append(Path(base) / "source")
    except (ImportError, ValueError):
        pass
    for root in roots:
        if (root / "include" / "cutlass" / "cutlass.h").is_file():
            return root.resolve()
    return None


def driver_library() -> Path | None:
    """The CUDA driver (``libcuda.so.1``) a CUTLASS kernel's host code calls for its TMA descriptors, or the toolkit's
    link stub of it (same soname); None where neither is here (then the kernel leaves those two functions to the
    driver already loaded in the process that runs it)."""
    for folder in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu", "/usr/local/nvidia/lib64",
                   "/usr/lib/wsl/lib"):
        p = Path(folder) / "libcuda.so.1"
        if p.exists():
            return p
    nvcc = find_nvcc()
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
             str(Path(os.path.realpath(nvcc)).parent.parent) if nvcc else None, "/usr/local/cuda"]
    for root in filter(None, roots):
        for sub in ("lib64/stubs", "targets/x86_64-linux/lib/stubs", "targets/sbsa-linux/lib/stubs"):
            p = Path(root) / sub / "libcuda.so"
            if p.exists():
                return p
    return None


def cutlass_build(arch: str) -> tuple[list[str], tuple[Path, ...], str]:
    """(nvcc's arguments for a CUTLASS source beyond a plain kernel's, the folders the compiler must read, what of
    this machine the build depends on: part of the cache key). ``arch``: the target (``target_arch``'s). Raises
    CompileError where the CUTLASS headers are not here."""
    root = cutlass_root()
    if root is None:
        raise CompileError("the source includes CUTLASS headers, but none were found: pip install nvidia-cutlass "
                           "(kforge[cutlass]) or set CUTLASS_PATH to a CUTLASS tree", "")
    num = arch.removeprefix("sm_")
    args = [f"-gencode=arch=compute_{num},code=sm_{num}", *_FLAGS,
            f"-I{root / 'include'}", f"-I{root / 'tools' / 'util' / 'include'}"]
    readable: list[Path] = [root]
    driver = driver_library()
    if driver is not None:
        args += ["-Xlinker", str(driver)]
        readable.append(driver.resolve().parent)
    version = hashlib.sha256((root / "include" / "cutlass" / "version.h").read_bytes()).hexdigest()[:16]
    return args, tuple(readable), f"cutlass:{root}:{version}:{driver or ''}"


__all__ = ["CUTLASS_ADDRESS_SPACE", "CUTLASS_FILE_BYTES", "CUTLASS_TIMEOUT_S", "cutlass_build", "cutlass_root",
           "driver_library", "target_arch", "uses_cutlass"]
