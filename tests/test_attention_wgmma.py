"""The tensor-core attention strategy for Hopper (``wgmma_tiles``, issue 45): where it applies and where it leaves
the card to ``flash_tiles``; every configuration of the seed shapes renders, passes the screen and builds for sm_90a
through kforge's compile path (screen, jail, binary wall); on a GPU, every configuration matches eager."""
from __future__ import annotations

import concurrent.futures as futures
import importlib.util
import os
from pathlib import Path

import pytest
import torch

from kforge.deploy import DeployedKernel
from kforge.evaluate._checks import compare
from kforge.kernels import DeviceInfo, Kernel, compile_source, device_info
from kforge.kernels._compile import find_nvcc
from kforge.kernels._cutlass import cutlass_root, target_arch
from kforge.kernels._screen import screen
from kforge.ops import Variant, get_spec
from kforge.ops.families.attention.strategies.wgmma_tiles import smem_bytes
from kforge.proposers.builtin import BuiltinProposer, get_strategy

from test_attention import H100, _gemma_e2b, _qkv, _variant, _window

SDPA, CHAIN = "scaled_dot_product_attention", "softmax_attention"
WGMMA = get_strategy(f"{SDPA}.cuda.wgmma_tiles")
FLASH = get_strategy(f"{SDPA}.cuda.flash_tiles")


def _wgmma(variant: Variant):
    return get_strategy(f"{variant.op}.cuda.wgmma_tiles")


def _flash(variant: Variant):
    return get_strategy(f"{variant.op}.cuda.flash_tiles")


A100 = DeviceInfo("cuda", "NVIDIA A100-SXM4-80GB", "sm_80", 108, 2000.0, 40 << 20, 163 << 10)
needs_cutlass = pytest.mark.skipif(find_nvcc() is None or cutlass_root() is None,
                                   reason='needs nvcc and the CUTLASS headers: pip install "kforge[cutlass]"')


def _seeds() -> dict[str, Variant]:
    """The seed cards it is for: Gemma 4's layers at 512 tokens, sliding (8 query heads of 256, one key head
    expanded, the window's boolean mask) and full (heads of 512, causal), SD3.5's joint attention (24 heads of 64,
    4429 tokens, [batch, tokens, heads, 64]) and Gemma 2's written-out chain (soft-capped at 50, an added mask)."""
    sliding, full, joint, chain = _gemma_e2b()
    return {"gemma4_sliding_256": sliding, "gemma4_full_512": full, "sd35_joint_64": joint,
            "chain_softcap_added_256": chain}


SEEDS = _seeds()


def _small() -> dict[str, Variant]:
    """Small cards that cover every kind it takes, 16-bit, at sizes that leave partial tiles (rows past L, keys past
    S); each card combines kinds, so that the GPU test builds few sources."""
    bf, f16 = torch.bfloat16, torch.float16
    # 3-d (no head dimension), causal, the query's width not contiguous: its tiles come element by element
    qt = torch.randn(3, 64, 70, dtype=bf).transpose(-1, -2)
    _, kt, vt = (t[:, 0] for t in _qkv(b=3, h=1, L=70, S=70, e=64, dtype=bf))
    qm, km, vm = _qkv(b=1, h=4, L=100, S=150, e=128, dtype=bf, kv_heads=2, seed=1)
    qa, ka, va = _qkv(b=2, h=2, L=65, S=200, e=64, ev=128, dtype=f16, seed=2)
    qw, kw, vw = _qkv(b=1, h=4, L=130, S=130, e=256, dtype=bf, kv_heads=1, seed=3)
    qw5, kw5, vw5 = _qkv(b=1, h=2, L=100, S=100, e=512, dtype=bf, kv_heads=1, seed=4)
    qc, kc, vc = _qkv(b=2, h=2, L=70, S=90, e=64, dtype=bf, seed=5)
    qf, kf, vf = _qkv(b=1, h=3, L=80, S=80, e=128, dtype=f16, seed=6)
    return {
        "causal_3d_strided_query_64": _variant(SDPA, qt, kt, vt, is_causal=True),
        "gqa_bool_mask_128": _variant(SDPA, qm, km, vm, attn_mask=torch.rand(100, 150) > 0.3, enable_gqa=True,
                                      scale=0.3),
        "added_mask_float16_value_width_128": _variant(SDPA, qa, ka, va,
                                                       attn_mask=torch.randn(2, 1, 65, 200).half()),
        "window_expanded_key_head_256": _variant(SDPA, qw, kw.expand(1, 4, 130, 256), vw.expand(1, 4, 130, 256),
                                                 attn_mask=_window(130, 130, 48)),
        "causal_expanded_key_head_512": _variant(SDPA, qw5, kw5.expand(1, 2, 100, 512), vw5.expand(1, 2, 100, 512),
                                                 is_causal=True),
        "chain_softcap_float32_mask_on_bfloat16_64": _variant(CHAIN, qc, kc, vc, torch.randn(1, 1, 70, 90), 0.125,
                                                              30.0),
        "chain_filled_minus_inf_float16_128": _variant(CHAIN, qf, kf, vf, ~_window(80, 80, 16), 0.125, None,
                                                       float("-inf")),
    }


