"""The binary wall: what a built kernel library may import and execute, checked before anything loads it.

The source screen (``_screen.py``) is a deny-list over text; this is an allow-list over the built ELF shared
library, the form that is loaded (by the runner, the re-check before install, ``Session.apply()`` and
``kforge.load()``). It reads the file itself (``struct`` over the section and program headers, ``.dynsym``,
``.dynstr``, ``.dynamic``) and refuses a library that

- imports a dynamic symbol outside a short list: the C math library (and its vector variants), memory and string
  helpers, ``malloc``/``free``, ``printf`` for debugging, clocks, OpenMP's entry points that ``gcc -fopenmp`` emits
  (never its offloading ones, nor the setters that outlive a call), the C++ runtime's exception and guard
  functions, the CUDA runtime's launch path and queries, cuBLASLt's matrix product, and what CUTLASS's host code
  needs (the driver's two TMA descriptor encoders, messages to std::cout/std::cerr, 128-bit division);
- needs a shared library outside the C, math, OpenMP, C++ and CUDA runtime, cuBLASLt and the CUDA driver;
- holds a raw system-call instruction (``syscall``, ``sysenter``, ``int $0x80``; ``svc`` on AArch64) in its
  executable code, found by disassembling it with binutils' ``objdump`` (refused when objdump is missing: the
  check fails closed);
- maps memory both writable and executable, asks for an executable stack, or has text relocations.

CUDA libraries link the CUDA runtime shared (``libcudart.so``), not statically as nvcc does by default: the static
runtime imports ``dlopen``, sockets, files and threads itself, which would leave nothing for a list to refuse.
"""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ._screen import CUBLAS_ALLOWED

# The C math library: every function of <math.h> on float, double and long double, its glibc aliases
# (__expf_finite, __isnanf ...) and libmvec's vector variants (_ZGVdN8v_expf: what -fopenmp's simd loops call).
_MATH = (r"(?:sin|cos|tan|asin|acos|atan|atan2|sinh|cosh|tanh|asinh|acosh|atanh|exp|exp2|exp10|expm1|log|log2|"
         r"log10|log1p|logb|pow|pow10|sqrt|rsqrt|cbrt|hypot|erf|erfc|lgamma|lgamma_r|tgamma|ceil|floor|trunc|round|"
         r"lround|llround|rint|lrint|llrint|nearbyint|fmod|remainder|remquo|fabs|fmin|fmax|fdim|fma|frexp|ldexp|"
         r"scalbn|scalbln|modf|copysign|nextafter|nexttoward|nan|ilogb|sincos|j0|j1|jn|y0|y1|yn|significand|"
         r"isnan|isinf|finite|signbit|fpclassify|issignaling)")
_MATH_NAME = re.compile(rf"^(?:__)?{_MATH}[fl]?(?:_finite)?$|^_ZGV[a-z][NM]\d+[vlu0-9]+_{_MATH}[fl]?$")

