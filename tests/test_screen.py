"""The static screen: every built-in and honest kernel passes, every forbidden construct is refused
with a line and a reason, and a refused source never reaches the compiler."""
from __future__ import annotations

import re
import pytest
import torch

from kforge.kernels import SourceRejected, compile_source, screen
from kforge.kernels._screen import screen_disabled
from kforge.proposers.builtin import all_strategies
from attacks import attack_files, attack_table
from kernel_files import KERNELS
from test_builtin_strategies import CPU, H200, SEEDS, small_variants

ENTRY = ('#include "kforge.h"\n{pre}\nKF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, '
         'int n_out, const double* p, int np, void* ws, void* s) {{\n{body}\n  return 0;\n}}\n')


def kernel(body: str = "", pre: str = "") -> str:
    return ENTRY.format(pre=pre, body=body)


def rules(source: str, backend: str = "cpu") -> set[str]:
    return {f.rule for f in screen(source, backend)}


def test_every_builtin_strategy_source_passes():
    """Each strategy's renders for the seed shapes and the small odd shapes, on both backends."""
    variants = small_variants(torch.float32) + small_variants(torch.bfloat16) + [f() for f in SEEDS.values()]
    checked = 0
    for strategy in all_strategies():
        for device in (H200, CPU):
            for v in variants:
                if not strategy.applies(v, device):
                    continue
                for i, config in enumerate(strategy.configs(v, device)):
                    if i >= 3:
                        break
                    found = screen(strategy.render(v, config, device), device.backend)
                    assert not found, f"{strategy.name} on {v.signature}: {found}"
                    checked += 1
    assert checked > 500


