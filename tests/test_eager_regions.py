"""Region and fused-operator winners for an eager user: ``Session.apply()`` and ``kforge.load()`` run them
through the model's forward captured as a graph (``deploy._graph.GraphForward``), operator winners beside
them, behind the guards of eager dispatch; ``remove()`` gives the model its own forward back."""
from __future__ import annotations

import copy
import io
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kforge
from kforge.ops import CardStatus, CardVerdict, placed_in_aten_graph

import extras
from scripted import search_until_correct

SEARCHED = ("region", "group_norm_silu", "softmax")


class Chains(nn.Module):
    """The chains a model's author writes by hand: RMSNorm as pow/mean/rsqrt/mul, the tanh GELU as its
    formula, a softmax, and a GroupNorm whose only reader is a SiLU."""

    def __init__(self, dim: int = 64, hidden: int = 128):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.norm = nn.GroupNorm(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        u = self.up(h)
        g = 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * torch.pow(u, 3.0))))
        s = torch.softmax(self.down(g), dim=-1)
        return F.silu(self.norm(s.reshape(s.shape[0], 8, 8, -1)))


def chains(seed: int = 0) -> tuple[Chains, torch.Tensor]:
    torch.manual_seed(seed)
    return Chains().eval(), torch.randn(2, 32, 64)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """The model captured with regions, and a short built-in search of its region, fused and softmax cards.

    The search is real (the built-in generator's candidates, judged by the evaluator); where its timing on this
    busy machine gave a card no winner, the verdict of the card's first correct candidate is stored as a winner
    (which of them is faster is not what these tests are about)."""
    model, x = chains()
    s = kforge.Session(model, x, device="cpu", workdir=tmp_path_factory.mktemp("eager-regions"))
    s.capture(timing_budget_ms=5.0)
    keys = [c.key for c in s.cards if c.op in SEARCHED]
    assert sorted(s.cards[k].op for k in keys) == ["group_norm_silu", "region", "region", "softmax"]

    search_until_correct(s, keys, iterations=2)
    yield s
    s.close()


def _eager(model, x):
    """The model's own forward (its class's), whatever is installed on the instance."""
    with torch.no_grad():
        return type(model).forward(model, x)


def _graph_signatures(dep):
    return sorted(dk.variant.signature for dk in dep.kernels if placed_in_aten_graph(dk.variant))


def test_apply_runs_region_and_fused_kernels_in_eager_and_remove_gives_the_forward_back(session):
    model, x = session.model, session.batches[0]
    expected = _eager(model, x)
    dep = session.apply(all_winners=True)
    try:
        graph = _graph_signatures(dep)
        assert len(graph) == 3 and sum(s.startswith("region[") for s in graph) == 2, graph
        assert any(s.startswith("group_norm_silu(") for s in graph)
        assert "4 kernels (1 operator, 3 region/fused in the model's graph)" in repr(dep), repr(dep)
        assert "forward" in model.__dict__
        with torch.no_grad():
            got = model(x)
            again = model(x)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(again, expected, rtol=1e-4, atol=1e-5)
        # every kernel ran, the regions' and the fused operator's included, once a forward; the softmax
        # winner (an operator's) runs in the same graph, by graph mode's rewrite of dynamo's graph
        assert set(dep.calls.values()) == {2}, dep.calls
        assert sorted(set(dep.graph.replaced)) == sorted(dk.variant.signature for dk in dep.kernels)
    finally:
        dep.remove()
    assert "forward" not in model.__dict__ and not dep.installed
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    assert set(dep.calls.values()) == {2}, "removed: no kernel runs"
    # installed again, the forward captured before is used again (no second capture)
    with dep, torch.no_grad():
        model(x)
    assert set(dep.calls.values()) == {3} and len(dep.graph.backend.graphs) == 1


