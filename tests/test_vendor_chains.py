"""Vendor-headed chains (issue 45): a matrix product or a convolution and the chain after it, found in the graph,
computed on the CPU by a generated C/OpenMP kernel, and written for Hopper on CUTLASS (built with nvcc where
nvcc and the CUTLASS headers are here)."""
from __future__ import annotations

import collections

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kforge import models
from kforge.kernels import compile_source, load_verified
from kforge.kernels._compile import find_nvcc
from kforge.ops import Unsupported, torch_dtype
from kforge.proposers.builtin._vendor_cpu import render_cpu
from kforge.proposers.builtin._vendor_cuda import (CutlassConfig, build_cutlass, cutlass_root, design, evt_inputs,
                                                   render_cuda)
from kforge.regions._vendor import aten_graph_calls, aten_graphs, find_vendor_chains, graph_values

import extras


# ----------------------------------------------------------------------------- small graphs


class Mixed(nn.Module):
    """One of each head kind, each followed by a chain of its own."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 32)
        self.lin2 = nn.Linear(16, 32)
        self.gn = nn.GroupNorm(4, 32)
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        with torch.no_grad():   # NB: eval batch norm with statistics that are not the identity
            self.bn.running_mean.normal_()
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x, img, a, b):
        y = F.relu(self.lin(x)) * 0.5                          # linear (3-d input) + relu + scale
        z = self.gn(self.lin2(x[0]))                           # linear + group norm + swish
        z = z * torch.sigmoid(z)
        c = F.relu(self.bn(self.conv(img)) + img.repeat(1, 2, 1, 1))   # conv + batch norm + residual + relu
        d = torch.softmax(torch.bmm(a, b) * 0.1, -1)           # bmm + scale + softmax
        e = torch.tanh(self.up(c))                             # transposed conv + tanh
        f = (a @ b[0]).clamp(-1, 1)                            # matmul + clamp
        return y, z, c, d, e, f


def _mixed_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [t.to(dtype) for t in (torch.randn(2, 5, 16, generator=g), torch.randn(2, 4, 6, 6, generator=g),
                                  torch.randn(3, 5, 7, generator=g), torch.randn(3, 7, 9, generator=g))]


def _mixed_chains(dtype=torch.float32):
    model = Mixed().eval().to(dtype)
    ((gm, args),) = aten_graph_calls(model, *_mixed_inputs(dtype))
    return gm, find_vendor_chains(gm.graph), args


def test_finds_each_head_kind_with_its_chain():
    gm, found, _ = _mixed_chains()
    got = [(fc.chain.head.kind, fc.chain.ir.ops if fc.chain.ir else ()) for fc in found]
    bn = ("sub", "add", "rsqrt", "mul", "mul", "add")
    assert got == [("addmm", ("relu", "mul")),
                   ("addmm", ("layer_norm", "mul", "add", "sigmoid", "mul")),
                   ("conv", (*bn, "add", "relu")),
                   ("bmm", ("mul", "softmax")),
                   ("conv_transpose", ("tanh",)),
                   ("mm", ("clamp",))]
    linear, gn, conv, bmm, up, mm = (fc.chain for fc in found)
    # F.linear's 3-d input: the product is [10, 32], the tail reads it as [2, 5, 32]
    assert (linear.head.m, linear.head.n, linear.head.k) == (10, 32, 16) and linear.frame == (2, 5, 32)
    assert linear.head.b_major == "col"   # the weight's transpose: K-major, as cuBLAS's TN
    # group norm: the frame splits the channels into groups, a layer norm over [C / G, HW]
    assert gn.groups == 4 and gn.frame == (5, 4, 8, 1)
    assert conv.head.conv.padding == (1, 1) and conv.head.bias is not None and conv.reduction is None
    assert bmm.head.batch == 3 and bmm.reduction == "softmax"
    assert up.head.conv.transposed and up.head.conv.stride == (2, 2)
    assert mm.frame == (3, 5, 9)


def test_a_chain_computes_what_the_graph_computes():
    gm, found, args = _mixed_chains()
    values = graph_values(gm, args)
    for fc in found:
        ins = [values[n] for n in fc.inputs]
        (out,) = fc.chain.reference(ins)
        assert torch.allclose(out, values[fc.outputs[0]], rtol=1e-5, atol=1e-5), fc.chain.describe()


class Escapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return torch.relu(y), y        # the product itself is read: it must be written, no chain fuses it


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, r):
        return torch.clamp(self.lin(x) * 2.0 + r, -3.0, 3.0)


def test_no_chain_where_the_product_is_read_elsewhere():
    (gm,) = aten_graphs(Escapes().eval(), torch.randn(4, 8))
    assert find_vendor_chains(gm.graph) == []


def test_a_residual_is_an_input_of_the_chain():
    (gm,) = aten_graphs(Residual().eval(), torch.randn(4, 8), torch.randn(4, 8))
    (fc,) = find_vendor_chains(gm.graph)
    assert fc.chain.ir.ops == ("mul", "add", "clamp")
    assert len(fc.chain.inputs) == 4   # x, weight^T, bias, the residual
    assert [t.source for t in fc.chain.tail_inputs] == [-1, 3]


# ----------------------------------------------------------------------------- the C/OpenMP kernel


def _run_cpu(chain, seed: int):
    built = compile_source(render_cpu(chain), "cpu", "native")
    kernel = load_verified(built.path, built.sha256)
    ins = chain.random_inputs(seed)
    outs = [torch.empty_strided(s.shape, s.stride, dtype=torch_dtype(s.dtype)).fill_(float("nan"))
            for s in chain.outputs]
    before = [t.clone() for t in ins]
    kernel.launch(ins, outs, [], torch.empty(kernel.workspace_bytes, dtype=torch.uint8))
    assert all(torch.equal(a, b) for a, b in zip(ins, before)), "the kernel wrote to an input"
    return outs, chain.reference(ins)


def _rel(out, ref) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_kernel_of_every_chain_matches_eager(dtype):
    _, found, _ = _mixed_chains(dtype)
    assert len(found) == 6
    bound = 1e-5 if dtype == torch.float32 else 1e-2
    for fc in found:
        for seed in (1, 2):
            outs, refs = _run_cpu(fc.chain, seed)
            for o, r in zip(outs, refs):
                assert not torch.isnan(o).any(), f"{fc.chain.describe()}: an output element was never written"
                assert _rel(o, r) < bound, fc.chain.describe()


class Grouped(nn.Module):
    """Strided and grouped convolutions (ResNeXt-like), a 1-d convolution, and a log-softmax after a bmm whose
    second operand is transposed."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=4, bias=False)
        self.c2 = nn.Conv1d(3, 6, 5, dilation=2)

    def forward(self, x, s, a, b):
        return (torch.sigmoid(self.c1(x)) * 3.0, F.gelu(self.c2(s), approximate="tanh"),
                torch.log_softmax(torch.bmm(a, b.transpose(1, 2)), -1).amax(-1, keepdim=True))


