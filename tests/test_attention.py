"""Attention cards (issue 45): ``scaled_dot_product_attention`` calls and attention written out by hand
(``softmax_attention``), with their masks (causal, boolean, added, a sliding window), soft-capping and grouped heads.
The built-in C kernel is judged against eager by kforge's judge; the cards are found in the reduced seed models; the
CUDA design builds with nvcc (and runs on a GPU where there is one); a winner runs in the applied model."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kforge
from kforge.deploy import DeployedKernel
from kforge.evaluate import Evaluator, Status
from kforge.kernels import DeviceInfo, Kernel, compile_source, device_info
from kforge.kernels._compile import find_nvcc
from kforge.kernels._screen import screen
from kforge.ops import TensorSig, Unsupported, Variant, get_spec
from kforge.proposers.builtin import get_strategy, strategies_for

import extras
from fused_checks import captured, judged_and_placed
from scripted import search_until_correct

SDPA, CHAIN = "scaled_dot_product_attention", "softmax_attention"
CPU = device_info("cpu")
H100 = DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", "sm_90", 132, 3000.0, 50 << 20, 227 << 10)


def _variant(op: str, *args, **kwargs) -> Variant:
    spec = get_spec(op)
    call = spec.bind(*args, **kwargs)
    return spec.variant(call, [spec.reference(list(call.inputs), call.params)])


def _qkv(b=2, h=3, L=7, S=9, e=16, ev=None, dtype=torch.float32, kv_heads=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, L, e, generator=g).to(dtype)
    k = torch.randn(b, kv_heads or h, S, e, generator=g).to(dtype)
    v = torch.randn(b, kv_heads or h, S, ev or e, generator=g).to(dtype)
    return q, k, v


def _window(L: int, S: int, w: int) -> torch.Tensor:
    """Gemma's sliding-window mask as transformers gives SDPA: True where query i sees key j (causal, the last w)."""
    i, j = torch.arange(L)[:, None], torch.arange(S)[None]
    return ((j <= i) & (j > i - w))[None, None]


def _cases() -> dict[str, Variant]:
    q, k, v = _qkv()
    L, S = q.shape[-2], k.shape[-2]
    qg, kg, vg = _qkv(h=4, kv_heads=2)
    qb, kb, vb = _qkv(dtype=torch.bfloat16, seed=1)
    qh, kh, vh = _qkv(dtype=torch.float16, seed=2)
    # Gemma's grouped heads as transformers hands them to SDPA without enable_gqa: one key head expanded (stride 0)
    q1, k1, v1 = _qkv(b=1, h=4, L=8, S=8, kv_heads=1)
    x3 = _qkv(b=2, h=1, e=8)
    return {
        "causal": _variant(SDPA, q, k, v, is_causal=True),
        "bool_mask": _variant(SDPA, q, k, v, attn_mask=torch.rand(L, S) > 0.3),
        "added_mask": _variant(SDPA, q, k, v, attn_mask=torch.randn(2, 1, L, S)),
        "sliding_window_4": _variant(SDPA, q, k, v, attn_mask=_window(L, S, 4)),
        "gqa": _variant(SDPA, qg, kg, vg, enable_gqa=True, scale=0.3),
        "expanded_key_head": _variant(SDPA, q1, k1.expand(1, 4, 8, 16), v1.expand(1, 4, 8, 16),
                                      attn_mask=_window(8, 8, 4)),
        "value_width": _variant(SDPA, *_qkv(ev=24), is_causal=True),
        "3d": _variant(SDPA, *(t[:, 0] for t in x3)),
        "float16_causal": _variant(SDPA, qh, kh, vh, is_causal=True),
        "bfloat16_window": _variant(SDPA, qb, kb, vb, attn_mask=_window(L, S, 4)),
        "bfloat16_added": _variant(SDPA, qb, kb, vb, attn_mask=torch.randn(L, S).bfloat16()),
        "chain_float32": _variant(CHAIN, q, k, v, None, 0.25),
        "chain_softcap_added_bfloat16": _variant(CHAIN, qb, kb, vb, torch.randn(1, 1, L, S).bfloat16(), 0.25, 5.0),
        "chain_filled_float16": _variant(CHAIN, qh, kh, vh, ~_window(L, S, 4), 0.25, None, -65504.0),
        "chain_float32_mask_on_bfloat16": _variant(CHAIN, qb, kb, vb, torch.randn(1, 1, L, S), 0.25, 30.0),
    }


