"""The untrusted side: building the C runner and driving one runner process per candidate.

The runner binary is built once per backend into the kforge cache; its sha256 is recorded when it
is built and checked before every start. A runner gets an environment allow-list, its own
session, a private folder, stdout/stderr in a file there (read back capped), and the fds it needs;
it sandboxes itself further (see docs/security.md) and reports what holds.
"""
from __future__ import annotations

import hashlib
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..kernels import INCLUDE_DIR, cache_dir, find_nvcc
from ..kernels._compile import run_tool
from ._frames import FRAME_BYTES, Code, Frame, Op, ProtocolError, Sandbox, check_answer

RUNNER_SOURCE = Path(__file__).parent / "runner" / "runner.c"
RUNNER_HEADER = INCLUDE_DIR / "kforge.h"   # the kernel ABI runner.c includes: its bytes are in the runner's key
RECORDER_SOURCE = Path(__file__).parent / "runner" / "recorder.c"
RECORD_NAME = "record.bin"   # in a recording runner's private folder: what its calls did (kernels/_plan.py)
LOG_TAIL_BYTES = 8192
LIBRARY_NAME = "kernel.so"   # in the runner's private folder: the judge copies the checked library there
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
_BUILT: dict[str, tuple[Path, str]] = {}
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class RunnerBuildError(RuntimeError):
    """The runner could not be built or its binary does not match the recorded hash."""


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _build_command(backend: str, src: Path, out: Path) -> list[str]:
    if backend == "cuda":
        nvcc = find_nvcc()
        if nvcc is None:
            raise RunnerBuildError("nvcc was not found: install the CUDA toolkit or set CUDA_HOME")
        return [nvcc, "-O2", "-x", "cu", "-std=c++17", "-DKF_RUNNER_CUDA", "-cudart", "static", f"-I{INCLUDE_DIR}",
                "-o", str(out), str(src), "-ldl"]
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RunnerBuildError("no C compiler was found: install gcc or set CC")
    return [*shlex.split(cc), "-O2", "-std=gnu11", f"-I{INCLUDE_DIR}", "-o", str(out), str(src), "-ldl"]


def _recorder_command(src: Path, out: Path) -> list[str]:
    from ..kernels._compile import cudart_dir

    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    runtime = cudart_dir()
    if cc is None or runtime is None:
        raise RunnerBuildError("the CUDA recorder needs a C compiler and the CUDA toolkit's shared runtime "
                               "(libcudart.so): install gcc and the CUDA toolkit, or set CUDA_HOME")
    soname = sorted(p.name for p in runtime.glob("libcudart.so.*") if p.name.count(".") == 2)
    lib = f"-l:{soname[0]}" if soname else "-lcudart"
    return [*shlex.split(cc), "-O2", "-std=gnu11", "-shared", "-fPIC", "-o", str(out), str(src), f"-L{runtime}", lib,
            f"-Wl,-rpath,{runtime}", "-ldl", "-lpthread"]


def recorder_library() -> tuple[Path, str]:
    """The CUDA recorder (``runner/recorder.c``, a shared library a recording runner loads before its candidate),
    built on first use, and its recorded sha256, checked now."""
    return runner_binary("recorder")


def build_key(backend: str) -> str:
    """What names the built runner for ``backend`` in the cache (``"recorder"``: the CUDA recorder): the bytes of
    the sources it is built from (runner.c with kforge.h, or recorder.c) and the backend."""
    if backend == "recorder":
        source = RECORDER_SOURCE.read_bytes()
    else:
        source = RUNNER_SOURCE.read_bytes() + RUNNER_HEADER.read_bytes()
    return hashlib.sha256(source + backend.encode()).hexdigest()[:16]


def runner_binary(backend: str) -> tuple[Path, str]:
    """The runner for ``backend`` (built on first use) and its recorded sha256, checked now (``backend``
    "recorder": the CUDA recorder library)."""
    if backend in _BUILT:
        path, digest = _BUILT[backend]
        if path.exists() and _sha256(path) == digest:
            return path, digest
        del _BUILT[backend]
    src = RECORDER_SOURCE if backend == "recorder" else RUNNER_SOURCE
    key = build_key(backend)
    folder = cache_dir().parent / "runner"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (f"recorder-{key}.so" if backend == "recorder" else f"runner-{backend}-{key}")
    record = path.with_suffix(".sha256")
    if path.exists() and record.exists() and _sha256(path) == record.read_text().strip():
        _BUILT[backend] = (path, record.read_text().strip())
        return _BUILT[backend]
    with tempfile.TemporaryDirectory(prefix="kforge-runner-build-") as tmp:
        out = Path(tmp) / "runner"
        try:
            command = _recorder_command(src, out) if backend == "recorder" else _build_command(backend, src, out)
            # NB: the compiler's jail, as for candidates: it reads the runner's source folder (and, as every build
            # in the jail, kforge's include folder) and writes only here
            proc = run_tool(command, 300.0, workdir=Path(tmp), readable=(src.parent,))
        except (subprocess.TimeoutExpired, OSError) as exc:
            raise RunnerBuildError(f"the {backend} runner could not be built ({exc}): check the compiler") from None
        if proc.returncode != 0:
            raise RunnerBuildError(f"the {backend} runner does not build (a kforge bug or a broken compiler):\n"
                                   f"{(proc.stdout + proc.stderr)[-4000:]}")
        digest = _sha256(out)
        staged = path.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(out, staged)
        os.chmod(staged, 0o555)
        os.replace(staged, path)
        record.write_text(digest + "\n")
    if _sha256(path) != digest:
        raise RunnerBuildError(f"{path} changed while it was being installed: remove it and retry")
    _BUILT[backend] = (path, digest)
    return _BUILT[backend]


