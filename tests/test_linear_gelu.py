"""A linear layer whose only reader is the tanh GELU: one ``linear_gelu`` card and kernel (the SD3.5 transformer's
feed-forward), found in the graph, judged, placed in the compiled graph; its CUDA design is cuBLASLt's GELU_BIAS
epilogue, screened, built against cuBLASLt where one is installed, and run on a GPU where there is one."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kforge
from kforge.deploy import DeployedKernel
from kforge.kernels import DeviceInfo, Kernel, compile_source, device_info
from kforge.kernels._compile import cublaslt_paths, find_nvcc, uses_cublaslt
from kforge.kernels._screen import screen
from kforge.ops import get_spec
from kforge.proposers.builtin import strategies_for

from fused_checks import captured, judged_and_placed


class _FeedForward(nn.Module):
    """x + out(gelu_tanh(proj(norm(x)))): the SD3.5 transformer's feed-forward in small."""

    def __init__(self, d: int = 32, hidden: int = 64, approximate: str = "tanh"):
        super().__init__()
        self.norm, self.proj, self.out = nn.LayerNorm(d), nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.approximate = approximate

    def forward(self, x):
        return x + self.out(F.gelu(self.proj(self.norm(x)), approximate=self.approximate))


class _Shared(_FeedForward):
    """The product read by the GELU and by something else: nothing to fuse."""

    def forward(self, x):
        h = self.proj(self.norm(x))
        return x + self.out(F.gelu(h, approximate="tanh") + h)


@pytest.fixture(autouse=True)
def _linear_gelu_on_the_cpu(monkeypatch):
    """The finder gives CPU graphs no linear_gelu card by default (no CPU design beats MKL's GEMM); these tests
    check the finder and the placement on the CPU."""
    import kforge.ops.families.linear_gelu._pattern as match

    monkeypatch.setattr(match, "LINEAR_GELU_ON_CPU", True)


def test_a_cpu_graph_gets_no_linear_gelu_card_by_default(tmp_path, monkeypatch):
    import kforge.ops.families.linear_gelu._pattern as match

    monkeypatch.setattr(match, "LINEAR_GELU_ON_CPU", False)
    torch.manual_seed(0)
    s = captured(_FeedForward(), torch.randn(2, 8, 32), tmp_path)
    assert not s.cards.by_op("linear_gelu")
    assert any(c.share > 0 for c in s.cards.by_op("gelu")), "the GELU keeps its own card"
    s.close()


@pytest.fixture
def session(tmp_path):
    torch.manual_seed(0)
    s = captured(_FeedForward(), torch.randn(2, 8, 32), tmp_path)
    yield s
    s.close()


def test_the_graph_capture_finds_the_linear_then_tanh_gelu_as_one_call_that_takes_their_share(session):
    (card,) = session.cards.by_op("linear_gelu")
    assert card.calls == 1 and card.share > 0
    assert [tuple(s.shape) for s in card.variant.inputs] == [(2, 8, 32), (64, 32), (64,)]
    assert tuple(card.variant.outputs[0].shape) == (2, 8, 64)
    # the projection's linear and the GELU are inside it; the output projection's linear is not
    linears = {tuple(c.variant.inputs[0].shape): c for c in session.cards.by_op("linear")}
    assert linears[(2, 8, 32)].share == 0.0 and linears[(2, 8, 64)].share > 0
    assert all(c.share == 0.0 for c in session.cards.by_op("gelu"))


@pytest.mark.parametrize("build", [lambda: _FeedForward(approximate="none"), _Shared], ids=["exact_gelu", "shared"])
def test_an_exact_gelu_or_a_product_read_elsewhere_is_not_fused(build, tmp_path):
    torch.manual_seed(0)
    s = captured(build(), torch.randn(2, 8, 32), tmp_path)
    assert not s.cards.by_op("linear_gelu")
    s.close()


def test_a_two_dimensional_input_is_fused_too(tmp_path):
    torch.manual_seed(0)
    s = captured(_FeedForward(), torch.randn(8, 32), tmp_path)
    (card,) = s.cards.by_op("linear_gelu")
    assert tuple(card.variant.inputs[0].shape) == (8, 32) and tuple(card.variant.outputs[0].shape) == (8, 64)
    s.close()