SMALL = _small()


def _on_gpu(variant: Variant) -> Variant:
    return variant.on("cuda:0")


# ----------------------------------------------------------------------------- where it applies


def test_it_takes_the_seed_cards_and_the_kinds_it_implements_and_leaves_the_rest_to_flash_tiles():
    for name, variant in {**SEEDS, **SMALL}.items():
        assert _wgmma(variant).applies(_on_gpu(variant), H100), name
    sliding, full, joint, chain = (_on_gpu(v) for v in _gemma_e2b())
    assert not WGMMA.applies(sliding, A100), "GMMA is Hopper's (sm_90a) only"
    # float32, widths it has no tiles for: flash_tiles' cards
    f32 = _on_gpu(_variant(SDPA, *_qkv(L=70, S=70, e=64), is_causal=True))
    narrow = _on_gpu(_variant(SDPA, *_qkv(e=32, dtype=torch.bfloat16)))
    wider = _on_gpu(_variant(SDPA, *_qkv(e=64, ev=1024, dtype=torch.bfloat16)))
    f32_chain = _on_gpu(_variant(CHAIN, *_qkv(L=70, S=70, e=64), None, 0.125))
    for refused in (f32, narrow, wider, f32_chain):
        assert not _wgmma(refused).applies(refused, H100), refused.signature
        assert _flash(refused).applies(refused, H100), refused.signature
    # where it applies it is the built-in proposer's first choice; flash_tiles still applies there
    proposer = BuiltinProposer()
    assert proposer.ranked(sliding, H100)[:2] == [WGMMA, FLASH]
    assert proposer.ranked(joint, H100)[:2] == [WGMMA, FLASH]
    assert proposer.ranked(full, H100)[:2] == [WGMMA, FLASH]
    assert proposer.ranked(chain, H100)[:2] == [_wgmma(chain), _flash(chain)]
    assert proposer.ranked(f32_chain, H100)[0] == _flash(f32_chain)


def test_every_configuration_of_the_seed_cards_fits_the_device_renders_and_passes_the_screen():
    for name, variant in SEEDS.items():
        strategy = _wgmma(variant)
        configs = list(strategy.configs(variant, H100))
        assert len(configs) > 1 and configs[0]["stages"] == 2, (name, configs)
        sources = set()
        for config in configs:
            assert smem_bytes(variant, config) <= H100.max_shared_per_block, (name, config)
            src = strategy.render(variant, config, H100)
            assert screen(src, "cuda") == (), (name, config)
            assert target_arch(src, "sm_90") == "sm_90a"
            for key, define in (("block_q", "BQ"), ("block_k", "BK"), ("stages", "STAGES")):
                assert f"#define {define} {config[key]}\n" in src
            sources.add(src)
        assert len(sources) == len(configs), "each configuration is its own kernel"
    # heads of 256: a 128-key tile's scores do not fit beside the output's registers; the Gemma card keeps 64-key tiles
    assert {c["block_k"] for c in WGMMA.configs(SEEDS["gemma4_sliding_256"], H100)} == {64}
    # heads of 512: two warpgroups share 64 rows, 256 values each; 64-key tiles leave room for one stage only
    full = list(WGMMA.configs(SEEDS["gemma4_full_512"], H100))
    assert {(c["block_q"], c["block_k"], c["stages"]) for c in full} == {(64, 32, 2), (64, 32, 1), (64, 64, 1)}
    assert "#define NV 2\n" in WGMMA.render(SEEDS["gemma4_full_512"], full[0], H100)
    # shared memory bounds the space: 100 KiB leaves the 256-wide card one-stage or 64-row blocks only
    small = DeviceInfo("cuda", "small", "sm_90", 132, 3000.0, 50 << 20, 100 << 10)
    for config in WGMMA.configs(SEEDS["gemma4_sliding_256"], small):
        assert smem_bytes(SEEDS["gemma4_sliding_256"], config) <= 100 << 10
        assert config["stages"] == 1 or config["block_q"] == 64


