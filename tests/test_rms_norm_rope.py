"""Gemma 4's q/k RMSNorm followed by the rotary embedding: one ``rms_norm_rope`` card and kernel, found in the graph
(a small module written as transformers writes Gemma's attention, and Gemma 4 itself), judged, placed in the
compiled graph; its CUDA design built, and run on a GPU where there is one."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import kforge
from kforge.deploy import DeployedKernel
from kforge.kernels import DeviceInfo, Kernel, compile_source, device_info
from kforge.kernels._compile import find_nvcc
from kforge.kernels._screen import screen
from kforge.ops import TensorSig, Variant, get_spec
from kforge.proposers.builtin import strategies_for

import extras
from fused_checks import captured, judged_and_placed


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Attention(nn.Module):
    """A query projection, Gemma's RMSNorm (float32 statistics and weight, then the input's dtype), the rotary
    embedding (cos and sin of the positions' angles, unsqueezed over the heads), then the heads first."""

    def __init__(self, d: int = 32, heads: int = 2, head_dim: int = 16, shared: bool = False):
        super().__init__()
        self.q = nn.Linear(d, heads * head_dim, bias=False)
        self.weight = nn.Parameter(torch.randn(head_dim))
        self.inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.heads, self.head_dim, self.shared = heads, head_dim, shared

    def norm(self, x):
        xf = x.float()
        y = xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + 1e-6, -0.5)
        return (y * self.weight.float()).type_as(x)

    def forward(self, x):
        b, s, _ = x.shape
        angles = torch.arange(s, dtype=torch.float32)[:, None] * self.inv_freq[None]
        emb = torch.cat((angles, angles), dim=-1)[None]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        q = self.norm(self.q(x).view(b, s, self.heads, self.head_dim))
        rotated = q * cos.unsqueeze(2) + _rotate_half(q) * sin.unsqueeze(2)
        out = rotated.transpose(1, 2).sum(-1)
        return out + q.sum() if self.shared else out   # shared: the normed query read elsewhere too


@pytest.fixture
def session(tmp_path):
    torch.manual_seed(0)
    s = captured(_Attention(), torch.randn(2, 8, 32), tmp_path)
    yield s
    s.close()


def test_the_graph_capture_finds_the_norm_and_rotation_as_one_call_that_takes_their_share(session):
    (card,) = session.cards.by_op("rms_norm_rope")
    assert card.calls == 1 and card.share > 0
    assert [tuple(s.shape) for s in card.variant.inputs] == [(2, 8, 2, 16), (16,), (1, 8, 1, 16), (1, 8, 1, 16)]
    assert tuple(card.variant.outputs[0].shape) == (2, 8, 2, 16)
    assert dict(card.variant.params)["eps"] == pytest.approx(1e-6)
    # the rotation's products are inside it
    rotations = [c for c in session.cards.by_op("mul") if tuple(c.variant.outputs[0].shape) == (2, 8, 2, 16)]
    assert rotations and all(c.share == 0.0 for c in rotations)


def test_a_normed_value_read_elsewhere_is_not_fused(tmp_path):
    torch.manual_seed(0)
    s = captured(_Attention(shared=True), torch.randn(2, 8, 32), tmp_path)
    assert not s.cards.by_op("rms_norm_rope")
    s.close()


def test_the_cpu_kernel_is_judged_correct_and_replaces_the_chain_in_the_compiled_graph(session):
    judged_and_placed(session, 'rms_norm_rope')


def test_gemma4_gives_one_card_for_each_query_and_key_norm(tmp_path):
    """Gemma 4 as transformers builds it (bf16: the norm's float32 copies are in the graph): at one layer a
    full-attention layer, its query (8 heads of 512) and key (1 head), each one call."""
    from kforge import models

    extras.module("transformers", "models")
    model, ids = models.gemma4_e2b(dtype=torch.bfloat16, layers=1, tokens=16)
    s = kforge.Session(model, ids, device="cpu", workdir=tmp_path / "wd")
    s.capture(timing_budget_ms=2)
    cards = s.cards.by_op("rms_norm_rope")
    shapes = sorted(tuple(c.variant.inputs[0].shape) for c in cards)
    assert shapes == [(1, 16, 1, 512), (1, 16, 8, 512)], [c.signature for c in cards]
    assert all(c.calls == 1 and c.variant.inputs[0].dtype == "bfloat16" for c in cards)
    assert all(tuple(c.variant.inputs[2].shape) == (1, 16, 1, 512) for c in cards)
    s.close()


H200 = DeviceInfo("cuda", "NVIDIA H200", "sm_90", 132, 4800.0, 50 << 20, 227 << 10)


