"""Compile a candidate's source into a shared library, in a content-addressed cache.

Every source is screened first (kforge/kernels/_screen.py): a refused one never reaches the
compiler. Built libraries are stored as ``objects/<sha256 of the binary>.so`` and found through
``index/<key>.json`` (key: hash of contract, header, target and source), which records that hash; both
are written atomically by the builder. Before a library is returned or loaded its bytes are
hashed again: a library changed after it was built is deleted, reported and rebuilt (or refused
by ``load_verified``), so an overwritten cache entry never runs.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ._screen import describe, screen, screen_disabled

if TYPE_CHECKING:
    from ._library import Kernel

INCLUDE_DIR = Path(__file__).parent / "include"
CONTRACT_VERSION = 1
# NB: the header's bytes are part of every cache key: a changed helper in kforge.h rebuilds what used it.
_HEADER_DIGEST = hashlib.sha256((INCLUDE_DIR / "kforge.h").read_bytes()).hexdigest()[:16]


class CompileError(RuntimeError):
    def __init__(self, message: str, log: str):
        super().__init__(message)
        self.log = log


class SourceRejected(CompileError):
    """The static screen refused the source (``log`` lists every finding); it was not compiled."""


class KernelIntegrityError(RuntimeError):
    """A compiled library's bytes no longer match the SHA-256 recorded when it was built."""


class CacheTamperedWarning(UserWarning):
    """A cached library had changed since it was built; it was deleted and rebuilt."""


@dataclass(frozen=True)
class CompiledKernel:
    path: Path
    log: str
    seconds: float
    cached: bool
    sha256: str = ""          # of the library's bytes, recorded when it was built

    def verify(self) -> None:
        """Raise KernelIntegrityError unless the library's bytes still hash to ``sha256``."""
        _check_digest(self.path, self.sha256)


def cache_dir() -> Path:
    root = os.environ.get("KFORGE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "kforge")
    path = Path(root) / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def file_sha256(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_digest(path: Path, expected: str) -> None:
    if len(expected) != 64:
        raise KernelIntegrityError(f"{path} has no recorded SHA-256 to check it against; build it with "
                                   "compile_source or pass the expected hash")
    try:
        actual = file_sha256(path)
    except OSError as exc:
        raise KernelIntegrityError(f"{path} cannot be read to check its SHA-256 ({exc})") from None
    if actual != expected:
        raise KernelIntegrityError(f"{path} does not match the SHA-256 recorded when it was built (expected "
                                   f"{expected[:16]}..., found {actual[:16]}...): the library was modified after "
                                   "it was built; refusing to load it")


def _is_cache_object(path: Path) -> bool:
    return path.parent.name == "objects" and path.suffix == ".so" and len(path.stem) == 64


def verify_binary(path: Path | str, sha256: str | None = None) -> Path:
    """Check a library before anything loads it; returns its path.

    ``sha256``: the expected hash (an exported artifact's manifest gives it). Without it the
    path must be a cache object, whose name is the hash of its bytes. A cache object that fails
    is deleted (its index entry then rebuilds it). Raises KernelIntegrityError.
    """
    path = Path(path)
    expected = sha256 if sha256 is not None else (path.stem if _is_cache_object(path) else "")
    try:
        _check_digest(path, expected)
    except KernelIntegrityError:
        if _is_cache_object(path) and sha256 is None:
            path.unlink(missing_ok=True)
        raise
    return path


def load_verified(path: Path | str, sha256: str | None = None) -> "Kernel":
    """``Kernel(path)`` after ``verify_binary(path, sha256)``: what deploy and the judge load with."""
    from ._library import Kernel

    return Kernel(verify_binary(path, sha256))


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "bin", "nvcc")):
            return os.path.join(root, "bin", "nvcc")
    return None


