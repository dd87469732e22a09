"""Compile a candidate's source into a shared library, in a content-addressed cache.

Every source is screened first (kforge/kernels/_screen.py): a refused one never reaches the
compiler. The compiler runs in a jail of its own (``run_tool``: an environment allow-list, a private folder
holding only the source, CPU-time, address-space, file-size and process limits, and Landlock where the kernel has
it), and its log keeps no line quoted from a file other than the candidate's source and the toolchain's headers. A
source that includes CUTLASS or CuTe gets the folders, target, flags and limits its build needs, and only it
(kforge/kernels/_cutlass.py).
Every built library passes the binary wall (kforge/kernels/_binary.py: what it imports, links and executes) before
it is cached, and again, by its hash, whenever it is verified for loading. Built libraries are stored as ``objects/<sha256 of the binary>.so`` and found through
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
import select
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ._binary import BinaryCheckUnavailable, check_library
from ._toolchain import BinaryRejected, CompileError, SourceRejected, find_nvcc
from ._cutlass import (CUTLASS_ADDRESS_SPACE, CUTLASS_FILE_BYTES, CUTLASS_TIMEOUT_S, cutlass_build, target_arch,
                       uses_cutlass)
from ._screen import binary_check_disabled, describe, screen, screen_disabled

if TYPE_CHECKING:
    from ._library import Kernel

INCLUDE_DIR = Path(__file__).parent / "include"
CONTRACT_VERSION = 1
# NB: how a source is built, in every cache key: 2 links the CUDA runtime shared (a library linked with the static one
# fails the binary wall, and must not come back as a cache hit)
_RECIPE = 2
# NB: the header's bytes are part of every cache key: a changed helper in kforge.h rebuilds what used it.
_HEADER_DIGEST = hashlib.sha256((INCLUDE_DIR / "kforge.h").read_bytes()).hexdigest()[:16]


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


def _check_digest(path: Path, expected: str) -> bytes:
    """The library's bytes, read once, after checking that they hash to ``expected``."""
    if len(expected) != 64:
        raise KernelIntegrityError(f"{path} has no recorded SHA-256 to check it against; build it with "
                                   "compile_source or pass the expected hash")
    try:
        data = path.read_bytes()
        actual = hashlib.sha256(data).hexdigest()
    except OSError as exc:
        raise KernelIntegrityError(f"{path} cannot be read to check its SHA-256 ({exc})") from None
    if actual != expected:
        raise KernelIntegrityError(f"{path} does not match the SHA-256 recorded when it was built (expected "
                                   f"{expected[:16]}..., found {actual[:16]}...): the library was modified after "
                                   "it was built; refusing to load it")
    return data


def _is_cache_object(path: Path) -> bool:
    return path.parent.name == "objects" and path.suffix == ".so" and len(path.stem) == 64


# The binary wall's verdicts in this process, by the SHA-256 of the bytes checked. NB: kept in memory only: a record
# on disk beside the cache could be written by whoever can write the cache, and would skip the check.
_WALL_PASSED: set[str] = set()


def check_binary(data: bytes, sha256: str) -> None:
    """The binary wall (kforge/kernels/_binary.py) on a library's bytes, whose SHA-256 is ``sha256``: raises
    BinaryRejected (a SourceRejected) naming what it imports, links or executes that a kernel may not, and
    CompileError when the check cannot be made here (then nothing loads either)."""
    if sha256 in _WALL_PASSED or binary_check_disabled():
        return
    try:
        findings = check_library(data)
    except BinaryCheckUnavailable as exc:
        raise CompileError(f"the kernel library cannot be checked before loading: {exc}", "") from None
    if findings:
        raise BinaryRejected(f"the built library was refused before loading: {findings[0]}"
                             + (f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""),
                             "\n".join(str(f) for f in findings))
    _WALL_PASSED.add(sha256)


def verify_binary(path: Path | str, sha256: str | None = None) -> Path:
    """Check a library before anything loads it; returns its path.

    ``sha256``: the expected hash (an exported artifact's manifest gives it). Without it the
    path must be a cache object, whose name is the hash of its bytes. A cache object that fails
    is deleted (its index entry then rebuilds it). Raises KernelIntegrityError when the bytes do
    not match, BinaryRejected when they fail the binary wall (``check_binary``).
    """
    path = Path(path)
    verified_bytes(path, sha256)
    return path