def test_the_cpu_kernel_is_judged_correct_and_replaces_both_calls_in_the_compiled_graph(session):
    judged_and_placed(session, 'linear_gelu')


def test_a_product_of_lower_precision_than_eagers_is_judged_wrong(session):
    """The design's own loop with its operands rounded to TF32's 10-bit mantissa first (what a float32 candidate
    gets from CUBLAS_COMPUTE_32F_FAST_TF32, which the screen refuses by name but a number can still choose): the
    judge's float32 check of a cuBLAS product (5e-5) refuses it, where 1e-3 let it pass."""
    (card,) = session.cards.by_op("linear_gelu")
    (strategy,) = strategies_for("linear_gelu", "cpu")
    cpu = device_info("cpu")
    src = strategy.render(card.variant, strategy.default(card.variant, cpu), cpu)
    product = "x_ld(x, m * XROW + k) * w_ld(w, n * WN + k * WK)"
    assert product in src
    rounded = src.replace(product, "mant10(x_ld(x, m * XROW + k)) * mant10(w_ld(w, n * WN + k * WK))").replace(
        "KF_ENTRY int kf_launch", "static inline float mant10(float v) { uint32_t u; memcpy(&u, &v, 4); "
        "u = (u + 0x0FFFu + ((u >> 13) & 1u)) & ~0x1FFFu; memcpy(&v, &u, 4); return v; }\nKF_ENTRY int kf_launch", 1)
    exact = session.evaluator.evaluate(card, src, session.store)
    lower = session.evaluator.evaluate(card, rounded, session.store)
    assert exact.status.is_correct, exact.summary()
    assert not lower.status.is_correct and lower.status.name == "WRONG_RESULT", lower.summary()


H200 = DeviceInfo("cuda", "NVIDIA H200", "sm_90", 132, 4800.0, 50 << 20, 227 << 10)


def _bf16_variant():
    """The SD3.5 transformer's feed-forward projection at 1024 px: bf16 [1, 4096, 1536] @ [6144, 1536].T + [6144]."""
    from kforge.ops import TensorSig, Variant

    def sig(shape, stride):
        return TensorSig(tuple(shape), "bfloat16", tuple(stride), "cuda")

    return Variant("linear_gelu", (sig((1, 4096, 1536), (4096 * 1536, 1536, 1)), sig((6144, 1536), (1536, 1)),
                                   sig((6144,), (1,))), (), (sig((1, 4096, 6144), (4096 * 6144, 6144, 1)),))


def test_the_cuda_design_is_cublaslts_epilogue_and_passes_the_screen():
    variant = _bf16_variant()
    (strategy,) = strategies_for("linear_gelu", "cuda")
    assert strategy.applies(variant, H200)
    src = strategy.render(variant, strategy.default(variant, H200), H200)
    assert uses_cublaslt(src) and "CUBLASLT_EPILOGUE_GELU_BIAS" in src and "CUDA_R_16BF" in src
    assert screen(src, "cuda") == ()
    # the column-major operands: w [N, K] transposed (ld K), x [M, K] as is (ld K), y [N, M] (ld N)
    assert "#define M 4096" in src and "#define N 6144" in src and "#define K 1536" in src
    assert "#define YROW 6144" in src and "#define XROW 1536" in src and "#define WN 1536" in src


def test_the_screen_allows_cublaslt_but_refuses_its_logger():
    ok = '#include "kforge.h"\n#include <cublasLt.h>\nint f(void) { cublasLtHandle_t h; return (int)cublasLtCreate(&h); }\n'
    assert screen(ok, "cuda") == ()
    for call in ('cublasLtLoggerOpenFile("/tmp/x")', "cublasLtLoggerSetFile(0)", "cublasLtLoggerSetCallback(0)"):
        bad = f'#include "kforge.h"\n#include <cublasLt.h>\nint f(void) {{ return (int){call}; }}\n'
        findings = screen(bad, "cuda")
        assert findings and "logger" in findings[0].message, findings


