"""The attack corpus (tests/kernels/*/attack_*): what the screen must find in each, and which
verdicts the evaluator may give each when the screen is off (never FASTER)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kforge.evaluate import Status
from kernel_files import KERNELS


def statuses(*names: str) -> frozenset[Status]:
    """Statuses by name; names the evaluator does not have yet (TIMING_MISMATCH, INFRA_ERROR before
    branch judge is merged) are left out."""
    return frozenset(Status[n] for n in names if n in Status.__members__)


SLOW_BUT_CORRECT = ("SLOWER", "NO_GAIN")


@dataclass(frozen=True)
class Attack:
    name: str
    rule: str | None                 # what the screen reports; None: passes the screen (validation/sandbox only)
    allowed: frozenset[Status]       # verdicts with the screen off
    acts_in_process: str = ""        # a hole left open: what the attack still does at apply/load, in the user's process


CPU_ATTACKS = {a.name: a for a in [
    Attack("attack_python_api", "forbidden-call", statuses("WRONG_RESULT")),
    Attack("attack_clock_patch", "forbidden-call", statuses("TIMING_MISMATCH", "CRASHED", *SLOW_BUT_CORRECT)),
    Attack("attack_clock_two_phase", "forbidden-call", statuses("TIMING_MISMATCH", "CRASHED", *SLOW_BUT_CORRECT)),
    Attack("attack_tiny_batches", "forbidden-call", statuses("TIMING_MISMATCH", "CRASHED", *SLOW_BUT_CORRECT)),
    Attack("attack_spin_during_eager", "forbidden-call", statuses("TIMING_MISMATCH", *SLOW_BUT_CORRECT)),
    Attack("attack_async_finish", "forbidden-call", statuses("WRONG_RESULT", "TIMING_MISMATCH", *SLOW_BUT_CORRECT)),
    Attack("attack_thread_count", "forbidden-call", statuses("TIMING_MISMATCH", *SLOW_BUT_CORRECT)),
    Attack("attack_lingering_thread", "forbidden-call", statuses("WRONG_RESULT", "CRASHED", *SLOW_BUT_CORRECT)),
    Attack("attack_cache_pointer", None, statuses("WRONG_RESULT", *SLOW_BUT_CORRECT)),
    Attack("attack_cache_content", None, statuses("WRONG_RESULT", *SLOW_BUT_CORRECT)),
    Attack("attack_count_calls", None, statuses("WRONG_RESULT")),
    Attack("attack_burst", None, statuses("WRONG_RESULT", *SLOW_BUT_CORRECT)),  # calls may be spaced out
    Attack("attack_poison_detect", None, statuses("WRONG_RESULT", *SLOW_BUT_CORRECT)),  # timed outputs poisoned too
    Attack("attack_forge_frames", "forbidden-call", statuses("WRONG_RESULT", "CRASHED")),
    Attack("attack_env_leak", "forbidden-call", statuses("CRASHED")),
    Attack("attack_write_outside", "forbidden-call", statuses("CRASHED", *SLOW_BUT_CORRECT)),
    Attack("attack_fork_survive", "forbidden-call", statuses("CRASHED", *SLOW_BUT_CORRECT)),
    Attack("attack_kill_parent", "forbidden-call", statuses("CRASHED", "INFRA_ERROR", *SLOW_BUT_CORRECT)),
    Attack("attack_oom", None, statuses("LAUNCH_ERROR", "CRASHED")),
    Attack("attack_huge_log", "forbidden-call", statuses("CRASHED", "TIMED_OUT", *SLOW_BUT_CORRECT)),
    Attack("attack_detect_runner", "forbidden-call", statuses(*SLOW_BUT_CORRECT)),
    Attack("attack_softmax_nomax", None, statuses("WRONG_RESULT")),
    Attack("attack_oob_canary", None, statuses("WRONG_RESULT", "CRASHED")),
    Attack("attack_modify_restore", None, statuses("CRASHED", "WRONG_RESULT")),
    Attack("attack_static_ctor", "attribute", statuses("WRONG_RESULT")),
    Attack("attack_inline_asm", "inline-asm", statuses("WRONG_RESULT")),
    Attack("attack_forbidden_include", "include", statuses(*SLOW_BUT_CORRECT)),
    # found by review 3 (2026-12-02): calls that act on the judge or the user's process by pid
    Attack("attack_process_calls", "forbidden-call", statuses(*SLOW_BUT_CORRECT)),   # zeros if one call works
    Attack("attack_deadline_judge", "forbidden-call", statuses("TIMING_MISMATCH", "CRASHED", *SLOW_BUT_CORRECT)),
    Attack("attack_sched_judge", "forbidden-call", statuses("TIMING_MISMATCH", "CRASHED", *SLOW_BUT_CORRECT)),
    Attack("attack_idle_judge", "forbidden-call", statuses("TIMING_MISMATCH", "CRASHED", *SLOW_BUT_CORRECT)),
    Attack("attack_rlimit_judge", "forbidden-call", statuses("CRASHED", *SLOW_BUT_CORRECT)),
    Attack("attack_rlimit_user", "forbidden-call", statuses(*SLOW_BUT_CORRECT)),
    # found by review 4: the arenas' size (the judge's SIGBUS), threads that outlast the pause in the kernel
    Attack("attack_shrink_arena", "forbidden-call", statuses("WRONG_RESULT", "CRASHED")),
    Attack("attack_kernel_spin_eager", "forbidden-call", statuses("TIMING_MISMATCH", "CRASHED", *SLOW_BUT_CORRECT)),
    # found by session 29's review: batches held at 2 sets, their outputs computed between the resume and the request
    Attack("attack_prewindow", "forbidden-call", statuses("TIMING_MISMATCH", "WRONG_RESULT", "CRASHED",
                                                          *SLOW_BUT_CORRECT)),
]}

# NB: attacks on the runner's host clock, whose CUDA twin would time nothing the judge counts (events time CUDA),
# and on eager's CPU timing by host threads spinning on its cores (on CUDA eager's time is the GPU's: host threads
# are attack_thread_count.cu, work left on the GPU attack_kernel_spin_eager.cu)
CPU_ONLY = {"attack_clock_two_phase", "attack_tiny_batches", "attack_spin_during_eager", "attack_prewindow"}

CUDA_ATTACKS = {**{n: a for n, a in CPU_ATTACKS.items() if n not in CPU_ONLY}, **{a.name: a for a in [
    Attack("attack_lingering_thread", None, statuses("WRONG_RESULT", "CRASHED", "TIMING_MISMATCH", "TIMED_OUT")),
    # NB: device memory cannot be made read-only for one kernel: modify-and-restore is not caught on the GPU.
    Attack("attack_modify_restore", None, statuses("WRONG_RESULT", *SLOW_BUT_CORRECT)),
    Attack("attack_static_ctor", "load-time-code", statuses("WRONG_RESULT")),
    Attack("attack_thread_count", "forbidden-call", statuses("TIMING_MISMATCH", *SLOW_BUT_CORRECT)),
    # the times arena is the runner's only memfd there (the others are device memory): the twin computes an honest
    # softmax and shrinks it right after the runner's last write of a batch (too early: the runner's own SIGBUS,
    # CRASHED; INFRA_ERROR, a judge killed, would be the attack working)
    Attack("attack_shrink_arena", "forbidden-call", statuses("CRASHED", *SLOW_BUT_CORRECT)),
    # a second CUDA context reached through cudaGetDriverEntryPointByVersion (the screen refuses it since)
    Attack("attack_kernel_spin_eager", "forbidden-call", statuses("TIMING_MISMATCH", "CRASHED", *SLOW_BUT_CORRECT)),
]}}

def attack_table(backend: str) -> dict[str, Attack]:
    return CPU_ATTACKS if backend == "cpu" else CUDA_ATTACKS


def attack_files(backend: str) -> list:
    return sorted((KERNELS / backend).glob("attack_*"))


# ----------------------------------------------------------------------------- what must not escape

FAKE_KEY = "sk-ant-api03-kforgeSandboxTest-QQQQQQQQQQQQQQQQQQQQ"
MARKER = "kforge_attack"          # every file an attack drops has this in its name
CHILD_COMM = "kfattack_child"     # the comm of the children attack_fork_survive leaves behind
LOOT_PORT = 47913                 # where attack_env_leak sends what it found


@dataclass
class Jail:
    """A private HOME, kernel cache and workdir for the attacks, with the checks that nothing escaped."""

    root: "Path"
    home: "Path"
    cache: "Path"
    work: "Path"

    @classmethod
    def make(cls, root: "Path") -> "Jail":
        jail = cls(root, root / "home", root / "cache", root / "work")
        for d in (jail.home, jail.cache, jail.work):
            d.mkdir(parents=True, exist_ok=True)
        return jail

    def dropped_files(self) -> list[str]:
        """Files an attack wrote outside the runner's folder (HOME, the cache, the workdir, the
        installed package, /tmp)."""
        import kforge

        package = Path(kforge.__file__).parent
        found = []
        for base in (self.home, self.cache, self.work, package, Path("/tmp"), self.root.parent):
            pattern = "**/*" if base in (self.home, self.cache, self.work, package) else "*"
            found += [str(p) for p in base.glob(pattern) if MARKER in p.name]
        return sorted(set(found))

    def files_with_secret(self) -> list[str]:
        out = []
        key = FAKE_KEY.encode()
        for base in (self.home, self.cache, self.work):
            for p in base.rglob("*"):
                try:
                    if p.is_file() and p.stat().st_size < (64 << 20) and key in p.read_bytes():
                        out.append(str(p))
                except OSError:
                    continue
        return out

    def tampered_cache_objects(self) -> list[str]:
        from kforge.kernels import KernelIntegrityError, verify_binary

        bad = []
        for p in (self.cache / "kernels" / "objects").glob("*.so"):
            try:
                verify_binary(p)
            except KernelIntegrityError:
                bad.append(p.name)
        return bad

    def clean(self) -> None:
        for name in self.dropped_files():
            try:
                Path(name).unlink()
            except OSError:
                pass


def surviving_children(within: "Path | None" = None) -> list[int]:
    """Processes named like attack_fork_survive's children; with ``within`` (a Jail's root), only those whose
    environment or working folder names it (the runner's HOME and folder, the user's process's HOME, lie under it).

    NB: other sessions on a shared machine run the same corpus at the same time: their runners' children, alive for
    the moment before their runner is killed, are not this test's (a machine-wide scan failed a test by chance)."""

    pids = []
    mark = str(within).encode() if within is not None else None
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "comm").read_text().strip() != CHILD_COMM:
                continue
            if mark is not None and mark not in (d / "environ").read_bytes() and \
                    mark not in os.readlink(d / "cwd").encode():
                continue
            pids.append(int(d.name))
        except OSError:
            continue
    return pids