def test_the_source_follows_the_cards_mask_layout_and_dtype():
    def defines(variant: Variant) -> str:
        strategy = _wgmma(variant)
        return strategy.render(variant, strategy.default(variant, H100), H100)

    assert "#define MASK 1\n" in defines(SEEDS["gemma4_sliding_256"])          # boolean, keeps
    assert "#define MASK 3\n" in defines(SMALL["added_mask_float16_value_width_128"])        # added
    assert "typedef cutlass::half_t q_t;" in defines(SMALL["added_mask_float16_value_width_128"])
    src = defines(SEEDS["sd35_joint_64"])
    assert "#define MASK 0\n" in src and "#define CAUSAL 0\n" in src and "#define SCALE 0.125f\n" in src
    assert "#define VEC_STRIDES 1\n" in src and "#define QSL 1536L\n" in src
    assert "#define CAUSAL 1\n" in defines(SMALL["causal_3d_strided_query_64"])
    assert "#define KOFF(bh) 0L\n" in defines(SEEDS["gemma4_sliding_256"]), "the one key head, read by every head"
    assert "#define VEC_STRIDES 0\n" in defines(SMALL["causal_3d_strided_query_64"]), "a strided width: element-wise"
    chain = defines(SEEDS["chain_softcap_added_256"])
    assert "#define CHAIN 1\n" in chain and "#define SOFTCAP 1\n" in chain and "#define CAP 50.0f\n" in chain
    assert "typedef cutlass::bfloat16_t s_t;" in chain, "bf16 scores plus a bf16 mask round to bf16"
    assert "typedef float s_t;" in defines(SMALL["chain_softcap_float32_mask_on_bfloat16_64"]), "float32 promotes"
    filled = defines(SMALL["chain_filled_minus_inf_float16_128"])
    assert "#define MASK 2\n" in filled and "#define FILL KF_NEG_INF\n" in filled