def _gemma_query(device: str = "cpu") -> Variant:
    """Gemma 4 E2B's query in a full-attention layer at 512 tokens: a [1, 512, 4096] projection viewed as 8 heads
    of 512; cos and sin [1, 512, 1, 512]."""
    def sig(shape, stride):
        return TensorSig(tuple(shape), "bfloat16", tuple(stride), device)

    x = sig((1, 512, 8, 512), (512 * 4096, 4096, 512, 1))
    cs = sig((1, 512, 1, 512), (512 * 512, 512, 512, 1))
    return Variant("rms_norm_rope", (x, sig((512,), (1,)), cs, cs), (("eps", 1e-6),), (x,))


def test_the_cuda_design_reads_each_half_once_and_passes_the_screen():
    variant = _gemma_query()
    (strategy,) = strategies_for("rms_norm_rope", "cuda")
    assert strategy.applies(variant, H200)
    config = strategy.default(variant, H200)
    assert config["vec"] == 8, "16-byte accesses: the half row (256) and every stride are multiples of 8"
    src = strategy.render(variant, config, H200)
    assert screen(src, "cuda") == ()
    # the row's offsets: heads and tokens of the input; tokens only of cos and sin (broadcast over the heads)
    # (the heads and tokens of a dense input fold to one factor: kforge.kernels._offsets.lin)
    assert "xo = ((r) * 512L)," in src and "co = (((r) / 8L) * 512L)," in src
    assert "#define D 512" in src
    assert {c["vec"] for c in strategy.configs(variant, H200)} == {8, 4, 2, 1}
    # a row whose half is no multiple of 8 (260 = 4 x 65) gets narrower accesses only
    x = TensorSig((3, 1, 520), "float16", (520, 520, 1), "cpu")
    cs = TensorSig((1, 1, 520), "float16", (520, 520, 1), "cpu")
    odd = Variant("rms_norm_rope", (x, TensorSig((520,), "float16", (1,), "cpu"), cs, cs), (("eps", 1e-5),), (x,))
    assert strategy.default(odd, H200)["vec"] == 4 and {c["vec"] for c in strategy.configs(odd, H200)} == {4, 2, 1}


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed")
def test_the_cuda_design_builds_for_sm90():
    variant = _gemma_query()
    (strategy,) = strategies_for("rms_norm_rope", "cuda")
    for config in list(strategy.configs(variant, H200))[:2]:
        compile_source(strategy.render(variant, config, H200), "cuda", "sm_90")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,shape,heads_stride", [("bfloat16", (1, 512, 8, 512), 4096),
                                                      ("bfloat16", (1, 512, 1, 256), 256),
                                                      ("float16", (2, 33, 3, 40), 120),
                                                      ("float32", (1, 7, 2, 520), 1040)])
def test_on_the_gpu_the_kernel_matches_the_reference_and_replays_in_a_cuda_graph(dtype, shape, heads_stride):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    spec = get_spec("rms_norm_rope")
    dt = getattr(torch, dtype)
    b, s, h, d = shape
    x = torch.randn(b, s, heads_stride, device="cuda", dtype=dt)[..., :h * d].view(b, s, h, d)
    w = torch.randn(d, device="cuda", dtype=dt)
    angles = torch.arange(s, device="cuda", dtype=torch.float32)[:, None] * torch.rand(d // 2, device="cuda")[None]
    emb = torch.cat((angles, angles), -1)[None].expand(b, s, d)
    cos, sin = emb.cos().to(dt).unsqueeze(2), emb.sin().to(dt).unsqueeze(2)
    call = spec.bind(x, w, cos, sin, 1e-6)
    ref = spec.reference(list(call.inputs), call.params)
    variant = spec.variant(call, [ref])
    info = device_info("cuda")
    (strategy,) = strategies_for("rms_norm_rope", "cuda")
    assert strategy.applies(variant, info)
    rtol, atol = spec.tolerance(dtype)
    for config in strategy.configs(variant, info):
        kernel = DeployedKernel(variant, Kernel(compile_source(strategy.render(variant, config, info), "cuda",
                                                               info.arch).path))
        (got,) = kernel((x, w, cos, sin))
        scale = ref.float().abs().max().item()
        err = (got.float() - ref.float()).abs()
        assert (err <= atol * scale + rtol * ref.float().abs()).all(), (config, err.max().item())
    # the last configuration in a CUDA graph, on an input of its own
    xg = x.clone()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        kernel((xg, w, cos, sin))
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        (captured,) = kernel((xg, w, cos, sin))
    xg.copy_(torch.randn_like(xg))
    graph.replay()
    torch.cuda.synchronize()
    fresh = spec.reference([xg, w, cos, sin], call.params)
    assert ((captured.float() - fresh.float()).abs() <= atol * fresh.float().abs().max()
            + rtol * fresh.float().abs()).all()