def kill_children(pids: list[int]) -> None:
    import os
    import signal

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def loot_listener():
    """A listening socket on the port attack_env_leak sends to, or None when the port is taken."""
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # NB: a connection this listener accepted and closed leaves the port in TIME_WAIT for a minute, where a plain bind
    # fails and the next test would run with no listener; another live listener still makes it fail
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", LOOT_PORT))
    except OSError:
        s.close()
        return None
    s.listen(8)
    s.setblocking(False)
    return s


def received(listener) -> bytes:
    """Everything sent to the listener so far (connections complete in the kernel before connect()
    returns, so a finished attack's connection is already queued: no waiting needed)."""
    data = b""
    if listener is None:
        return data
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return data
        conn.settimeout(1.0)
        try:
            while chunk := conn.recv(1 << 16):
                data += chunk
        except OSError:
            pass
        conn.close()


# ----------------------------------------------------------------------------- issue 42: the judge wall
# the input arena written behind the judge (its memfd reopened writable; on CUDA, device memory the runner can write),
# a kernel right for more calls than the old re-check at apply made, memory asked for past the runner's limit
CPU_ATTACKS.update({a.name: a for a in [
    Attack("attack_reopen_input", "forbidden-call", statuses("WRONG_RESULT", *SLOW_BUT_CORRECT)),
    Attack("attack_remap_input", "forbidden-call", statuses("WRONG_RESULT", *SLOW_BUT_CORRECT)),
    Attack("attack_wrong_after_calls", None, statuses("WRONG_RESULT")),
    Attack("attack_hold_memory", None, statuses("CRASHED", "LAUNCH_ERROR")),
]})
CUDA_ATTACKS.update({a.name: a for a in [
    Attack("attack_reopen_input", None, statuses("WRONG_RESULT")),
    Attack("attack_wrong_after_calls", None, statuses("WRONG_RESULT")),
    Attack("attack_hold_memory", "forbidden-call", statuses("CRASHED", "LAUNCH_ERROR")),
]})