def verified_bytes(path: Path | str, sha256: str | None = None) -> tuple[bytes, str]:
    """``verify_binary``, returning the very bytes that were hashed and checked, and their SHA-256: what a deployed
    CPU kernel's worker loads (written into its private folder), so that no later change of the file can slip in
    between the check and the load."""
    path = Path(path)
    expected = sha256 if sha256 is not None else (path.stem if _is_cache_object(path) else "")
    try:
        data = _check_digest(path, expected)   # NB: the wall checks the very bytes that were hashed
    except KernelIntegrityError:
        if _is_cache_object(path) and sha256 is None:
            path.unlink(missing_ok=True)
        raise
    check_binary(data, expected)
    return data, expected


def load_verified(path: Path | str, sha256: str | None = None) -> "Kernel":
    """``Kernel(path)`` after ``verify_binary(path, sha256)`` (its hash, then the binary wall): what deploy and the
    judge load with. Raises KernelIntegrityError or BinaryRejected; nothing of the library runs then."""
    from ._library import Kernel

    return Kernel(verify_binary(path, sha256))


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


def cudart_dir() -> Path | None:
    """The folder of the CUDA toolkit's shared runtime (``libcudart.so.N``) that kernels link and name as their
    rpath, or None."""
    nvcc = find_nvcc()
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    if nvcc:
        roots.append(str(Path(os.path.realpath(nvcc)).parent.parent))
    roots.append("/usr/local/cuda")
    for root in filter(None, roots):
        for sub in ("lib64", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib", "lib"):
            folder = Path(root) / sub
            if folder.is_dir() and any(folder.glob("libcudart.so.*")):
                return Path(os.path.realpath(folder))
    return None


def _command(backend: str, arch: str, src: Path, out: Path) -> tuple[list[str], tuple[Path, ...]]:
    """The compiler's command line, and the folders beyond the toolchain's it must read (cuBLAS's, CUTLASS's).
    ``arch``: the target, ``target_arch``'s for a CUDA source."""
    if backend == "cuda":
        nvcc = find_nvcc()
        if nvcc is None:
            raise CompileError("nvcc was not found: install the CUDA toolkit or set CUDA_HOME", "")
        libraries: list[str] = []
        readable: list[Path] = []
        target = [f"-arch={arch}", "-lineinfo"]
        text = src.read_text()
        if uses_cutlass(text):
            # NB: _cutlass.py names each addition and why; the flags of the builds measured there (no -lineinfo)
            target, readable_cutlass, _ = cutlass_build(arch)
            readable += readable_cutlass
        if uses_cublaslt(text):
            found = cublaslt_paths()
            if found is None:
                raise CompileError("the source includes cublasLt.h, but no cuBLASLt was found: install the CUDA "
                                   "toolkit's cuBLAS or the nvidia-cublas wheel PyTorch's CUDA builds use", "")
            inc, lib = found
            # NB: the library by its own file name (the wheel has no unversioned libcublasLt.so) and its folder as
            # the rpath, so the sandboxed runner's loader finds it without LD_LIBRARY_PATH; the headers through a
            # folder of cuBLAS's own (the wheel's include folder may hold a CUDA runtime's headers of another
            # version than nvcc's, which would come first)
            headers = _cublas_headers(inc)
            libraries = [f"-I{headers}", "-Xlinker", str(lib), "-Xlinker", f"-rpath={lib.parent}"]
            readable += [headers, inc.resolve(), lib.resolve().parent]
        # NB: the CUDA runtime linked shared (nvcc links it statically by default): the static runtime imports dlopen,
        # files, sockets and threads, and the binary wall could then tell nothing a kernel calls from what it does.
        # A torch process already holds libcudart.so.N, which the loader reuses by its soname; the rpath serves the
        # runner (docs/security.md)
        runtime = cudart_dir()
        if runtime is not None:
            libraries += ["-Xlinker", f"-rpath={runtime}"]
        return [nvcc, "-O3", "-std=c++17", *target, "-shared", "-cudart", "shared", "-Xcompiler", "-fPIC",
                f"-I{INCLUDE_DIR}", "-o", str(out), str(src), *libraries], tuple(readable)
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
            "-o", str(out), str(src), "-lm"], ()


# ----------------------------------------------------------------------------- the compiler's jail