IMPORTS = frozenset({
    # memory and strings (string.h, stdlib.h), fortified forms (_FORTIFY_SOURCE), stack protector
    "memcpy", "memmove", "memset", "memcmp", "memchr", "strlen", "strnlen", "strcmp", "strncmp", "strcpy",
    "strncpy", "strcat", "strncat", "strchr", "strrchr", "strstr", "__memcpy_chk", "__memmove_chk",
    "__memset_chk", "__strcpy_chk", "__strncpy_chk", "__stack_chk_fail", "__stack_chk_guard",
    "malloc", "calloc", "realloc", "free", "aligned_alloc", "posix_memalign", "qsort", "bsearch", "abs", "labs",
    "llabs", "div", "ldiv", "strtol", "strtoul", "strtoll", "strtoull", "strtof", "strtod", "atoi", "atol", "atof",
    # printf for debugging (stdio.h is allowed for it), assert, clocks (time.h)
    "printf", "puts", "putchar", "snprintf", "sprintf", "vsnprintf", "__printf_chk", "__sprintf_chk",
    "__snprintf_chk", "__vsnprintf_chk", "__assert_fail", "abort", "clock_gettime", "clock", "time", "nanosleep",
    # what the compiler's start files reference (weak), the C++ runtime (exceptions, local statics, new/delete)
    "__cxa_finalize", "__gmon_start__", "_ITM_deregisterTMCloneTable", "_ITM_registerTMCloneTable",
    "__gxx_personality_v0", "_Unwind_Resume", "_Znwm", "_Znam", "_ZdlPv", "_ZdlPvm", "_ZdaPv", "_ZdaPvm",
    "_ZSt9terminatev", "__errno_location", "_ZNSt8ios_base4InitC1Ev", "_ZNSt8ios_base4InitD1Ev",
    # ... <iostream>'s one initialiser of the standard streams as libstdc++ 13 and later emit it in place of the
    # static ios_base::Init object above (every CUTLASS build on the H100's g++ imported it, 2026-12-07)
    "_ZSt21ios_base_library_initv",
    # OpenMP (gcc -fopenmp): the queries and locks of omp.h
    "omp_get_thread_num", "omp_get_num_threads", "omp_get_max_threads", "omp_get_num_procs", "omp_in_parallel",
    "omp_get_level", "omp_get_active_level", "omp_get_team_size", "omp_get_ancestor_thread_num", "omp_get_wtime",
    "omp_get_wtick", "omp_get_dynamic", "omp_get_nested", "omp_get_thread_limit", "omp_get_schedule",
    "omp_init_lock", "omp_destroy_lock", "omp_set_lock", "omp_unset_lock", "omp_test_lock", "omp_init_nest_lock",
    "omp_destroy_nest_lock", "omp_set_nest_lock", "omp_unset_nest_lock", "omp_test_nest_lock",
    # the CUDA runtime: what nvcc's host stubs call to register and launch kernels, and the calls a kernel makes
    # on the stream it is given (errors, device queries, attributes, async copies)
    "__cudaRegisterFatBinary", "__cudaRegisterFatBinaryEnd", "__cudaUnregisterFatBinary", "__cudaRegisterFunction",
    "__cudaRegisterVar", "__cudaRegisterManagedVar", "__cudaPushCallConfiguration", "__cudaPopCallConfiguration",
    "__cudaLaunchKernel", "__cudaGetKernel", "__cudaInitModule", "cudaLaunchKernel", "cudaLaunchKernelExC",
    "cudaLaunchCooperativeKernel", "cudaGetLastError", "cudaPeekAtLastError", "cudaGetErrorString",
    "cudaGetErrorName", "cudaGetDevice", "cudaGetDeviceCount", "cudaDeviceGetAttribute", "cudaGetDeviceProperties",
    "cudaGetDeviceProperties_v2", "cudaFuncSetAttribute", "cudaFuncGetAttributes",
    "cudaOccupancyMaxActiveBlocksPerMultiprocessor", "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
    "cudaOccupancyMaxPotentialBlockSize", "cudaStreamIsCapturing", "cudaStreamGetCaptureInfo",
    "cudaMemcpyAsync", "cudaMemsetAsync", "cudaMemcpy2DAsync", "cudaMemcpyToSymbolAsync",
    "cudaMemcpyFromSymbolAsync", "cudaStreamSynchronize", "cudaDeviceSynchronize",
    # cuBLASLt: the matrix product's functions, as the screen allows them
    *(n for n in CUBLAS_ALLOWED if n != "cublasLt"),
    # CUTLASS's host code (kernels/_cutlass.py): the driver's two TMA descriptor encoders, called by name (CUTLASS
    # built with CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL; never cudaGetDriverEntryPoint, which reaches any driver
    # function): they fill a 128-byte struct in host memory from the arguments, nothing else
    "cuTensorMapEncodeTiled", "cuTensorMapEncodeIm2col",
    # ... its error and trace messages, written to std::cout/std::cerr (as printf writes to stdout): the two streams
    # and the inserters its messages use; no file or string stream can be made with these (their constructors are
    # not here)
    "_ZSt4cout", "_ZSt4cerr", "_ZNSo3putEc", "_ZNSo5flushEv", "_ZNSolsEi", "_ZNSo9_M_insertImEERSoT_",
    "_ZNSo9_M_insertIPKvEERSoT_", "_ZSt16__ostream_insertIcSt11char_traitsIcEERSt13basic_ostreamIT_T0_ES6_PKS3_l",
    "_ZNKSt5ctypeIcE13_M_widen_initEv",
    # ... and gcc's 128-bit integer division (libgcc), for its index arithmetic
    "__udivti3", "__umodti3", "__divti3", "__modti3",
})
# OpenMP's runtime (libgomp): parallel regions, loops, barriers, tasks, reductions; never offloading to a device
# (GOMP_target*, which loads plugins), GOMP_error (exits the process), nor the omp_set_*/omp_pause_* calls that
# change the runtime for the code that runs after the kernel.
_GOMP = re.compile(r"^GOMP_(?!target|offload|error)\w+$|^__kmpc_(?!.*target|.*offload)\w+$")
_CXX_RUNTIME = re.compile(r"^__cxa_\w+$|^_ZSt\d+__throw_\w+$")

