"""Regions on the CPU: the finder on the built-in examples, region cards, the LLM's reference, and
capture -> region card -> builtin search -> verdict -> the kernel running inside the model."""
from __future__ import annotations


import pytest
import torch

import kforge
from kforge.kernels import Kernel, compile_source
from kforge.ops import TensorSig, get_spec
from kforge.regions import (Node, Ref, RegionIR, capture_regions, find_regions, region_ir, region_variant,
                            regions_backend)

RMS = "pow,mean,add,rsqrt,mul,mul"
GELU = "mul,pow,mul,add,mul,tanh,add,mul"
RESIDUAL_RMS = "add," + RMS


def _by_ops(records):
    out: dict[str, list] = {}
    for r in records:
        out.setdefault(",".join(region_ir(r.variant).ops), []).append(r)
    return out


def test_finder_finds_rmsnorm_gelu_and_residual_chains_in_tiny_chains():
    model, x = kforge.example("tiny_chains")
    found = capture_regions(model, [x])
    assert found.error is None and found.graph_breaks == 0
    by_ops = _by_ops(found.records)
    assert sorted(by_ops) == sorted([RMS, GELU, RESIDUAL_RMS])
    assert [r.calls for r in by_ops[RMS]] == [1]          # the first block's norm
    assert [r.calls for r in by_ops[GELU]] == [2]         # one per block, same signature
    # the residual add joins the next norm: between blocks it is read again later (two outputs),
    # before the final norm it is not (one output)
    assert sorted(len(r.variant.outputs) for r in by_ops[RESIDUAL_RMS]) == [1, 2]
    assert all(len(r.examples) == r.calls for r in found.records)
    gelu = by_ops[GELU][0].variant
    assert [s.shape for s in gelu.inputs] == [(2, 32, 128)] and gelu.outputs[0].shape == (2, 32, 128)


def test_reductions_off_the_last_dims_and_matmuls_are_boundaries():
    class M(torch.nn.Module):
        def forward(self, x, w):
            a = torch.exp(x) * 2.0
            b = a.mean(dim=1, keepdim=True)          # not the trailing dim: a boundary
            c = (b - 1.0).abs()
            d = torch.softmax(c @ w, dim=-1) * 3.0     # the matmul is a boundary
            return d.amax(-1) + 0                      # a second reduction: its own region

    found = capture_regions(M(), [(torch.randn(4, 5, 8), torch.randn(8, 8))])
    # the mean over dim 1 and the matmul split the chain; the softmax and the amax are two
    # reductions, so the softmax stays alone (an operator card) and the amax takes the mul
    ops = sorted(",".join(region_ir(r.variant).ops) for r in found.records)
    assert ops == ["exp,mul", "mul,amax", "sub,abs"]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    model, x = kforge.example("tiny_chains")
    s = kforge.Session(model, x, device="cpu", workdir=tmp_path_factory.mktemp("regions"))
    s.capture(timing_budget_ms=5.0)
    yield s
    s.close()


def test_region_cards_share_the_table_with_op_cards(session):
    frame = session.cards.to_frame()
    regions = frame[frame.kind == "region"]
    assert set(frame.kind) == {"op", "region"} and (regions.op == "region").all()
    assert sorted(regions.ops) == sorted([RMS, GELU, RESIDUAL_RMS, RESIDUAL_RMS])
    assert dict(zip(regions.ops, regions.calls))[GELU] == 2
    # shares are of the model's forward (measured inside it): the cards of one forward never add past it
    assert 0.0 < frame.share.sum() <= 1.0 + 1e-9
    # every tanh call is inside the GELU regions: its op card's time now counts in their share
    tanh = frame[frame.op == "tanh"]
    assert len(tanh) == 1 and tanh.share.iloc[0] == 0.0
    assert (frame[frame.op == "linear"].share > 0).all()
    for _, row in regions.iterrows():
        assert row.share > 0 and row.examples == row.calls
        assert row.signature.startswith(f"region[{row.ops}](")


def test_region_cards_come_back_from_the_store(session):
    again = kforge.Session.open(session.workdir)
    assert [c.key for c in again.cards] == [c.key for c in session.cards]
    assert sum(c.op == "region" for c in again.cards) == 4


