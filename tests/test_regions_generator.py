"""The region generator: random regions, every generated C kernel against eager; CUDA sources compile."""
from __future__ import annotations

import random
import shutil

import pytest
import torch

from kforge.evaluate._checks import compare
from kforge.kernels import Kernel, compile_source, param_vector
from kforge.ops import TensorSig, Unsupported, get_spec
from kforge.regions import Node, Ref, RegionIR, generate, plan_region, plan_variant, region_variant
from kforge.regions._codegen import math_knobs
from kforge.regions._ir import OPS
from kforge.regions._spec import region_ir

FLOATS = ("float32", "bfloat16", "float16")
# the IR's operators by kind: one the IR gains is generated, or the generator fails on it
UNARY = tuple(n for n, o in OPS.items() if o.kind == "unary")
BINARY = tuple(n for n, o in OPS.items() if o.kind == "binary")
COMPARE = tuple(n for n, o in OPS.items() if o.kind == "compare")
REDUCE = tuple(n for n, o in OPS.items() if o.kind in ("reduce", "norm"))


def _sig(shape, dtype, rng: random.Random) -> TensorSig:
    """Contiguous, or (2-d and up, sometimes) with the last two dims stored transposed."""
    t = torch.empty(shape, dtype=getattr(torch, dtype))
    if len(shape) >= 2 and rng.random() < 0.25:
        t = torch.empty(shape[:-2] + (shape[-1], shape[-2]), dtype=t.dtype).transpose(-1, -2)
    return TensorSig.of(t)


def random_region(seed: int) -> tuple[RegionIR, list[TensorSig]]:
    """A random composition of pointwise operators with broadcasting and casts, and (half the
    time) one reduction with a prologue and an epilogue."""
    rng = random.Random(seed)
    rank = rng.randint(1, 3)
    shape = tuple(rng.choice((2, 3, 5)) for _ in range(rank - 1)) + (rng.choice((1, 7, 16, 64, 130, 257, 512)),)
    main = rng.choice(FLOATS)
    sigs = [_sig(shape, main, rng)]
    for _ in range(rng.randint(0, 2)):
        bshape = tuple(1 if rng.random() < 0.4 else s for s in shape)[rng.randint(0, rank - 1):]
        sigs.append(_sig(bshape or (1,), rng.choice(FLOATS), rng))
    with_where = rng.random() < 0.25
    if with_where:
        sigs.append(TensorSig.of(torch.empty(shape, dtype=torch.bool)))
    nodes: list[Node] = []
    pool: list[Ref] = [Ref("i", i) for i in range(len(sigs) - with_where)]

    def add(op, *args, **attrs) -> Ref:
        nodes.append(Node(op, tuple(args), tuple(sorted(attrs.items()))))
        return Ref("n", len(nodes) - 1)

    def step() -> None:
        kind = rng.random()
        x = rng.choice(pool)
        if kind < 0.4:
            op = rng.choice(UNARY)
            if op in ("log", "sqrt", "rsqrt", "reciprocal"):
                x = add("add", add("abs", x), Ref("c", 0.5))
            if op == "exp":
                x = add("tanh", x)
            pool.append(add(op, x, approximate=rng.choice(("none", "tanh"))) if op == "gelu" else add(op, x))
        elif kind < 0.75:
            op = rng.choice(BINARY)
            if op == "pow":  # a positive base: fractional exponents stay real
                base = add("add", add("abs", x), Ref("c", 0.1))
                pool.append(add("pow", base, Ref("c", rng.choice((2, 3, 0.5, 2.5)))))
                return
            y = rng.choice(pool)
            if op not in ("maximum", "minimum") and rng.random() < 0.3:
                y = Ref("c", rng.choice((0.5, 2, -1.5, 1e-6)))
            if op == "div":
                y = add("add", add("abs", y), Ref("c", 0.5)) if y.kind != "c" else Ref("c", 1.7)
            pool.append(add(op, x, y))
        elif kind < 0.85:
            pool.append(add("cast", x, dtype=rng.choice(FLOATS)))
        elif kind < 0.93:   # a condition: the boolean input, or a comparison
            if with_where and rng.random() < 0.5:
                cond = Ref("i", len(sigs) - 1)
            else:
                cond = add(rng.choice(COMPARE), x, rng.choice(pool + [Ref("c", 0.25)]))
            pool.append(add("where", cond, x, rng.choice(pool)))
        else:
            pool.append(add("clamp", x, min=-1.0, max=rng.choice((1.0, None))))

    for _ in range(rng.randint(1, 4)):
        step()
    if rng.random() < 0.5:
        full = [r for r in pool if r.kind == "i" and sigs[r.value].shape == shape] or [Ref("i", 0)]
        x = add("mul", rng.choice(full), pool[-1]) if pool[-1].kind == "n" else full[0]
        op = rng.choice(REDUCE)
        k = rng.randint(1, min(2, rank))
        if op in ("softmax", "log_softmax"):
            r = add(op, x, k=1)
        elif op == "layer_norm":
            r = add(op, x, k=k, eps=1e-5)
        else:
            r = add(op, x, k=k, keepdim=True)
        pool = [r] + [p for p in pool if p.kind == "i"]
        for _ in range(rng.randint(0, 3)):
            step()
        if pool[-1] is not r and rng.random() < 0.5:
            pool.append(add("mul", pool[-1], r))
    ir = RegionIR(len(sigs), tuple(nodes), (len(nodes) - 1,))
    return ir, sigs


