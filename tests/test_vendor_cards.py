"""Vendor-headed chains as cards (issue 45): a capture option makes each matrix product or convolution with the chain
after it one ``vendor_chain`` card, the built-in library has kernels for it (C/OpenMP here, CUTLASS designs on CUDA),
the judge holds it to a float32 tolerance that refuses reduced precision, and a winner runs in the model's graph."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kforge
from kforge.evaluate import Evaluator, Status
from kforge.kernels import DeviceInfo
from kforge.ops import Card, get_spec
from kforge.proposers import ProposalRequest
from kforge.proposers._llm import card_prompt
from kforge.proposers.builtin import strategies_for
from kforge.proposers.builtin._vendor_cpu import render_cpu
from kforge.proposers.builtin._vendor_cuda import config_space, default_config, design
from kforge.regions import VENDOR_CHAIN, VendorChain, chain_variant, vendor_chain
from kforge.regions._capture import chains_by_default
from kforge.regions._deploy import partition
from kforge.regions._vendor import aten_graph_calls, find_vendor_chains
from kforge.regions._vendor_spec import chain_source
from kforge.regions._vendor_strategies import has_cuda_design

from scripted import search_until_correct

H200 = DeviceInfo("cuda", "H200", "sm_90", 132, 4250.0)


class LinearChain(nn.Module):
    """nn.Linear (bias) + GELU + a residual add, then a second Linear + ReLU."""

    def __init__(self, dim: int = 64):
        super().__init__()
        self.up = nn.Linear(dim, dim)
        self.down = nn.Linear(dim, dim)

    def forward(self, x):
        h = F.gelu(self.up(x)) + x
        return F.relu(self.down(h))


class ConvChain(nn.Module):
    """Conv2d + BatchNorm2d (eval, statistics that are not the identity) + ReLU."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        with torch.no_grad():
            self.bn.running_mean.normal_()
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def linear_chain(seed: int = 0):
    torch.manual_seed(seed)
    return LinearChain().eval(), torch.randn(2, 16, 64)


def conv_chain(seed: int = 0):
    torch.manual_seed(seed)
    return ConvChain().eval(), torch.randn(2, 4, 8, 8)


def _chains(model, x, dtype=torch.float32):
    ((gm, _),) = aten_graph_calls(model.to(dtype), x.to(dtype))
    return [fc.chain for fc in find_vendor_chains(gm.graph)]


def _eager(model, x):
    with torch.no_grad():
        return type(model).forward(model, x)


# ----------------------------------------------------------------------------- the card kind


def test_a_chain_round_trips_through_its_json_and_its_variant():
    chains = _chains(*linear_chain()) + _chains(*conv_chain())
    assert [c.head.kind for c in chains] == ["addmm", "addmm", "conv"]
    for c in chains:
        again = VendorChain.loads(c.dumps())
        assert again == c and again.key == c.key and again.dumps() == c.dumps()
        v = chain_variant(c)
        assert v.op == VENDOR_CHAIN and vendor_chain(v) == c and v.inputs == c.inputs
        # a variant moved to another device keeps its chain: the record holds no device
        assert '"cpu"' not in c.dumps() and vendor_chain(v.on("cuda:1")) == c
    with pytest.raises(ValueError, match="version"):
        VendorChain.loads(json.dumps({**json.loads(chains[0].dumps()), "v": 2}))


