"""The helpers of the benchmark scripts that read what a device run found (no GPU needed)."""
from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"kforge_bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_profile_reads_a_kernels_triton_source_from_the_smallest_cached_file_that_defines_it(tmp_path):
    profile = _script("compiled_profile")
    (tmp_path / "ab").mkdir()
    kernel = "@triton.jit\ndef triton_per_fused_mean_mul_11(in_ptr0, out_ptr0, xnumel, r0_numel):\n    pass\n"
    (tmp_path / "ab" / "cabc.py").write_text(kernel)
    module = "import triton\n" + "# the compiled module embeds every kernel\n" * 40 + kernel.replace("11", "12") + kernel
    (tmp_path / "module.py").write_text(module)
    (tmp_path / "other.py").write_text("def triton_per_fused_mean_mul_1(in_ptr0):\n    pass\n")
    found = profile.inductor_sources(["triton_per_fused_mean_mul_11", "triton_per_fused_mean_mul_12",
                                      "triton_poi_fused_gone_3", "nvjet_sm90_tst_128x128"], tmp_path)
    assert found["triton_per_fused_mean_mul_11"] == kernel, "a kernel's own file, not the module embedding it"
    assert "def triton_per_fused_mean_mul_12(" in found["triton_per_fused_mean_mul_12"]
    assert set(found) == {"triton_per_fused_mean_mul_11", "triton_per_fused_mean_mul_12"}
    assert profile.inductor_sources(["triton_per_fused_mean_mul_11"], tmp_path / "missing") == {}
    # a name the profiler cut short: the definition it starts; a whole name never takes a longer one's
    cut = profile.inductor_sources(["triton_per_fused_mean_mu", "triton_per_fused_mean_mul_1"], tmp_path)
    assert cut["triton_per_fused_mean_mu"].startswith("# full name: triton_per_fused_mean_mul_1")
    assert cut["triton_per_fused_mean_mul_1"] == "def triton_per_fused_mean_mul_1(in_ptr0):\n    pass\n"


def test_the_profile_gives_each_kernel_its_launches_and_time_a_launch():
    profile = _script("compiled_profile")
    rows = {"triton_poi_fused_gelu_17": 765.0, "nvjet_sm90_tst_192x128": 6595.5}
    summary = profile.summarize(rows, 5, {"triton_poi_fused_gelu_17": 24.0})
    gelu = next(r for r in summary["top"] if r["kernel"] == "triton_poi_fused_gelu_17")
    assert gelu["launches"] == 24.0 and abs(gelu["us_a_launch"] - 765.0 / 24) < 1e-9
    gemm = next(r for r in summary["top"] if r["kernel"].startswith("nvjet"))
    assert gemm["launches"] is None and gemm["us_a_launch"] is None
    assert abs(summary["gpu_us"] - sum(rows.values())) < 1e-9


def test_the_profile_reads_each_kernels_launch_shape_from_the_trace():
    profile = _script("compiled_profile")
    name = "triton_per_fused__scaled_dot_product_cudnn_attention__to_copy_add_mean_mul_pow_rsqrt_transpose_view_11"
    trace = {"traceEvents": [
        {"cat": "cpu_op", "name": "aten::mm", "args": {}},
        {"cat": "kernel", "name": name, "args": {"grid": [4096, 1, 1], "block": [256, 1, 1],
                                                 "registers per thread": 40, "shared memory": 0}},
        {"cat": "kernel", "name": name, "args": {"grid": [7, 1, 1], "block": [32, 1, 1]}},
        {"cat": "kernel", "name": "Memset (Device)", "args": {}},
    ]}
    shapes = profile.launch_shapes(trace)
    assert shapes == {name: {"grid": [4096, 1, 1], "block": [256, 1, 1], "registers": 40, "shared_bytes": 0}}
    # the profiler's key is the name cut short: the shape is found by prefix
    summary = profile.summarize({name[:100]: 1573.7}, 5, {name[:100]: 48.0}, shapes)
    assert summary["top"][0]["launch_shape"]["grid"] == [4096, 1, 1]
    assert profile.summarize({"nvjet_x": 1.0}, 5, {}, shapes)["top"][0]["launch_shape"] is None


def test_the_attention_benchmark_checks_and_times_each_configuration_on_the_cpu():
    """benchmarks/attention.py on its small CPU case: the C kernel built, held to the judge's rule
    (``evaluate._checks.compare``) on fresh inputs and timed beside eager."""
    bench = _script("attention")
    variants = bench.cases("cpu")
    assert set(variants) == {"gemma4_sliding_window_32", "gemma4_full_causal_64", "sd35_joint", "chain_softcap_added"}
    row = bench.run_case("gemma4_full_causal_64", variants["gemma4_full_causal_64"], "cpu", [], 1, 20.0, 1)
    assert [c["correct"] for c in row["configs"]] == [True] and set(row["us"]) == {"eager", "kforge[default]"}
    assert row["speedup_vs_eager"] == row["us"]["eager"] / row["us"]["kforge[default]"]