def test_cpu_kernel_of_strided_grouped_and_transposed_operands():
    model = Grouped().eval()
    args = (torch.randn(2, 8, 9, 9), torch.randn(2, 3, 20), torch.randn(2, 6, 8), torch.randn(2, 5, 8))
    (gm,) = aten_graphs(model, *args)
    found = find_vendor_chains(gm.graph)
    assert [fc.chain.ops for fc in found] == [("conv", "sigmoid", "mul"), ("conv", "gelu"), ("bmm", "log_softmax")]
    assert found[2].chain.head.b_major == "col"
    for fc in found:
        outs, refs = _run_cpu(fc.chain, 3)
        assert _rel(outs[0], refs[0]) < 1e-5, fc.chain.describe()


# ----------------------------------------------------------------------------- the seed models, reduced


class Bottleneck(nn.Module):
    """torchvision's ResNet-50 bottleneck (torchvision is not installable beside this torch on the CPU machine)."""

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        cout = width * 4
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = self.down(x) if self.down is not None else x
        return F.relu(out + identity)


class SmallResNet(nn.Module):
    """ResNet-50's stem, its first stage's first two bottlenecks and the second stage's first (a downsample with
    stride), its head; channel widths divided by 4."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16)
        self.blocks = nn.Sequential(Bottleneck(16, 16), Bottleneck(64, 16), Bottleneck(64, 32, stride=2))
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = self.blocks(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _summary(found) -> collections.Counter:
    return collections.Counter(fc.chain.describe() for fc in found)


def test_resnet_bottlenecks_give_conv_batch_norm_relu_and_add_chains():
    model = SmallResNet().eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 32, 32)
    ((gm, args),) = aten_graph_calls(model, x)
    found = find_vendor_chains(gm.graph)
    bn = ("sub", "add", "rsqrt", "mul", "mul", "add")
    ops = collections.Counter(fc.chain.ops for fc in found)
    # stem + two per block: conv, batch norm, relu
    assert ops[("conv", *bn, "relu")] == 1 + 2 * 3
    # each block's last conv: batch norm, the residual add, relu (the last block's also the global average pool:
    # a reduction over H, W); the downsample's conv: its batch norm alone
    assert ops[("conv", *bn, "add", "relu")] == 2
    assert ops[("conv", *bn, "add", "relu", "mean")] == 1
    assert ops[("conv", *bn)] == 2
    assert len(found) == 12     # the final linear has no chain after it
    print("\nResNet-50 (reduced):", dict(_summary(found)))
    # a residual chain on the C/OpenMP backend against the graph's own values
    values = graph_values(gm, args)
    for fc in (found[3], found[-2]):   # a residual block's chain, and the one ending in the pool
        built = compile_source(render_cpu(fc.chain), "cpu", "native")
        kernel = load_verified(built.path, built.sha256)
        out = torch.full_like(values[fc.outputs[0]], float("nan"))
        kernel.launch([values[n] for n in fc.inputs], [out], [], torch.empty(kernel.workspace_bytes, dtype=torch.uint8))
        assert _rel(out, values[fc.outputs[0]]) < 1e-5, fc.chain.describe()


def test_sd35_transformer_chains():
    extras.module("diffusers", "models")
    model, inputs = models.build("sd35_transformer", dtype=torch.float32, layers=1, resolution=64, tokens=8)
    found = [fc for gm in aten_graphs(model, **inputs) for fc in find_vendor_chains(gm.graph)]
    print("\nSD3.5 transformer (1 layer):", dict(_summary(found)))
    ops = [fc.chain.ops for fc in found]
    assert ("addmm", "gelu") in ops                                  # the feed-forward's linear + tanh GELU
    assert any(o[0] == "addmm" and "layer_norm" in o for o in ops)   # a projection, then the next norm
    assert all(fc.chain.head.kind in ("addmm", "mm", "bmm", "conv") for fc in found)


def test_gemma4_chains():
    extras.module("transformers", "models")
    model, ids = models.gemma4_e2b(dtype=torch.float32, layers=2, tokens=16,
                                   overrides={"vocab_size": 4096, "vocab_size_per_layer_input": 4096})
    found = [fc for gm in aten_graphs(model, ids) for fc in find_vendor_chains(gm.graph)]
    print("\nGemma 4 (2 layers):", dict(_summary(found)))
    ops = [fc.chain.ops for fc in found]
    assert any(o[0] == "mm" and "gelu" in o for o in ops)            # the MLP's gate projection + tanh GELU
    assert any(o[0] == "mm" and "tanh" in o for o in ops)            # the final logit soft-capping


# ----------------------------------------------------------------------------- CUDA on CUTLASS


def _bf16_chains():
    class Lin(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(256, 512)

        def forward(self, x, r):
            return F.relu(self.l(x)) + r

    class ConvBn(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.bn = nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64)

        def forward(self, x):
            return F.relu(self.bn(self.c(x)) + x)

    def scores(a, b):
        return torch.softmax(torch.bmm(a, b) * 0.125, -1)

    bf = torch.bfloat16
    (g1,) = aten_graphs(Lin().eval().to(bf), torch.randn(4, 64, 256, dtype=bf), torch.randn(4, 64, 512, dtype=bf))
    (g2,) = aten_graphs(ConvBn().eval().to(bf), torch.randn(2, 64, 16, 16, dtype=bf))
    (g3,) = aten_graphs(scores, torch.randn(4, 128, 64, dtype=bf), torch.randn(4, 64, 128, dtype=bf))
    _, mixed, _ = _mixed_chains(bf)
    return (find_vendor_chains(g1.graph)[0].chain, find_vendor_chains(g2.graph)[0].chain,
            find_vendor_chains(g3.graph)[0].chain, mixed)


def test_cuda_designs_follow_the_chain():
    lin, conv, rows, mixed = _bf16_chains()
    assert design(lin) == "evt"
    assert [e.kind for e in evt_inputs(lin)] == ["row", "src"]   # the bias per column, the residual as C
    assert design(conv) == "conv"
    assert design(rows) == "gemm_then_rows"                       # softmax: a reduction over the rows
    assert "kf_block<1>" in render_cuda(rows)                     # the row maximum, across the block
    by_kind = {fc.chain.head.kind: fc.chain for fc in mixed}
    with pytest.raises(Unsupported):
        design(by_kind["bmm"])                                    # K = 7: rows TMA cannot read
    with pytest.raises(Unsupported):
        design(by_kind["conv_transpose"])
    src = render_cuda(lin, CutlassConfig((128, 256, 64), (2, 1), 4, 8, "n", "cooperative"))
    assert "Shape<_128, _256, _64>" in src and "StageCount<4>" in src and "max_swizzle_size = 8" in src
    assert "Sm90RowBroadcast" in src and "Sm90SrcFetch" in src
    f32 = _mixed_chains(torch.float32)[1][0].chain
    with pytest.raises(Unsupported, match="TF32"):
        design(f32)


_BUILD = pytest.mark.skipif(find_nvcc() is None or cutlass_root() is None,
                            reason='needs nvcc and the CUTLASS headers: pip install "kforge[cutlass]"')


@_BUILD
@pytest.mark.slow
@pytest.mark.parametrize("which", ["evt", "conv"])
def test_cutlass_sources_build_with_nvcc(which):
    lin, conv, _, _ = _bf16_chains()
    chain = lin if which == "evt" else conv
    config = CutlassConfig((128, 128, 64), (1, 2), 0, 1, "heuristic", "cooperative")
    built = build_cutlass(render_cuda(chain, config))
    data = built.path.read_bytes()
    assert data[:4] == b"\x7fELF" and b"kf_launch" in data and b"kf_workspace_bytes" in data
    print(f"\n{which}: {'cached' if built.cached else f'built in {built.seconds:.0f} s'}; binary wall: "
          + ("passes" if not built.wall else "; ".join(built.wall[:4])))
    again = build_cutlass(render_cuda(chain, config))
    assert again.cached and again.sha256 == built.sha256
