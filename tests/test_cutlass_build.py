"""CUTLASS sources through the judge's path (issue 45): the screen admits CUTLASS's and CuTe's headers and nothing
more, the compile command and limits change for such a source only, the binary wall admits what CUTLASS's host code
imports and nothing more, and a rendered vendor chain builds with nvcc through ``compile_source``, cached by content
(where nvcc and the CUTLASS headers are here)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kforge.kernels import SourceRejected, cache_dir, compile_source, find_nvcc, screen
from kforge.kernels._binary import check_library, read_elf
from kforge.kernels._compile import TOOL_LIMITS, _command, compile_limits, compile_timeout
from kforge.kernels._cutlass import CUTLASS_ADDRESS_SPACE, CUTLASS_TIMEOUT_S, cutlass_root, target_arch, uses_cutlass
from kforge.proposers.builtin._vendor_cuda import CutlassConfig, build_cutlass, render_cuda

from kernel_files import kernel_source
from test_vendor_chains import _bf16_chains

# NB: test_vendor_chains builds the same two sources with this configuration: one session builds each once
CONFIG = CutlassConfig((128, 128, 64), (1, 2), 0, 1, "heuristic", "cooperative")
needs_cutlass = pytest.mark.skipif(find_nvcc() is None or cutlass_root() is None,
                                   reason='needs nvcc and the CUTLASS headers: pip install "kforge[cutlass]"')
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("gcc") is None, reason="needs gcc and g++")


def _sources() -> dict[str, str]:
    lin, conv, rows, _ = _bf16_chains()
    return {"evt": render_cuda(lin, CONFIG), "conv": render_cuda(conv, CONFIG), "gemm_then_rows": render_cuda(rows, CONFIG)}


# ----------------------------------------------------------------------------- the screen


def test_the_screen_admits_every_cutlass_design():
    for which, source in _sources().items():
        assert screen(source, "cuda") == (), which
        assert uses_cutlass(source) and target_arch(source, "sm_90") == "sm_90a"


@pytest.mark.parametrize("header", [
    '"cutlass/../../../etc/passwd"', '"cutlass/util/../../../../etc/shadow.h"', '"cute/./tensor.hpp"',
    '"cutlass//etc/passwd.h"', '"/etc/passwd"', '"cutlass/gemm/notes.txt"', '<cutlass/cutlass.h>',
    '"cutlass\\\\cutlass.h"', '"cute/tensor.hpp "', '"cutlass"',
])
def test_an_include_that_leaves_the_cutlass_tree_is_refused(header):
    source = f'#include "cutlass/cutlass.h"\n#include {header}\n'
    findings = screen(source, "cuda")
    assert [f.line for f in findings] == [2], findings
    with pytest.raises(SourceRejected, match="line 2"):
        compile_source(source, "cuda", "sm_90")


@pytest.mark.parametrize("attack, rule", [
    ('const char* home = getenv("HOME");', "forbidden-call"),
    ('asm volatile("syscall");', "inline-asm"),
    ("void* p = cudaGetDriverEntryPoint;", "forbidden-call"),    # any driver function, which CUTLASS must not use
    ("#define KF_NAME(a, b) a##b", "macro"),
    ('#include "cutlass/../kforge_secret.h"', "include"),
])
def test_a_cutlass_source_is_screened_as_any_other(attack, rule):
    source = _sources()["evt"].replace("using namespace cute;", f"using namespace cute;\n{attack}", 1)
    assert any(f.rule == rule for f in screen(source, "cuda"))
    with pytest.raises(SourceRejected):
        compile_source(source, "cuda", "sm_90")


# ----------------------------------------------------------------------------- the command and the limits


def test_only_a_cutlass_source_gets_sm_90a_and_a_cutlass_builds_limits():
    plain = kernel_source("cuda", "softmax_rows")
    cutlass = _sources()["evt"]
    assert target_arch(plain, "sm_90") == "sm_90"
    assert target_arch(cutlass, "sm_80") == "sm_80" and target_arch(cutlass, "sm_90a") == "sm_90a"
    assert target_arch("/* #include \"cute/tensor.hpp\" */\n", "sm_90") == "sm_90"
    assert compile_timeout(plain, "cuda") == 120.0 and compile_limits(plain, "cuda") == TOOL_LIMITS["cuda"]
    assert compile_timeout(cutlass, "cuda") == CUTLASS_TIMEOUT_S
    limits = compile_limits(cutlass, "cuda")
    assert limits.address_space_bytes == CUTLASS_ADDRESS_SPACE and limits.cpu_s == CUTLASS_TIMEOUT_S
    assert compile_limits(cutlass, "cuda", 30.0).cpu_s == 30.0


@needs_cutlass
def test_the_cutlass_command_adds_its_headers_target_and_flags_and_a_plain_one_does_not(tmp_path):
    root = cutlass_root()
    (tmp_path / "plain.cu").write_text(kernel_source("cuda", "softmax_rows"))
    (tmp_path / "cutlass.cu").write_text(_sources()["evt"])
    plain, plain_read = _command("cuda", "sm_90", tmp_path / "plain.cu", tmp_path / "plain.so")
    cmd, read = _command("cuda", "sm_90a", tmp_path / "cutlass.cu", tmp_path / "cutlass.so")
    assert "-arch=sm_90" in plain and not any(str(root) in c or "relaxed" in c or "CUTLASS" in c for c in plain) and plain_read == ()
    assert "-gencode=arch=compute_90a,code=sm_90a" in cmd and "--expt-relaxed-constexpr" in cmd
    assert "-DCUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL=1" in cmd
    assert f"-I{root / 'include'}" in cmd and f"-I{root / 'tools' / 'util' / 'include'}" in cmd
    assert root in read and "-cudart" in cmd


# ----------------------------------------------------------------------------- the binary wall


def _library(tmp_path: Path, name: str, code: str, *link: str, cxx: bool = False) -> bytes:
    src = tmp_path / f"{name}.{'cc' if cxx else 'c'}"
    src.write_text(code)
    out = tmp_path / f"{name}.so"
    subprocess.run(["g++" if cxx else "gcc", "-shared", "-fPIC", "-O1", "-o", str(out), str(src), *link], check=True)
    return out.read_bytes()


def _driver_stub(tmp_path: Path, soname: str) -> Path:
    out = tmp_path / soname
    src = tmp_path / f"{soname}.c"
    src.write_text("int cuTensorMapEncodeTiled(void) { return 0; }\nint cuMemAlloc_v2(void) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src), f"-Wl,-soname,{soname}"], check=True)
    return out


_CALLS = "extern int {0}(void);\nint kf_call_{0}(void) {{ return {0}(); }}\n"


@needs_gxx
def test_the_wall_admits_cutlass_host_imports_and_nothing_beside_them(tmp_path):
    # what CUTLASS's host code imports: the two TMA encoders by name, its messages to std::cout and std::cerr
    cutlass_like = ('#include <iostream>\nextern "C" int cuTensorMapEncodeTiled(void);\n'
                    'extern "C" int cuTensorMapEncodeIm2col(void);\n'
                    'extern "C" int kf_host(int n, const void* p) {\n'
                    '  if (n < 0) std::cerr << "CUTLASS: " << n << " " << p << std::endl;\n'
                    '  std::cout << (unsigned long)n << std::flush;\n'
                    '  return cuTensorMapEncodeTiled() + cuTensorMapEncodeIm2col(); }\n')
    stub = _driver_stub(tmp_path, "libcuda.so.1")
    data = _library(tmp_path, "cutlass_like", cutlass_like, "-Wl,--no-as-needed", str(stub), cxx=True)
    assert "libcuda.so.1" in read_elf(data).needed
    assert check_library(data) == ()
    # the driver's other functions: a generic lookup, an allocation, a launch around the runtime
    for name in ("cuGetProcAddress_v2", "cuMemAlloc_v2", "cuLaunchKernel", "cudaGetDriverEntryPointByVersion"):
        found = check_library(_library(tmp_path, name, _CALLS.format(name)))
        assert [f.rule for f in found] == ["import"] and name in str(found[0])
    # a file stream: the std::ostream inserters are admitted, nothing that opens a file
    files = _library(tmp_path, "ofstream", '#include <fstream>\nextern "C" void kf_f(int n) '
                     '{ std::ofstream f("/tmp/kforge_attack_ofstream.txt"); f << n; }\n', cxx=True)
    assert any(f.rule == "import" and "ofstream" in str(f) for f in check_library(files))
    # another NVIDIA library than the driver by its soname
    other = _driver_stub(tmp_path, "libnvidia-ml.so.1")
    data = _library(tmp_path, "nvml", _CALLS.format("cuTensorMapEncodeTiled"), "-Wl,--no-as-needed", str(other))
    assert [f.rule for f in check_library(data)] == ["library"]


def test_the_wall_admits_iostreams_initialiser_of_every_libstdcxx_and_no_stream_that_opens_a_file():
    from kforge.kernels._binary import allowed_import

    # <iostream> in a CUTLASS header: gcc 12 imports the static ios_base::Init's constructor and destructor,
    # gcc 13 and later one initialiser; both set up std::cout and std::cerr, nothing else
    for name in ("_ZNSt8ios_base4InitC1Ev", "_ZNSt8ios_base4InitD1Ev", "_ZSt21ios_base_library_initv"):
        assert allowed_import(name), name
    for name in ("_ZNSt14basic_ofstreamIcSt11char_traitsIcEEC1EPKcSt13_Ios_Openmode",
                 "_ZNSt13basic_filebufIcSt11char_traitsIcEE4openEPKcSt13_Ios_Openmode", "_ZSt3cin"):
        assert not allowed_import(name), name


# ----------------------------------------------------------------------------- built through the judge's path


@needs_cutlass
@pytest.mark.slow
@pytest.mark.parametrize("which", ["evt", "conv"])
def test_a_rendered_chain_builds_through_the_judges_path_and_passes_the_wall(which):
    source = _sources()[which]
    built = compile_source(source, "cuda", "sm_90")   # NB: the device's arch, as the judge passes it
    data = built.path.read_bytes()
    assert check_library(data) == ()
    info = read_elf(data)
    assert "cuTensorMapEncodeTiled" in info.imports
    assert ("cuTensorMapEncodeIm2col" in info.imports) == (which == "conv")
    assert not any(n.startswith("cudaGetDriverEntryPoint") for n in info.imports)
    assert any((cache_dir() / "index").glob("cuda-sm_90a-*.json"))   # built for sm_90a, not the device's sm_90
    print(f"\n{which}: {'cached' if built.cached else f'built in {built.seconds:.0f} s'} ({len(data)} bytes)")
    again = compile_source(source, "cuda", "sm_90")
    assert again.cached and again.seconds == 0.0 and again.sha256 == built.sha256
    # one path: the benchmark's build is the judge's cache entry
    bench = build_cutlass(source)
    assert bench.cached and bench.sha256 == built.sha256 and bench.wall == ()