def _cases(n: int, tries: int = 2000):
    """``n`` regions, then more only while they bring an IR operator no region has yet."""
    out, unseen, seed = [], set(OPS), 0
    while (len(out) < n or unseen) and seed < tries:
        ir, sigs = random_region(seed)
        seed += 1
        if len(out) >= n and not unseen & set(ir.ops):
            continue
        try:
            variant = region_variant(ir, sigs)
            plan_region(ir, list(variant.inputs), list(variant.outputs))
        except Unsupported:
            continue
        out.append((seed - 1, variant))
        unseen -= set(ir.ops)
    return out


CASES = _cases(40)

# NB: a difference the generator found, reported and left visible: eager's CPU add of a 16-bit tensor and a Python
# float rounds the float to the tensor's dtype first (x + 0.1 adds 0.0999755859375), the C kernel adds 0.1f
KNOWN = {10: "a 16-bit abs(x) + 0.1 under pow(., 0.5), then layer_norm and a cube: eager rounds 0.1 to float16 "
             "before the add (37 of 384 sums differ by an ulp), the kernel does not"}


def _known(cases: list) -> list:
    return [pytest.param(seed, v, id=f"seed{seed}", marks=pytest.mark.xfail(strict=True, reason=KNOWN[seed]))
            if seed in KNOWN else pytest.param(seed, v, id=f"seed{seed}") for seed, v in cases]


def _run(variant, source: str, seed: int):
    spec = get_spec("region")
    kernel = Kernel(compile_source(source, "cpu", "native").path)
    inputs = spec.random_inputs(variant, seed)
    refs = spec.reference(inputs, variant.param_dict)
    outs = [torch.full(s.shape, float("nan")).to(getattr(torch, s.dtype)).as_strided(s.shape, s.stride)
            for s in variant.outputs]
    kernel.prepare(len(variant.inputs), len(variant.outputs), param_vector(variant)).launch(inputs, outs, None, 0)
    return [compare(spec, o, r, f"output {i}") for i, (o, r) in enumerate(zip(outs, refs))]


def test_random_regions_cover_every_ir_operator_reductions_casts_and_broadcasting():
    ops = [o for _, v in CASES for o in region_ir(v).ops]
    assert not set(OPS) - set(ops), f"random_region never generates {sorted(set(OPS) - set(ops))}"
    assert sum(1 for _, v in CASES if region_ir(v).reduction is not None) >= 10
    assert "cast" in ops and "where" in ops
    assert any(s.shape != v.outputs[0].shape for _, v in CASES for s in v.inputs)
    assert any(not s.is_contiguous for _, v in CASES for s in v.inputs)


@pytest.mark.parametrize("seed,variant", _known(CASES))
def test_generated_c_kernel_matches_eager(seed, variant):
    for m in _run(variant, generate(variant, "cpu"), seed):
        assert m.ok, f"{variant.signature}: {m.message}\n{get_spec('region').source(variant)}"


@pytest.mark.parametrize("seed,variant", _known([c for c in CASES if region_ir(c[1]).reduction is not None][:4]))
def test_every_cpu_choice_matches_eager(seed, variant):
    for config in ({"cache": 0, "rows_per_task": 4}, {"cache": 1, "rows_per_task": 1}):
        for m in _run(variant, generate(variant, "cpu", config), seed):
            assert m.ok, f"{config}: {m.message}"


HALF_CASES = [c for c in CASES if math_knobs(plan_variant(c[1]))[1]]


def test_random_regions_have_16_bit_chains_to_round_or_not():
    assert len(HALF_CASES) >= 8


@pytest.mark.parametrize("seed,variant", _known(HALF_CASES))
def test_float32_through_the_chain_matches_eager(seed, variant):
    """round=0 (Inductor's numerics: no rounding between nodes but at casts) stays within a 16-bit
    output's tolerance."""
    source = generate(variant, "cpu", {"round": 0})
    assert source != generate(variant, "cpu", {"round": 1})
    for m in _run(variant, source, seed):
        assert m.ok, f"{variant.signature}: {m.message}\n{get_spec('region').source(variant)}"