def test_the_spec_computes_the_chain_samples_realistic_inputs_and_describes_it():
    conv = _chains(*conv_chain())[0]
    v = chain_variant(conv)
    spec = get_spec(VENDOR_CHAIN)
    ins = spec.random_inputs(v, seed=3)
    assert [tuple(t.shape) for t in ins] == [s.shape for s in v.inputs]
    var = ins[4]   # the batch norm's running variance: positive, as a model's is
    assert tuple(var.shape) == (8,) and bool((var > 0).all())
    ref = spec.reference(ins, v.param_dict)[0]
    torch.testing.assert_close(ref, conv.reference(ins)[0])
    # eager's spelling (F.conv2d, F.batch_norm, relu) gives the same values
    torch.testing.assert_close(spec.run_eager(ins, v.param_dict)[0], ref, rtol=1e-5, atol=1e-5)
    assert v.signature.startswith("conv2d(x[2, 4, 8, 8], w[8, 4, 3, 3]") and v.signature.endswith("-> [sub,add,rsqrt,mul,mul,add,relu]")
    assert spec.tolerance("float32") == (1e-4, 1e-4) and spec.tolerance("bfloat16") == (1.6e-2, 1.6e-2)
    # the printed reference is the computation
    for chain in (conv, *_chains(*linear_chain())):
        scope: dict = {}
        exec(chain_source(chain), scope)
        ins = chain.random_inputs(1)
        torch.testing.assert_close(scope["vendor_chain"](*ins), chain.reference(ins)[0])


# ----------------------------------------------------------------------------- capture


@pytest.mark.parametrize("build", [linear_chain, conv_chain])
def test_capture_with_vendor_chains_gives_chain_cards_that_take_their_calls_share(tmp_path, build):
    model, x = build()
    s = kforge.Session(model, x, device="cpu", workdir=tmp_path)
    try:
        cards = s.capture(timing_budget_ms=5.0, vendor_chains=True)
    finally:
        s.close()
    chains = [c for c in cards if c.op == VENDOR_CHAIN]
    tails = [vendor_chain(c.variant).ir.ops for c in chains]
    if build is linear_chain:
        assert tails == [("gelu", "add"), ("relu",)] or tails == [("relu",), ("gelu", "add")], tails
    else:
        assert tails == [("sub", "add", "rsqrt", "mul", "mul", "add", "relu")], tails
    assert all(c.calls == 1 and c.share > 0 and c.examples >= 1 for c in chains)
    # no region card holds a chain's node, and the operator calls a chain stands for count there
    assert not [c for c in cards if c.op == "region"]
    others = [c for c in cards if c.op != VENDOR_CHAIN]
    assert sorted(c.op for c in others) == (["add", "gelu", "linear", "relu"] if build is linear_chain
                                            else ["batch_norm", "conv2d", "relu"])
    assert all(c.share == 0 for c in others), [(c.op, c.share) for c in others]
    assert sum(c.share for c in cards) <= 1.0 + 1e-9


def test_a_capture_with_chains_off_is_the_capture_without_them(tmp_path):
    model, x = linear_chain()
    s = kforge.Session(model, x, device="cpu", workdir=tmp_path)
    try:
        default = s.capture(timing_budget_ms=5.0)   # off on the CPU by default
        off = s.capture(timing_budget_ms=5.0, vendor_chains=False)
    finally:
        s.close()
    assert sorted(c.key for c in default) == sorted(c.key for c in off)
    assert sorted(c.op for c in off) == ["add", "gelu", "linear", "region", "relu"]
    region = next(c for c in off if c.op == "region")
    assert get_spec("region").ops_of(region.variant) == ("gelu", "add")
    # the graph split with chains off is the split the regions alone make
    ((gm, _),) = aten_graph_calls(model, x)
    assert [f.variant.key for f in partition(gm)] == [f.variant.key for f in partition(gm, chains=frozenset())]
    assert region.key in {f.variant.key for f in partition(gm)}


def test_no_chain_is_claimed_by_default_and_the_cuda_rule_claims_16_bit_products():
    f32 = chain_variant(_chains(*linear_chain())[0])
    model, x = linear_chain()
    bf16 = chain_variant(_chains(model, x, torch.bfloat16)[0])
    # opt in until a GPU benchmark shows the CUTLASS winners placed and faster: a chain claims its tail's region card
    assert chains_by_default("cpu") is False and chains_by_default("cuda:0") is False
    claims = has_cuda_design   # the rule a CUDA default will use
    assert claims(bf16) and not claims(f32)   # a float32 chain's tail stays a region card
    ((gm, _),) = aten_graph_calls(model, x.to(torch.bfloat16))
    found = partition(gm, chains=claims)
    assert sorted(f.variant.op for f in found) == [VENDOR_CHAIN, VENDOR_CHAIN]