#: a deployed kernel's worker (no judge timing eager beside it): OpenMP's threads wait actively this long after a
#: call before they sleep, unless the user's environment says otherwise (libgomp's default is 300,000 spins)
WORKER_SPINCOUNT = "10000"


def runner_env(private_dir: str, cublaslt: bool = False, judged: bool = True) -> dict[str, str]:
    """The runner's whole environment: an allow-list, never a key or a config path. ``cublaslt``: the candidate
    links cuBLASLt (``kernels.uses_cublaslt``), so its runner may read the library's folder; no other runner may.
    ``judged``: a judge's runner (else a deployed CPU kernel's worker, ``kforge.deploy._worker``)."""
    env = {k: v for k, v in os.environ.items()
           if (k in ("PATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES") or k.startswith(("CUDA_", "OMP_", "GOMP_")))
           and not _SECRET.search(k)}
    if judged:
        # NB: PASSIVE so the runner's OpenMP pool sleeps between calls instead of spinning on the
        # cores the judge times eager on.
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env:
        # NB: a worker's threads put to sleep at once (PASSIVE) must be woken by every call: on this loaded 2-core
        # machine a served softmax with 2 threads then took 4-15 ms a call; libgomp's default spin (300,000) made
        # it 5 ms there too (the spinning thread holds the core the caller needs). A short spin keeps back-to-back
        # calls warm and bounds what an idle worker burns.
        env["GOMP_SPINCOUNT"] = WORKER_SPINCOUNT
    env.update(HOME=private_dir, TMPDIR=private_dir)
    # NB: a candidate built against cuBLASLt loads it by its rpath after the sandbox is up: the runner's file
    # rules must let it read that folder (the nvidia-cublas wheel's lies wherever Python's packages do)
    from ..kernels._compile import cublaslt_paths

    found = cublaslt_paths() if cublaslt else None
    if found is not None:
        env["KFORGE_RUNNER_LIB_DIRS"] = str(found[1].parent)
    return env


_KNOWN_SANDBOX = sum(m.value for m in Sandbox)   # the steps this judge knows; others are ignored


def threads_allowed(env: dict[str, str]) -> int:
    """The threads a runner started with ``env`` may keep busy: OMP_NUM_THREADS (its first level),
    else every core this process may use."""
    try:
        return max(1, int(env.get("OMP_NUM_THREADS", "").split(",")[0]))
    except ValueError:
        return CORES


@dataclass(frozen=True)
class Exit:
    """How a runner process ended."""

    code: int | None         # exit code, or None when killed by a signal
    signal: int | None
    cpu_s: float
    killed_by_judge: bool

    def describe(self) -> str:
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            return f"was killed by {name}"
        return f"exited with code {self.code}"


@dataclass(frozen=True, eq=False)
class CpuTimes:
    """A runner's CPU time in ns: all its threads (those that exited included), and each live thread."""

    total_ns: int
    threads: dict[int, int]

    def since(self, before: "CpuTimes") -> "CpuUse":
        per = [ns - before.threads.get(tid, 0) for tid, ns in self.threads.items()]
        return CpuUse((self.total_ns - before.total_ns) / 1e3, max(per, default=0) / 1e3)


@dataclass(frozen=True)
class CpuUse:
    """The runner's CPU time over an interval, in us: all threads together, and its busiest live thread."""

    total_us: float
    busiest_us: float


@dataclass(frozen=True)
class RunnerMemory:
    """What a runner may hold: ``resident`` bytes (the judge kills it above), ``rlimit`` (its RLIMIT_AS on the
    CPU, its RLIMIT_DATA beyond what it holds at start on CUDA) and ``arenas``, the shared bytes it maps."""

    resident: int
    rlimit: int
    arenas: int

    @property
    def own(self) -> int:
        """The resident bytes it may hold beyond the arenas (the candidate's own, and the runner's)."""
        return self.resident - self.arenas