def test_math_knobs_are_offered_only_where_they_change_the_kernel():
    from kforge.kernels import DeviceInfo
    from kforge.regions._generator import default_config, valid_config

    gpu = DeviceInfo("cuda", "H200", "sm_90", 132, 4250.0)
    f32 = [v for _, v in CASES if not any(math_knobs(plan_variant(v)))]
    assert f32, "the random regions should include some with no 16-bit node"
    for v in f32[:5]:
        base = default_config(v, gpu)
        assert base.get("fast", 0) == 0 and base.get("round", 1) == 1
        assert not valid_config(v, {**base, "fast": 1}, gpu)
        assert not valid_config(v, {**base, "round": 0}, gpu)
    fast = [v for _, v in CASES if math_knobs(plan_variant(v))[0]]
    assert fast
    source = generate(fast[0], "cuda", {"fast": 1})
    assert "kf_tanh_approx" in source or "__expf" in source or "__logf" in source
    assert "kf_tanh_approx" not in generate(fast[0], "cuda", {"fast": 0}) and "__expf" not in generate(
        fast[0], "cuda", {"fast": 0})


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("index", [0, 1, 2, 3, 4])
def test_generated_cuda_source_compiles_for_sm90(index):
    pointwise = [v for _, v in CASES if region_ir(v).reduction is None]
    rows = [v for _, v in CASES if region_ir(v).reduction is not None]
    picks = [pointwise[0], rows[0], rows[1], pointwise[1], rows[2]]
    configs = [None, None, {"split": 2, "threads": 128, "tpr": 128, "cache": 0, "vec": 1}, {"vec": 1, "fast": 0, "round": 1},
               {"cache": 1}]
    variant = picks[index]
    source = generate(variant, "cuda", configs[index])
    built = compile_source(source, "cuda", "sm_90")
    assert built.path.exists()


def _norm_variants():
    """The random regions' norms, and chains around each norm at shapes a model has."""
    from kforge.regions import capture_regions

    F = torch.nn.functional
    bf = torch.bfloat16
    chains = [
        (lambda s, m: torch.softmax(s * 0.125 + m, dim=-1).to(bf), torch.randn(2, 4, 64, 64), torch.zeros(1, 1, 64, 64)),
        (lambda s: torch.softmax(s.float() * 0.5, dim=-1), torch.randn(8, 512, dtype=bf)),
        (lambda s: torch.log_softmax(s * 2.0, dim=-1).to(bf), torch.randn(6, 96)),
        (lambda x, sc, sh: F.layer_norm(x, (256,)) * (1 + sc) + sh, torch.randn(4, 256, dtype=bf),
         torch.randn(1, 256, dtype=bf), torch.randn(1, 256, dtype=bf)),
    ]
    found = [capture_regions(fn, [ins], examples_per_variant=0) for fn, *ins in chains]
    return [v for _, v in CASES if region_ir(v).reduction is not None
            and plan_variant(v).red_op in ("softmax", "log_softmax", "layer_norm")] + [
        r.variant for f in found for r in f.records if plan_variant(r.variant).red_op in REDUCE]


def test_cached_norm_rows_take_their_statistics_in_two_passes():
    """A norm whose row is held in registers: max then exponentials (softmax), mean then squared
    deviations (layer_norm) from the registers, no one-pass online statistics; other reductions
    shuffle only the fields they use."""
    from kforge.kernels import DeviceInfo
    from kforge.regions._generator import valid_config

    gpu = DeviceInfo("cuda", "H200", "sm_90", 132, 4250.0)
    norms = _norm_variants()
    assert {plan_variant(v).red_op for v in norms} >= {"softmax", "layer_norm"}, "the random regions should hold norms"
    for v in norms:
        plan = plan_variant(v)
        cached = {"threads": 128, "tpr": 32, "vec": 1, "split": 1, "cache": 1}
        if not valid_config(v, {**cached, "fast": 0, "round": 1}, gpu):
            continue
        two = generate(v, "cuda", cached, gpu)
        one = generate(v, "cuda", {**cached, "cache": 0}, gpu)
        assert "in two passes" in two and "st_add(&st" not in two.split("region_red")[-1], plan.red_op
        assert "in two passes" not in one and "st_add(&st" in one
        if plan.red_op == "softmax":
            assert "* inv_)" in two and "expf(cp[it][l] - m_)" in two
    sums = [v for _, v in CASES if region_ir(v).reduction is not None and plan_variant(v).red_op in ("sum", "mean")]
    assert sums
    src = generate(sums[0], "cuda", None, gpu)
    assert src.count("__shfl_xor_sync(0xffffffffu, st.") == 1, "a sum shuffles its one field only"