_CUBLASLT_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]cublasLt\.h[>"]', re.M)
_CUBLASLT_NAME = re.compile(r"\bcublasLt\w+")


def uses_cublaslt(source: str) -> bool:
    """Whether a source includes cuBLASLt or names its functions (then a CUDA source is built against the library,
    ``cublaslt_paths``, and the judge lets the candidate's runner read the library's folder): read as the screen
    reads it, comments removed and spliced lines joined."""
    from ._screen import _join_splices, _strip_comments

    text = _strip_comments(_join_splices(source))
    return bool(_CUBLASLT_INCLUDE.search(text) or _CUBLASLT_NAME.search(text))


def cublaslt_paths() -> tuple[Path, Path] | None:
    """(the folder holding cublasLt.h, the cuBLASLt shared library): the ``nvidia-cublas`` wheel's that PyTorch's
    CUDA builds install and load (``nvidia/cu13`` or ``nvidia/cublas``), so that a deployed kernel runs on the
    library it was judged with; else the CUDA toolkit's; or None."""
    candidates: list[tuple[Path, Path]] = []
    try:
        import importlib.util

        spec = importlib.util.find_spec("nvidia")
        for base in (spec.submodule_search_locations or []) if spec is not None else []:
            for sub in sorted(Path(base).iterdir(), reverse=True):
                candidates.append((sub / "include", sub / "lib"))
    except (ImportError, OSError, ValueError):
        pass
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = find_nvcc()
    if nvcc:
        roots.append(str(Path(os.path.realpath(nvcc)).parent.parent))
    candidates += [(Path(r) / "include", Path(r) / "lib64") for r in roots if r]
    candidates += [(Path(r) / "targets" / "x86_64-linux" / "include", Path(r) / "targets" / "x86_64-linux" / "lib")
                   for r in roots if r]
    for inc, lib in candidates:
        if not (inc / "cublasLt.h").is_file():
            continue
        libs = sorted(lib.glob("libcublasLt.so*"), key=lambda p: (len(p.name), p.name)) if lib.is_dir() else []
        if libs:
            return inc, libs[0]
    return None


def _cublas_headers(inc: Path) -> Path:
    """A folder (in the kernel cache) holding links to cuBLAS's headers in ``inc`` and nothing else."""
    digest = hashlib.sha256(str(inc).encode()).hexdigest()[:12]
    folder = cache_dir() / "include" / f"cublas-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    for header in sorted(inc.glob("cublas*.h")):
        link = folder / header.name
        if not link.exists():
            try:
                link.symlink_to(header)
            except FileExistsError:   # NB: another builder made it first
                pass
    return folder


def _command(backend: str, arch: str, src: Path, out: Path) -> list[str]:
    if backend == "cuda":
        nvcc = find_nvcc()
        if nvcc is None:
            raise CompileError("nvcc was not found: install the CUDA toolkit or set CUDA_HOME", "")
        libraries: list[str] = []
        if uses_cublaslt(src.read_text()):
            found = cublaslt_paths()
            if found is None:
                raise CompileError("the source includes cublasLt.h, but no cuBLASLt was found: install the CUDA "
                                   "toolkit's cuBLAS or the nvidia-cublas wheel PyTorch's CUDA builds use", "")
            inc, lib = found
            # NB: the library by its own file name (the wheel has no unversioned libcublasLt.so) and its folder as
            # the rpath, so the sandboxed runner's loader finds it without LD_LIBRARY_PATH; the headers through a
            # folder of cuBLAS's own (the wheel's include folder may hold a CUDA runtime's headers of another
            # version than nvcc's, which would come first)
            libraries = [f"-I{_cublas_headers(inc)}", "-Xlinker", str(lib), "-Xlinker", f"-rpath={lib.parent}"]
        return [nvcc, "-O3", "-std=c++17", f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC",
                "-lineinfo", f"-I{INCLUDE_DIR}", "-o", str(out), str(src), *libraries]
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


def run_tool(command: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """Run a compiler to completion, its output captured as text, in its own session: on a timeout (or
    any interruption) the whole process group is killed, the driver's children (cc1, cicc, ptxas) too.
    Raises subprocess.TimeoutExpired after killing it, OSError when it cannot start."""
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.communicate()
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _cached(entry: Path) -> tuple[CompiledKernel | None, str]:
    """The verified cache hit of an index entry, or (None, what was wrong with it)."""
    try:
        record = json.loads(entry.read_text())
        if not re.fullmatch(r"[0-9a-f]{64}", str(record["sha256"])):
            raise ValueError(f"sha256 {str(record['sha256'])[:80]!r} is not a SHA-256")
        obj = entry.parent.parent / "objects" / f"{record['sha256']}.so"
    except FileNotFoundError:
        return None, ""
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"index entry {entry.name} is unreadable ({exc})"
    if not obj.exists():
        return None, f"{obj.name} named by index entry {entry.name} is missing"
    try:
        verify_binary(obj)
    except KernelIntegrityError as exc:
        return None, str(exc)
    return CompiledKernel(obj, "", 0.0, True, record["sha256"]), ""


def _write_atomic(path: Path, data: bytes) -> None:
    staged = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    with open(staged, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(staged, path)


def compile_source(source: str, backend: str, arch: str, *, timeout_s: float = 120.0) -> CompiledKernel:
    """Build ``source`` for ``backend`` ("cuda": arch like "sm_90"; "cpu": "native").

    Raises SourceRejected (a CompileError) when the static screen refuses the source. Returns the
    cached library when the same source was built for the same target before and its bytes still
    match the hash recorded then; otherwise the entry is deleted, a CacheTamperedWarning is
    issued, and the source is built again.
    """
    if not screen_disabled():
        findings = screen(source, backend)
        if findings:
            raise SourceRejected(f"the source was refused before compiling: {findings[0]}"
                                 + (f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""),
                                 describe(findings))
    # NB: a library built against cuBLASLt keeps that library's path as its rpath: another cuBLASLt (a wheel upgraded,
    # CUDA_HOME changed) is another build, not a cache hit on one judged with the old library
    linked = ""
    if backend == "cuda" and uses_cublaslt(source):
        found = cublaslt_paths()
        if found is not None:
            st = found[1].resolve().stat()
            linked = f"{found[1].resolve()}:{st.st_size}:{st.st_mtime_ns}"
    key = hashlib.sha256(f"{CONTRACT_VERSION}|{_HEADER_DIGEST}|{backend}|{arch}|{linked}|{source}".encode()).hexdigest()[:32]
    root = cache_dir()
    (root / "index").mkdir(exist_ok=True)
    (root / "objects").mkdir(exist_ok=True)
    entry = root / "index" / f"{backend}-{arch}-{key}.json"
    hit, problem = _cached(entry)
    if hit is not None:
        return hit
    note = ""
    if problem:
        entry.unlink(missing_ok=True)
        note = f"kforge: the cached library for this source was rebuilt: {problem}"
        warnings.warn(note, CacheTamperedWarning, stacklevel=2)
        note += "\n"
    suffix = ".cu" if backend == "cuda" else ".c"
    with tempfile.TemporaryDirectory(prefix="kforge-build-") as tmp:
        src = Path(tmp) / f"kernel{suffix}"
        src.write_text(source)
        tmp_out = Path(tmp) / "kernel.so"
        start = time.perf_counter()
        try:
            proc = run_tool(_command(backend, arch, src, tmp_out), timeout_s)
        except subprocess.TimeoutExpired:
            raise CompileError(f"compilation took longer than {timeout_s:.0f} s (the compiler and everything it "
                               "started were killed)", "") from None
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
        binary = tmp_out.read_bytes()
    # NB: the object is named by its own hash and written before the index entry that points to
    # it, both by rename: concurrent builders of one source never see a partial file, and the
    # last index entry written always names a complete object.
    sha = hashlib.sha256(binary).hexdigest()
    obj = root / "objects" / f"{sha}.so"
    if not obj.exists() or file_sha256(obj) != sha:
        _write_atomic(obj, binary)
    _write_atomic(entry, json.dumps({"sha256": sha, "backend": backend, "arch": arch,
                                     "contract": CONTRACT_VERSION, "built_at": time.time()}).encode())
    return CompiledKernel(obj, note + log[-20000:], seconds, False, sha)