def test_reference_source_is_a_standalone_function_equal_to_the_reference(session):
    spec = get_spec("region")
    for card in session.cards.by_op("region"):
        text = spec.source(card.variant)
        scope: dict = {}
        exec(text, scope)
        inputs = spec.random_inputs(card.variant, seed=3)
        got = scope["region"](*inputs)
        got = list(got) if isinstance(got, tuple) else [got]
        for a, b in zip(got, spec.reference(inputs, card.variant.param_dict)):
            assert torch.equal(a, b)


def test_llm_prompt_gets_the_region_function(session):
    from kforge.kernels import device_info
    from kforge.proposers._base import ProposalRequest
    from kforge.proposers._llm import card_prompt

    card = next(c for c in session.cards.by_op("region") if ",".join(region_ir(c.variant).ops) == GELU)
    text = card_prompt(ProposalRequest(card, "cpu", device_info("cpu")))
    assert "def region(x0):" in text and "torch.tanh(" in text and "inputs[0] x0: float32, shape (2, 32, 128)" in text


def test_signature_is_structure_shapes_strides_and_constants():
    def rms(eps):
        return RegionIR(2, (Node("pow", (Ref("i", 0), Ref("c", 2))), Node("mean", (Ref("n", 0),), (("k", 1), ("keepdim", True))),
                            Node("add", (Ref("n", 1), Ref("c", eps))), Node("rsqrt", (Ref("n", 2),)),
                            Node("mul", (Ref("i", 0), Ref("n", 3))), Node("mul", (Ref("i", 1), Ref("n", 4)))), (5,))

    x, w = TensorSig.of(torch.empty(4, 64)), TensorSig.of(torch.empty(64))
    xt = TensorSig.of(torch.empty(64, 4).t())
    keys = {region_variant(rms(1e-6), [x, w]).key, region_variant(rms(1e-5), [x, w]).key,
            region_variant(rms(1e-6), [xt, w]).key, region_variant(rms(1e-6), [TensorSig.of(torch.empty(8, 64)), w]).key}
    assert len(keys) == 4
    assert region_variant(rms(1e-6), [x, w]).key == region_variant(rms(1e-6), [x, w]).key


def test_capture_end_to_end_builtin_search_verdict_and_the_kernel_in_the_model(session):
    from kforge.deploy import DeployedKernel, Deployment

    keys = [c.key for c in session.cards.by_op("region")]
    session.optimize(proposer="builtin", iterations=2, cards=keys, confirm=False)
    kernels = []
    for key in keys:
        cands = session.store.candidates(key)
        assert cands and all(c.strategy and c.strategy.startswith("region.cpu.") for c in cands)
        correct = [c for c in cands if c.status is not None and c.status.is_correct]
        assert correct, [(c.strategy, c.status, c.evaluation.message) for c in cands]
        best = max(correct, key=lambda c: c.evaluation.speedup or 0.0)
        kernels.append(DeployedKernel(session.cards[key].variant, Kernel(compile_source(best.source, "cpu", "native").path)))

    model, x = session.model, session.batches[0]
    with torch.no_grad():
        expected = model(x)
    with Deployment(kernels, None):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=regions_backend(kernels), dynamic=False)
        with torch.no_grad():
            got = compiled(x)
        torch._dynamo.reset()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    calls = {",".join(region_ir(k.variant).ops) + f"/{len(k.variant.outputs)}": k.calls for k in kernels}
    assert calls == {RMS + "/1": 1, GELU + "/1": 2, RESIDUAL_RMS + "/2": 1, RESIDUAL_RMS + "/1": 1}

    # graph mode: Deployment.compile (and so Session.compile, kforge.load(...).compile) runs them too,
    # with Inductor compiling the rest of the graph
    for backend in ("eager", "inductor"):
        dep = Deployment(kernels, None)
        before = {k.variant.key: k.calls for k in kernels}
        with dep:
            torch._dynamo.reset()
            compiled = dep.compile(model, backend=backend, dynamic=False)
            with torch.no_grad():
                got = compiled(x)
            torch._dynamo.reset()
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert sorted(compiled.kforge_backend.replaced) == sorted(k.variant.signature for k in kernels
                                                                  for _ in range(calls[",".join(region_ir(k.variant).ops) + f"/{len(k.variant.outputs)}"]))
        assert all(k.calls > before[k.variant.key] for k in kernels), backend