@pytest.mark.parametrize("faster", [False, True])
def test_apply_keeps_region_kernels_only_where_the_model_is_measurably_faster_with_them(session, monkeypatch, faster):
    """The captured forward has a cost of its own (dynamo's guards, the graph run op by op): apply() times the
    session's model with its region and fused kernels and without them (operator winners in both arms), and
    leaves them out, saying why, unless the model is measurably faster with them. The timer is replaced here,
    so that what is decided does not depend on this machine's load."""
    import kforge.deploy._fallback as fallback
    from kforge.deploy._fallback import Comparison

    arms = []

    def compare(device, **_):
        def timed(with_arm, without_arm):
            arms.append((with_arm.kernels, without_arm.kernels))
            with_us = 80.0 if faster else 120.0
            return Comparison(with_us, 100.0, 2.0, paired_us=100.0 - with_us)
        return timed

    monkeypatch.setattr(fallback, "interleaved", compare)
    model, x = session.model, session.batches[0]
    with session.apply() as dep, torch.no_grad():
        (with_kernels, without_kernels), = arms
        graph = sorted(set(with_kernels) - set(without_kernels))
        assert len(graph) == 3 and all(s.startswith(("region[", "group_norm_silu(")) for s in graph), graph
        assert any(s.startswith("softmax(") for s in without_kernels)
        assert _graph_signatures(dep) == (graph if faster else [])
        torch.testing.assert_close(model(x), _eager(model, x), rtol=1e-4, atol=1e-5)
        calls = {dk.variant.signature: dk.calls for dk in dep.kernels}
        reasons = dict(dep.skipped)
        if faster:
            assert not any(s in reasons for s in graph) and all(calls[s] == 1 for s in graph)
        else:
            assert "forward" not in model.__dict__, "no region kernel kept: the model keeps its own forward"
            assert sorted(s for s in reasons if s in graph) == graph
            assert all("0.833x" in reasons[s] and "slower" in reasons[s] and "all_winners=True" in reasons[s]
                       for s in graph), reasons
            assert not any(s in calls for s in graph) or all(calls[s] == 0 for s in graph)
        assert sum(c for s, c in calls.items() if s.startswith("softmax(")) == 1, "the operator winner stays"


def test_a_changed_shape_is_captured_again_and_its_calls_stay_as_traced(session):
    model, x = session.model, session.batches[0]
    wider = torch.randn(3, 32, 64)
    with session.apply(all_winners=True) as dep, torch.no_grad():
        model(x)
        assert set(dep.calls.values()) == {1}
        torch.testing.assert_close(model(wider), _eager(model, wider), rtol=1e-4, atol=1e-5)
        assert set(dep.calls.values()) == {1}, "no kernel has batch 3's shapes"
        graphs = dep.graph.backend.graphs
        assert len(graphs) == 2 and graphs[-1].replaced == [], [g.replaced for g in graphs]
        torch.testing.assert_close(model(x), _eager(model, x), rtol=1e-4, atol=1e-5)
        assert set(dep.calls.values()) == {2} and len(graphs) == 2, "batch 2's graph is still there"


def test_a_forward_that_records_gradients_runs_the_plain_model(session):
    model, x = session.model, session.batches[0]
    with session.apply(all_winners=True) as dep:
        out = model(x)   # grad mode on, the parameters require grad: a kernel has no backward
        out.sum().backward()
        assert all(p.grad is not None for p in model.parameters())
        assert set(dep.calls.values()) == {0}
        model.zero_grad(set_to_none=True)
        for p in model.parameters():
            p.requires_grad_(False)
        try:
            with torch.enable_grad():
                got = model(x)   # nothing needs gradients: the graph runs, kernels included
            assert not got.requires_grad and set(dep.calls.values()) == {1}
            model(x.clone().requires_grad_())   # an input that needs them: plain again
            assert set(dep.calls.values()) == {1}
        finally:
            for p in model.parameters():
                p.requires_grad_(True)