@dataclass(frozen=True)
class ToolLimits:
    """What a compiler and each process it starts may use: CPU seconds (RLIMIT_CPU, per process), address space
    and the size of any file it writes (RLIMIT_AS, RLIMIT_FSIZE, bytes), and processes beyond those its user
    already runs (RLIMIT_NPROC; root is not held to it)."""

    cpu_s: float = 120.0
    address_space_bytes: int = 8 << 30
    file_bytes: int = 512 << 20
    processes: int = 512


# NB: measured with gcc 12 and nvcc 13.0 (docs/security.md): every built-in CUDA kernel (cuBLASLt's included) builds
# within 256 MiB of address space, one including cub/cub.cuh within 1 GiB, a CPU kernel within 64 MiB
TOOL_LIMITS = {"cpu": ToolLimits(address_space_bytes=2 << 30), "cuda": ToolLimits(address_space_bytes=4 << 30)}
COMPILE_TIMEOUT_S = 120.0   # NB: a plain kernel's; a CUTLASS source's is CUTLASS_TIMEOUT_S (_cutlass.py)

# The compiler's whole environment: the toolchain's own variables and the locale, never a key, token or config path
_TOOL_ENV = frozenset({"PATH", "LANG", "LANGUAGE", "CUDA_HOME", "CUDA_PATH", "NVCC_PREPEND_FLAGS",
                       "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "LD_LIBRARY_PATH", "COMPILER_PATH", "LIBRARY_PATH", "CPATH",
                       "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "GCC_EXEC_PREFIX", "SOURCE_DATE_EPOCH"})
_PATH_LISTS = ("LD_LIBRARY_PATH", "COMPILER_PATH", "LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH")
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|AUTH", re.IGNORECASE)
# What every compiler reads: system headers and libraries, the dynamic loader's configuration
_SYSTEM_READ = ("/usr/bin", "/usr/include", "/usr/local/include", "/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/libexec",
                "/usr/local/lib", "/bin", "/lib", "/lib64", "/lib32", "/etc/ld.so.cache", "/etc/ld.so.conf",
                "/etc/ld.so.conf.d", "/dev/urandom")
_TOOLCHAIN_SUBDIRS = ("bin", "include", "lib", "lib64", "libexec", "nvvm", "targets")
_JAIL = Path(__file__).with_name("_jail.py")
_JAIL_SOURCE = Path(__file__).with_name("jail.c")
_COMPILED_JAIL: dict[str, tuple[Path, str] | None] = {}   # by the source's hash: (binary, its SHA-256), None: no build
_COMPILED_JAIL_LOCK = threading.Lock()


def _compiled_jail() -> Path | None:
    """The compiler's jail compiled from ``jail.c`` (what ``_jail.py`` does, without an interpreter's start for every
    compile), built on first use into the kforge cache through ``_jail.py`` and checked by its SHA-256 before every
    use; None where it cannot be built (the source not shipped, no C compiler): ``run_tool`` then runs ``_jail.py``."""
    try:
        source = _JAIL_SOURCE.read_bytes()
    except OSError:
        return None
    key = hashlib.sha256(source).hexdigest()[:16]
    with _COMPILED_JAIL_LOCK:
        built = _COMPILED_JAIL.get(key, ())
        if built is None:
            return None
        folder = cache_dir().parent / "jail"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"jail-{key}"
        record = path.with_suffix(".sha256")
        try:
            digest = built[1] if built else record.read_text().strip()
            if file_sha256(path) == digest:   # NB: as the runner's binary: hashed before every use
                _COMPILED_JAIL[key] = (path, digest)
                return path
        except OSError:
            pass
        cc = shutil.which("gcc") or shutil.which("cc")
        _COMPILED_JAIL[key] = None
        if cc is None:
            return None
        with tempfile.TemporaryDirectory(prefix="kforge-jail-build-") as tmp:
            out = Path(tmp) / "jail"
            try:
                proc = run_tool([cc, "-O2", "-o", str(out), str(_JAIL_SOURCE)], 120.0, workdir=Path(tmp),
                                readable=(_JAIL_SOURCE.parent,), interpreted=True)
            except (subprocess.TimeoutExpired, OSError):
                return None
            if proc.returncode != 0:
                return None
            digest = file_sha256(out)
            staged = path.with_suffix(f".{os.getpid()}.tmp")
            shutil.copyfile(out, staged)
            os.chmod(staged, 0o555)
            os.replace(staged, path)
            record.write_text(digest + "\n")
        if file_sha256(path) != digest:
            return None
        _COMPILED_JAIL[key] = (path, digest)
        return path


def tool_env(workdir: Path | str) -> dict[str, str]:
    """The environment a compiler gets: the allow-list ``_TOOL_ENV`` and LC_* from this process's (no name that looks
    like a secret), TMPDIR and HOME pointed at its private folder."""
    env = {k: v for k, v in os.environ.items() if (k in _TOOL_ENV or k.startswith("LC_")) and not _SECRET.search(k)}
    env.update(TMPDIR=str(workdir), HOME=str(workdir), CCACHE_DISABLE="1")
    return env


def _toolchain_dirs(command: Sequence[str], env: dict[str, str]) -> list[str]:
    """Folders of the programs the command runs (the compiler, nvcc's host compiler, a CUDA toolkit), each read
    with its prefix's include, lib, libexec, nvvm and targets folders."""
    programs = [command[0], "gcc", "cc"]
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    out: list[str] = []
    for program in programs:
        found = shutil.which(program, path=env.get("PATH"))
        if found:
            for path in {found, os.path.realpath(found)}:
                roots.append(str(Path(path).parent.parent))
                if program == command[0]:   # NB: a compiler (or a launcher: CC="ccache gcc") outside any toolchain prefix
                    out.append(str(Path(path).parent))
    for root in filter(None, roots):
        if os.path.isdir(root):
            out += [os.path.join(os.path.realpath(root), sub) for sub in _TOOLCHAIN_SUBDIRS]
    for name in _PATH_LISTS:
        out += [p for p in env.get(name, "").split(":") if p]
    return out


def run_tool(command: list[str], timeout_s: float, *, workdir: Path, readable: Sequence[Path | str] = (),
             limits: ToolLimits | None = None, interpreted: bool = False) -> subprocess.CompletedProcess:
    """Run a compiler to completion in its jail (``_jail.py``) and its own session, in ``workdir`` (its private
    folder: the only place it may write), with ``tool_env``'s environment and ``limits``; where the kernel has
    Landlock it may read only ``workdir``, ``readable``, kforge's headers, the toolchain's and the system's
    include and library folders. Its output (stdout and stderr together) comes back as ``stdout``, cut to its last
    256 KiB. On a timeout (or any interruption) the whole process group is killed, the driver's children (cc1,
    cicc, ptxas) too. The jail is ``jail.c`` compiled (``_compiled_jail``), or, where that cannot be built or
    ``interpreted`` is set, ``_jail.py`` in a fresh interpreter. Raises subprocess.TimeoutExpired after killing it,
    OSError when it cannot start."""
    import sys

    limits = limits or ToolLimits(cpu_s=timeout_s)
    workdir = Path(workdir)
    env = tool_env(workdir)
    config = {
        "limits": {"cpu_s": max(1, int(limits.cpu_s)), "address_space_bytes": int(limits.address_space_bytes),
                   "file_bytes": int(limits.file_bytes), "processes": int(limits.processes)},
        "read": [*_SYSTEM_READ, *_toolchain_dirs(command, env), str(INCLUDE_DIR), *(str(p) for p in readable)],
        "write": [str(workdir)],
        "devices": ["/dev/null"],
    }
    jail = None if interpreted else _compiled_jail()
    if jail is not None:
        from ._jail import _processes_of_user

        lim = config["limits"]
        # NB: root is not held to RLIMIT_NPROC, which counts all of the user's tasks, not this tree's (0: not set)
        nproc = 0 if os.getuid() == 0 else _processes_of_user() + lim["processes"]
        argv = [str(jail), str(lim["cpu_s"]), str(lim["address_space_bytes"]), str(lim["file_bytes"]), str(nproc),
                str(len(config["read"])), str(len(config["devices"])), str(len(config["write"])), *config["read"],
                *config["devices"], *config["write"], "--", *command]
    else:
        argv = [sys.executable, "-I", "-S", str(_JAIL), json.dumps(config), "--", *command]
    log_path = workdir / ".compiler-output"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=env,
                                start_new_session=True)
        try:
            _wait(proc, timeout_s)
        except BaseException:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
            raise
        finally:
            try:   # NB: what the driver left running (a child it did not wait for) goes with it
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    with open(log_path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - _LOG_READ_BYTES))
        out = f.read().decode("utf-8", "replace")
    log_path.unlink(missing_ok=True)
    if proc.returncode == 127 and out.startswith(_JAIL_FAILED):
        raise OSError(out[len(_JAIL_FAILED):].strip())
    return subprocess.CompletedProcess(command, proc.returncode, out, "")