# Shared libraries a kernel may need: the C library, libm (+ libmvec), OpenMP, the C++ runtime, the dynamic loader,
# the shared CUDA runtime and cuBLASLt; before glibc 2.34 libdl/libpthread/librt held what libc now holds.
_NEEDED = re.compile(r"^(?:libc|libm|libmvec|libgomp|libomp|libiomp5|libstdc\+\+|libgcc_s|libdl|libpthread|librt|"
                     r"ld-linux-x86-64|ld-linux-aarch64|libcudart|libcublasLt)\.so(?:\.\d+)*$"
                     r"|^libcuda\.so\.1$")   # NB: the driver, for CUTLASS's two TMA encoders (IMPORTS)

# Raw system calls in executable code, by architecture (ELF e_machine)
_X86_64, _AARCH64 = 62, 183
_SYSCALL_INSNS = {_X86_64: ("syscall", "sysenter"), _AARCH64: ("svc",)}


class BinaryCheckUnavailable(RuntimeError):
    """The check cannot run here (objdump missing, an architecture it does not know): nothing is loaded."""


@dataclass(frozen=True)
class BinaryFinding:
    """One reason a built library is refused."""

    rule: str        # "import", "library", "syscall", "memory"
    message: str

    def __str__(self) -> str:
        return self.message


def allowed_import(name: str) -> bool:
    """Whether a kernel library may import the dynamic symbol ``name``."""
    return name in IMPORTS or bool(_MATH_NAME.match(name) or _GOMP.match(name) or _CXX_RUNTIME.match(name))


# ----------------------------------------------------------------------------- ELF


class NotAnElf(ValueError):
    pass


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    entsize: int


@dataclass(frozen=True)
class ElfInfo:
    """What the wall reads of a shared library."""

    machine: int
    imports: tuple[str, ...]         # undefined dynamic symbols
    needed: tuple[str, ...]          # DT_NEEDED
    text_relocations: bool
    writable_code: bool              # a PT_LOAD both writable and executable
    executable_stack: bool
    executable_sections: tuple[str, ...]
    code: tuple[tuple[int, int], ...] = ()   # (file offset, size) of every executable section held in the file


_SHT_DYNSYM, _SHT_DYNAMIC = 11, 6
_SHF_EXECINSTR = 0x4
_PT_LOAD, _PT_DYNAMIC, _PT_GNU_STACK = 1, 2, 0x6474E551
_PF_X, _PF_W = 1, 2
_DT_NEEDED, _DT_TEXTREL, _DT_FLAGS, _DF_TEXTREL = 1, 22, 30, 0x4