def test_a_forward_that_cannot_be_captured_runs_eagerly_and_says_why(session, monkeypatch):
    """The graph forward's compile fails (here its backend raises): the call runs the model's own forward, no
    exception reaches the user, the region and fused kernels stay off with the reason in ``skipped``, and the
    operator winner still dispatches eagerly."""
    from kforge.deploy._graph import KforgeBackend

    def broken(self, gm, example_inputs):
        raise RuntimeError("no graph today")

    monkeypatch.setattr(KforgeBackend, "__call__", broken)
    model, x = session.model, session.batches[0]
    expected = _eager(model, x)
    with pytest.warns(UserWarning, match="could not be captured"), session.apply(all_winners=True) as dep, torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)
        reasons = dict(dep.skipped)
        assert sorted(reasons) == _graph_signatures(dep)
        assert all("no graph today" in why for why in reasons.values())
        assert "not running, see skipped" in repr(dep)
        calls = {dk.variant.op: dk.calls for dk in dep.kernels}
        assert calls["softmax"] == 2 and calls["region"] == 0 and calls["group_norm_silu"] == 0


def test_a_process_wide_deployment_says_region_kernels_need_the_model(session):
    model, x = session.model, session.batches[0]
    with session.apply(scope="process", all_winners=True) as dep, torch.no_grad():
        model(x)
        reasons = dict(dep.skipped)
        assert sorted(reasons) == _graph_signatures(dep)
        assert all("nn.Module" in why for why in reasons.values())
        assert "forward" not in model.__dict__
        calls = {dk.variant.op: dk.calls for dk in dep.kernels}
        assert calls["softmax"] == 1 and calls["region"] == 0


def test_a_copy_of_an_applied_model_is_plain(session):
    model, x = session.model, session.batches[0]
    expected = _eager(model, x)
    with session.apply(all_winners=True) as dep, torch.no_grad():
        twin = copy.deepcopy(model)
        buf = io.BytesIO()
        torch.save(model, buf)
        torch.testing.assert_close(twin(x), expected, rtol=0, atol=0)
        assert set(dep.calls.values()) == {0}, "a copy runs without kforge: it is applied to a copy on its own"
        model(x)
        assert set(dep.calls.values()) == {1}
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), expected, rtol=0, atol=0)


def test_a_compile_of_an_applied_model_traces_the_plain_forward(session):
    """torch.compile of the model while its graph forward is installed: dynamo traces the model's own forward
    (the graph forward steps aside, so no region kernel is in that graph), and graph mode's compile still places
    every kernel."""
    model, x = session.model, session.batches[0]
    expected = _eager(model, x)
    with session.apply(all_winners=True) as dep, torch.no_grad():
        plain = torch.compile(model, backend="eager", dynamic=False)
        torch.testing.assert_close(plain(x), expected, rtol=1e-4, atol=1e-5)
        # NB: backend="eager" runs dynamo's graph as Python calls, so the softmax method there still meets the
        # eager dispatcher at run time; the graph forward's kernels are not in it
        assert all(dk.calls == 0 for dk in dep.graph_kernels), dep.calls
        compiled = dep.compile(backend="eager", dynamic=False)
        torch.testing.assert_close(compiled(x), expected, rtol=1e-4, atol=1e-5)
        assert sorted(set(compiled.kforge_backend.replaced)) == sorted(dk.variant.signature for dk in dep.kernels)
        assert all(dk.calls == 1 for dk in dep.graph_kernels), dep.calls