def _wait(proc: subprocess.Popen, timeout_s: float) -> int:
    """``proc.wait(timeout=timeout_s)``, woken by the process's exit (a pidfd) where the kernel has one. NB: Popen.wait
    with a timeout polls, sleeping 0.5 ms, then twice as long each time up to 50 ms: a 70 ms compile was seen ended
    only at 113 ms, and that, not the jail, was most of what the compiler's jail cost a verdict."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return proc.wait(timeout=timeout_s)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if not poller.poll(max(0, int(timeout_s * 1000))):
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
    finally:
        os.close(fd)
    return proc.wait()


_LOG_READ_BYTES = 256 << 10
_JAIL_FAILED = "kforge: the compiler's jail could not start it:"
_LIMIT_SIGNS = (
    ("CPU-time", re.compile(r"CPU time limit exceeded|signal 24\b|SIGXCPU")),
    ("file-size", re.compile(r"File size limit exceeded|signal 25\b|SIGXFSZ|File too large")),
    ("address-space", re.compile(r"out of memory|memory exhausted|Cannot allocate memory|std::bad_alloc|"
                                 r"Out of memory|cannot allocate|unable to allocate", re.IGNORECASE)),
    ("process-count", re.compile(r"(?:fork|vfork|posix_spawn|cannot execute)[^\n]*Resource temporarily unavailable")),
)


def limit_hit(proc: subprocess.CompletedProcess, limits: ToolLimits) -> str | None:
    """Which of ``limits`` stopped the compiler (from how it ended and what it printed), as a phrase, or None."""
    values = {"CPU-time": f"{limits.cpu_s:.0f} s of CPU", "file-size": f"{limits.file_bytes >> 20} MiB a file",
              "address-space": f"{limits.address_space_bytes >> 20} MiB",
              "process-count": f"{limits.processes} processes"}
    by_signal = {-int(signal.SIGXCPU): "CPU-time", -int(signal.SIGXFSZ): "file-size"}
    which = by_signal.get(proc.returncode)
    if which is None:
        for name, sign in _LIMIT_SIGNS:
            if sign.search(proc.stdout):
                which = name
                break
    return f"its {which} limit ({values[which]})" if which else None


# ----------------------------------------------------------------------------- the compile log


_LOCATION = re.compile(r"^(?P<path>[^\s:()][^:()\n]*?)(?::\d+(?::\d+)?:|\(\d+\)(?::| ?:)|:\s+(?:In |At |Assembler ))")
_LEFT_OUT = "[kforge: a message about another file than the candidate's source was left out]"


def safe_log(log: str, source_name: str, public: Sequence[Path | str] = ()) -> str:
    """The compiler's log with every message located in a file other than ``source_name`` (and the public headers
    under ``public``, kforge's and the toolchain's) left out, with the lines it quotes: a directive that names a file
    cannot bring that file's lines into feedback, the store or an LLM's prompt."""
    roots = [os.path.normpath(str(p)) + os.sep for p in (INCLUDE_DIR, *public)]
    out: list[str] = []
    dropping = False
    for line in log.splitlines():
        m = _LOCATION.match(line)
        if m is not None:
            path = m.group("path").strip()
            if path.startswith("In file included from"):
                dropping = False
            else:
                norm = os.path.normpath(path)
                dropping = not (path == source_name or norm == source_name
                                or any(norm.startswith(r) for r in roots))
            if dropping:
                if not out or out[-1] != _LEFT_OUT:
                    out.append(_LEFT_OUT)
                continue
        elif dropping and (not line.strip() or line[:1].isspace() or line.lstrip().startswith("|")):
            continue
        else:
            dropping = False
        out.append(line)
    return "\n".join(out) + ("\n" if log.endswith("\n") else "")


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
    except (KernelIntegrityError, BinaryRejected) as exc:   # NB: a cache entry never skips the binary wall
        return None, str(exc) if isinstance(exc, KernelIntegrityError) else f"{obj.name} fails the binary wall: {exc}"
    return CompiledKernel(obj, "", 0.0, True, record["sha256"]), ""


def _write_atomic(path: Path, data: bytes) -> None:
    staged = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    with open(staged, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(staged, path)


def compile_timeout(source: str, backend: str) -> float:
    """The seconds ``compile_source`` allows the compiler by default: ``CUTLASS_TIMEOUT_S`` for a CUDA source that
    includes CUTLASS or CuTe (``_cutlass.py``), ``COMPILE_TIMEOUT_S`` for any other. What waits for a build (the
    evaluator's pool) allows at least as much."""
    return CUTLASS_TIMEOUT_S if backend == "cuda" and uses_cutlass(source) else COMPILE_TIMEOUT_S


def compile_limits(source: str, backend: str, timeout_s: float | None = None) -> ToolLimits:
    """The compiler's limits for ``source``: ``TOOL_LIMITS[backend]``, or for a CUTLASS source the address space and
    file size its build needs (``_cutlass.py``); CPU time ``timeout_s`` (``compile_timeout``'s by default)."""
    cpu_s = compile_timeout(source, backend) if timeout_s is None else timeout_s
    if backend == "cuda" and uses_cutlass(source):
        return ToolLimits(cpu_s=cpu_s, address_space_bytes=CUTLASS_ADDRESS_SPACE, file_bytes=CUTLASS_FILE_BYTES)
    return replace(TOOL_LIMITS.get(backend, ToolLimits()), cpu_s=cpu_s)


def compile_source(source: str, backend: str, arch: str, *, timeout_s: float | None = None,
                   limits: ToolLimits | None = None) -> CompiledKernel:
    """Build ``source`` for ``backend`` ("cuda": arch like "sm_90"; "cpu": "native") in the compiler's jail
    (``run_tool``), under ``limits`` (``compile_limits``: ``TOOL_LIMITS[backend]``, a CUTLASS source's own, with CPU
    time ``timeout_s``, ``compile_timeout``'s by default). A CUDA source is built for ``target_arch(source, arch)``
    (``sm_90a`` for CUTLASS on an ``sm_90`` device).

    Raises SourceRejected (a CompileError) when the static screen refuses the source, BinaryRejected (a
    SourceRejected) when the built library fails the binary wall, CompileError when the compiler fails or is
    stopped by a limit (the message names it). Returns the
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
    if backend == "cuda":
        arch = target_arch(source, arch)
        if uses_cutlass(source):   # NB: other CUTLASS headers, or a driver to link where there was none: another build
            linked += "|" + cutlass_build(arch)[2]
    key = hashlib.sha256(f"{CONTRACT_VERSION}|{_RECIPE}|{_HEADER_DIGEST}|{backend}|{arch}|{linked}|{source}"
                         .encode()).hexdigest()[:32]
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
        command, readable = _command(backend, arch, src, tmp_out)
        if timeout_s is None:
            timeout_s = compile_timeout(source, backend)
        limits = limits or compile_limits(source, backend, timeout_s)
        try:
            proc = run_tool(command, timeout_s, workdir=Path(tmp), readable=readable, limits=limits)
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
        public = [*readable, *(d for d in _toolchain_dirs(command, tool_env(tmp)) if d.endswith(("include", "targets"))),
                  "/usr/include", "/usr/local/include", "/usr/lib/gcc", tmp]   # NB: tmp: the compiler's own files
        log = safe_log(proc.stdout.replace(str(src), src.name), src.name, public)
        if proc.returncode != 0:
            hit_limit = limit_hit(proc, limits)
            if hit_limit is not None:
                raise CompileError(f"the compiler was stopped by {hit_limit}: the source takes more to compile than "
                                   "a kernel may", log[-20000:])
            raise CompileError(f"compilation failed (exit {proc.returncode})", log[-20000:])
        binary = tmp_out.read_bytes()
    # NB: the object is named by its own hash and written before the index entry that points to
    # it, both by rename: concurrent builders of one source never see a partial file, and the
    # last index entry written always names a complete object.
    sha = hashlib.sha256(binary).hexdigest()
    try:
        check_binary(binary, sha)   # NB: before it is cached: a refused library is never written where it could load
    except BinaryRejected as exc:
        exc.log = f"{exc.log}\n{log[-20000:]}" if log.strip() else exc.log
        raise
    obj = root / "objects" / f"{sha}.so"
    if not obj.exists() or file_sha256(obj) != sha:
        _write_atomic(obj, binary)
    _write_atomic(entry, json.dumps({"sha256": sha, "backend": backend, "arch": arch,
                                     "contract": CONTRACT_VERSION, "built_at": time.time()}).encode())
    return CompiledKernel(obj, note + log[-20000:], seconds, False, sha)