def test_the_attention_benchmark_times_its_configurations_beside_flash_tiles():
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "attention.py"
    spec = importlib.util.spec_from_file_location("kforge_bench_attention_wgmma", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cases = bench.cases("cuda")
    for name, variant in cases.items():
        picked = bench.configurations(variant, H100)
        for strategy in (_wgmma(variant), _flash(variant)):
            expected = list(strategy.configs(variant, H100)) if strategy.applies(variant, H100) else []
            assert [c for s, c in picked if s == strategy] == expected, (name, strategy.name)
    assert all(_wgmma(v).applies(v, H100) for v in cases.values()), "every seed card of the benchmark is one of its"


# ----------------------------------------------------------------------------- builds (nvcc, sm_90a)


def _build(variant: Variant, config: dict, info: DeviceInfo = H100):
    return compile_source(_wgmma(variant).render(variant, config, info), "cuda", info.arch)


@needs_cutlass
@pytest.mark.slow
def test_every_configuration_of_the_seed_cards_builds_for_sm90a_through_the_compile_path():
    """Screen, jail, nvcc for sm_90a and the binary wall, for every configuration: the source's static checks (P
    takes S's accumulator in order, the tiles dense) hold for each."""
    jobs = [(v, c) for v in SEEDS.values() for c in _wgmma(v).configs(v, H100)]
    with futures.ThreadPoolExecutor(2) as pool:
        built = list(pool.map(lambda j: _build(*j), jobs))
    assert all(b.path.is_file() for b in built)
    assert len({b.sha256 for b in built}) == len(jobs)


@needs_cutlass
@pytest.mark.slow
def test_the_kinds_beyond_the_seed_cards_build_for_sm90a():
    """The small cards' kinds (their default configuration): 3-d, causal and a strided query; grouped heads and a
    boolean mask; float16, an added mask and a value width of its own; the chain with a float32 mask and with a
    filled one."""
    with futures.ThreadPoolExecutor(2) as pool:
        built = list(pool.map(lambda v: _build(v, _wgmma(v).default(v, H100)), SMALL.values()))
    assert all(b.path.is_file() for b in built)


# ----------------------------------------------------------------------------- on the GPU


_FULLY_MASKED = ("gqa_bool_mask_128", "chain_filled_minus_inf_float16_128")
# NB: the sampled masks are random; a window's own mask has key tiles that no row keeps (skipped) and tiles that every
# row keeps whole (not tested element by element)
_WINDOWS = {"window_expanded_key_head_256": lambda: _window(130, 130, 48),
            "gemma4_sliding_256": lambda: _window(512, 512, 512)}


def _fully_masked_rows(variant: Variant, ins: list) -> list:
    """A boolean mask with some query rows that keep no key: SDPA's (False everywhere) gives zeros there, the chain's
    (filled everywhere with -inf) NaN, as eager's softmax gives."""
    mask = ins[3].clone()
    blocked = variant.op == CHAIN
    mask[..., 3, :] = blocked
    mask[..., -1, :] = blocked
    return [*ins[:3], mask]


def _try_build(variant: Variant, config: dict, info: DeviceInfo):
    try:
        return _build(variant, config, info)
    except Exception as exc:  # noqa: BLE001 - raised in the test of the card it belongs to
        return exc


@pytest.fixture(scope="module")
def gpu_builds() -> dict:
    """Every configuration of every card, built at once on all of the machine's cores (~20 s of CPU a build)."""
    info = device_info("cuda")
    if not info.arch.startswith("sm_90"):
        return {}
    if find_nvcc() is None or cutlass_root() is None:
        pytest.fail("the GPU check builds with nvcc and the CUTLASS headers: pip install nvidia-cutlass or set "
                    "CUTLASS_PATH (device_session.sh: tar xJf .carry/cutlass.tar.xz -C build/cutlass)")
    jobs = [(name, _on_gpu(card), config) for name, card in {**SMALL, **SEEDS}.items()
            for config in _wgmma(card).configs(_on_gpu(card), info)]
    with futures.ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        libs = list(pool.map(lambda j: _try_build(j[1], j[2], info), jobs))
    out: dict = {}
    for (name, _, config), lib in zip(jobs, libs):
        out.setdefault(name, []).append((config, lib))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("name", [*SMALL, *SEEDS])
def test_on_the_gpu_every_configuration_matches_eager(name, gpu_builds):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    info = device_info("cuda")
    if not info.arch.startswith("sm_90"):
        pytest.skip(f"wgmma_tiles is for sm_90a; this GPU is {info.arch}")
    card = {**SMALL, **SEEDS}[name]
    variant = _on_gpu(card)
    spec = get_spec(variant.op)
    assert _wgmma(variant).applies(variant, info)
    configs = [c for c, _ in gpu_builds[name]]
    assert configs == list(_wgmma(variant).configs(variant, info))
    for config, lib in gpu_builds[name]:
        if isinstance(lib, Exception):
            raise AssertionError(f"{name} {config} did not build") from lib
    built = [lib for _, lib in gpu_builds[name]]
    for seed in (3, 4, "window"):
        if seed == "window" and name not in _WINDOWS:
            continue
        ins = [None if t is None else t.cuda() for t in spec.random_inputs(card, seed=seed if seed != "window" else 5)]
        if name in _FULLY_MASKED:
            ins = _fully_masked_rows(variant, ins)
        if seed == "window":
            ins[3] = _WINDOWS[name]().cuda()
        before = [None if t is None else t.clone() for t in ins]
        ref = spec.reference(ins, variant.param_dict)
        for config, lib in zip(configs, built):
            kernel = DeployedKernel(variant, Kernel(lib.path))
            (got,) = kernel(tuple(ins))
            torch.cuda.synchronize()
            verdict = compare(spec, got, ref, "output")
            assert verdict.ok, (name, config, seed, verdict.message)
            assert all(a is None or torch.equal(a, b) for a, b in zip(ins, before)), "inputs unchanged"
            if name in _FULLY_MASKED:
                rows = got[..., [3, -1], :]
                assert bool((rows == 0).all()) if variant.op == SDPA else bool(rows.isnan().all())