def test_replace_regions_leaves_other_regions_and_nodes_alone():
    from torch._dynamo.backends.common import aot_autograd

    from kforge.regions import replace_regions

    seen = []

    def fw(gm, ex):
        before = [n.target for n in gm.graph.nodes]
        assert replace_regions(gm, {}) == []
        assert [n.target for n in gm.graph.nodes] == before
        seen.append(len(find_regions(gm.graph)))
        return gm

    model, x = kforge.example("tiny_chains")
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=aot_autograd(fw_compiler=fw), dynamic=False)(x)
    torch._dynamo.reset()
    assert seen == [5]


def test_region_benchmark_summary_reports_each_floor_and_the_median_of_an_even_count():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parent.parent / "benchmarks" / "regions.py"
    spec = importlib.util.spec_from_file_location("kforge_bench_regions", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    rows = [{"region": "a", "kforge_us": 6.0, "inductor_us": 7.0, "floor_us": 1.0},
            {"region": bench.LAUNCH_PROBE, "kforge_us": 5.0, "inductor_us": 4.0, "floor_us": 0.0},
            {"region": "b", "kforge_us": 12.0, "inductor_us": 11.0, "floor_us": 10.0},
            {"region": "c", "kforge_us": 5.5, "inductor_us": 6.0, "floor_us": 0.5},
            {"region": "d", "kforge_us": 30.0, "inductor_us": 33.0, "floor_us": 20.0},
            {"region": "e", "kforge_us": None}]
    rows, probe, launch = bench._apply_launch_floor(rows)
    assert launch == 5.0 and probe["inductor_us"] == 4.0 and [r["region"] for r in rows] == list("abcde")
    assert rows[0]["launch_aware_floor_us"] == 5.0 and rows[0]["launch_plus_floor_us"] == 6.0
    assert "launch_aware_floor_us" not in rows[4]
    s = bench._summary(rows)
    assert (s["timed"], s["kforge_at_least_inductor"], s["fraction_at_least_inductor"]) == (4, 3, 0.75)
    assert s["median_kforge_over_floor"] == pytest.approx((1.5 + 6.0) / 2)       # 1.2, 1.5, 6, 11
    assert s["median_kforge_over_launch_aware_floor"] == pytest.approx(1.2)  # 1.1, 1.2, 1.2, 1.5
    assert s["median_kforge_over_launch_plus_floor"] == pytest.approx(1.0)     # 0.8, 1.0, 1.0, 1.2
    assert s["regions_floor_ge_5us"] == 2 and s["median_kforge_over_floor_where_floor_ge_5us"] == pytest.approx(1.35)
    assert s["no_correct_kernel"] == ["e"]
    assert bench._median([]) is None and bench._median([3.0, 1.0, 2.0]) == 2.0


class _WithTensorConstant(torch.nn.Module):
    """The model, and beside it a value scaled by a tensor made in forward (as Gemma's
    ``torch.tensor(hidden_size ** 0.5)``): AOTAutograd's graph holds it as a tensor constant, which
    Inductor's second pass lifts in front of the inputs (torch 2.11 registers it as a buffer)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor):
        return self.inner(x), x.amax() * torch.tensor(3.0, dtype=x.dtype)


@pytest.mark.parametrize("wrap", [False, True], ids=["model", "with_tensor_constant"])
def test_region_graphs_keep_the_models_parameters_as_static_inputs(session, monkeypatch, wrap):
    """A region kernel sends the graph through kforge's own AOTAutograd pass; Inductor's inner compile
    must still be told which inputs are parameters (else reduce-overhead's CUDA graphs copy every
    weight on each replay): as many inputs left non-static as plain torch.compile leaves."""
    import torch._inductor.compile_fx as cfx

    from kforge.deploy._graph import compile_with

    from kforge.deploy import DeployedKernel

    key = session.cards.by_op("region")[0].key
    session.optimize(proposer="builtin", iterations=1, cards=[key], confirm=False)
    correct = [c for c in session.store.candidates(key) if c.status is not None and c.status.is_correct]
    assert correct, "the built-in generator made no correct region kernel"
    kernels = [DeployedKernel(session.cards[key].variant, Kernel(compile_source(correct[0].source, "cpu", "native").path))]
    seen: list[tuple[int, tuple]] = []
    free: list[list] = []   # the shapes of the inputs left non-static
    real = cfx._compile_fx_inner

    def spy(gm, example_inputs, **kwargs):
        static = tuple(kwargs.get("static_input_idxs") or ())
        seen.append((len(example_inputs), static))
        free.append([tuple(t.shape) if isinstance(t, torch.Tensor) else t for i, t in enumerate(example_inputs)
                     if i not in static])
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(cfx, "_compile_fx_inner", spy)
    model, x = session.model, session.batches[0]
    if wrap:
        model = _WithTensorConstant(model)
    runs = {}
    for name, ks in (("plain", []), ("region", kernels)):
        seen.clear()
        torch._dynamo.reset()
        compiled = compile_with(model, ks, dynamic=False)
        # NB: a cache hit compiles nothing
        with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):
            out = compiled(x)
        torch._dynamo.reset()
        runs[name] = (list(seen), compiled.kforge_backend.replaced, out)
    n_params = sum(1 for _ in model.parameters()) + sum(1 for _ in model.buffers())
    (plain_inputs, plain_static), = runs["plain"][0]
    (region_inputs, region_static), = runs["region"][0]
    assert runs["region"][1] and not runs["plain"][1]
    assert len(plain_static) == n_params > 0
    # every input but the model's own inputs is static: in both, the same number is not
    assert region_inputs - len(region_static) == plain_inputs - len(plain_static) == 1
    assert free == [[tuple(x.shape)]] * 2, "the input left to copy on each replay must be the model's input"
    assert len(region_static) == len(set(region_static)) and max(region_static) < region_inputs
    if wrap:
        torch.testing.assert_close(runs["region"][2][1], runs["plain"][2][1])
    assert kernels[0].calls > 0, "the graph ran the region's reference, not its kernel (no Deployment installed)"


def test_a_warm_compile_through_kforges_path_loads_the_graph_with_its_static_inputs(session, monkeypatch, tmp_path):
    """Inductor's second AOTAutograd pass keeps its cache (a restarted process compiles in half the time): on a hit
    the inner compile, which hands Inductor the parameters' indices, does not run, so the graph the hit loads must be
    the one the miss compiled, static inputs and all (else reduce-overhead's CUDA graphs copy every weight on each
    replay)."""
    from torch._dynamo.utils import counters
    from torch._inductor import output_code

    from kforge.deploy import DeployedKernel
    from kforge.deploy._graph import compile_with

    key = session.cards.by_op("region")[0].key
    session.optimize(proposer="builtin", iterations=1, cards=[key], confirm=False)
    correct = [c for c in session.store.candidates(key) if c.status is not None and c.status.is_correct]
    kernels = [DeployedKernel(session.cards[key].variant, Kernel(compile_source(correct[0].source, "cpu", "native").path))]
    loaded: list[tuple] = []
    real = output_code.CompiledFxGraph.post_compile

    def spy(self, *args, **kwargs):   # NB: runs on a miss and on a hit, after the graph is compiled or loaded
        loaded.append(tuple(self.fx_kwargs.get("static_input_idxs") or ()))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(output_code.CompiledFxGraph, "post_compile", spy)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model, x = session.model, session.batches[0]
    hits = []
    outs = []
    for _ in range(2):
        torch._dynamo.reset()
        before = counters["aot_autograd"]["autograd_cache_hit"]
        with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=False, fx_graph_cache=True):
            compiled = compile_with(model, kernels, dynamic=False)
            outs.append(compiled(x))
        hits.append(counters["aot_autograd"]["autograd_cache_hit"] - before)
        assert compiled.kforge_backend.replaced
    torch._dynamo.reset()
    n_params = sum(1 for _ in model.parameters()) + sum(1 for _ in model.buffers())
    assert hits == [0, 1], "the second compile did not load the first one's graph"
    assert len(loaded) == 2 and loaded[0] == loaded[1] and len(loaded[1]) == n_params > 0, loaded
    torch.testing.assert_close(outs[1], outs[0])
    assert kernels[0].calls > 0


class _WithCache(torch.nn.Module):
    """The model, and a buffer it writes in place each forward at a position it is given, as a
    static KV cache is written in decoding."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner
        self.register_buffer("cache", torch.zeros(4, 8))

    def forward(self, x: torch.Tensor, pos: torch.Tensor):
        out = self.inner(x)
        self.cache.index_copy_(0, pos, out.reshape(-1)[:8].reshape(1, 8))
        return out


def test_region_graphs_keep_input_mutations_inside_the_graph(session, monkeypatch):
    """A buffer written in place (a static KV cache) stays a mutation inside the graph Inductor
    compiles, as under plain torch.compile: kforge's own AOTAutograd pass must not turn it into an
    extra output that the runtime copies back into the whole buffer after every call."""
    import torch._inductor.compile_fx as cfx

    from kforge.deploy import DeployedKernel
    from kforge.deploy._graph import compile_with

    key = session.cards.by_op("region")[0].key
    session.optimize(proposer="builtin", iterations=1, cards=[key], confirm=False)
    correct = [c for c in session.store.candidates(key) if c.status is not None and c.status.is_correct]
    assert correct, "the built-in generator made no correct region kernel"
    kernels = [DeployedKernel(session.cards[key].variant, Kernel(compile_source(correct[0].source, "cpu", "native").path))]
    outputs: list[int] = []
    real = cfx._compile_fx_inner

    def spy(gm, example_inputs, **kwargs):
        outputs.append(len(next(n for n in gm.graph.nodes if n.op == "output").args[0]))
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(cfx, "_compile_fx_inner", spy)
    x = session.batches[0]
    eager = _WithCache(session.model)
    with torch.no_grad():
        for i in (2, 0):
            eager(x, torch.tensor([i]))
    runs = {}
    for name, ks in (("plain", []), ("region", kernels)):
        outputs.clear()
        model = _WithCache(session.model)
        torch._dynamo.reset()
        compiled = compile_with(model, ks, dynamic=False)
        with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):
            for i in (2, 0):
                compiled(x, torch.tensor([i]))
        torch._dynamo.reset()
        runs[name] = (list(outputs), compiled.kforge_backend.replaced)
        torch.testing.assert_close(model.cache, eager.cache)
    assert runs["region"][1] and not runs["plain"][1]
    assert runs["region"][0] == runs["plain"][0], "the region graph returns the mutated buffer as an extra output"


