"""Static checks on a candidate's source before it is compiled: defence in depth, not the sandbox.

A candidate is one translation unit that computes on the tensors it is given. Nothing it
legitimately needs touches processes, files, sockets, signals, the environment, the dynamic
loader, page protections or Python, runs code when the library is loaded, or needs assembly;
this screen refuses sources that name any of those, so most attacks fail before a compiler sees
them, with a message that says which line and why.

How: comments are removed and line splices joined, then the source is cut into tokens the way
the C preprocessor does (raw and wide strings kept whole). Every identifier in every branch of
every ``#if`` is checked, so code hidden behind a condition is seen. Macros cannot assemble a
name that is not in that token stream, because the screen refuses the only operator that makes
new identifiers (``##``, also spelt ``%:%:``), ``_Pragma`` and computed ``#include``; scanning
the raw tokens therefore covers what a preprocessed stream would, without running ``gcc -E``
/ ``nvcc -E`` (milliseconds instead of a process per candidate).

Not caught (the sandbox and the judge hold these): code that reaches a forbidden function by
address arithmetic from an allowed one (e.g. from ``&printf`` into libc), hand-made machine code
in a data array jumped to through a function pointer (needs executable memory, which nothing
allowed can make), C++ globals whose constructor comes from a type in an allowed header or is
reached through a ``typedef``/``using``/template, and any misbehaviour of allowed calls
(``malloc`` of 6 GiB, ``printf`` of a huge log, endless loops, wrong results).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

# Headers a kernel may include. Standard C numerics and memory helpers, OpenMP for the CPU
# backend, the CUDA runtime and its half/bfloat16 types, and the header-only CUDA libraries
# (cub, cooperative groups) that block reductions use. stdio.h is allowed for printf debugging
# (the file functions it declares are refused by name below), time.h for clocks and nanosleep
# (clock_settime and timers are refused by name).
ALLOWED_INCLUDES = frozenset({
    "kforge.h",
    "math.h", "float.h", "limits.h", "stdint.h", "stddef.h", "stdbool.h", "stdlib.h", "string.h",
    "stdio.h", "assert.h", "inttypes.h", "stdalign.h", "complex.h", "fenv.h", "time.h",
    "cmath", "cfloat", "climits", "cstdint", "cstddef", "cstdlib", "cstring", "cstdio", "cassert", "ctime",
    "type_traits", "limits", "utility", "algorithm", "array", "numeric",
    "omp.h", "immintrin.h", "x86intrin.h", "arm_neon.h",
    "cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "math_constants.h",
    "mma.h", "cooperative_groups.h", "cooperative_groups/reduce.h", "cooperative_groups/memcpy_async.h",
    "cub/cub.cuh", "cub/block/block_reduce.cuh", "cub/block/block_scan.cuh", "cub/warp/warp_reduce.cuh",
    "cub/block/block_load.cuh", "cub/block/block_store.cuh", "cuda/pipeline", "cuda/barrier",
    # cuBLASLt: a matrix product with an epilogue (one family's design: a product with its activation); its logger, which opens files and calls
    # back, is refused by name below
    "cublasLt.h",
})

# Header-only CUDA compute libraries: any header under these folders.
ALLOWED_INCLUDE_DIRS = ("cub/", "cooperative_groups/", "cuda/std/")
# CUTLASS and CuTe (header-only; the compile path adds their folders, kernels/_cutlass.py): a header under these
# folders, named by plain path components (letters, digits, `_`, `-`, inner dots) ending in a header's suffix, so that
# no `..`, `.`, empty component, absolute path or backslash can lead out of the tree.
ALLOWED_INCLUDE_TREES = ("cutlass", "cute")
_TREE_HEADER = re.compile(r"(?:cutlass|cute)(?:/[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*)+\.(?:h|hpp|hh|cuh|inl)")

# Pragmas that only shape code generation inside the unit. Anything else (weak, visibility,
# redefine_extname, section, init, GCC push_options with visibility...) is refused.
ALLOWED_PRAGMAS = (
    "omp", "unroll", "nounroll", "once", "STDC", "GCC unroll", "GCC ivdep", "GCC optimize",
    "nv_diag_suppress", "nv_diag_default", "diag_suppress", "clang loop",
)

_GROUPS: dict[str, tuple[str, ...]] = {
    "starts or controls processes": (
        "fork", "vfork", "clone", "clone3", "execl", "execle", "execlp", "execv", "execve", "execvp",
        "execvpe", "fexecve", "posix_spawn", "posix_spawnp", "system", "popen", "pclose", "daemon",
        "setsid", "setpgid", "setpgrp", "waitpid", "wait3", "wait4", "waitid", "exit", "_exit", "_Exit",
        "quick_exit", "atexit", "at_quick_exit", "on_exit", "getppid", "getpgid", "getpgrp",
        "pthread_create", "pthread_detach", "pthread_atfork", "pthread_kill", "thrd_create",
        "thrd_detach", "sched_setaffinity", "sched_setscheduler", "setpriority", "nice", "prctl",
        "setrlimit", "prlimit", "unshare", "setns", "chroot", "setuid", "setgid", "seteuid", "setegid",
    ),
    "touches files or file descriptors": (
        "fopen", "fopen64", "freopen", "fdopen", "tmpfile", "tmpnam", "mkstemp", "mkdtemp", "open",
        "open64", "openat", "openat2", "creat", "creat64", "read", "pread", "pread64", "readv",
        "preadv", "write", "pwrite", "pwrite64", "writev", "pwritev", "close", "close_range", "dup",
        "dup2", "dup3", "pipe", "pipe2", "mkfifo", "mknod", "ioctl", "fcntl", "sendfile", "splice",
        "tee", "vmsplice", "copy_file_range", "unlink", "unlinkat", "remove", "rename", "renameat",
        "mkdir", "mkdirat", "rmdir", "chmod", "fchmod", "chown", "fchown", "link", "symlink",
        "readlink", "readlinkat", "truncate", "ftruncate", "opendir", "fdopendir", "readdir",
        "scandir", "chdir", "fchdir", "getcwd", "get_current_dir_name", "realpath", "mount",
        "umount", "umount2", "fwrite", "fputs", "fputc", "putc", "fprintf", "vfprintf", "dprintf",
        "vdprintf", "fflush", "fclose", "fread", "fgets", "fgetc", "fscanf", "fseek", "setvbuf",
        "stdin", "stdout", "stderr", "FILE", "inotify_init", "fanotify_init", "memfd_create",
        "shm_open", "shm_unlink", "sync", "syncfs", "fsync",
    ),
    "uses the network": (
        "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4", "send", "sendto",
        "sendmsg", "sendmmsg", "recv", "recvfrom", "recvmsg", "recvmmsg", "getaddrinfo",
        "gethostbyname", "gethostbyaddr", "setsockopt", "getsockopt", "shutdown", "gethostname",
        "inet_addr", "inet_pton", "htons", "sockaddr", "sockaddr_in", "sockaddr_un",
    ),
    "sends or handles signals": (
        "signal", "sigaction", "sigset", "bsd_signal", "sysv_signal", "kill", "killpg", "raise", "tgkill",
        "tkill", "sigqueue", "alarm", "ualarm", "setitimer", "timer_create", "sigprocmask",
        "pthread_sigmask", "sigsuspend", "sigwait", "signalfd", "sigaltstack",
    ),
    "loads code or changes memory protection": (
        "dlopen", "dlmopen", "dlsym", "dlvsym", "dlclose", "dlerror", "dladdr", "dladdr1", "dlinfo",
        "dl_iterate_phdr", "RTLD_DEFAULT", "RTLD_NEXT", "mprotect", "pkey_mprotect", "mmap", "mmap64",
        "munmap", "mremap", "madvise", "brk", "sbrk", "process_vm_readv", "process_vm_writev",
        "getauxval", "__builtin_return_address", "__builtin_frame_address",
        "__builtin_extract_return_addr", "__builtin_apply", "__builtin_apply_args", "_init", "_fini",
        "cuModuleLoad", "cuModuleLoadData", "cuModuleLoadDataEx", "cuLibraryLoadData",
        "cuLibraryLoadFromFile", "cudaLibraryLoadData", "cudaLibraryLoadFromFile",
    ),
    "makes system calls or traces processes": (
        "syscall", "ptrace", "seccomp", "personality", "ioperm", "iopl", "bpf", "perf_event_open",
        "kexec_load", "init_module", "reboot", "clock_settime", "settimeofday", "adjtimex",
    ),
    "reads or changes the environment": (
        "getenv", "secure_getenv", "setenv", "putenv", "unsetenv", "clearenv", "environ", "__environ",
        "_environ", "program_invocation_name", "program_invocation_short_name", "__progname",
        "__progname_full", "getlogin", "getpwuid", "getpwnam",
    ),
    "changes thread settings that outlive the call": (
        "omp_set_num_threads", "omp_set_dynamic", "omp_set_nested", "omp_set_max_active_levels",
        "omp_set_schedule", "omp_set_default_device", "kmp_set_blocktime", "kmp_set_library",
        "omp_pause_resource", "omp_pause_resource_all", "cudaSetDeviceFlags", "cudaDeviceReset",
        "cudaDeviceSetLimit", "cudaDeviceSetCacheConfig", "cudaDeviceSetSharedMemConfig",
        "cudaSetDevice", "cudaCtxResetPersistingL2Cache",
    ),
    # NB: a driver entry point found by name reaches any driver function (a second context on the GPU
    # escapes the runner's device sync and its events: attack_kernel_spin_eager.cu)
    # NB: cuBLASLt's logger writes to a file it opens by name, to a FILE* or through a callback of the caller's
    "uses cuBLASLt's logger (files, callbacks)": (
        "cublasLtLoggerOpenFile", "cublasLtLoggerSetFile", "cublasLtLoggerSetCallback", "cublasLtLoggerSetLevel",
        "cublasLtLoggerSetMask", "cublasLtLoggerForceDisable", "cublasLoggerConfigure", "cublasSetLoggerCallback",
        "cublasGetLoggerCallback",
    ),
    "reaches the CUDA driver around the runtime": (
        "cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion", "cuGetProcAddress",
        "cuGetProcAddress_v2", "cuInit", "cuCtxCreate", "cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4",
        "cuCtxDestroy", "cuCtxPushCurrent", "cuCtxPopCurrent", "cuCtxSetCurrent", "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxSetFlags", "cuGreenCtxCreate", "cudaCtxCreate",
    ),
}
FORBIDDEN: dict[str, str] = {name: why for why, names in _GROUPS.items() for name in names}

# cuBLASLt, where a source includes it: the functions of a matrix product and nothing else. Its library exports
# functions that change process-wide state (context shutdown, heuristics caches, environment modes, CPU instruction
# masks), which a kernel deployed into the user's process (sharing PyTorch's loaded cuBLASLt) could call though the
# judge's runner never shows it: any other function named cublas* is refused. Types (``*_t``) stay allowed.
CUBLAS_ALLOWED = frozenset({
    "cublasLtCreate", "cublasLtDestroy", "cublasLtGetVersion", "cublasLtGetStatusName", "cublasLtGetStatusString",
    "cublasLtMatmul", "cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy", "cublasLtMatmulDescSetAttribute",
    "cublasLtMatmulDescGetAttribute", "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy",
    "cublasLtMatrixLayoutSetAttribute", "cublasLtMatrixLayoutGetAttribute", "cublasLtMatmulPreferenceCreate",
    "cublasLtMatmulPreferenceDestroy", "cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulPreferenceGetAttribute",
    "cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmulAlgoGetIds", "cublasLtMatmulAlgoInit", "cublasLtMatmulAlgoCheck",
    "cublasLtMatmulAlgoConfigSetAttribute", "cublasLtMatmulAlgoConfigGetAttribute",
    "cublasLtMatmulAlgoCapGetAttribute",
    "cublasLt",   # NB: the header's name, as the include line's tokens have it (no such function)
})
# NB: a speed bump, not a boundary: an enum's value can be written as a number through a cast or an attribute's
# pointer. The names that choose a lower-precision product (cuBLAS's TF32 and half compute types, fast
# accumulation, emulation; TF32 in WMMA or conversions) are refused so that no candidate uses them by accident
_REDUCED_PRECISION = re.compile(r"(?i:tf32)|^CUBLAS\w*(?:_FAST|EMULAT|COMPUTE_16F)")
_FORBIDDEN_PREFIX = re.compile(r"^(?:_?Py[A-Z_]|__libc_|__NR_|SYS_[a-z]|__sys_|__x64_sys|_dl_|__dl_)")
_ASM = frozenset({"asm", "__asm__", "__asm"})
_PRAGMA_OPERATORS = frozenset({"_Pragma", "__pragma"})
# Preprocessor operators that look files up by name (their existence is a bit the compiler would tell)
_FILE_OPERATORS = frozenset({"__has_include", "__has_include_next", "__has_embed"})
# Assembler directives that read a file into the object (they only work inside assembly, refused anyway)
_ASM_FILE = re.compile(r"\.(?:incbin|include)\b")
_ATTRIBUTE_WORDS = frozenset({"__attribute__", "__attribute", "__declspec"})
# Attributes that run code at load or unload, place code or data in chosen sections, or bind
# a name to another symbol.
_ATTR_DENY = frozenset({
    "constructor", "destructor", "section", "init_priority", "ifunc", "alias", "weakref", "weak",
    "symver", "visibility", "used", "retain", "naked", "target_clones", "init_seg", "allocate",
    "code_seg", "no_reorder",
})
_SECTION_NAMES = re.compile(r"\.(?:init_array|fini_array|preinit_array|ctors|dtors|init|fini)\b")
_ATTR_EXCEPT = {"visibility": "KF_ENTRY (from kforge.h) sets the entry point's visibility"}

_TOKEN = re.compile(r"""
    (?P<raw>(?:u8|u|U|L)?R"(?P<delim>[^ ()\\\t\n"]{0,16})\((?s:.*?)\)(?P=delim)")
  | (?P<str>(?:u8|u|U|L)?"(?:[^"\\\n]|\\.)*"?)
  | (?P<chr>(?:u8|u|U|L)?'(?:[^'\\\n]|\\.)*'?)
  | (?P<num>\.?\d(?:[eEpP][+-]|[\w.']|\\[uU])*)
  | (?P<ident>[A-Za-z_$][\w$]*)
  | (?P<ucn>\\[uU][0-9A-Fa-f]*)
  | (?P<punct>\#\#|%:%:|%:|<:|:>|<%|%>|\[\[|\]\]|::|->|\S)
""", re.VERBOSE)
_COMMENT = re.compile(r"""//[^\n]*|/\*(?s:.*?)\*/|(?:u8|u|U|L)?R"([^ ()\\\t\n"]{0,16})\((?s:.*?)\)\1"|"""
                      r""""(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?""")
_TRIGRAPH = re.compile(r"\?\?[=/'()!<>\-]")
_DIRECTIVE = re.compile(r"^[ \t]*(?:#|%:)[ \t]*(\w*)(.*)$", re.MULTILINE)


@dataclass(frozen=True)
class Finding:
    """One reason a source is refused."""

    line: int
    rule: str        # "forbidden-call", "inline-asm", "include", "pragma", "attribute", "load-time-code", "macro"
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def screen_disabled() -> bool:
    """The screen is off only for kforge's own tests (KFORGE_SCREEN=off or =binary under pytest), so the
    attack corpus can reach the walls behind it."""
    return os.environ.get("KFORGE_SCREEN") in ("off", "binary") and "PYTEST_CURRENT_TEST" in os.environ


def binary_check_disabled() -> bool:
    """The binary wall (kforge/kernels/_binary.py) is off only with the screen, for kforge's own tests of the sandbox
    behind both (KFORGE_SCREEN=off under pytest); KFORGE_SCREEN=binary turns off the source screen alone."""
    return os.environ.get("KFORGE_SCREEN") == "off" and "PYTEST_CURRENT_TEST" in os.environ


def screen(source: str, backend: str = "cpu") -> tuple[Finding, ...]:
    """Every reason to refuse ``source`` (empty when it may be compiled). ``backend``: "cpu" or "cuda"."""
    found: list[Finding] = _check_line_ends(source)
    text = _join_splices(source)
    clean = _strip_comments(text)
    found += _check_directives(clean)
    tokens = _tokens(clean)
    found += _check_tokens(tokens, clean)
    directive_lines = {clean.count("\n", 0, m.start()) + 1 for m in _DIRECTIVE.finditer(clean)}
    found += _check_load_time_code([t for t in tokens if t.line not in directive_lines])
    seen: set[tuple[int, str]] = set()
    unique = []
    for f in sorted(found, key=lambda f: f.line):
        if (f.line, f.message) not in seen:
            seen.add((f.line, f.message))
            unique.append(f)
    return tuple(unique)


# ----------------------------------------------------------------------------- lexing


# NB: gcc and nvcc also splice a backslash followed by spaces or tabs before the line's end (with a warning), and
# end a line at a lone carriage return: a name split so passed a screen that joined only backslash-newline
_LOOSE_SPLICE = re.compile(r"\\[ \t\f\v]+(?=\r\n|\r|\n|$)")
_LONE_CR = re.compile(r"\r(?!\n)")


def _check_line_ends(source: str) -> list[Finding]:
    """Line ends the compiler reads otherwise than the screen would: a backslash with blanks after it, a lone
    carriage return."""
    out = []
    for pattern, what in ((_LOOSE_SPLICE, "a backslash followed by blanks before the line's end (the compiler "
                                          "joins the lines; write the backslash last, or remove it)"),
                          (_LONE_CR, "a carriage return without a newline (the compiler ends a line there; use "
                                     "newlines)")):
        m = pattern.search(source)
        if m:
            line = source.count("\n", 0, m.start()) + 1
            out.append(Finding(line, "line-end", what))
    return out


def _join_splices(source: str) -> str:
    """Translation phase 2 (backslash-newline removed), keeping line numbers: each removed newline
    is put back after the logical line ends."""
    if "\\" not in source:
        return source
    out, pending = [], 0
    for line in source.replace("\r\n", "\n").split("\n"):
        if line.endswith("\\"):
            out.append(line[:-1])
            pending += 1
            continue
        out.append(line + "\n" * (pending + 1))
        pending = 0
    return "".join(out)[:-1] if out else ""


def _strip_comments(text: str) -> str:
    """Comments replaced by spaces (newlines kept); string literals untouched."""
    def sub(m: re.Match) -> str:
        s = m.group(0)
        if s.startswith("//") or s.startswith("/*"):
            return " " + "\n" * s.count("\n")
        return s
    return _COMMENT.sub(sub, text)


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    line: int


def _tokens(clean: str) -> list[_Tok]:
    toks: list[_Tok] = []
    line, last = 1, 0
    for m in _TOKEN.finditer(clean):
        line += clean.count("\n", last, m.start())
        last = m.start()
        kind = m.lastgroup if m.lastgroup != "delim" else "raw"
        if m.group("raw") is not None:
            kind = "str"
        toks.append(_Tok(kind, m.group(0), line))
    return toks


# ----------------------------------------------------------------------------- checks


def _check_directives(clean: str) -> list[Finding]:
    out = []
    for m in _DIRECTIVE.finditer(clean):
        line = clean.count("\n", 0, m.start()) + 1
        name, rest = m.group(1), m.group(2).strip()
        if name == "include":
            inc = re.fullmatch(r'"([^"]+)"|<([^>]+)>', rest)
            if inc is None:
                out.append(Finding(line, "include", f"#include {rest} is not a plain \"file\" or <file>: computed "
                                   "includes are not allowed; name the header"))
                continue
            header = (inc.group(1) or inc.group(2)).strip()
            allowed = header in ALLOWED_INCLUDES or (header.startswith(ALLOWED_INCLUDE_DIRS) and ".." not in header
                                                     and "\\" not in header)
            if not allowed and header.split("/")[0] in ALLOWED_INCLUDE_TREES:
                allowed = inc.group(1) is not None and _TREE_HEADER.fullmatch(inc.group(1)) is not None
                if not allowed:
                    out.append(Finding(line, "include", f"#include {rest}: a CUTLASS or CuTe header is named by plain "
                                       "folders and a file under cutlass/ or cute/ (#include \"cutlass/gemm/...hpp\"; "
                                       "no `..`, `.`, empty or absolute parts, no spaces)"))
                    continue
            if not allowed:
                out.append(Finding(line, "include", f"#include {rest} is not on the allow-list: kforge.h, the standard C "
                                   "numeric/integer/string headers, omp.h, the CUDA runtime, fp16/bf16, cub, "
                                   "cooperative_groups, cuBLASLt, CUTLASS and CuTe headers (docs/security.md lists "
                                   "them)"))
        elif name in ("include_next", "import", "embed", "assert", "ident", "sccs"):
            out.append(Finding(line, "include", f"#{name} is not allowed in a kernel"))
        elif name == "line" or name.isdigit():
            # NB: a line marker names the file the compiler's messages quote lines from (`#line 1 "/etc/passwd"`)
            out.append(Finding(line, "include", f"#{name} {rest[:40]}: line markers are not allowed in a kernel (they "
                               "name the file whose lines the compiler quotes)"))
        elif name == "pragma":
            if not any(rest == p or rest.startswith(p + " ") or rest.startswith(p + "(") for p in ALLOWED_PRAGMAS):
                out.append(Finding(line, "pragma", f"#pragma {rest}: only {', '.join(ALLOWED_PRAGMAS)} pragmas are "
                                   "allowed (others change linkage, sections or symbols)"))
            elif rest.startswith("GCC optimize") and re.search(r"[=/]", rest):
                out.append(Finding(line, "pragma", f"#pragma {rest}: GCC optimize takes optimisation flags without "
                                   "values (an option with a value can name a file)"))
    return out


def _check_tokens(toks: list[_Tok], clean: str) -> list[Finding]:
    out = []
    n = len(toks)
    i = 0
    while i < n:
        t = toks[i]
        if t.kind == "ident":
            name = t.text
            if name in _ASM:
                out.append(Finding(t.line, "inline-asm", f"`{name}`: inline assembly is not allowed; write C/CUDA "
                                   "(use intrinsics such as __shfl_xor_sync, __ldg, __nanosleep)"))
            elif name in _PRAGMA_OPERATORS:
                out.append(Finding(t.line, "pragma", f"`{name}`: pragma operators are not allowed; write #pragma"))
            elif name in _FILE_OPERATORS:
                out.append(Finding(t.line, "include", f"`{name}` looks a file up by name: not allowed in a kernel"))
            elif name in FORBIDDEN:
                out.append(Finding(t.line, "forbidden-call", f"`{name}` {FORBIDDEN[name]}: a kernel only computes on "
                                   "the tensors it is given"))
            elif _alias_of(name) in FORBIDDEN:
                bare = _alias_of(name)
                out.append(Finding(t.line, "forbidden-call", f"`{name}` is libc's alias of `{bare}`, which "
                                   f"{FORBIDDEN[bare]}: a kernel only computes on the tensors it is given"))
            elif _REDUCED_PRECISION.search(name):
                out.append(Finding(t.line, "precision", f"`{name}` selects a matrix product of lower precision than "
                                   "eager's (TF32, half accumulation, fast accumulation, emulation): the judge compares "
                                   "with eager's float32 accumulation; use CUBLAS_COMPUTE_32F"))
            elif name.startswith("cublas") and not name.endswith("_t") and name not in CUBLAS_ALLOWED:
                out.append(Finding(t.line, "forbidden-call", f"`{name}` is a cuBLAS function outside the matrix "
                                   "product's (kforge allows cuBLASLt's matmul, its descriptors, layouts, preferences "
                                   "and heuristics only)"))
            elif _FORBIDDEN_PREFIX.match(name):
                why = "the Python C API" if "Py" in name[:3] else "a libc/loader internal or a raw system call number"
                out.append(Finding(t.line, "forbidden-call", f"`{name}` is {why}: not allowed in a kernel"))
            elif name in _ATTRIBUTE_WORDS:
                j, words = _group(toks, i + 1, "(", ")")
                out += _attribute_findings(words, t.line)
                i = j
                continue
        elif t.kind == "punct":
            if t.text in ("##", "%:%:"):
                out.append(Finding(t.line, "macro", "token pasting (`##`) is not allowed in a kernel: it can build "
                                   "names the screen cannot see; write the names out"))
            elif t.text == "[[":
                j, words = _group(toks, i, "[[", "]]")
                out += _attribute_findings(words, t.line)
        elif t.kind == "ucn":
            out.append(Finding(t.line, "macro", "universal character names (\\u...) outside strings are not allowed"))
        elif t.kind == "str" and _SECTION_NAMES.search(t.text):
            out.append(Finding(t.line, "load-time-code", f"{t.text[:40]}: names a load-time section"))
        elif t.kind == "str" and _ASM_FILE.search(t.text):
            out.append(Finding(t.line, "include", f"{t.text[:40]}: an assembler directive that reads a file"))
        i += 1
    blanked = _COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), clean)
    for m in _TRIGRAPH.finditer(blanked):
        out.append(Finding(clean.count("\n", 0, m.start()) + 1, "macro", f"trigraph `{m.group(0)}` is not allowed"))
    return out


def _alias_of(name: str) -> str:
    """The function a libc-internal spelling names: ``__open``, ``__open_nocancel``, ``__socket`` -> ``open``,
    ``socket`` ("" for a name without leading underscores)."""
    if not name.startswith("_"):
        return ""
    bare = name.lstrip("_")
    for suffix in ("_nocancel", "_internal"):
        bare = bare.removesuffix(suffix)
    return bare


def _group(toks: list[_Tok], i: int, open_: str, close: str) -> tuple[int, list[_Tok]]:
    """The tokens of the balanced group starting at ``toks[i]`` (which should be ``open_``)."""
    if i >= len(toks) or toks[i].text != open_:
        return i, []
    depth, j = 0, i
    while j < len(toks):
        if toks[j].text == open_:
            depth += 1
        elif toks[j].text == close:
            depth -= 1
            if depth == 0:
                return j + 1, toks[i:j + 1]
        j += 1
    return j, toks[i:]


def _attribute_findings(words: list[_Tok], line: int) -> list[Finding]:
    out = []
    for w in words:
        if w.kind != "ident":
            if w.kind == "str" and _SECTION_NAMES.search(w.text):
                out.append(Finding(line, "attribute", f"{w.text}: names a load-time section"))
            continue
        bare = w.text.strip("_")
        if bare in _ATTR_DENY:
            hint = _ATTR_EXCEPT.get(bare, "it runs code at load time, places code in chosen sections or binds "
                                          "symbols")
            out.append(Finding(w.line, "attribute", f"__attribute__(({bare})) is not allowed: {hint}"))
    return out


_SPECIFIERS = frozenset({"static", "const", "volatile", "inline", "extern", "thread_local", "_Thread_local",
                         "__thread", "constexpr", "constinit", "mutable", "register", "__host__", "struct",
                         "class", "typename"})
_TYPE_WORDS = frozenset({"void", "int", "float", "double", "char", "short", "long", "unsigned", "signed", "bool",
                         "const", "size_t", "int32_t", "int64_t", "uint32_t", "uint64_t", "struct", "class",
                         "kf_tensor", "__half", "__nv_bfloat16", "half", "float4", "float2"})
_DEVICE_SPECIFIERS = frozenset({"__device__", "__constant__", "__shared__", "__managed__"})


def _check_load_time_code(toks: list[_Tok]) -> list[Finding]:
    """C++ code that runs when the library loads: namespace-scope objects of a class with a
    constructor or destructor, and namespace-scope initialisers that call a function of the file
    or a lambda (dynamic initialisation)."""
    ctor_types, functions = _ctor_types_and_functions(toks)
    out: list[Finding] = []
    stack: list[str] = []         # "ns" for namespace / extern "C" braces, "block" otherwise
    stmt: list[_Tok] = []
    for i, t in enumerate(toks):
        top = all(k == "ns" for k in stack)
        if t.text in ("{", "<%"):
            if top:
                head = [x.text for x in stmt]
                is_ns = (len(head) >= 1 and head[0] == "namespace") or \
                        (len(head) >= 2 and head[-2] == "extern" and toks[i - 1].kind == "str") or \
                        (len(head) == 1 and head[0] == "extern")
                if is_ns:
                    stack.append("ns")
                    stmt = []
                    continue
                # NB: `T x{f()};` initialises as `T x = f();` does (a declarator's name, then the brace)
                in_init = "=" in head or (len(head) >= 2 and stmt[-1].kind == "ident"
                                          and head[0] not in ("struct", "class", "union", "enum"))
                stack.append("init" if in_init else "block")
                if not in_init and head and head[0] in ("struct", "class", "union"):
                    stack[-1] = "type"
                if in_init:
                    stmt.append(t)
                continue
            stack.append("block")
            continue
        if t.text in ("}", "%>"):
            kind = stack.pop() if stack else "block"
            if all(k == "ns" for k in stack):
                if kind == "init":
                    stmt.append(t)
                elif kind == "type":
                    # struct X { ... } g;  -> keep the head to see a declarator after the body
                    stmt.append(_Tok("punct", "{}", t.line))
                elif kind != "ns":
                    stmt = []
            continue
        if not top:
            if stack and stack[-1] == "init" and all(k in ("ns", "init") for k in stack):
                stmt.append(t)
            continue
        if t.text == ";":
            out += _statement_findings(stmt, ctor_types, functions)
            stmt = []
            continue
        if t.kind == "punct" and t.text == "#":
            continue
        stmt.append(t)
    return out


def _statement_findings(stmt: list[_Tok], ctor_types: set[str], functions: set[str]) -> list[Finding]:
    if not stmt:
        return []
    texts = [t.text for t in stmt]
    if texts[0] in ("typedef", "using", "template", "namespace", "friend", "static_assert"):
        return []
    if any(t in _DEVICE_SPECIFIERS for t in texts):
        return []
    line = stmt[0].line
    j = 0
    while j < len(texts) and texts[j] in _SPECIFIERS:
        j += 1
    if j < len(texts) and texts[j] in ctor_types:
        after = texts[j + 2] if j + 2 < len(texts) else ";"
        call = texts[j + 3] if j + 3 < len(texts) else ")"
        # NB: `X f(int a);` and `X f();` declare functions; `X g;`, `X g(1);`, `X g = ...` make objects.
        is_function = after == "(" and (call == ")" or call in _TYPE_WORDS or call in ctor_types)
        if j + 1 < len(stmt) and stmt[j + 1].kind == "ident" and not is_function:
            return [Finding(line, "load-time-code", f"a namespace-scope object of class `{texts[j]}`: its "
                            "constructor or destructor would run when the library loads or unloads; make it "
                            "a local variable")]
    if "{}" in texts:
        k = texts.index("{}")
        head = texts[:k]
        if head and head[0] in ("struct", "class", "union") and len(head) >= 2 and head[1] in ctor_types \
                and k + 1 < len(texts) and stmt[k + 1].kind == "ident":
            return [Finding(line, "load-time-code", f"a namespace-scope object of class `{head[1]}`: its "
                            "constructor or destructor would run when the library loads; make it a local variable")]
    if "=" in texts:
        init = stmt[texts.index("=") + 1:]
        for a, b in zip(init, init[1:]):
            if a.kind == "ident" and a.text in functions and b.text == "(":
                return [Finding(a.line, "load-time-code", f"a namespace-scope initialiser calls `{a.text}`: it would "
                                "run when the library loads; compute it inside kf_launch")]
            if a.text in ("]", ":>") and b.text in ("(", "{", "<%", "mutable", "->"):
                return [Finding(a.line, "load-time-code", "a lambda in a namespace-scope initialiser would run when "
                                "the library loads; compute it inside kf_launch")]
    called = _initialiser_call(stmt, functions)
    if called is not None:
        return [Finding(called.line, "load-time-code", f"a namespace-scope initialiser calls `{called.text}`: it would "
                        "run when the library loads (a library's function too, e.g. cuBLASLt's); compute it inside "
                        "kf_launch")]
    return []


# Words a namespace-scope declaration may follow with "(" without calling anything at load time
_NOT_CALLS = frozenset({"sizeof", "alignof", "_Alignof", "alignas", "_Alignas", "__align__", "decltype", "static_cast",
                        "const_cast", "reinterpret_cast", "noexcept", "defined", "__launch_bounds__"})


def _initialiser_call(stmt: list[_Tok], functions: set[str] = frozenset()) -> _Tok | None:
    """A call in a namespace-scope declaration's initialiser (after ``=``, or inside the parentheses or braces of a
    direct initialisation, ``T x(f());`` / ``T x{f()};``): dynamic initialisation, which runs when the library loads.
    A function's own declarator (``T f(int);``) calls nothing; attributes are skipped. The C math library's functions
    may be called (``1.0f / sqrtf(128.0f)``), unless the file defines a function of that name (``functions``)."""
    depth, after_eq = 0, False
    skip_to = -1
    for i, (a, b) in enumerate(zip(stmt, stmt[1:])):
        if i < skip_to:
            continue
        if a.text in _ATTRIBUTE_WORDS:
            skip_to, _ = _group(stmt, i + 1, "(", ")")
            continue
        if a.text == "=":
            after_eq = True
        elif a.text in ("(", "{", "<%"):
            depth += 1
        elif a.text in (")", "}", "%>"):
            depth -= 1
        if a.kind == "ident" and b.text == "(" and (after_eq or depth > 0) and a.text not in _NOT_CALLS \
                and a.text not in _TYPE_WORDS and (a.text in functions or not _PURE_MATH.match(a.text)):
            return a
    return None


# The C math library's functions (no side effects): a constant such as 1 / sqrtf(128) may call them
_PURE_MATH = re.compile(r"^(?:sqrt|cbrt|rsqrt|exp|exp2|expm1|log|log2|log10|log1p|pow|sin|cos|tan|asin|acos|atan|"
                        r"atan2|sinh|cosh|tanh|fabs|abs|floor|ceil|round|trunc|fmin|fmax|fma|hypot|erf|erfc|ldexp)[fl]?$")


def _ctor_types_and_functions(toks: list[_Tok]) -> tuple[set[str], set[str]]:
    """Classes of the file with a constructor/destructor (or a member of such a class, or a default
    member initialiser), and the names of functions the file defines."""
    bodies: dict[str, list[_Tok]] = {}
    functions: set[str] = set()
    n = len(toks)
    for i, t in enumerate(toks):
        if t.text in ("struct", "class", "union") and i + 1 < n and toks[i + 1].kind == "ident":
            name = toks[i + 1].text
            j = i + 2
            while j < n and toks[j].text not in ("{", "<%", ";", "(", ")", ","):
                j += 1
            if j < n and toks[j].text in ("{", "<%"):
                end, body = _group(toks, j, toks[j].text, "}" if toks[j].text == "{" else "%>")
                bodies[name] = body
        if t.text in ("{", "<%") and i > 0:
            k = i - 1
            while k > 0 and toks[k].kind == "ident" and toks[k].text in ("const", "noexcept", "override",
                                                                          "final", "volatile"):
                k -= 1
            if toks[k].text == ")":
                depth = 0
                while k >= 0:
                    if toks[k].text == ")":
                        depth += 1
                    elif toks[k].text == "(":
                        depth -= 1
                        if depth == 0:
                            break
                    k -= 1
                if k > 0 and toks[k - 1].kind == "ident":
                    functions.add(toks[k - 1].text)
    ctor: set[str] = set()
    for name, body in bodies.items():
        depth = 0
        for a, b in zip(body, body[1:]):
            depth += a.text in ("{", "<%")
            depth -= a.text in ("}", "%>")
            if (a.text == name and b.text == "(") or (a.text == "~" and b.text == name) or \
                    (depth == 1 and a.text == "=" and b.text != "="):
                ctor.add(name)
                break
    changed = True
    while changed:
        changed = False
        for name, body in bodies.items():
            if name not in ctor and any(t.text in ctor for t in body):
                ctor.add(name)
                changed = True
    functions -= {"if", "for", "while", "switch", "return", "sizeof", "catch", "__launch_bounds__"}
    return ctor, functions


def describe(findings: tuple[Finding, ...]) -> str:
    """The findings as the log of a refused source."""
    return "\n".join(str(f) for f in findings)