class ConvNorm(nn.Module):
    """conv -> GroupNorm -> SiLU -> conv: where Inductor lays the graph out channels-last (mkldnn convolutions on the
    CPU), capture makes the fused card the channels-last twin of the traced call."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(F.silu(self.norm(self.conv(x))))


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                    reason="Inductor lays CPU graphs out channels-last only where mkldnn runs convolutions")
def test_a_channels_last_twin_stays_out_of_eager_and_the_plain_kernel_keeps_its_calls(tmp_path):
    """The eager model keeps the traced (contiguous) layout, so a fused twin cannot run there: it is listed in
    ``skipped`` (it runs under torch.compile), and the group_norm's own winner still takes the call eagerly (had
    the twin been given to the graph forward, the plain kernel would have stepped aside for it there)."""
    torch.manual_seed(0)
    model, x = ConvNorm().eval(), torch.randn(2, 4, 9, 7)
    s = kforge.Session(model, x, device="cpu", workdir=tmp_path / "wd")
    s.capture(timing_budget_ms=5.0)
    (twin,) = s.cards.by_op("group_norm_silu")
    (plain,) = [c for c in s.cards.by_op("group_norm") if c.variant.inputs[0].is_contiguous]
    assert not twin.variant.inputs[0].is_contiguous
    s.optimize(proposer="builtin", iterations=1, cards=[twin.key, plain.key], confirm=False)
    for card in (twin, plain):
        found = [c for c in s.store.candidates(card.key) if c.status is not None and c.status.is_correct]
        assert found, [(c.strategy, c.status) for c in s.store.candidates(card.key)]
        s.store.save_result(card.key, CardVerdict(CardStatus.WINNER, "test", winner_id=found[0].id, winner_speedup=1.5,
                                                  kernel_us=card.eager_us / 1.5, eager_us=card.eager_us, candidates=1))
    expected = _eager(model, x)
    with s.apply(all_winners=True) as dep, torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)
        assert [sig for sig, _ in dep.skipped] == [twin.signature]
        assert "runs under torch.compile only" in dep.skipped[0][1]
        assert dep.graph is None and "forward" not in model.__dict__
        assert dep.calls == {twin.signature: 0, plain.signature: 1}
    s.close()


def test_a_librarys_function_kernel_and_a_region_run_together_in_the_graph_forward(tmp_path):
    """transformers' gated delta rule (an operator computed by a library's function, reached through its hooks) and
    a region of the model's own: in the graph forward the function's call is its graph twin, which takes its
    kernel, and the region takes its own."""
    extras.module("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "models")
    from kforge.kernels import device_info
    from kforge.proposers.builtin import strategies_for
    from test_functions import _model

    model, x = _model()
    s = kforge.Session(model, x, device="cpu", workdir=tmp_path / "wd")
    s.capture(timing_budget_ms=2, inductor_baseline=False)
    (region,) = s.cards.by_op("region")
    rules = s.cards.by_op("gated_delta_rule")
    assert rules
    dev = device_info("cpu")
    for card in rules:   # the CPU strategy's kernel, judged
        (strategy,) = strategies_for(card.op, "cpu")
        src = strategy.render(card.variant, strategy.default(card.variant, dev), dev)
        ev = s.evaluator.evaluate(card, src, s.store)
        assert ev.status.is_correct, ev.summary()
        cid = s.store.add_candidate(card.key, None, "test", src, intent="built-in")
        s.store.set_evaluation(cid, ev)
    s.optimize(proposer="builtin", iterations=1, cards=[region.key], confirm=False)
    for card in [region, *rules]:
        found = [c for c in s.store.candidates(card.key) if c.status is not None and c.status.is_correct]
        assert found, [(c.strategy, c.status) for c in s.store.candidates(card.key)]
        s.store.save_result(card.key, CardVerdict(CardStatus.WINNER, "test", winner_id=found[0].id, winner_speedup=1.5,
                                                  kernel_us=card.eager_us / 1.5, eager_us=card.eager_us, candidates=1))
    expected = _eager(model, x)
    with s.apply(all_winners=True) as dep, torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-4)
        assert dep.graph is not None and dep.graph.failure is None
        assert all(dk.calls > 0 for dk in dep.kernels), dep.calls
        assert any(sig.startswith("region[") for sig in dep.graph.replaced)
        assert any(sig.startswith("gated_delta_rule(") for sig in dep.graph.replaced)
    s.close()


_LOAD = textwrap.dedent("""
    import json, sys
    import torch
    sys.path.insert(0, {tests!r})
    import kforge
    from test_eager_regions import chains

    model, _ = chains()
    x = torch.load({x!r}, weights_only=True)
    dep = kforge.load(model, {path!r}, device="cpu")
    with torch.no_grad():
        y = model(x)
    print(json.dumps({{"calls": dep.calls, "skipped": dep.skipped, "repr": repr(dep), "out": y.flatten().tolist()}}))