CASES = _cases()


@pytest.fixture(scope="module")
def judge():
    with Evaluator("cpu", timeout_s=120) as ev:
        yield ev


def _cpu_source(variant: Variant) -> str:
    (strategy,) = strategies_for(variant.op, "cpu")
    assert strategy.applies(variant, CPU)
    return strategy.render(variant, strategy.default(variant, CPU), CPU)


@pytest.mark.parametrize("name", list(CASES))
def test_the_c_kernel_is_judged_correct_against_eager(judge, name):
    variant = CASES[name]
    result = judge.evaluate_variant(variant, _cpu_source(variant))
    assert result.status.is_correct, (name, result.status, result.message)


def test_the_judge_refuses_the_kernel_when_it_ignores_the_mask_or_the_causal_rule(judge):
    for name, line in (("sliding_window_4", "#define MASK 1"), ("causal", "#define CAUSAL 1"),
                       ("chain_softcap_added_bfloat16", "#define SOFTCAP 1")):
        src = _cpu_source(CASES[name])
        assert line in src
        result = judge.evaluate_variant(CASES[name], src.replace(line, line[:-1] + "0"))
        assert result.status is Status.WRONG_RESULT, (name, result.status, result.message)


def _run(variant: Variant, inputs) -> torch.Tensor:
    kernel = DeployedKernel(variant, Kernel(compile_source(_cpu_source(variant), "cpu", "native").path))
    (out,) = kernel(tuple(inputs))
    return out


def test_a_row_with_no_key_left_is_zero_for_sdpa_and_nan_for_the_written_out_softmax():
    """torch's SDPA kernels give zero where the mask leaves a query no key; softmax over -inf everywhere is NaN."""
    q, k, v = _qkv()
    mask = torch.rand(7, 9) > 0.3
    mask[2] = False
    variant = _variant(SDPA, q, k, v, attn_mask=mask)
    got = _run(variant, (q, k, v, mask))
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), rtol=1e-4, atol=1e-4)
    assert bool((got[:, :, 2] == 0).all())
    filled = ~mask[None, None]
    variant = _variant(CHAIN, q, k, v, filled, 0.25, None, float("-inf"))
    got = _run(variant, (q, k, v, filled))
    expected = get_spec(CHAIN).reference([q, k, v, filled], variant.param_dict)
    assert bool(got[:, :, 2].isnan().all()) and bool(expected[:, :, 2].isnan().all())
    keep = torch.ones(7, dtype=torch.bool)
    keep[2] = False
    torch.testing.assert_close(got[:, :, keep], expected[:, :, keep], rtol=1e-5, atol=1e-5)


def test_the_binder_refuses_what_the_kernels_do_not_compute():
    q, k, v = _qkv()
    spec = get_spec(SDPA)
    with pytest.raises(Unsupported, match="dropout"):
        spec.bind(q, k, v, dropout_p=0.1)
    with pytest.raises(Unsupported, match="gradients"):
        spec.bind(q.requires_grad_(), k, v)
    q.requires_grad_(False)
    with torch.no_grad():   # the same call under no_grad is inference: bound
        spec.bind(q.requires_grad_(), k, v)
    q.requires_grad_(False)
    with pytest.raises(Unsupported, match="one dtype"):
        spec.bind(q, k.half(), v)
    with pytest.raises(Unsupported, match="enable_gqa"):
        spec.bind(*_qkv(h=4, kv_heads=2))
    with pytest.raises(Unsupported, match="is_causal"):
        spec.bind(q, k, v, attn_mask=torch.ones(7, 9, dtype=torch.bool), is_causal=True)
    with pytest.raises(Unsupported, match="broadcast"):
        spec.bind(q, k, v, attn_mask=torch.ones(7, 8, dtype=torch.bool))