@pytest.mark.parametrize("path", sorted(p for p in KERNELS.glob("*/*") if not p.stem.startswith("attack_")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_honest_and_fault_corpus_passes(path):
    """The fault corpus must reach the evaluator: the screen is not where those are caught."""
    assert screen(path.read_text(), path.parent.name) == ()


ATTACKS = attack_files("cpu") + attack_files("cuda")


def test_the_attack_tables_cover_the_corpus():
    for backend in ("cpu", "cuda"):
        assert {p.stem for p in attack_files(backend)} == set(attack_table(backend))


@pytest.mark.parametrize("path", ATTACKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_attack_corpus_is_screened(path):
    """Each attack is refused for its own reason, and still refused when its includes are deleted
    (a candidate can declare the functions it calls itself)."""
    expected = attack_table(path.parent.name)[path.stem].rule
    source = path.read_text()
    found = rules(source, path.parent.name)
    if expected is None:
        assert found == set(), screen(source, path.parent.name)
        return
    assert expected in found, screen(source, path.parent.name)
    if expected != "include":
        no_includes = re.sub(r"(?m)^\s*#\s*include\s*<[^>]*>\s*$", "", source)
        assert expected in rules(no_includes, path.parent.name)


@pytest.mark.parametrize("source,rule", [
    (kernel("system(\"id\");"), "forbidden-call"),
    (kernel("int (*f)(const char*) = 0; f = popen;"), "forbidden-call"),
    (kernel("", "extern char** environ;"), "forbidden-call"),
    (kernel("PyRun_SimpleString(\"x=1\");"), "forbidden-call"),
    (kernel("long r = SYS_kill + __NR_getppid;"), "forbidden-call"),
    (kernel("omp_set_num_threads(1);"), "forbidden-call"),
    (kernel("#ifdef NEVER_DEFINED\n  kill(0, 9);\n#endif"), "forbidden-call"),        # hidden branch
    (kernel("sys\\\ntem(\"id\");"), "forbidden-call"),                                # line splice
    (kernel("", "#define J(a, b) a##b\n"), "macro"),                                  # token paste
    (kernel("", "%:define J(a, b) a%:%:b\n"), "macro"),                              # digraph paste
    (kernel("int a ??= 1;"), "macro"),                                               # trigraph
    (kernel("int \\u0073ystem = 1;"), "macro"),                                       # UCN in a name
    (kernel("asm(\"nop\");"), "inline-asm"),
    (kernel("__asm__ volatile(\"nop\");"), "inline-asm"),
    (kernel("", "#include <unistd.h>\n"), "include"),
    (kernel("", "#include \"../../etc/passwd\"\n"), "include"),
    (kernel("", "#define H <unistd.h>\n#include H\n"), "include"),
    (kernel("", "#include_next <math.h>\n"), "include"),
    (kernel("", "#include <cub/../../unistd.h>\n"), "include"),
    (kernel("", "#pragma weak kf_launch\n"), "pragma"),
    (kernel("", "#pragma GCC visibility push(default)\n"), "pragma"),
    (kernel("", "#pragma redefine_extname f system\n"), "pragma"),
    (kernel("", "_Pragma(\"weak kf_launch\")\n"), "pragma"),
    (kernel("", "__attribute__((constructor)) static void f(void) {}\n"), "attribute"),
    (kernel("", "static void __attribute__((__destructor__(101))) f(void) {}\n"), "attribute"),
    (kernel("", "__attribute__((section(\".text.evil\"))) int v = 1;\n"), "attribute"),
    (kernel("", "static void* p __attribute__((section(\".init_array\"))) = 0;\n"), "attribute"),
    (kernel("", "void g(void) __attribute__((alias(\"kf_launch\")));\n"), "attribute"),
    (kernel("", "[[gnu::constructor]] static void f() {}\n"), "attribute"),
    # the compiler also splices a backslash with blanks after it, and ends a line at a lone carriage return
    (kernel("sys\\  \ntem(\"id\");"), "line-end"),
    (kernel("sys\\\t\ntem(\"id\");"), "line-end"),
    (kernel("", "__attribute__((con\\ \nstructor)) static void f(void) {}\n"), "line-end"),
    (kernel("int a = 1;\rsystem(\"id\");"), "line-end"),
    # a matrix product of lower precision than eager's float32 (TF32, half or fast accumulation, emulation)
    (kernel("int ct = CUBLAS_COMPUTE_32F_FAST_TF32; (void)ct;"), "precision"),
    (kernel("int ct = CUBLAS_COMPUTE_16F; (void)ct;"), "precision"),
    (kernel("int a = CUBLASLT_MATMUL_DESC_FAST_ACCUM; (void)a;"), "precision"),
    (kernel("int a = CUBLAS_EMULATION_STRATEGY_EAGER; (void)a;"), "precision"),
    (kernel("float t = __float_to_tf32(1.f); (void)t;"), "precision"),
])
def test_forbidden_constructs_are_found(source, rule):
    found = screen(source)
    assert rule in {f.rule for f in found}, found
    assert all(f.line >= 1 and f.message for f in found)


CPP_LOAD_TIME = [
    "struct G { G() { } }; static G g;",
    "struct G { ~G() { } }; G g;",
    "struct G { G(int v) { } }; namespace ns { const G g(3); }",
    "struct G { int v = 4; }; G g;",
    "struct G { G() {} }; struct H { G member; }; static H h;",
    "struct G { G() {} } g;",
    "static int setup() { return 1; } static int v = setup();",
    "static int v = [] { return 1; }();",
    # a library's function (cuBLASLt's, allowed inside kf_launch) in an initialiser, in each form of one
    "static cublasLtHandle_t h; static cublasStatus_t s = cublasLtCreate(&h);",
    "static cublasLtHandle_t h; static cublasStatus_t s(cublasLtCreate(&h));",
    "static cublasLtHandle_t h; static cublasStatus_t s{cublasLtCreate(&h)};",
    "static size_t v = 1 + cublasLtGetVersion();",
    "static float expf2(float x) { return x; } static float expm1f(float x) { return x; } static float v(expm1f(1.f));",
]


@pytest.mark.parametrize("pre", CPP_LOAD_TIME)
def test_cpp_code_that_runs_at_load_is_found(pre):
    found = screen(kernel("", pre), "cuda")
    assert "load-time-code" in {f.rule for f in found}, found


@pytest.mark.parametrize("pre,body", [
    ("struct G { G() {} float v; }; G make(int n); G other();", "G local; (void)local;"),   # locals and prototypes
    ("static const float K = 1.0f / sqrtf(128.0f); __device__ float table[4] = {1, 2, 3, 4};", ""),
    ("struct Acc { float m, s; }; static Acc zero_acc;", ""),            # a trivial type: no code at load
    ("#pragma once\n#include <math.h>\n#include <cuda_fp16.h>\n#include <cooperative_groups.h>\n"
     "#include <cub/block/block_radix_sort.cuh>\n#include <algorithm>", ""),
    ("static int section_len(int wait_count) { int signal_value = wait_count; return signal_value; }",
     "const char* msg = \"system call; fork; asm\"; (void)msg; (void)section_len(1);"),   # look-alikes, strings
    ("/* calls system() and fork(); uses asm */", "// kill(getppid(), 9);"),             # comments
    ("", "#pragma omp parallel for schedule(static)\n  for (int i = 0; i < 4; ++i) {}\n#pragma unroll 4\n"),
    ("#define ROWS 4\n#define AT(r, c) ((r) * ROWS + (c))", "int v = AT(1, 2); (void)v;"),
    ("static float table[2]{1.f, 2.f}; static float buf[4] __attribute__((aligned(16))); enum E { A, B };"
     "static const int n = (int)sizeof(float) * 2;", ""),
    ("#define LONG_MACRO(a) \\\n  ((a) + 1)", "int v = LONG_MACRO(2); (void)v;\r\n"),   # splices, CRLF
])
def test_honest_code_passes(pre, body):
    assert screen(kernel(body, pre), "cuda") == ()


def test_a_refused_source_never_reaches_the_compiler(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/compiler")
    with pytest.raises(SourceRejected) as exc:
        compile_source(kernel("fork();", "#include <unistd.h>"), "cpu", "native")
    assert "refused before compiling" in str(exc.value) and "line 2" in str(exc.value)
    assert "`fork`" in exc.value.log and "unistd.h" in exc.value.log


def test_the_screen_is_bypassed_only_for_kforge_tests(monkeypatch):
    monkeypatch.setenv("KFORGE_SCREEN", "off")
    assert screen_disabled()
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    assert not screen_disabled()


@pytest.fixture(scope="module")
def evaluator():
    from kforge.evaluate import Evaluator

    with Evaluator("cpu", timeout_s=30) as ev:
        yield ev


@pytest.mark.parametrize("name", ["attack_fork_survive", "attack_static_ctor", "attack_inline_asm",
                                  "attack_forbidden_include"])
def test_the_evaluator_refuses_screened_sources(evaluator, name):
    """With the screen on (the default) a refused source gets its own status and the reason, and
    the evaluator goes on with the next candidate."""
    from kforge.capture import Card
    from kforge.evaluate import Status
    from kernel_files import kernel_source

    card = Card.for_call("softmax", torch.randn(32, 256), -1)
    verdict = evaluator.evaluate(card, kernel_source("cpu", name))
    assert verdict.status is Status.REJECTED and "refused before compiling" in verdict.message, verdict.summary()
    assert "line " in verdict.compile_log and verdict.score == 0.0
    assert evaluator.evaluate(card, kernel_source("cpu", "softmax_rows")).status.is_correct


def test_only_a_runner_of_a_cublaslt_candidate_may_read_the_librarys_folder(monkeypatch, tmp_path):
    """KFORGE_RUNNER_LIB_DIRS (the Landlock rule for cuBLASLt's folder) is set for a candidate that includes cuBLASLt
    or names its functions, and for no other."""
    import kforge.kernels._compile as compile_mod
    from kforge.evaluate._runner import runner_env
    from kforge.kernels._compile import uses_cublaslt

    lib = tmp_path / "lib" / "libcublasLt.so.13"
    monkeypatch.setattr(compile_mod, "cublaslt_paths", lambda: (tmp_path / "include", lib))
    assert runner_env(str(tmp_path), cublaslt=True)["KFORGE_RUNNER_LIB_DIRS"] == str(lib.parent)
    assert "KFORGE_RUNNER_LIB_DIRS" not in runner_env(str(tmp_path))
    assert uses_cublaslt("#include <cublasLt.h>\n") and uses_cublaslt("size_t v = cublasLtGetVersion();")
    assert not uses_cublaslt("// #include <cublasLt.h>\nint cublas_like = 0;")