def test_fast_reaches_a_softmax_only_where_every_output_is_16_bit():
    from kforge.regions._codegen import fast_reduction

    for v in _norm_variants():
        plan = plan_variant(v)
        half = all(s.dtype in ("bfloat16", "float16") for s in plan.outputs)
        assert fast_reduction(plan) == (plan.red_op in ("softmax", "log_softmax") and half)
        if fast_reduction(plan):
            assert math_knobs(plan)[0]
            assert "__expf" in generate(v, "cuda", {"fast": 1}) and "__expf" not in generate(v, "cuda", {"fast": 0})


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_two_pass_sources_compile_for_sm90():
    """The two-pass statistics within a warp (several rows per block) and across warps (a row per block)."""
    from concurrent.futures import ThreadPoolExecutor

    from kforge.kernels import DeviceInfo
    from kforge.regions._generator import valid_config

    gpu = DeviceInfo("cuda", "H200", "sm_90", 132, 4250.0)
    jobs = []
    for op in ("softmax", "log_softmax", "layer_norm"):
        v = next((v for v in _norm_variants() if plan_variant(v).red_op == op), None)
        if v is None:
            continue
        for c in ({"threads": 128, "tpr": 8, "vec": 1, "split": 1, "cache": 1},
                  {"threads": 256, "tpr": 256, "vec": 1, "split": 1, "cache": 1}):
            c = {**c, "fast": int(math_knobs(plan_variant(v))[0]), "round": 1}
            if valid_config(v, c, gpu):
                jobs.append(generate(v, "cuda", c, gpu))
    assert len(jobs) >= 3
    with ThreadPoolExecutor(2) as pool:
        built = list(pool.map(lambda src: compile_source(src, "cuda", "sm_90"), jobs))
    assert all(b.path.exists() for b in built)


def _channels_last_add_relu_scale() -> object:
    """relu(a + b) * c on N,C,H,W tensors stored channels-last, c one value per channel: a ResNet
    block's residual twin with a per-channel scale."""
    x = torch.empty(2, 16, 5, 3).to(memory_format=torch.channels_last)
    sigs = [TensorSig.of(x), TensorSig.of(x), TensorSig.of(torch.empty(16, 1, 1))]
    ir = RegionIR(3, (Node("add", (Ref("i", 0), Ref("i", 1))), Node("relu", (Ref("n", 0),)),
                      Node("mul", (Ref("n", 1), Ref("i", 2)))), (2,))
    return region_variant(ir, sigs)


def test_a_channels_last_pointwise_region_is_walked_in_memory_order():
    """The kernel sweeps a channels-last region N,H,W,C: every full-shape tensor at the linear index, the
    per-channel one at the innermost dim, 16-byte vectors on the GPU. Walked N,C,H,W its accesses were C
    elements apart (0.23-0.72x of eager on the H200 for ResNet-50's add,relu twins)."""
    from kforge.regions._codegen import flat_offset

    variant = _channels_last_add_relu_scale()
    assert variant.outputs[0].stride == (240, 1, 48, 16)
    plan = plan_variant(variant)
    assert plan.shape == (2, 5, 3, 16)
    assert [flat_offset(plan, s.shape, s.stride, "i") for s in plan.inputs] == ["(i)", "(i)", "(((i) % 16L) * 1L)"]
    for seed in (0, 1):
        for m in _run(variant, generate(variant, "cpu"), seed):
            assert m.ok, m.message
    source = generate(variant, "cuda", {"vec": 4})
    assert "load_vec<V>(in0 + (base)" in source and "load_vec<V>(in1 + (base)" in source, source
    if shutil.which("nvcc") is not None:
        assert compile_source(source, "cuda", "sm_90").path.exists()


def test_a_second_output_in_another_layout_is_stored_at_its_own_offsets():
    """A region's outputs are stored in 16-byte vectors at each output's own offset: only the first one is
    dense in the walk order. Before, every output was stored at the first one's linear index, which put a
    second output laid out otherwise (here transposed against the first) at the wrong elements."""
    x = TensorSig.of(torch.empty(8, 3, 8).transpose(0, 1))   # [3,8,8] with strides (8, 24, 1)
    y = TensorSig.of(torch.empty(3, 8, 8))
    ir = RegionIR(2, (Node("relu", (Ref("i", 0),)), Node("relu", (Ref("i", 1),))), (0, 1))
    variant = region_variant(ir, [x, y])
    assert variant.outputs[0].stride != variant.outputs[1].stride
    source = generate(variant, "cuda", {"vec": 4})
    assert "store_vec<V>(out0 + (base)" in source and "store_vec<V>(out1 + (base)" not in source, source
    assert "store_vec<V>(out1 + (((base) / 24L) * 8L" in source
    for m in _run(variant, generate(variant, "cpu"), 0):
        assert m.ok, m.message
    if shutil.which("nvcc") is not None:
        assert compile_source(source, "cuda", "sm_90").path.exists()