def read_elf(data: bytes) -> ElfInfo:
    """Parse a 64-bit little-endian ELF shared library. Raises NotAnElf for anything else or a malformed file."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise NotAnElf("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise NotAnElf("not a 64-bit little-endian ELF file")
    try:
        return _read_elf(data)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise NotAnElf(f"malformed ELF file ({exc})") from None


def _cstr(data: bytes, table: _Section, offset: int) -> str:
    if offset >= table.size:
        raise NotAnElf("a name points outside its string table")
    start = table.offset + offset
    end = data.index(b"\0", start, table.offset + table.size)
    return data[start:end].decode("ascii", "replace")


def _read_elf(data: bytes) -> ElfInfo:
    (e_type, machine, _v, _entry, phoff, shoff, _flags, _ehsize, phentsize, phnum, shentsize, shnum,
     shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", data, 16)
    if e_type != 3:
        raise NotAnElf("not a shared library (ELF type ET_DYN)")
    if shentsize != 64 or phentsize != 56 or shnum == 0:
        raise NotAnElf("unexpected header sizes")
    if shoff + shnum * 64 > len(data) or phoff + phnum * 56 > len(data):
        raise NotAnElf("headers point past the end of the file")
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * 64) for i in range(shnum)]
    for s in raw:
        if s[1] != 8 and s[4] + s[5] > len(data):   # SHT_NOBITS takes no room in the file
            raise NotAnElf("a section points past the end of the file")
    names = raw[shstrndx] if shstrndx < shnum else None
    sections = []
    for name, typ, flags, _addr, offset, size, link, _info, _align, entsize in raw:
        label = _cstr(data, _Section("", 0, 0, names[4], names[5], 0, 0), name) if names is not None else ""
        sections.append(_Section(label, typ, flags, offset, size, link, entsize))
    imports: list[str] = []
    needed: list[str] = []
    textrel = False
    for sec in sections:
        if sec.type == _SHT_DYNSYM:
            strtab = sections[sec.link]
            for off in range(sec.offset + 24, sec.offset + sec.size, 24):   # entry 0 is the null symbol
                st_name, _info, _other, st_shndx = struct.unpack_from("<IBBH", data, off)
                if st_shndx == 0 and st_name:
                    imports.append(_cstr(data, strtab, st_name))
        elif sec.type == _SHT_DYNAMIC:
            strtab = sections[sec.link]
            for off in range(sec.offset, sec.offset + sec.size, 16):
                tag, value = struct.unpack_from("<qQ", data, off)
                if tag == 0:
                    break
                if tag == _DT_NEEDED:
                    needed.append(_cstr(data, strtab, value))
                elif tag == _DT_TEXTREL or (tag == _DT_FLAGS and value & _DF_TEXTREL):
                    textrel = True
    writable_code = exec_stack = False
    has_dynamic_segment = False
    for i in range(phnum):
        p_type, p_flags = struct.unpack_from("<II", data, phoff + i * 56)
        if p_type == _PT_LOAD and p_flags & _PF_X and p_flags & _PF_W:
            writable_code = True
        elif p_type == _PT_GNU_STACK and p_flags & _PF_X:
            exec_stack = True
        has_dynamic_segment |= p_type == _PT_DYNAMIC
    if has_dynamic_segment and not any(s.type == _SHT_DYNAMIC for s in sections):
        # NB: the loader reads the dynamic segment, not the section table: a library that hides its .dynamic
        # section from the table could need libraries this parser never saw
        raise NotAnElf("the library has a dynamic segment but no .dynamic section")
    executable = tuple(s.name for s in sections if s.flags & _SHF_EXECINSTR and s.size)
    code = tuple((s.offset, s.size) for s in sections if s.flags & _SHF_EXECINSTR and s.size and s.type != 8)
    return ElfInfo(machine, tuple(imports), tuple(needed), textrel, writable_code, exec_stack, executable, code)


# ----------------------------------------------------------------------------- the check


def check_library(data: bytes) -> tuple[BinaryFinding, ...]:
    """Every reason to refuse the shared library ``data`` (empty when it may be loaded).

    Raises BinaryCheckUnavailable when the check cannot be made here (no objdump, an unknown architecture)."""
    try:
        info = read_elf(data)
    except NotAnElf as exc:
        return (BinaryFinding("library", f"the library cannot be read as an ELF shared library: {exc}"),)
    found: list[BinaryFinding] = []
    bad = sorted({n for n in info.imports if not allowed_import(n)})
    if bad:
        hint = ""
        if "dlopen" in bad and not any(n.startswith("libcudart") for n in info.needed) and \
                b"__cudaRegisterFatBinary" in data:
            hint = (" (it links the CUDA runtime statically: a kernel built before kforge linked it shared; build it "
                    "again from its source)")
        if "dlopen" in bad and b"nvtx" in data.lower():
            hint = (" (NVTX, which cub/cub.cuh brings in, loads a library named by an environment variable: include "
                    "the block-level cub headers, or #define CCCL_DISABLE_NVTX before including cub)")
        shown = ", ".join(f"`{n}`" for n in bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        found.append(BinaryFinding("import", f"the library imports {shown}, outside what a kernel may call (math, "
                                   "memory, printf, clocks, OpenMP's loops, the CUDA runtime's launch path, "
                                   "cuBLASLt's matmul, CUTLASS's TMA descriptors and messages; docs/security.md lists "
                                   f"them){hint}"))
    for lib in info.needed:
        if not _NEEDED.match(lib):
            found.append(BinaryFinding("library", f"the library needs `{lib}`: a kernel may link only the C, math, "
                                       "OpenMP, C++ and CUDA runtimes, cuBLASLt and the CUDA driver"))
    if info.writable_code:
        found.append(BinaryFinding("memory", "the library maps memory both writable and executable"))
    if info.executable_stack:
        found.append(BinaryFinding("memory", "the library asks for an executable stack"))
    if info.text_relocations:
        found.append(BinaryFinding("memory", "the library has text relocations (its code is written when it loads)"))
    found += _syscall_findings(data, info)
    return tuple(found)


_INSN = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)(?:\s+(\S+))?", re.M)
_X86_SYSCALL_BYTES = re.compile(rb"\x0f\x05|\x0f\x34|\xcd\x80", re.S)


def _syscall_bytes(data: bytes, info: ElfInfo) -> bool:
    """Whether the bytes of a system-call instruction occur anywhere in the executable sections, at any offset (x86-64)
    or word (AArch64 ``svc``). NB: a superset of what the disassembly finds: without such bytes there is nothing for
    objdump to name, and most kernels skip it (~10 ms of the check)."""
    for offset, size in info.code:
        chunk = data[offset:offset + size]
        if info.machine == _X86_64 and _X86_SYSCALL_BYTES.search(chunk):
            return True
        if info.machine == _AARCH64 and any((w & 0xFFE0001F) == 0xD4000001 for (w,) in struct.iter_unpack(
                "<I", chunk[:len(chunk) // 4 * 4])):
            return True
    return not info.code   # NB: executable sections but none held in the file: let the disassembly decide


def _syscall_findings(data: bytes, info: ElfInfo) -> list[BinaryFinding]:
    if info.machine not in _SYSCALL_INSNS:
        raise BinaryCheckUnavailable(f"kforge checks kernel libraries for x86-64 and AArch64 only (this one is for ELF "
                                     f"machine {info.machine})")
    if not info.executable_sections or not _syscall_bytes(data, info):
        return []
    objdump = shutil.which("objdump")
    if objdump is None:
        raise BinaryCheckUnavailable("objdump (binutils) is needed to check a kernel library's machine code before "
                                     "it loads, and was not found: install binutils")
    # NB: a private copy, so that what is disassembled is the bytes that were hashed and parsed
    with tempfile.TemporaryDirectory(prefix="kforge-check-") as tmp:
        copy = Path(tmp) / "kernel.so"
        copy.write_bytes(data)
        proc = subprocess.run([objdump, "-d", "-w", "--no-show-raw-insn", str(copy)],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace", timeout=120,
                              env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"})
    if proc.returncode != 0:
        raise BinaryCheckUnavailable(f"objdump could not disassemble the library: {proc.stderr.strip()[-300:]}")
    wanted = _SYSCALL_INSNS[info.machine]
    hits: list[str] = []
    for m in _INSN.finditer(proc.stdout):
        insn, operand = m.group(2), m.group(3) or ""
        if insn in wanted or (info.machine == _X86_64 and insn == "int" and operand == "$0x80"):
            hits.append(f"`{insn}{' ' + operand if insn == 'int' else ''}` at 0x{m.group(1)}")
    if not hits:
        return []
    more = f" and {len(hits) - 3} more" if len(hits) > 3 else ""
    return [BinaryFinding("syscall", f"the library's code makes raw system calls ({', '.join(hits[:3])}{more}): a "
                          "kernel reaches the system only through the functions it may import")]
