"""The build wall: the compiler's jail, file-naming directives, and the allow-list on the built library.

With the source screen off (KFORGE_SCREEN=binary, honoured only under pytest) the attacks reach the compiler and the
binary wall: each is refused before anything loads it, by the runner's path (compile_source) and in the user's
process (load_verified, kforge.load of an artifact whose binary was swapped). Every built-in kernel passes.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import kforge
from attacks import FAKE_KEY
from kernel_files import kernel_source
from kforge.kernels import (BinaryRejected, CacheTamperedWarning, CompileError, ToolLimits, compile_source, find_nvcc,
                            load_verified)
from kforge.kernels._binary import check_library, read_elf
from kforge.kernels._compile import run_tool, safe_log, tool_env
from kforge.proposers.builtin import strategies_for
from test_builtin_strategies import CPU, _cuda_cases, small_variants

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed")
needs_objdump = pytest.mark.skipif(shutil.which("objdump") is None, reason="binutils' objdump is not installed")


def _landlock_abi() -> int:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return int(libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))


needs_landlock = pytest.mark.skipif(_landlock_abi() < 1, reason="this kernel has no Landlock")


@pytest.fixture
def wall_only(tmp_path, monkeypatch):
    """A cache of the test's own, a fake API key in the environment, the source screen off, the binary wall on."""
    monkeypatch.setenv("KFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
    monkeypatch.setenv("KFORGE_SCREEN", "binary")
    return tmp_path


def _objects(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "kernels" / "objects").glob("*.so"))


# ----------------------------------------------------------------------------- refused before loading


# attack -> a name the refusal must give (an import, or the instruction)
REFUSED = {
    "attack_libc_alias": "__open",        # and __read, __socket, __connect, __write, __fork
    "attack_fork_survive": "fork",
    "attack_python_api": "dlsym",
    "attack_env_leak": "getenv",
    "attack_inline_asm": "syscall",       # a raw system call written in inline assembly
}


@needs_objdump
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_forbidden_imports_and_raw_syscalls_are_refused_before_loading(wall_only, name):
    with pytest.raises(BinaryRejected) as info:
        compile_source(kernel_source("cpu", name), "cpu", "native")
    assert f"`{REFUSED[name]}" in str(info.value) + info.value.log
    assert _objects(wall_only) == []      # never cached, so never loaded from the cache either


@pytest.mark.parametrize("name", ["attack_include_file", "attack_incbin"])
def test_a_directive_naming_a_file_fails_to_compile_and_its_lines_stay_out_of_the_log(wall_only, name):
    with pytest.raises(CompileError) as info:
        compile_source(kernel_source("cpu", name), "cpu", "native")
    assert not isinstance(info.value, BinaryRejected)
    lines = [line for line in Path("/etc/passwd").read_text().splitlines() if line.strip()]
    assert lines and not any(line in info.value.log for line in lines), info.value.log


def test_the_kept_log_drops_messages_located_in_other_files():
    log = ('In file included from kernel.c:3:\n'
           '/home/user/.secrets:1:5: error: unknown type name \'token\'\n'
           '    1 | token=abc123\n'
           '      |     ^~~~~\n'
           'kernel.c:9:3: error: expected \';\' before \'}\' token\n'
           '    9 |   y = 1\n'
           '      |        ^\n'
           '/etc/passwd(1): error: identifier "root" is undefined\n'
           '    root:x:0:0:root:/root:/bin/bash\n'
           '    ^\n'
           '\n'
           '1 error detected in the compilation of "kernel.cu".\n')
    kept = safe_log(log, "kernel.c")
    assert "abc123" not in kept and "root:x" not in kept and "token" not in kept.split("kernel.c:9")[0]
    assert "kernel.c:9:3: error: expected ';'" in kept and "y = 1" in kept
    assert kept.count("was left out") == 2 and "1 error detected" in kept


def _swapped_library(tmp_path: Path, marker: Path) -> Path:
    """A library built outside kforge (no screen, no wall) that would make ``marker`` as it loads and reach files
    through libc's aliases."""
    src = tmp_path / "evil.c"
    src.write_text('extern int __open(const char*, int, ...);\n'
                   'extern int __close(int);\n'
                   f'__attribute__((constructor)) static void at_load(void) {{ int fd = __open("{marker}", 0101, 0600);'
                   ' if (fd >= 0) __close(fd); }\n'
                   'int kf_launch(void* a, int b, void* c, int d, void* e, int f, void* g, void* h) { return 0; }\n')
    out = tmp_path / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(out), str(src)], check=True)
    return out


@needs_objdump
def test_a_swapped_binary_is_refused_in_the_users_process(wall_only):
    marker = wall_only / "loaded_marker"
    evil = _swapped_library(wall_only, marker)
    sha = hashlib.sha256(evil.read_bytes()).hexdigest()
    with pytest.raises(BinaryRejected, match="__open"):
        load_verified(evil, sha)
    assert not marker.exists()