def test_sampled_masks_are_realistic_and_keep_the_masks_layout():
    variant = CASES["expanded_key_head"]
    ins = get_spec(SDPA).random_inputs(variant, seed=5)
    assert [tuple(t.stride()) for t in ins] == [s.stride for s in variant.inputs]
    mask = ins[3]
    assert mask.dtype == torch.bool and 0.5 < mask.float().mean().item() < 0.95
    added = get_spec(SDPA).random_inputs(CASES["added_mask"], seed=5)[3]
    assert (added == torch.finfo(added.dtype).min).any() and (added == 0).any()


# ----------------------------------------------------------------------------- written out by hand


class _EagerAttention(nn.Module):
    """Attention as transformers' eager_attention_forward writes it (Gemma 2's soft-capping, an added mask, a
    float32 softmax, an inference dropout), around projections."""

    def __init__(self, d=32, heads=2, softcap: float | None = 20.0, mask: str = "added"):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.heads, self.softcap, self.mask = heads, softcap, mask

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        w = torch.matmul(q, k.transpose(2, 3)) * (d // self.heads) ** -0.5
        if self.softcap is not None:
            w = w / self.softcap
            w = torch.tanh(w)
            w = w * self.softcap
        blocked = torch.ones(s, s, dtype=torch.bool).triu(1)[None, None]
        if self.mask == "added":
            w = w + torch.zeros(s, s, dtype=x.dtype).masked_fill(blocked[0, 0], torch.finfo(x.dtype).min)
        else:
            w = w.masked_fill(blocked, float("-inf"))
        p = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        p = F.dropout(p, p=0.0, training=self.training)
        return torch.matmul(p, v).transpose(1, 2).reshape(b, s, d)


@pytest.mark.parametrize("softcap, mask", [(20.0, "added"), (None, "filled")])
def test_a_written_out_attention_is_one_card_that_takes_its_operators_share(tmp_path, softcap, mask):
    torch.manual_seed(0)
    s = captured(_EagerAttention(softcap=softcap, mask=mask), torch.randn(2, 8, 32), tmp_path)
    try:
        (card,) = s.cards.by_op(CHAIN)
        p = card.variant.param_dict
        assert card.calls == 1 and card.share > 0
        assert p["softcap"] == softcap and p["scale"] == pytest.approx(16 ** -0.5)
        assert (p["fill"] is None) == (mask == "added") and card.variant.inputs[3] is not None
        assert [tuple(t.shape) for t in card.variant.inputs[:3]] == [(2, 2, 8, 16)] * 3
        # the scores' softmax and the products are inside it
        assert all(c.share == 0.0 for c in s.cards if c.op in ("softmax", "matmul", "tanh"))
    finally:
        s.close()


def test_plain_pytorch_attention_is_a_card_too(tmp_path):
    """The built-in example's attention as plain PyTorch writes it (``q @ k.transpose(-1, -2)``, a softmax in the
    scores' dtype, no mask, the heads unbound from one projection) is a softmax_attention card; its SDPA call another."""
    model, ids = kforge.example("tiny_transformer")
    s = captured(model, ids, tmp_path)
    try:
        (chain,) = s.cards.by_op(CHAIN)
        (sdpa,) = s.cards.by_op(SDPA)
        assert chain.variant.param_dict == {"scale": 0.25, "softcap": None, "fill": None}
        assert chain.variant.inputs[3] is None and chain.share > 0 and sdpa.variant.param_dict["is_causal"]
        assert all(c.share == 0.0 for c in s.cards if c.op in ("softmax", "matmul"))
    finally:
        s.close()


def test_the_written_out_chains_kernel_is_judged_and_replaces_the_chain_in_the_compiled_graph(tmp_path):
    torch.manual_seed(0)
    s = captured(_EagerAttention(), torch.randn(2, 8, 32), tmp_path)
    try:
        judged_and_placed(s, CHAIN)
    finally:
        s.close()


# ----------------------------------------------------------------------------- the seed models


def _tiny_gemma(tmp_path, attn: str, dtype=torch.float32):
    """Gemma 4 at 5 layers (four sliding, one full) and 16 tokens, its sliding window 4 so that the sliding layers'
    mask is a real window."""
    from kforge import models

    extras.module("transformers", "models")
    model, ids = models.gemma4_e2b(dtype=dtype, layers=5, tokens=16, attn_implementation=attn,
                                   overrides={"vocab_size": 4096, "vocab_size_per_layer_input": 4096,
                                              "sliding_window": 4})
    s = kforge.Session(model, ids, device="cpu", workdir=tmp_path / "wd")
    s.capture(timing_budget_ms=2)
    return s


def test_gemma4_sdpa_calls_are_cards_with_the_sliding_window_mask_causal_and_grouped_heads(tmp_path, judge):
    s = _tiny_gemma(tmp_path, "sdpa")
    try:
        cards = s.cards.by_op(SDPA)
        assert sum(c.calls for c in cards) == 5
        window = [c for c in cards if c.variant.inputs[3] is not None]
        causal = [c for c in cards if c.variant.param_dict["is_causal"]]
        assert [c.calls for c in window] == [4] and [c.calls for c in causal] == [1]
        (w,) = window
        q, k, _, mask = w.variant.inputs
        assert mask.dtype == "bool" and tuple(mask.shape) == (1, 1, 16, 16)
        assert tuple(q.shape) == (1, 8, 16, 256) and k.stride[1] == 0, "one key head, expanded for 8 query heads"
        assert tuple(causal[0].variant.inputs[0].shape) == (1, 8, 16, 512)
        for card in (w, causal[0]):
            result = judge.evaluate_variant(card.variant, _cpu_source(card.variant))
            assert result.status.is_correct, (card.signature, result.status, result.message)
    finally:
        s.close()


def test_gemma4_eager_attention_is_written_out_chains(tmp_path):
    s = _tiny_gemma(tmp_path, "eager", torch.bfloat16)
    try:
        cards = s.cards.by_op(CHAIN)
        assert sum(c.calls for c in cards) == 5 and not s.cards.by_op(SDPA)
        assert all(c.variant.inputs[0].dtype == "bfloat16" and c.variant.inputs[3] is not None for c in cards)
        assert {c.variant.param_dict["scale"] for c in cards} == {1.0}
        assert all(c.op != "softmax" or c.share == 0 for c in s.cards)
    finally:
        s.close()


def test_sd35_transformer_joint_attention_is_sdpa_cards(tmp_path, judge):
    from kforge import models

    extras.module("diffusers", "models")
    model, inputs = models.build("sd35_transformer", dtype=torch.float32, layers=1, resolution=64, tokens=8)
    s = kforge.Session(model, inputs, device="cpu", workdir=tmp_path / "wd")
    try:
        s.capture(timing_budget_ms=2)
        cards = s.cards.by_op(SDPA)
        assert cards and all(tuple(c.variant.inputs[0].shape)[1::2] == (24, 64) for c in cards)
        assert not any(c.variant.param_dict["is_causal"] or c.variant.inputs[3] is not None for c in cards)
        card = max(cards, key=lambda c: c.variant.inputs[0].shape[2])
        result = judge.evaluate_variant(card.variant, _cpu_source(card.variant))
        assert result.status.is_correct, (card.signature, result.status, result.message)
    finally:
        s.close()


# ----------------------------------------------------------------------------- deployed


class _TwoAttentions(nn.Module):
    """An SDPA call with a sliding-window mask, then attention written out by hand on its output."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 48)
        self.out = nn.Linear(16, 48)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.proj(x).view(b, s, 3, 2, 8).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=_window(s, s, 4))
        q2, k2, v2 = self.out(y.transpose(1, 2).reshape(b, s, 16)).view(b, s, 3, 2, 8).permute(2, 0, 3, 1, 4)
        w = torch.matmul(q2, k2.transpose(2, 3)) * 0.5
        return torch.matmul(F.softmax(w, dim=-1, dtype=torch.float32).to(q2.dtype), v2)


@pytest.mark.slow
def test_winners_run_in_the_applied_model_with_eagers_output(tmp_path):
    torch.manual_seed(0)
    model, x = _TwoAttentions().eval(), torch.randn(2, 8, 16)
    s = kforge.Session(model, x, device="cpu", workdir=tmp_path / "wd")
    try:
        s.capture(timing_budget_ms=2)
        keys = [c.key for c in s.cards if c.op in (SDPA, CHAIN)]
        assert sorted(s.cards[k].op for k in keys) == [SDPA, CHAIN]
        search_until_correct(s, keys, iterations=1)
        with torch.no_grad():
            expected = model(x)
        dep = s.apply(all_winners=True)
        try:
            with torch.no_grad():
                got = model(x)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
            ran = {k.variant.op: dep.calls.get(k.variant.signature, 0) for k in dep.kernels}
            assert ran.get(SDPA, 0) > 0 and ran.get(CHAIN, 0) > 0, (ran, dep.calls, dep.skipped)
        finally:
            dep.remove()
    finally:
        s.close()


# ----------------------------------------------------------------------------- CUDA


def _gemma_e2b(device: str = "cpu") -> list[Variant]:
    """Gemma 4 E2B at 512 tokens, bf16: a sliding layer (8 query heads of 256, the one key head expanded, the
    window's boolean mask) and a full layer (heads of 512, causal); the SD3.5 transformer's joint attention at
    1024 px (24 heads of 64, 4096 + 333 tokens, laid out [batch, tokens, heads, width]); Gemma 2's written-out
    chain (soft-capped at 50, an added mask)."""
    def sig(shape, stride, dtype="bfloat16"):
        return TensorSig(tuple(shape), dtype, tuple(stride), device)

    out = []
    for e, causal in ((256, False), (512, True)):
        q = sig((1, 8, 512, e), (512 * 8 * e, e, 8 * e, 1))
        kv = sig((1, 8, 512, e), (512 * e, 0, e, 1))
        mask = None if causal else sig((1, 1, 512, 512), (512 * 512, 512 * 512, 512, 1), "bool")
        o = sig((1, 8, 512, e), (8 * 512 * e, 512 * e, e, 1))
        out.append(Variant(SDPA, (q, kv, kv, mask), (("is_causal", causal), ("scale", 1.0), ("enable_gqa", False)),
                           (o,)))
    n = 4096 + 333
    q = sig((1, 24, n, 64), (n * 1536, 64, 1536, 1))
    out.append(Variant(SDPA, (q, q, q, None), (("is_causal", False), ("scale", None), ("enable_gqa", False)),
                       (sig((1, 24, n, 64), (24 * n * 64, n * 64, 64, 1)),)))
    q = sig((1, 8, 512, 256), (8 * 512 * 256, 512 * 256, 256, 1))
    out.append(Variant(CHAIN, (q, q, q, sig((1, 1, 512, 512), (512 * 512, 512 * 512, 512, 1))),
                       (("scale", 0.0625), ("softcap", 50.0), ("fill", None)), (q,)))
    return out


def test_the_cuda_design_fits_the_seed_shapes_and_passes_the_screen():
    for variant in _gemma_e2b():
        strategy = get_strategy(f"{variant.op}.cuda.flash_tiles")
        assert strategy.applies(variant, H100), variant.signature
        configs = list(strategy.configs(variant, H100))
        assert len(configs) > 1
        e = variant.inputs[0].shape[-1]
        for config in configs:
            threads = 32 * config["warps"]
            assert config["block_q"] * variant.inputs[2].shape[-1] <= 64 * threads, "output rows fit in registers"
            src = strategy.render(variant, config, H100)
            assert screen(src, "cuda") == ()
        default = strategy.default(variant, H100)
        assert default["block_q"] == (16 if e == 512 else 32 if e == 256 else 64), (variant.signature, default)
    # a head too wide for any tile in 48 KB of shared memory has no design there
    small = DeviceInfo("cuda", "small", "sm_90", 1, 1.0, 0, 48 << 10)
    assert not get_strategy(f"{SDPA}.cuda.flash_tiles").applies(_gemma_e2b()[1], small)


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed")
@pytest.mark.slow
def test_the_cuda_design_builds_for_sm90():
    """The seed shapes, and the cases with what they lack: a boolean mask filled, float16, float32, an added float32
    mask on SDPA, grouped heads."""
    extra = [CASES[name].on("cuda:0") for name in ("chain_filled_float16", "added_mask", "gqa")]
    for variant in _gemma_e2b() + extra:
        strategy = get_strategy(f"{variant.op}.cuda.flash_tiles")
        compile_source(strategy.render(variant, strategy.default(variant, H100), H100), "cuda", "sm_90")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_on_the_gpu_every_configuration_matches_eager(name):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    info = device_info("cuda")
    variant = CASES[name].on("cuda:0")
    spec = get_spec(variant.op)
    strategy = get_strategy(f"{variant.op}.cuda.flash_tiles")
    ins = [None if t is None else t.cuda() for t in spec.random_inputs(CASES[name], seed=3)]
    ref = spec.reference(ins, variant.param_dict)
    rtol, atol = spec.tolerance(variant.outputs[0].dtype)
    for config in strategy.configs(variant, info):
        kernel = DeployedKernel(variant, Kernel(compile_source(strategy.render(variant, config, info), "cuda",
                                                               info.arch).path))
        (got,) = kernel(tuple(ins))
        scale = ref.float().abs().max().item()
        err = (got.float() - ref.float()).abs()
        assert (err <= atol * scale + rtol * ref.float().abs()).all(), (config, err.max().item())


def test_the_llm_prompt_names_attentions_building_blocks_and_the_problem():
    from kforge.ops import Card
    from kforge.proposers import ProposalRequest
    from kforge.proposers._llm import card_prompt

    sliding, full, joint, chain = (v.on("cuda:0") for v in _gemma_e2b())
    text = card_prompt(ProposalRequest(Card(sliding, 1, 10.0, 0.5, None), "cuda", H100))
    for needle in ("# An attention card", "4096 query rows (leading dimensions [1, 8] x 512 queries), 512 keys",
                   "one head expanded over the query heads (stride 0)", "boolean, True keeps a key",
                   "never assume its pattern", "online softmax", "CuTe", "wgmma", "sm_90a", "gives zeros"):
        assert needle in text, needle
    text = card_prompt(ProposalRequest(Card(full, 1, 10.0, 0.5, None), "cuda", H100))
    assert "causal (key j is visible to query i where j <= i" in text and "Mask: an input" not in text
    text = card_prompt(ProposalRequest(Card(chain, 1, 10.0, 0.5, None), "cuda", H100))
    for needle in ("soft-capped as 50.0 * tanh(s / 50.0)", "bfloat16, added to the scores",
                   "writes and reads the whole score matrix (512 x 512 per head)", "is NaN"):
        assert needle in text, needle
    gqa = CASES["gqa"]
    text = card_prompt(ProposalRequest(Card(gqa, 1, 10.0, 0.5, None), "cpu", CPU))
    assert "2 query heads share each key and value head (query head h reads key head h // 2)" in text
    assert "(q . k_j) * 0.3" in text and "no library beyond OpenMP" in text and "CuTe" not in text
    assert "1/sqrt(16)" in card_prompt(ProposalRequest(Card(CASES["causal"], 1, 10.0, 0.5, None), "cpu", CPU))
