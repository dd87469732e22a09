"""The compiler's jail: run as ``python -I -S _jail.py CONFIG -- COMMAND...``, it limits itself and execs COMMAND.

Standard library only, and nothing of kforge is imported: it runs in a fresh interpreter (a process of its own, so
no ``preexec_fn`` runs in a threaded parent). CONFIG is JSON: ``limits`` (RLIMIT_CPU seconds, RLIMIT_AS and
RLIMIT_FSIZE bytes, processes beyond those the user runs now), ``read`` (folders and files the compiler may read and
execute), ``write`` (its private folder), ``devices`` (files it may read and write, /dev/null). Where the kernel has
Landlock, file access outside those paths and TCP are refused for the compiler and everything it starts; without
Landlock the limits alone apply.
"""
from __future__ import annotations

import ctypes
import json
import os
import resource
import sys

_PR_SET_NO_NEW_PRIVS = 38
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446   # the same on x86-64 and AArch64
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1, 2, 4, 8
_TRUNCATE, _IOCTL_DEV = 1 << 14, 1 << 15


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32)]


def _processes_of_user() -> int:
    """Tasks (threads) this user runs now: what RLIMIT_NPROC counts."""
    uid, n = os.getuid(), 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                n += int(fields["Threads"])
        except (OSError, KeyError, ValueError):
            continue
    return n


def _limit(which: int, value: int, grace: int = 0) -> None:
    _soft, hard = resource.getrlimit(which)
    top = value + grace
    if hard != resource.RLIM_INFINITY:
        top, value = min(top, hard), min(value, hard)
    resource.setrlimit(which, (value, top))


def _landlock(libc, read: list[str], write: list[str], devices: list[str]) -> None:
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    abi = syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return
    fs = (1 << 13) - 1
    if abi >= 2:
        fs |= 1 << 13          # REFER
    if abi >= 3:
        fs |= _TRUNCATE
    if abi >= 5:
        fs |= _IOCTL_DEV
    attr = _RulesetAttr(fs, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)   # no TCP; no signals or abstract sockets out
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return
    file_rights = _EXECUTE | _WRITE_FILE | _READ_FILE | (fs & (_TRUNCATE | _IOCTL_DEV))

    def allow(path: str, access: int) -> None:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if not os.path.isdir(path):
                access &= file_rights
            rule = _PathBeneath(access & fs, fd)
            syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0))
        finally:
            os.close(fd)

    for path in read:
        allow(path, _READ_FILE | _READ_DIR | _EXECUTE)
    for path in devices:
        allow(path, _READ_FILE | _WRITE_FILE | _TRUNCATE | _IOCTL_DEV)
    for path in write:
        allow(path, fs)
    if syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    os.close(ruleset)


def _which(program: str) -> str:
    if os.sep in program:
        return program
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", program)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(2, "No such file or directory", program)


def main(argv: list[str]) -> None:
    config = json.loads(argv[1])
    command = argv[3:]
    limits = config["limits"]
    _limit(resource.RLIMIT_CORE, 0)
    # NB: a soft limit below the hard one: the compiler gets SIGXCPU / SIGXFSZ (which say which limit) before SIGKILL
    _limit(resource.RLIMIT_CPU, int(limits["cpu_s"]), grace=5)
    _limit(resource.RLIMIT_FSIZE, int(limits["file_bytes"]))
    _limit(resource.RLIMIT_AS, int(limits["address_space_bytes"]))
    if os.getuid() != 0:   # NB: root is not held to RLIMIT_NPROC; it counts all of the user's tasks, not this tree's
        _limit(resource.RLIMIT_NPROC, _processes_of_user() + int(limits["processes"]))
    program = _which(command[0])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    # NB: nothing may be imported from here on: the interpreter's own files are outside what the rules let it read
    _landlock(libc, config["read"], config["write"], config["devices"])
    os.execv(program, command)


if __name__ == "__main__":
    try:
        main(sys.argv)
    except OSError as exc:
        sys.stderr.write(f"kforge: the compiler's jail could not start it: {exc}\n")
        sys.exit(127)