# ----------------------------------------------------------------------------- strategies and prompts


def test_builtin_strategies_cover_the_chain_on_both_backends():
    f32 = chain_variant(_chains(*linear_chain())[0])
    cpu = [s for s in strategies_for(VENDOR_CHAIN, "cpu") if s.applies(f32, DeviceInfo("cpu", "cpu", "", 0, 10.0))]
    assert [s.name for s in cpu] == ["vendor_chain.cpu.loops"]
    # float32: no CUTLASS design (its tensor cores would compute in TF32)
    assert not [s for s in strategies_for(VENDOR_CHAIN, "cuda") if s.applies(f32, H200)]
    model, x = linear_chain()
    bf16 = chain_variant(_chains(model, x, torch.bfloat16)[0])
    chain = vendor_chain(bf16)
    cuda = [s for s in strategies_for(VENDOR_CHAIN, "cuda") if s.applies(bf16, H200)]
    assert [s.name for s in cuda] == [f"vendor_chain.cuda.{design(chain)}"]
    (st,) = cuda
    configs = list(st.configs(bf16, H200))
    assert len(configs) == len(config_space(chain)) and configs[0] == st.default(bf16, H200)
    assert st.default(bf16, H200)["tile"] == "x".join(map(str, default_config(chain).tile))
    a, b = (st.render(bf16, c, H200) for c in configs[:2])
    assert a != b and '#include "kforge.h"' in a and "kf_launch" in a and "cutlass" in a


def test_the_llm_prompt_names_the_building_blocks_and_the_problem():
    model, x = linear_chain()
    v = chain_variant(_chains(model, x, torch.bfloat16)[0])
    card = Card(v, 1, 10.0, 0.5, None)
    text = card_prompt(ProposalRequest(card, "cuda", H200))
    for needle in ("CUTLASS 3", "epilogue visitor tree", "TMA warp-specialised", "cuBLASLt", "cuDNN",
                   "M=32, N=64, K=64", "B column-major", "Tail IR (2 operators: gelu, add)", "def vendor_chain(",
                   "sm_90a"):
        assert needle in text, needle
    f32 = chain_variant(_chains(*conv_chain())[0])
    text = card_prompt(ProposalRequest(Card(f32, 1, 10.0, 0.5, None), "cpu", DeviceInfo("cpu", "cpu", "", 0, 10.0)))
    assert "stride [1, 1], padding [1, 1]" in text and "no TF32" in text and "CUTLASS" not in text


# ----------------------------------------------------------------------------- the judge


_TF32 = r"""
static inline float kf_mant10(float x) {   /* TF32: a 10-bit mantissa, rounded */
    union { float f; uint32_t u; } v; v.f = x; v.u = (v.u + 0x1000u) & 0xffffe000u; return v.f;
}
"""