# ----------------------------------------------------------------------------- issue 42: the build wall
# libc's double-underscore aliases of refused calls (the binary wall refuses their imports), a directive and an
# assembler directive that name a file (the compiler's jail cannot read it; the kept log quotes none of its lines)
for _table in (CPU_ATTACKS, CUDA_ATTACKS):
    _table.update({a.name: a for a in [
        Attack("attack_libc_alias", "forbidden-call", statuses("CRASHED", *SLOW_BUT_CORRECT)),
        Attack("attack_include_file", "include", statuses("COMPILE_ERROR")),
        Attack("attack_incbin", "inline-asm", statuses("COMPILE_ERROR", "WRONG_RESULT")),
    ]})


# ----------------------------------------------------------------------------- issue 42 review (eighth pass)
# an allowed import's address walked to libc's refused functions: nothing the screen or the binary wall sees; the
# runner's sandbox stops it. At apply/load a CPU kernel runs in a sandboxed worker too (deploy/_worker.py): nothing
# reached; a CUDA kernel's host code ran in the user's process (docs/security.md, "eighth pass")
_WALK_HOLE = ("reaches libc's getenv/open/socket from `&abort` with only allowed imports: no static wall closes this "
              "in the user's process (docs/security.md, eighth pass)")
CPU_ATTACKS["attack_libc_walk"] = Attack("attack_libc_walk", None, statuses(*SLOW_BUT_CORRECT))
# the same walk from a constructor: code that runs when the library is loaded (on the CPU, only ever by a runner)
CPU_ATTACKS["attack_ctor_walk"] = Attack("attack_ctor_walk", "attribute", statuses(*SLOW_BUT_CORRECT))
CUDA_ATTACKS["attack_libc_walk"] = Attack("attack_libc_walk", None, statuses(*SLOW_BUT_CORRECT),
                                          acts_in_process=_WALK_HOLE)
# the sealed inputs written through /proc/self/mem (the kernel's forced access; no CUDA twin: device memory has no such
# path, attack_reopen_input.cu writes it directly)
CPU_ATTACKS.update({a.name: a for a in [
    Attack("attack_procmem_input", "forbidden-call", statuses("WRONG_RESULT", *SLOW_BUT_CORRECT)),
]})