""")


def test_export_then_load_in_a_fresh_process_runs_the_same_kernels(session, tmp_path):
    model, x = session.model, session.batches[0]
    path = session.export(tmp_path / "artifact")
    entries = json.loads((path / "manifest.json").read_text())["kernels"]
    assert sorted(e["variant"]["op"] for e in entries) == sorted(["region", "region", "group_norm_silu", "softmax"])
    torch.save(x, tmp_path / "x.pt")
    tests = os.path.dirname(__file__)
    script = _LOAD.format(tests=tests, path=str(path), x=str(tmp_path / "x.pt"))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), tests])})
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["skipped"] == [], result["skipped"]
    assert sorted(result["calls"]) == sorted(e["signature"] for e in entries)
    assert set(result["calls"].values()) == {1}, result["calls"]
    assert "3 region/fused in the model's graph" in result["repr"]
    torch.testing.assert_close(torch.tensor(result["out"]), _eager(model, x).flatten(), rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_on_the_gpu_region_kernels_run_eagerly_and_in_a_captured_cuda_graph(tmp_path):
    """On CUDA: a short built-in search of the model's region cards, apply(), the kernels run in the eager
    forward and the output matches; the same forward recorded into a CUDA graph replays with them (kforge::run
    launches on the current stream, its outputs from the caching allocator)."""
    model, x = chains()
    model, x = model.cuda(), x.cuda()
    s = kforge.Session(model, x, device="cuda", workdir=tmp_path / "wd")
    s.capture(timing_budget_ms=20.0)
    keys = [c.key for c in s.cards.by_op("region")]
    assert len(keys) == 2
    s.optimize(proposer="builtin", iterations=2, cards=keys, confirm=False)
    for key in keys:
        found = [c for c in s.store.candidates(key) if c.status is not None and c.status.is_correct]
        assert found, [(c.strategy, c.status) for c in s.store.candidates(key)]
        card = s.cards[key]
        s.store.save_result(key, CardVerdict(CardStatus.WINNER, "test", winner_id=found[0].id, winner_speedup=1.5,
                                             kernel_us=card.eager_us / 1.5, eager_us=card.eager_us, candidates=1))
    expected = _eager(model, x)
    with s.apply(all_winners=True) as dep, torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)
        assert set(dep.calls.values()) == {1}, dep.calls
        static = x.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            model(static)   # warm: the graph forward's own allocations before the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(static)
        static.copy_(x * 0.5)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, _eager(model, x * 0.5), rtol=1e-4, atol=1e-5)
    s.close()


def test_region_kernels_run_though_the_models_forward_has_been_compiled_past_dynamos_limit(session, monkeypatch):
    """Dynamo keeps its compiled variants on the code object of the frame it compiled, 8 at most. kforge's own
    compiles of the user's forward (region capture, the model-level checks) and the user's leave entries there; a
    captured forward compiled on the same code object past that limit would run the plain forward with nothing
    said (torch 2.11, which cannot isolate a compile's recompiles, did so on the H100): every kernel must still
    run. Checked without ``isolate_recompiles``, as on torch 2.11."""
    from kforge.deploy import _graph
    from kforge.deploy._graph import no_recompile_limit

    monkeypatch.setattr(_graph, "_COMPILE_KEYWORDS", _graph._COMPILE_KEYWORDS - {"isolate_recompiles"})
    model, x = session.model, session.batches[0]
    expected = _eager(model, x)
    torch._dynamo.reset()
    with no_recompile_limit(), torch.no_grad():
        for _ in range(10):   # NB: a new backend each time: dynamo recompiles (BACKEND_MATCH) and keeps each entry
            torch.compile(model, backend=lambda gm, example: gm.forward)(x)
    with session.apply(all_winners=True) as dep, torch.no_grad():
        got = model(x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert dep.graph is not None and dep.graph.failure is None
    assert set(dep.calls.values()) == {1}, dep.calls