@pytest.mark.slow
def test_the_judge_passes_the_c_kernel_and_refuses_a_product_in_reduced_precision():
    """The C kernel (sums in double) is correct; the same kernel with its operands rounded to TF32 or bf16, as tensor
    cores would take them, is refused."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 64), nn.LayerNorm(64)).eval()
    ((gm, _),) = aten_graph_calls(model, torch.randn(32, 512))
    (chain,) = [fc.chain for fc in find_vendor_chains(gm.graph)]
    v = chain_variant(chain)
    src = render_cpu(chain)
    line = next(ln for ln in src.splitlines() if "acc += (double)" in ln)
    la, lb = line.split("acc += (double)")[1].rstrip(";").split(" * (double)")

    def rounded(fn: str) -> str:
        return src.replace(line, line.replace(f"(double){la} * (double){lb}", f"(double){fn}({la}) * (double){fn}({lb})")
                           ).replace("#include <omp.h>", "#include <omp.h>\n" + _TF32)

    with Evaluator("cpu", timeout_s=60) as ev:
        good = ev.evaluate_variant(v, src)
        assert good.status.is_correct, (good.status, good.message)
        for fn in ("kf_mant10", "KF_R_BF16"):
            bad = ev.evaluate_variant(v, rounded(fn))
            assert bad.status is Status.WRONG_RESULT, (fn, bad.status, bad.message)


# ----------------------------------------------------------------------------- search and deploy


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """Both models captured with vendor chains, each chain card searched briefly by the built-in library and judged
    by the evaluator; the first correct candidate stored as the card's winner where timing on this busy machine gave
    none (MKL is faster than the C loops: which is faster is not what these tests are about)."""
    out = []
    for build in (linear_chain, conv_chain):
        model, x = build()
        s = kforge.Session(model, x, device="cpu", workdir=tmp_path_factory.mktemp(build.__name__))
        s.capture(timing_budget_ms=5.0, vendor_chains=True)
        keys = [c.key for c in s.cards if c.op == VENDOR_CHAIN]

        found = search_until_correct(s, keys, iterations=1)
        assert all(f[0].strategy == "vendor_chain.cpu.loops" for f in found.values())
        out.append(s)
    yield out
    for s in out:
        s.close()


@pytest.mark.slow
def test_a_chain_winner_runs_in_the_applied_model(searched):
    for s in searched:
        model, x = s.model, s.batches[0]
        expected = _eager(model, x)
        plan = s.deployment_plan(all_winners=True)
        assert sorted(k.variant.op for k in plan.kernels) == [VENDOR_CHAIN] * len(plan.kernels) and plan.kernels
        dep = s.apply(all_winners=True)
        try:
            with torch.no_grad():
                got = model(x)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
            assert dep.calls and all(n == 1 for n in dep.calls.values()), dep.calls
            assert sorted(set(dep.graph.replaced)) == sorted(dk.variant.signature for dk in dep.kernels)
        finally:
            dep.remove()


_LOAD = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, {tests!r})
    import kforge
    from test_vendor_cards import conv_chain
    model, x = conv_chain()
    dep = kforge.load(model, {path!r}, all_winners=True)
    with torch.no_grad():
        out = model(x)
    print(json.dumps({{"calls": dep.calls, "skipped": dep.skipped, "out": out.flatten().tolist()}}))
""")


@pytest.mark.slow
def test_an_exported_chain_kernel_runs_after_load_in_a_fresh_process(searched, tmp_path):
    s = searched[1]
    path = s.export(tmp_path / "artifact", all_winners=True)
    entries = json.loads((path / "manifest.json").read_text())["kernels"]
    assert [e["variant"]["op"] for e in entries] == [VENDOR_CHAIN]
    tests = os.path.dirname(__file__)
    out = subprocess.run([sys.executable, "-c", _LOAD.format(tests=tests, path=str(path))], capture_output=True,
                         text=True, timeout=600, env={**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), tests])})
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["skipped"] == [] and list(result["calls"].values()) == [1], result
    torch.testing.assert_close(torch.tensor(result["out"]), _eager(s.model, s.batches[0]).flatten(), rtol=1e-4,
                               atol=1e-4)


# ----------------------------------------------------------------------------- command line and views


def test_the_command_line_captures_chains_when_asked_and_a_chains_label_keeps_its_tail(tmp_path):
    from kforge.views._data import short_label

    def capture(*flags):
        proc = subprocess.run([sys.executable, "-m", "kforge.cli", "capture", "--example", "tiny_cnn", "--device", "cpu",
                               "--workdir", str(tmp_path / ("on" if flags else "off")), "--json", *flags],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)["cards"]

    on, off = capture("--vendor-chains"), capture()
    def chains(cards):
        return [c for c in cards if c["variant"]["op"] == VENDOR_CHAIN]

    assert chains(on) and not chains(off)   # off unless asked
    model, x = conv_chain()
    s = kforge.Session(model, x, device="cpu", workdir=tmp_path / "s")
    cards = s.capture(timing_budget_ms=2.0, vendor_chains=True)
    label = short_label(next(c for c in cards if c.op == VENDOR_CHAIN), limit=200)
    assert label.startswith("conv2d(") and " -> [" in label, label   # the head and its tail, not the head alone
    s.close()