def test_the_screen_allows_cublaslts_matrix_product_only():
    """The library exports functions that change process-wide state (a deployed kernel shares PyTorch's loaded
    cuBLASLt); declared by hand they need no header. Only the matrix product's functions are allowed."""
    for name in ("cublasLtShutdownCtx", "cublasLtHeuristicsCacheSetCapacity", "cublasLtSetEnvironmentMode",
                 "cublasLtDisableCpuInstructionsSetMask", "cublasCreate_v2"):
        bad = f'#include "kforge.h"\nextern "C" int {name}(void);\nint f(void) {{ return {name}(); }}\n'
        findings = screen(bad, "cuda")
        assert findings and any(name in f.message for f in findings), (name, findings)
    ok = ('#include "kforge.h"\n#include <cublasLt.h>\nint f(cublasLtHandle_t h, cublasLtMatmulDesc_t d) {\n'
          '  cublasLtMatmulHeuristicResult_t r; int n = 0;\n'
          '  return (int)cublasLtMatmulAlgoGetHeuristic(h, d, 0, 0, 0, 0, 0, 1, &r, &n); }\n')
    assert screen(ok, "cuda") == ()


def test_a_cublaslt_include_is_seen_as_the_screen_sees_it():
    assert uses_cublaslt("#include/**/<cublasLt.h>\n") and uses_cublaslt("#  include \\\n<cublasLt.h>\n")
    assert not uses_cublaslt("// #include <cublasLt.h>\n") and not uses_cublaslt("/* #include <cublasLt.h> */\n")


def test_the_cuda_design_leaves_what_cublaslt_refuses_to_others():
    from kforge.ops import TensorSig, Variant

    (strategy,) = strategies_for("linear_gelu", "cuda")

    def v(x, w, y, xs=None, ws=None):
        def sig(shape, stride=None):
            stride = stride or tuple(int(torch.tensor(shape[i + 1:]).prod()) for i in range(len(shape)))
            return TensorSig(tuple(shape), "bfloat16", tuple(stride), "cuda")
        return Variant("linear_gelu", (sig(x, xs), sig(w, ws), sig((w[0],))), (), (sig(y),))

    assert strategy.applies(v((2, 64, 32), (48, 32), (2, 64, 48)), H200)
    assert not strategy.applies(v((1, 1, 32), (48, 32), (1, 1, 48)), H200), "one row (M=1)"
    assert not strategy.applies(v((64, 32), (1, 32), (64, 1)), H200), "one output (N=1)"
    assert not strategy.applies(v((64, 1), (48, 1), (64, 48)), H200), "nothing to reduce (K=1)"
    assert not strategy.applies(v((64, 32), (48, 32), (64, 48), xs=(0, 1)), H200), "broadcast rows"
    assert not strategy.applies(v((64, 32), (48, 32), (64, 48), ws=(0, 1)), H200), "an expanded weight"


@pytest.mark.skipif(find_nvcc() is None or cublaslt_paths() is None, reason="needs nvcc and a cuBLASLt to build against")
def test_the_cuda_design_builds_and_links_cublaslt(tmp_path, monkeypatch):
    import shutil
    import subprocess

    monkeypatch.setenv("KFORGE_CACHE", str(tmp_path / "cache"))
    variant = _bf16_variant()
    (strategy,) = strategies_for("linear_gelu", "cuda")
    src = strategy.render(variant, strategy.default(variant, H200), H200)
    built = compile_source(src, "cuda", "sm_90", timeout_s=300)
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("built; readelf is not here to read what it links")
    needed = subprocess.run([readelf, "-d", str(built.path)], capture_output=True, text=True).stdout
    assert "libcublasLt.so" in needed and str(cublaslt_paths()[1].parent) in needed, needed


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,shape", [("bfloat16", (2, 300, 1536)), ("float32", (77, 96)),
                                         ("float16", (1, 4096, 1536))])