def test_end_to_end_times_region_kernels_in_eager_as_apply_installs_them(session):
    """The eager check installs a region kernel as apply() does (the model's forward as a graph), so the eager
    arm that holds it runs it; for a model that is no nn.Module (nothing to put the graph forward on) it is not
    timed in eager, and the report says it runs in graph mode only."""
    import json

    from kforge.deploy import DeployedKernel
    from kforge.deploy._fallback import Comparison
    from kforge.deploy._report import measure

    key = session.cards.by_op("region")[0].key
    if not session.store.candidates(key):
        session.optimize(proposer="builtin", iterations=1, cards=[key], confirm=False)
    correct = [c for c in session.store.candidates(key) if c.status is not None and c.status.is_correct]
    assert correct, "the built-in generator made no correct region kernel"
    dk = DeployedKernel(session.cards[key].variant, Kernel(compile_source(correct[0].source, "cpu", "native").path))
    sig = dk.variant.signature
    calls = []

    def compare(a, b):   # any arm holding the kernel reads 10% faster; the arms run once each
        calls.append((a.kernels, b.kernels))
        for arm in (a, b):
            arm.enter()
            with torch.no_grad():
                arm.forward()
            arm.exit()
        return Comparison(90.0 if a.kernels else 100.0, 90.0 if b.kernels else 100.0, 1.0)

    args, kwargs = session._inputs()
    report = measure(session.model, args, kwargs, [dk], [10.0], device="cpu", modes=("default",),
                     backend="aot_eager", compare=compare)
    eager = next(f for f in report.fallback if f.mode == "eager")
    assert eager.not_in_mode == () and eager.kept == (sig,)
    assert calls[0] == ((sig,), ()), calls
    row = next(r for r in report.rows if r.label == "eager + kforge")
    assert row.kernels == 1 and report.kernels_installed == 1
    assert all(r.error is None for r in report.rows), [(r.label, r.error) for r in report.rows]
    eager_calls = dk.calls
    assert eager_calls > 0, "the eager arm ran the region kernel"
    assert "forward" not in session.model.__dict__, "the eager arms gave the model its forward back"

    model = session.model
    calls.clear()
    report = measure(lambda x: model(x), args, kwargs, [dk], [10.0], device="cpu", compile=False, compare=compare)
    (eager,) = report.fallback
    assert eager.not_in_mode == (sig,) and eager.kept == () and eager.forwards_built == 0
    assert all(arm == () for pair in calls for arm in pair), calls   # no eager arm with the region kernel
    assert dk.calls == eager_calls
    assert f"not run {sig}: runs in graph mode only" in report.table()
    assert json.loads(json.dumps(report.to_json()))["fallback"][0]["not_in_mode"] == [sig]