@needs_objdump
def test_kforge_load_refuses_an_artifact_whose_binary_and_checksums_were_swapped(wall_only):
    from test_deploy import _winner_session

    s, model, _card = _winner_session(wall_only)
    path = s.export(wall_only / "artifact")
    s.close()
    marker = wall_only / "loaded_marker"
    evil = _swapped_library(wall_only, marker)
    mf = path / "manifest.json"
    manifest = json.loads(mf.read_text())
    (entry,) = manifest["kernels"]
    shutil.copyfile(evil, path / "kernels" / entry["binary"])
    entry["binary_sha256"] = hashlib.sha256(evil.read_bytes()).hexdigest()
    mf.write_text(json.dumps(manifest))
    original = torch.Tensor.softmax
    with pytest.raises(BinaryRejected, match="__open"):
        kforge.load(model, path, device="cpu")
    assert not marker.exists() and torch.Tensor.softmax is original


@needs_objdump
def test_a_tampered_cache_entry_does_not_skip_the_wall(wall_only):
    source = kernel_source("cpu", "softmax_rows")
    honest = compile_source(source, "cpu", "native")
    marker = wall_only / "loaded_marker"
    evil = _swapped_library(wall_only, marker).read_bytes()
    sha = hashlib.sha256(evil).hexdigest()
    objects = honest.path.parent
    (objects / f"{sha}.so").write_bytes(evil)       # a well-named object, and the index pointed at it
    (entry,) = (objects.parent / "index").glob("*.json")
    record = json.loads(entry.read_text())
    entry.write_text(json.dumps({**record, "sha256": sha}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = compile_source(source, "cpu", "native")
    assert again.sha256 == honest.sha256 and not again.cached
    assert any(issubclass(w.category, CacheTamperedWarning) and "binary wall" in str(w.message) for w in caught)
    assert not marker.exists()


# ----------------------------------------------------------------------------- honest kernels pass


@needs_objdump
def test_every_builtin_cpu_strategy_passes_the_wall():
    """One kernel of every CPU strategy that applies to the small shapes (from the registry), checked on its bytes."""
    cases: dict[str, str] = {}
    for dtype in (torch.float32, torch.bfloat16):
        for v in small_variants(dtype):
            for s in strategies_for(v.op, "cpu"):
                if s.applies(v, CPU):
                    cases.setdefault(s.name, s.render(v, s.default(v, CPU), CPU))
    assert len(cases) >= 30
    for name, source in cases.items():
        built = compile_source(source, "cpu", "native")
        assert check_library(built.path.read_bytes()) == (), name


@needs_nvcc
@needs_objdump
def test_builtin_cuda_kernels_built_with_nvcc_pass_the_wall():
    """One source of every CUDA strategy (cuBLASLt's where its headers are here), built with nvcc: the shared CUDA
    runtime's launch path and nothing that the static runtime would have brought."""
    from kforge.kernels._compile import cublaslt_paths, uses_cublaslt

    first: dict[str, str] = {}
    for _label, name, source in _cuda_cases():
        first.setdefault(name, source)
    sources = [s for s in first.values() if cublaslt_paths() is not None or not uses_cublaslt(s)]

    def check(source: str) -> tuple[str, ...]:
        built = compile_source(source, "cuda", "sm_90")
        info = read_elf(built.path.read_bytes())
        assert any(n.startswith("libcudart.so") for n in info.needed), info.needed
        return tuple(str(f) for f in check_library(built.path.read_bytes()))

    with ThreadPoolExecutor(2) as pool:
        found = list(pool.map(check, sources))
    assert all(f == () for f in found), [f for f in found if f][:3]


_SYSCALL_BYTES_IN_AN_IMMEDIATE = """#include "kforge.h"
KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    volatile int k = 0x050f;   /* the bytes of `syscall` (0f 05), inside a mov's immediate */
    ((float*)out[0].data)[0] = (float)k;
    return 0;
}
"""


@needs_objdump
def test_system_call_bytes_are_disassembled_and_refused_only_as_instructions(wall_only, monkeypatch):
    """The bytes of a system-call instruction anywhere in the code send the library to objdump, which names only real
    instructions; a library without such bytes is checked without it (no binutils needed for it)."""
    from kforge.kernels import _binary

    monkeypatch.setenv("KFORGE_SCREEN", "off")
    hidden = compile_source(_SYSCALL_BYTES_IN_AN_IMMEDIATE, "cpu", "native").path.read_bytes()
    raw = compile_source(kernel_source("cpu", "attack_inline_asm"), "cpu", "native").path.read_bytes()
    honest = compile_source(kernel_source("cpu", "softmax_rows"), "cpu", "native").path.read_bytes()
    assert b"\x0f\x05" in hidden
    assert check_library(hidden) == ()
    assert [f.rule for f in check_library(raw)] == ["syscall"]
    monkeypatch.setattr(_binary.shutil, "which", lambda name: None)
    assert check_library(honest) == ()
    with pytest.raises(_binary.BinaryCheckUnavailable, match="install binutils"):
        check_library(raw)


@needs_objdump
def test_the_elf_reader_agrees_with_binutils():
    built = compile_source(kernel_source("cpu", "group_norm"), "cpu", "native")
    nm = subprocess.run(["nm", "-D", "--undefined-only", str(built.path)], capture_output=True, text=True, check=True)
    expected = {line.split()[-1].split("@")[0] for line in nm.stdout.splitlines() if line.strip()}
    info = read_elf(built.path.read_bytes())
    assert set(info.imports) == expected
    assert "libgomp.so.1" in info.needed


# ----------------------------------------------------------------------------- the compiler's jail


# NB: both jails: jail.c compiled (what compiles go through) and _jail.py (where jail.c cannot be built)
both_jails = pytest.mark.parametrize("interpreted", [False, True], ids=["compiled", "interpreted"])


def test_the_compiled_jail_is_built_and_sets_the_limits(tmp_path, monkeypatch):
    from kforge.kernels._compile import _compiled_jail

    monkeypatch.setenv("KFORGE_CACHE", str(tmp_path / "cache"))
    assert _compiled_jail() is not None
    for interpreted in (False, True):
        proc = run_tool(["sh", "-c", "ulimit -t; ulimit -v; ulimit -c"], 30, workdir=tmp_path, interpreted=interpreted,
                        limits=ToolLimits(cpu_s=7, address_space_bytes=300 << 20))
        assert proc.returncode == 0 and proc.stdout.split() == ["7", str(300 << 10), "0"], (interpreted, proc.stdout)


@both_jails
def test_the_compilers_environment_holds_no_secrets(tmp_path, monkeypatch, interpreted):
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    monkeypatch.setenv("GITHUB_TOKEN", FAKE_KEY)
    monkeypatch.setenv("KFORGE_TEST_SETTING", FAKE_KEY)
    env = tool_env(tmp_path)
    assert FAKE_KEY not in json.dumps(env) and env["TMPDIR"] == str(tmp_path) == env["HOME"]
    proc = run_tool(["env"], 30, workdir=tmp_path, interpreted=interpreted)       # what the process really gets
    assert proc.returncode == 0 and "PATH=" in proc.stdout and FAKE_KEY not in proc.stdout


@needs_landlock
@both_jails
def test_the_compiler_reads_and_writes_only_where_it_may(tmp_path, interpreted):
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "secret").write_text(FAKE_KEY)
    work = tmp_path / "work"
    work.mkdir()
    proc = run_tool(["sh", "-c", f"cat {outside}/secret; echo x > {outside}/dropped; echo ok > mine; cat mine"], 30,
                    workdir=work, interpreted=interpreted)
    assert FAKE_KEY not in proc.stdout and "ok" in proc.stdout
    assert not (outside / "dropped").exists()
    shutil.rmtree(outside)


# NB: `#if` over a macro that expands to 10^10 tokens: the preprocessor streams them (constant memory), hours of CPU
_CPU_BOMB = "".join(["#define A0 1+1+1+1+1+1+1+1+1+1+\n"] + [f"#define A{i} A{i - 1} A{i - 1} A{i - 1} A{i - 1} A{i - 1} "
                     f"A{i - 1} A{i - 1} A{i - 1} A{i - 1} A{i - 1}\n" for i in range(1, 10)] + ["#if A9 1\n#endif\n"])
# an initialiser of 10^8 elements: the compiler holds them all
_MEMORY_BOMB = "".join(["#define B0 1.f,1.f,1.f,1.f,1.f,1.f,1.f,1.f,1.f,1.f,\n"] + [
    f"#define B{i} B{i - 1} B{i - 1} B{i - 1} B{i - 1} B{i - 1} B{i - 1} B{i - 1} B{i - 1} B{i - 1} B{i - 1}\n"
    for i in range(1, 8)] + ["const float table[] = { B7 };\n"])


def test_a_compile_past_its_cpu_time_fails_as_the_candidates_compile_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KFORGE_CACHE", str(tmp_path))
    with pytest.raises(CompileError, match="CPU-time limit") as info:
        compile_source(kernel_source("cpu", "softmax_rows") + _CPU_BOMB, "cpu", "native", timeout_s=300,
                       limits=ToolLimits(cpu_s=2))
    assert not isinstance(info.value, BinaryRejected)


def test_a_compile_past_its_address_space_fails_as_the_candidates_compile_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KFORGE_CACHE", str(tmp_path))
    with pytest.raises(CompileError, match="address-space limit"):
        compile_source(kernel_source("cpu", "softmax_rows") + _MEMORY_BOMB, "cpu", "native", timeout_s=300,
                       limits=ToolLimits(cpu_s=240, address_space_bytes=256 << 20))