def available_memory() -> int | None:
    """The machine's available memory now (``MemAvailable``), None where /proc/meminfo does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def oom_kills() -> int:
    """Processes the kernel's OOM killer has ended since boot (/proc/vmstat), 0 where it does not say."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return 0


class RunnerTimeout(Exception):
    """No answer within the deadline."""


class RunnerGone(Exception):
    """The channel closed: the runner died or closed it."""


#: How often the judge reads a runner's resident memory while it waits for an answer.
_MEMORY_POLL_S = 0.02


def resident_bytes(pid: int) -> int | None:
    """Process ``pid``'s resident memory now (None: gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class RunnerProcess:
    """One runner for one candidate. Every method that waits takes an absolute deadline."""

    def __init__(self, binary: Path, args: list[str], pass_fds: tuple[int, ...], private_dir: str,
                 cublaslt: bool = False, memory: RunnerMemory | None = None, recorder: Path | None = None,
                 judged: bool = True):
        self.private_dir = private_dir
        #: what it may hold (None: not watched); over ``memory.resident``, the judge kills it while it waits
        self.memory = memory
        self.memory_limit = memory.resident if memory is not None else 0
        self.over_memory = 0   # the resident bytes seen when the judge killed it for memory (0: never)
        # NB: the most it was seen holding, by the judge's own reads while it waited; not wait4's ru_maxrss, which
        # counts the judge's own memory, held by the child between fork and exec
        self.peak_rss = 0
        self.oom_kills_at_start = oom_kills()
        self.log_path = os.path.join(private_dir, "output.log")
        self.library_path = os.path.join(private_dir, LIBRARY_NAME)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = parent
        self._seq = 0
        self.exit: Exit | None = None
        self.killed = False
        self.paused = False   # stopped by pause() until resume()
        # NB: the judge keeps its own descriptor of the log and reads through it: the runner can replace
        # the name (a link to another file, a FIFO) but not the file this descriptor is.
        log = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self._log_fd: int | None = os.dup(log)
        env = runner_env(private_dir, cublaslt, judged)
        # NB: a recording runner writes what its calls did into a file the judge made and keeps open, as the log
        self._record_fd: int | None = None
        if recorder is not None:
            self._record_fd = os.open(os.path.join(private_dir, RECORD_NAME),
                                      os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            env["KFORGE_RUNNER_RECORDER"] = str(recorder)
        self.threads = threads_allowed(env)
        try:
            self.proc = subprocess.Popen(
                [str(binary), str(child.fileno()), *args], pass_fds=(child.fileno(), *pass_fds),
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=private_dir,
                start_new_session=True, close_fds=True)
        finally:
            os.close(log)
            child.close()
        self.pid = self.proc.pid

    # ---- frames
    def recv(self, deadline: float) -> Frame:
        """The next frame; RunnerGone when the channel closes, or when the runner holds more resident memory
        than ``memory_limit`` (it is killed then, and ``over_memory`` says how much it held)."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RunnerTimeout
            wait = min(remaining, _MEMORY_POLL_S) if self.memory_limit else remaining
            ready, _, _ = select.select([self.sock], [], [], wait)
            if ready:
                break
            # NB: RLIMIT_AS bounds a CPU runner's address space, but not what a CUDA runner maps shared, nor what
            # the machine has left: past its limit the judge kills it, before the kernel's OOM killer picks a victim
            rss = resident_bytes(self.pid) if self.memory_limit else None
            self.peak_rss = max(self.peak_rss, rss or 0)
            if rss is not None and rss > self.memory_limit:
                self.over_memory = rss
                self.kill()
                raise RunnerGone(f"the runner held {rss} bytes, over its limit of {self.memory_limit}")
        try:
            data = self.sock.recv(FRAME_BYTES + 1)
        except OSError as exc:
            raise RunnerGone(str(exc)) from None
        if not data:
            raise RunnerGone("the channel closed")
        return Frame.decode(data)

    def request(self, op: Op, deadline: float, a: int = 0, b: int = 0) -> tuple[Frame, float]:
        """Send one request and read its answer; returns the answer and the judge's wall seconds."""
        self._seq += 1
        seq = self._seq
        start = time.perf_counter()
        try:
            self.sock.send(Frame(seq, op, 0, a, b).encode())
        except OSError as exc:
            raise RunnerGone(str(exc)) from None
        frame = check_answer(self.recv(deadline), seq, op)
        return frame, time.perf_counter() - start

    def ready(self, deadline: float) -> Frame:
        frame = self.recv(deadline)
        if frame.op == Op.FAULT:
            return frame
        if frame.op != Op.READY or frame.seq != 0:
            raise ProtocolError(f"the first frame is op {frame.op}, not ready")
        return frame

    def sandbox(self, frame: Frame) -> Sandbox:
        return Sandbox(frame.c & _KNOWN_SANDBOX)

    def _per_thread(self, name: str) -> dict[int, list[str]]:
        """``/proc/<pid>/task/<tid>/<name>`` of each of the runner's live threads, split in fields (the
        judge reads them; a thread gone in between is left out)."""
        out: dict[int, list[str]] = {}
        try:
            tasks = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return out
        for tid in tasks:
            try:
                with open(f"/proc/{self.pid}/task/{tid}/{name}") as f:
                    text = f.read()
            except OSError:
                continue
            # NB: stat's second field (the name, in parentheses) may hold spaces: fields after it
            out[int(tid)] = text.rsplit(")", 1)[1].split() if name == "stat" else text.split()
        return out

    def cpu_times(self) -> "CpuTimes":
        """The runner's CPU time so far, as the kernel accounts it (no clock the runner can touch)."""
        threads = {tid: int(f[0]) for tid, f in self._per_thread("schedstat").items() if f and f[0].isdigit()}
        try:
            # NB: the process's CPU clock counts its exited threads too, and the running ones up to now
            # (schedstat lags a running thread by up to a tick).
            total = time.clock_gettime_ns((~self.pid << 3) | 2)   # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
        except OSError:
            total = sum(threads.values())
        return CpuTimes(total, threads)

    # ---- stopped while the judge times eager
    def pause(self, timeout: float, blocked_ok: bool = False) -> bool:
        """Stop every thread of the runner's process group (SIGSTOP, which nothing can catch or block)
        and wait until each is stopped; False if one was not within ``timeout`` (it then stops at its
        next return to user space). ``blocked_ok``: a thread in uninterruptible sleep (D: the CUDA
        driver's, waiting on the device) counts as stopped, since it uses no CPU until it wakes, and
        stops then. ``resume`` lets them go on."""
        settled = "TtZXD" if blocked_ok else "TtZX"
        if self.exit is not None:
            return True
        try:
            os.killpg(self.pid, signal.SIGSTOP)
        except (ProcessLookupError, PermissionError):
            return True
        self.paused = True
        end = time.monotonic() + timeout
        # NB: every thread stopped (T, t), or gone (Z, X), or (blocked_ok) in uninterruptible sleep (D)
        while not all(f and f[0] in settled for f in self._per_thread("stat").values()):
            if time.monotonic() >= end:
                return False
            time.sleep(0.0002)
        return True

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            try:
                os.killpg(self.pid, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass

    # ---- end of life
    def kill(self) -> None:
        """Kill the runner's whole process group."""
        if self.exit is None:
            self.killed = True
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def wait(self, timeout: float) -> Exit | None:
        """The runner's exit, reaped with its CPU time; None if it is still running after ``timeout``."""
        if self.exit is not None:
            return self.exit
        end = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.proc.returncode = status  # NB: reaped here; keeps Popen from waiting on a reused pid
                sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
                code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
                self.exit = Exit(code, sig, usage.ru_utime + usage.ru_stime, self.killed)
                return self.exit
            if time.monotonic() >= end:
                return None
            time.sleep(0.005)

    def close(self, graceful: bool = True) -> Exit:
        self.resume()   # NB: a stopped runner would not read its QUIT
        if graceful and self.exit is None:
            try:
                self.sock.send(Frame(self._seq + 1, Op.QUIT, 0).encode())
            except OSError:
                pass
            self.wait(1.0)
        self.kill()
        ex = self.wait(10.0) or Exit(None, None, 0.0, True)
        # NB: the group outlives its leader only if something escaped the sandbox; kill it anyway.
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.sock.close()
        return ex

    def output_tail(self, n: int = LOG_TAIL_BYTES) -> str:
        """The last ``n`` bytes of the runner's stdout/stderr (never the whole file)."""
        fd = self._log_fd
        if fd is None:
            return ""
        try:
            size = os.fstat(fd).st_size
            return os.pread(fd, n, max(0, size - n)).decode(errors="replace")
        except OSError:
            return ""

    def read_record(self, offset: int, size: int, limit: int = 96 << 20) -> bytes:
        """``size`` bytes at ``offset`` of the record file (through the judge's own descriptor), at most ``limit``."""
        if self._record_fd is None or size > limit:
            return b""
        try:
            return os.pread(self._record_fd, size, offset)
        except OSError:
            return b""

    def remove_private_dir(self) -> None:
        if self._record_fd is not None:
            os.close(self._record_fd)
            self._record_fd = None
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None
        shutil.rmtree(self.private_dir, ignore_errors=True)


def code_name(code: int) -> str:
    try:
        return Code(code).name.lower()
    except ValueError:
        return str(code)