def test_on_the_gpu_the_cublaslt_kernel_matches_the_reference_and_replays_in_a_cuda_graph(dtype, shape, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if cublaslt_paths() is None:
        pytest.skip("no cuBLASLt to build against")
    spec = get_spec("linear_gelu")
    dt = getattr(torch, dtype)
    hidden = 6144 if shape[-1] == 1536 else 200
    x = torch.randn(*shape, device="cuda", dtype=dt)
    w = (torch.randn(hidden, shape[-1], device="cuda") / shape[-1] ** 0.5).to(dt)
    b = torch.randn(hidden, device="cuda", dtype=dt)
    call = spec.bind(x, w, b)
    ref = spec.reference(list(call.inputs), call.params)
    variant = spec.variant(call, [ref])
    info = device_info("cuda")
    (strategy,) = strategies_for("linear_gelu", "cuda")
    assert strategy.applies(variant, info)
    for config in strategy.configs(variant, info):
        kernel = DeployedKernel(variant, Kernel(compile_source(strategy.render(variant, config, info), "cuda",
                                                               info.arch).path))
        (got,) = kernel((x, w, b))
        rtol, atol = spec.tolerance(dtype)
        scale = ref.float().abs().max().item()
        err = (got.float() - ref.float()).abs()
        assert (err <= atol * scale + rtol * ref.float().abs()).all(), (config, err.max().item())
        if dtype == "float32":
            # NB: the tanh form, not erf's (they differ by up to 4.7e-4 near |x| = 2.7, within the vendor tolerance)
            assert err.max().item() < 1e-4, ("GELU_BIAS is not the tanh GELU here", err.max().item())
        # the graph gets its own input (the next configuration is checked against ref, made from x)
        xg = x.clone()
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.stream(stream):
            kernel((xg, w, b))   # warm on the capturing stream
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            (captured,) = kernel((xg, w, b))
        xg.copy_(torch.randn_like(xg))
        graph.replay()
        torch.cuda.synchronize()
        fresh = spec.reference([xg, w, b], call.params)
        assert ((captured.float() - fresh.float()).abs() <= atol * fresh.float().abs().max() + rtol * fresh.float().abs()).all()


@pytest.mark.skipif(cublaslt_paths() is None, reason="needs a cuBLASLt library to link")
def test_a_kernel_linked_against_cublaslt_loads_and_runs_inside_the_runners_sandbox(tmp_path, monkeypatch):
    """The library's folder must be readable under the runner's Landlock rules (KFORGE_RUNNER_LIB_DIRS, kept by
    the runner's own environment filter) and its load-time code must pass seccomp. A CPU kernel linked against
    cuBLASLt (through a compiler wrapper: the CPU backend does not link it) calls cublasLtGetVersion, which needs
    no GPU, inside the fully sandboxed CPU runner."""
    import shutil

    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("needs gcc")
    lib = cublaslt_paths()[1]
    wrapper = tmp_path / "cc.sh"
    wrapper.write_text("#!/bin/sh\nextra=\nfor a in \"$@\"; do case \"$a\" in *.c) grep -q LINK_CUBLASLT \"$a\" && "
                       f"extra=\"{lib} -Wl,-rpath,{lib.parent}\";; esac; done\nexec {gcc} \"$@\" $extra\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    # NB: the compiler's jail reads the folders LIBRARY_PATH names (the source includes no cublasLt.h here, so
    # nothing else tells the jail that the link reads cuBLASLt's folder)
    monkeypatch.setenv("LIBRARY_PATH", str(lib.parent))
    monkeypatch.setenv("KFORGE_CACHE", str(tmp_path / "cache"))
    source = r'''#include "kforge.h"
/* LINK_CUBLASLT */
#include <stddef.h>
extern size_t cublasLtGetVersion(void);
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const float* x = (const float*)inputs[0].data;
    float* y = (float*)outputs[0].data;
    long n = 1;
    for (int d = 0; d < inputs[0].ndim; ++d) n *= inputs[0].sizes[d];
    for (long i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
    return cublasLtGetVersion() > 0 ? 0 : 77;
}
'''
    torch.manual_seed(0)
    s = kforge.Session(nn.ReLU(), torch.randn(64, 64), device="cpu", workdir=tmp_path / "wd")
    s.capture(timing_budget_ms=2, regions=False)
    (card,) = s.cards.by_op("relu")
    ev = s.evaluator.evaluate(card, source, s.store)
    s.close()
    assert ev.status.is_correct, ev.summary()
    steps = {step.strip() for step in (ev.sandbox or "").split(",")}
    assert {"landlock_fs", "seccomp"} <= steps or not ev.sandbox, ev.sandbox
