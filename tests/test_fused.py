"""A fused operator on the CPU: a group_norm whose only reader is a SiLU (every ResNet block of the
SD3.5 VAE decoder) is found in the model's graph as one ``group_norm_silu`` card, searched with the
built-in strategies, and its kernel replaces both calls under torch.compile."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import kforge
from kforge.deploy import DeployedKernel, Deployment
from kforge.kernels import Kernel, compile_source, device_info
from kforge.regions import capture_regions


class Block(nn.Module):
    """conv -> GroupNorm -> SiLU -> conv, twice the same shapes; then a GroupNorm read by two (no fusion)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.act = nn.SiLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.norm2 = nn.GroupNorm(2, 8)
        self.tail = nn.GroupNorm(4, 8)

    def forward(self, x):
        h = self.conv2(self.act(self.norm(self.conv(x))))
        h = self.conv2(torch.nn.functional.silu(self.norm2(h)))
        t = self.tail(h)
        return torch.nn.functional.silu(t) + t   # the norm's output has two readers: stays a group_norm


def _model():
    torch.manual_seed(0)
    return Block().eval(), torch.randn(2, 4, 9, 7)


def test_the_graph_capture_finds_group_norm_then_silu_as_one_fused_call():
    model, x = _model()
    found = capture_regions(model, [x])
    assert found.error is None
    fused = [r for r in found.records if r.variant.op == "group_norm_silu"]
    assert len(fused) == 1 and fused[0].calls == 2, [(r.variant.op, r.calls) for r in found.records]
    v = fused[0].variant
    assert [s.shape for s in v.inputs] == [(2, 8, 9, 7), (8,), (8,)] and v.param_dict["num_groups"] == 2
    assert len(fused[0].examples) == 2
    # each example is one call's own inputs: the first call's reproduces silu(norm(conv(x)))
    with torch.no_grad():
        want = torch.nn.functional.silu(model.norm(model.conv(x)))
    ins = fused[0].examples[0]
    torch.testing.assert_close(ins[1], model.norm.weight.detach())
    torch.testing.assert_close(torch.nn.functional.silu(torch.nn.functional.group_norm(ins[0], 2, ins[1], ins[2], 1e-5)),
                               want)


def test_a_fused_card_with_a_tensor_over_the_capture_limit_keeps_no_example(tmp_path):
    """Region capture keeps operator capture's limit (``CaptureLimits.max_tensor_bytes``): a card with a larger
    tensor keeps no example, and its search runs on fresh inputs. Before, the SD3.5 VAE's fused twins (512 MB
    tensors) kept two examples each and their outputs: gigabytes cloned, written and read again."""
    model, x = _model()
    found = capture_regions(model, [x], max_tensor_bytes=2 * 8 * 9 * 7 * 4 - 1)   # one byte under [2,8,9,7] f32
    (fused,) = [r for r in found.records if r.variant.op == "group_norm_silu"]
    assert fused.calls == 2 and fused.examples == []
    s = kforge.Session(model, x, device="cpu", workdir=tmp_path, limits=kforge.CaptureLimits(max_tensor_bytes=1000))
    s.capture(timing_budget_ms=2.0)
    (card,) = s.cards.by_op("group_norm_silu")
    assert card.examples == 0 and s.store.load_examples(card.key, "cpu") == []
    s.close()
    found = capture_regions(model, [x], max_tensor_bytes=2 * 8 * 9 * 7 * 4)
    assert [len(r.examples) for r in found.records if r.variant.op == "group_norm_silu"] == [2]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    model, x = _model()
    s = kforge.Session(model, x, device="cpu", workdir=tmp_path_factory.mktemp("fused"))
    s.capture(timing_budget_ms=5.0)
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    yield
    torch._dynamo.reset()


def _kernel(s, card, iterations: int = 1) -> DeployedKernel:
    """A kernel for ``card`` from a correct candidate of a built-in search (searched here unless the
    session has one), built for the session's device."""
    def correct():
        return [c for c in s.store.candidates(card.key) if c.status is not None and c.status.is_correct]

    if not correct():
        s.optimize(proposer="builtin", iterations=iterations, cards=[card.key], confirm=False)
    found = correct()
    assert found, [(c.strategy, c.status) for c in s.store.candidates(card.key)]
    cuda = s.device.startswith("cuda")
    built = compile_source(found[0].source, "cuda" if cuda else "cpu", device_info(s.device).arch if cuda else "native")
    return DeployedKernel(card.variant, Kernel(built.path))


def _compile_run(kernels, model, x, backend: str = "inductor", code: bool = False, **compile_kwargs):
    """(the compiled model, its output, Inductor's code when ``code``): ``model`` compiled once with
    ``kernels`` deployed (``compile_kwargs`` go to torch.compile); the deployment is gone when this
    returns (the graphs stay)."""
    from torch._inductor.utils import run_and_get_code

    with Deployment(list(kernels), None) as dep:
        torch._dynamo.reset()
        compiled = dep.compile(model, backend=backend, dynamic=False, **compile_kwargs)
        with torch.no_grad():
            if code:
                got, (text, *_) = run_and_get_code(compiled, x)
            else:
                got, text = compiled(x), None
    return compiled, got, text


def _eager(model, x):
    with torch.no_grad():
        return model(x)


def _captured(build, shape, tmp_path, device: str = "cpu"):
    """(session, model, x): ``build()`` in eval mode on a seeded random ``shape`` input, captured."""
    torch.manual_seed(0)
    model, x = build().to(device).eval(), torch.randn(*shape, device=device)
    s = kforge.Session(model, x, device=device, workdir=tmp_path)
    s.capture(timing_budget_ms=5.0)
    return s, model, x


def _fused_cards(s):
    """The fused group_norm -> SiLU cards, with or without the convolution's bias as a prologue: every card of a
    family that is an epilogue (derived from the registry)."""
    from kforge.ops import family_of

    return [c for c in s.cards if (f := family_of(c.op)) is not None and f.epilogue is not None]


def _group_norm_cards(s):
    """(the group_norm cards in the traced layout, their channels-last twins)."""
    cards = s.cards.by_op("group_norm")
    return [c for c in cards if c.variant.inputs[0].is_contiguous], [c for c in cards if not c.variant.inputs[0].is_contiguous]


def test_the_fused_card_takes_the_share_of_the_calls_it_stands_for(session):
    frame = session.cards.to_frame()
    fused = frame[frame.op == "group_norm_silu"]
    assert len(fused) == 1 and fused.calls.iloc[0] == 2 and fused.kind.iloc[0] == "op"
    assert fused.share.iloc[0] > 0 and 0.0 < frame.share.sum() <= 1.0 + 1e-9
    # the two fused group_norms are inside it (their op card keeps its calls, its share moves to the
    # fused card); the tail's group_norm (two readers) keeps its share, or hands it to its channels-last
    # twin where Inductor lays the graph out so (mkldnn)
    traced, twins = _group_norm_cards(session)
    plain = {c.calls: c.share for c in traced}
    assert sorted(plain) == [1, 2] and plain[2] == 0.0
    if torch.backends.mkldnn.is_available():
        assert len(twins) == 1 and twins[0].calls == 1 and twins[0].share > 0 and plain[1] == 0.0
    else:
        assert not twins and plain[1] > 0


def test_search_then_the_kernel_replaces_both_calls_under_compile(session):
    (card,) = session.cards.by_op("group_norm_silu")
    kernel = _kernel(session, card, iterations=2)
    assert all(c.strategy.startswith("group_norm_silu.cpu.") for c in session.store.candidates(card.key))
    model, x = session.model, session.batches[0]
    expected = _eager(model, x)
    for backend in ("eager", "aot_eager"):
        before = kernel.calls
        compiled, got, _ = _compile_run([kernel], model, x, backend)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert compiled.kforge_backend.replaced == [card.variant.signature] * 2, backend
        assert kernel.calls == before + 2, "the kernel itself ran, once a fused pair"


needs_mkldnn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                  reason="Inductor lays CPU graphs out channels-last only where mkldnn runs convolutions")


@needs_mkldnn
def test_under_inductors_channels_last_layout_the_kernel_takes_its_buffers_without_copies(session):
    """Inductor runs a convolution graph channels-last (on the CPU whenever mkldnn runs the convolutions;
    on the GPU by its heuristic, e.g. the SD3.5 VAE decoder). A fused card is then the channels-last twin
    of the traced call, and its kernel is called through ``kforge::run_flexible``: Inductor hands it the
    convolution's buffer as it is. Before, the generated code copied every call's input into the traced
    layout and its output back (a ``cpp_fused_run`` kernel in front of each call)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kforge.regions._layout import inductor_lays_out_channels_last

    (card,) = session.cards.by_op("group_norm_silu")
    x_sig = card.variant.inputs[0]
    assert x_sig.stride == torch.empty(x_sig.shape).to(memory_format=torch.channels_last).stride(), card.signature
    kernel = _kernel(session, card)
    model, x = session.model, session.batches[0]
    expected = _eager(model, x)
    compiled, got, code = _compile_run([kernel], model, x, code=True)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert compiled.kforge_backend.replaced == [card.variant.signature] * 2
    assert code.count("torch.ops.kforge.run_flexible.default(") == 2, code
    assert "cpp_fused_run" not in code, "a copy kernel in front of the call"
    assert kernel.relayouts == 0, "the kernel got the layout it was made for"
    # the deployment gone, the same graphs run the operator itself (tests/test_fastpath.py: its output layout)
    calls = kernel.calls
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), expected, rtol=1e-4, atol=1e-4)
    assert kernel.calls == calls and len(compiled.kforge_backend.graphs) == 1, "no recompilation"
    # the decision is Inductor's own, asked of the ATen graph: channels-last where mkldnn runs convolutions
    conv = torch.nn.Conv2d(4, 8, 3)
    with torch.no_grad():
        gm = make_fx(lambda t: conv(t))(torch.randn(1, 4, 8, 8))
    assert inductor_lays_out_channels_last(gm)
    assert not inductor_lays_out_channels_last(make_fx(lambda t: t.relu() + 1)(torch.randn(1, 4, 8, 8)))


@needs_mkldnn
def test_a_mode_without_inductors_layout_optimization_places_no_channels_last_twin(session):
    """``options={"layout_optimization": False}`` keeps Inductor's graph in the traced layout: the twin,
    made for a channels-last graph, is then not placed, and the report says why (strides). Before, the
    pass asked Inductor's decision outside the mode's options and placed the twin, whose every call then
    paid a copy into its layout (``relayouts``)."""
    (card,) = session.cards.by_op("group_norm_silu")
    kernel = _kernel(session, card)
    model, x = session.model, session.batches[0]
    compiled, got, code = _compile_run([kernel], model, x, code=True, options={"layout_optimization": False})
    torch.testing.assert_close(got, _eager(model, x), rtol=1e-4, atol=1e-4)
    assert compiled.kforge_backend.replaced == [] and "kforge" not in code
    assert kernel.relayouts == 0
    from kforge.deploy._graph import nearest_miss

    assert "differs in strides" in nearest_miss(card.variant, compiled.kforge_backend.missed)


def test_with_grad_mode_on_the_kernel_stays_out_of_the_graph(session):
    """The kernels have no backward: a graph traced with grad mode on, whose parameters require grad,
    keeps the operators; traced under no_grad (inference), it takes the kernel (the test above)."""
    (card,) = session.cards.by_op("group_norm_silu")
    model, x = session.model, session.batches[0]
    with Deployment([_kernel(session, card)], None) as dep:
        torch._dynamo.reset()
        compiled = dep.compile(model, backend="eager", dynamic=False)
        compiled(x)   # grad mode on
    assert compiled.kforge_backend.replaced == []


def test_an_unplaced_fused_kernel_is_told_what_the_graph_has_instead():
    """The report of a kernel no compiled call took names the nearest call of its operator and what
    differs (here the layout: on the H200 two of the SD3.5 VAE's fused cards met channels-last inputs)."""
    from kforge.deploy._graph import nearest_miss
    from kforge.ops import get_spec

    x, w, b = torch.randn(1, 8, 4, 4), torch.randn(8), torch.randn(8)
    fused = get_spec("group_norm_silu")
    want = fused.variant(fused.bind(x, 2, w, b, 1e-5), ())
    cl = x.to(memory_format=torch.channels_last)
    as_cl = fused.variant(fused.bind(cl, 2, w, b, 1e-5), ())
    other = fused.variant(fused.bind(torch.randn(1, 8, 2, 2), 2, w, b, 1e-5), ())
    eps = fused.variant(fused.bind(x, 2, w, b, 1e-6), ())
    assert "(differs in strides)" in nearest_miss(want, [other, as_cl])
    assert "(differs in parameters)" in nearest_miss(want, [other, eps])
    assert "(differs in shapes)" in nearest_miss(want, [other])
    assert nearest_miss(want, []) is None


def test_the_capture_interpreter_lays_arguments_out_as_traced():
    """The ATen graph was traced on fake tensors; where a real argument's layout differs and the
    operator refuses it, the capture runs it again on a copy laid out as the trace had it."""
    import torch.fx as fx

    from kforge.regions._capture import TracedLayoutInterpreter

    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(4, 6)
    y = g.call_function(torch.ops.aten.view.default, (x, [24]))
    g.output(y)
    gm = fx.GraphModule(torch.nn.Module(), g)
    real = torch.arange(24.0).reshape(6, 4).t()   # [4, 6], transposed: view refuses it

    with pytest.raises(RuntimeError):
        gm(real)
    torch.testing.assert_close(TracedLayoutInterpreter(gm).run(real), real.contiguous().view(24))


class _ConvBlock(nn.Module):
    """3x3 convolutions wide enough (by default) that Inductor lays the graph out channels-last on the GPU."""

    def __init__(self, cin: int = 64, channels: int = 128, groups: int = 32):
        super().__init__()
        self.conv = nn.Conv2d(cin, channels, 3, padding=1)
        self.norm = nn.GroupNorm(groups, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return self.conv2(torch.nn.functional.silu(self.norm(self.conv(x))))


class _Residual(nn.Module):
    """conv -> (+ residual) -> relu -> conv: the add,relu region between convolutions (every ResNet block)."""

    def __init__(self, channels: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return self.conv2(torch.relu(self.conv(x) + x))


class _WideResidual(_Residual):
    """The residual block wide enough for the GPU, its add fed by two convolutions (no graph input)."""

    def __init__(self):
        super().__init__(128)

    def forward(self, x):
        h = self.conv(x)
        return self.conv2(torch.relu(self.conv2(h) + h))


def _add_relu(s):
    (card,) = [c for c in s.cards if c.op == "region" and "add" in c.signature and "relu" in c.signature]
    return card


class _WideLone(_ConvBlock):
    """The convolution block wide enough for the GPU, its group_norm read by the convolution alone."""

    def forward(self, x):
        return self.conv2(self.norm(self.conv(x)))


@pytest.mark.parametrize("build,shape,pick", [
    (_ConvBlock, (1, 64, 64, 64), lambda s: _fused_cards(s)[0]),
    (_WideResidual, (2, 128, 32, 32), _add_relu),
    (_WideLone, (1, 64, 64, 64), lambda s: [c for c in s.cards.by_op("group_norm") if c.share > 0][0]),
], ids=["fused", "region", "lone"])
def test_on_the_gpu_the_kernel_follows_inductors_layout(tmp_path, build, shape, pick):
    """The GPU side of the channels-last tests: where Inductor's decision is channels-last, the card
    (a fused operator, a region between convolutions, a lone group_norm) is the twin, its call goes through
    kforge::run_flexible and gets Inductor's buffer without a copy."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    s, model, x = _captured(build, shape, tmp_path, "cuda")
    card = pick(s)
    kernel = _kernel(s, card, iterations=2)
    channels_last = card.variant.outputs[0].stride[1] == 1
    expected = _eager(model, x)
    compiled, got, code = _compile_run([kernel], model, x, code=True)
    s.close()
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)
    assert got.stride() == expected.stride()
    assert compiled.kforge_backend.replaced == [card.variant.signature], code
    assert ("kforge.run_flexible.default(" in code) == channels_last, (card.signature, code)
    assert kernel.relayouts == 0, "the kernel got the layout it was made for"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_on_the_gpu_the_channels_last_tile_kernel_is_correct(tmp_path, dtype):
    """The twin's own design (``nhwc_tiles``: threads along the channels of each position, per-tile
    partial statistics), in several configurations, against eager on two samples. Before it, the
    channels-last twins of the SD3.5 VAE's group_norm -> SiLU ran 5.7 ms for bf16[1,256,1024,1024]
    (about 15x the bandwidth floor; the H200, 2026-12-03)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from kforge.kernels import device_info
    from kforge.proposers.builtin._strategy import get_strategy

    torch.manual_seed(0)
    model, x = _ConvBlock().cuda().eval().to(dtype), torch.randn(2, 64, 32, 32, device="cuda", dtype=dtype)
    s = kforge.Session(model, x, device="cuda", workdir=tmp_path)
    s.capture(timing_budget_ms=5.0)
    (card,) = _fused_cards(s)
    assert card.op == "biased_group_norm_silu", "on the GPU the convolution's bias is the kernel's prologue"
    assert card.variant.inputs[0].stride[1] == 1, f"not a channels-last twin: {card.signature}"
    strategy, dev = get_strategy(f"{card.op}.cuda.nhwc_tiles"), device_info("cuda")
    assert strategy.applies(card.variant, dev)
    configs = [strategy.default(card.variant, dev), {"threads": 1024, "vec": 1, "waves": 2, "unroll": 4},
               {"threads": 128, "vec": 2, "waves": 16, "unroll": 4}]
    for config in configs:
        assert strategy.valid(card.variant, config, dev), config
        ev = s.evaluator.evaluate(card, strategy.render(card.variant, config, dev), s.store)
        print(f"nhwc_tiles {config} {card.signature}: {ev.summary()}")
        assert ev.status.is_correct, (config, ev.summary())
    s.close()


class _LoneNorm(_WideLone):
    """conv -> GroupNorm -> conv, small: a group_norm no SiLU reads (the SD3.5 VAE's attention norm, many UNets)."""

    def __init__(self):
        super().__init__(4, 8, 2)


@needs_mkldnn
def test_a_lone_group_norm_between_convolutions_is_a_channels_last_twin(tmp_path):
    """A group_norm no SiLU reads gets its channels-last twin as a card of its own (the eager card's share
    moves to it) and is placed through ``kforge::run_flexible``: no copy around it. A plain kernel for the
    traced call, deployed with it, steps aside. Before, its only card was the traced (contiguous) one, whose
    kernel paid Inductor's copies in and out."""
    s, model, x = _captured(_LoneNorm, (2, 4, 9, 7), tmp_path)
    (plain,), (twin,) = _group_norm_cards(s)
    cl = torch.empty(2, 8, 9, 7).to(memory_format=torch.channels_last).stride()
    assert twin.variant.inputs[0].stride == cl and twin.variant.outputs[0].stride == cl, twin.signature
    assert twin.calls == 1 and twin.share > 0 and plain.share == 0.0
    kernels = [_kernel(s, twin), _kernel(s, plain)]
    expected = _eager(model, x)
    compiled, got, code = _compile_run(kernels, model, x, code=True)
    s.close()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert compiled.kforge_backend.replaced == [twin.variant.signature], code
    assert code.count("torch.ops.kforge.run_flexible.default(") == 1 and "kforge.run.default(" not in code, code
    assert "cpp_fused_run" not in code, "a copy kernel in front of the call"
    assert kernels[0].relayouts == 0 and kernels[0].calls >= 1 and kernels[1].calls == 0


class _NormFirst(nn.Module):
    """A group_norm of the graph's own input (no twin: Inductor keeps inputs as they are), then conv ->
    group_norm of the same shapes -> conv (a twin)."""

    def __init__(self):
        super().__init__()
        self.n1, self.conv = nn.GroupNorm(2, 8), nn.Conv2d(8, 8, 3, padding=1)
        self.n2, self.conv2 = nn.GroupNorm(2, 8), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.conv2(self.n2(self.conv(self.n1(x))))


@needs_mkldnn
def test_a_plain_group_norm_kernel_that_steps_aside_for_a_twin_still_takes_the_calls_the_twin_cannot(tmp_path):
    """The plain kernel steps aside in dynamo's graph wherever a twin of the same shapes is deployed; the
    calls the twin cannot take (one reading the graph's input; every call where the mode keeps the traced
    layout) are then placed in the ATen graph. Before, they stayed on PyTorch's group_norm (found by review)."""
    s, model, x = _captured(_NormFirst, (2, 8, 9, 7), tmp_path)
    (plain,), (twin,) = _group_norm_cards(s)
    assert plain.calls == 2 and plain.share > 0 and twin.calls == 1
    kernels = [_kernel(s, twin), _kernel(s, plain)]
    s.close()
    expected = _eager(model, x)
    compiled, got, _ = _compile_run(kernels, model, x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert sorted(compiled.kforge_backend.replaced) == sorted([plain.variant.signature, twin.variant.signature])
    assert kernels[0].calls >= 1 and kernels[1].calls >= 1
    torch._dynamo.reset()
    compiled, got, _ = _compile_run(kernels, model, x, options={"layout_optimization": False})
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert compiled.kforge_backend.replaced == [plain.variant.signature] * 2


@needs_mkldnn
def test_a_pointwise_region_between_convolutions_is_a_channels_last_twin_too(tmp_path):
    """A pointwise region whose tensors Inductor lays out channels-last (the residual add + relu of a
    ResNet block) gets the twin's card and ``kforge::run_flexible``: no copy in front of the call,
    the kernel's own layout, eager's output. The graph's own input (the residual) keeps its layout."""
    s, model, x = _captured(_Residual, (2, 8, 16, 16), tmp_path)
    card = _add_relu(s)
    cl = torch.empty(2, 8, 16, 16).to(memory_format=torch.channels_last).stride()
    assert card.variant.outputs[0].stride == cl and card.share > 0, card.signature
    kernel = _kernel(s, card)
    expected = _eager(model, x)
    compiled, got, code = _compile_run([kernel], model, x, code=True)
    s.close()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert got.stride() == expected.stride(), "the twin's layout does not reach the model's caller"
    assert compiled.kforge_backend.replaced == [card.variant.signature]
    assert code.count("torch.ops.kforge.run_flexible.default(") == 1, code
    assert "cpp_fused_run" not in code, "a copy kernel in front of the call"
    assert kernel.relayouts == 0 and kernel.calls >= 1


class _Tail(nn.Module):
    """A pointwise region after a convolution whose output is the model's output."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x) * 2 + 1)


@needs_mkldnn
def test_a_twin_whose_output_is_the_models_output_returns_eagers_layout(tmp_path):
    s, model, x = _captured(_Tail, (2, 8, 16, 16), tmp_path)
    (card,) = [c for c in s.cards if c.op == "region"]
    assert card.variant.outputs[0].stride[1] == 1, card.signature   # the twin
    kernel = _kernel(s, card)
    expected = _eager(model, x)
    for backend in ("inductor", "aot_eager"):
        compiled, got, _ = _compile_run([kernel], model, x, backend)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        assert compiled.kforge_backend.replaced == [card.variant.signature], backend
        assert got.stride() == expected.stride(), backend
    s.close()


class _Shared(nn.Module):
    """One GroupNorm signature twice: first read only by a SiLU (fused), then by two (a plain group_norm)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.norm = nn.GroupNorm(2, 8)

    def forward(self, x):
        h = self.conv(torch.nn.functional.silu(self.norm(self.conv(x))))
        t = self.norm(h)
        return t + t.sigmoid()


class _TwoNorms(nn.Module):
    """Two group_norm -> SiLU pairs on the same shapes, with 2 and with 4 groups."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.a, self.b = nn.GroupNorm(2, 8), nn.GroupNorm(4, 8)

    def forward(self, x):
        h = self.conv(torch.nn.functional.silu(self.a(self.conv(x))))
        return self.conv(torch.nn.functional.silu(self.b(h)))


@pytest.mark.parametrize("build,plain_groups", [(_Shared, 2), (_TwoNorms, 4)], ids=["same-signature", "other-groups"])
def test_a_plain_group_norm_kernel_and_a_fused_one_each_take_their_own_calls(tmp_path, build, plain_groups):
    """With winners for a fused card (2 groups) and a plain group_norm, each call gets its own kernel:
    the pair goes to the fused kernel (placed in the ATen graph), the other call to the plain kernel
    (placed in dynamo's graph, before the ATen pass runs), whether that call has the fused pair's
    signature but another reader, or is a pair the fused kernel does not take (other parameters)."""
    s, model, x = _captured(build, (2, 8, 9, 7), tmp_path)
    fused = next(c for c in s.cards.by_op("group_norm_silu") if c.variant.param_dict["num_groups"] == 2)
    plain = next(c for c in s.cards.by_op("group_norm") if c.variant.param_dict["num_groups"] == plain_groups
                 and c.variant.inputs[0].shape == fused.variant.inputs[0].shape)
    kernels = [_kernel(s, fused), _kernel(s, plain)]
    expected = _eager(model, x)
    compiled, got, _ = _compile_run(kernels, model, x, "aot_eager")
    s.close()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert sorted(compiled.kforge_backend.replaced) == sorted([fused.signature, plain.signature])
    assert kernels[0].calls == 1 and kernels[1].calls == 1


class _Peel(nn.Module):
    """conv -> GroupNorm -> SiLU (the convolution read by the norm alone: its bias can move into the fused kernel),
    then conv -> GroupNorm -> SiLU -> conv, + that convolution's output again (two readers: its bias stays)."""

    def __init__(self):
        super().__init__()
        self.conv, self.n1 = nn.Conv2d(4, 8, 3, padding=1), nn.GroupNorm(2, 8)
        self.conv2, self.n2 = nn.Conv2d(8, 8, 3, padding=1), nn.GroupNorm(2, 8)
        self.conv3 = nn.Conv2d(8, 8, 3, padding=1)
        with torch.no_grad():   # biases far apart per channel: a bias added twice, or not at all, shows
            for conv in (self.conv, self.conv2):
                conv.bias.copy_(torch.linspace(-3, 3, 8))

    def forward(self, x):
        g = self.conv2(torch.nn.functional.silu(self.n1(self.conv(x))))
        return self.conv3(torch.nn.functional.silu(self.n2(g))) + g


@needs_mkldnn
def test_a_convolutions_bias_moves_into_the_fused_kernel_where_inductor_would_peel_it(tmp_path, monkeypatch):
    """On the GPU Inductor runs a convolution without its bias and adds the bias in a pointwise kernel of its
    own, fused into its group_norm's reads. A kforge kernel taking the convolution's output made Inductor write
    that sum first (652 us a forward for one SD3.5 VAE call on the H200, 2026-12-03m). Where the convolution's
    only reader is the group_norm, the fused card is ``biased_group_norm_silu``: its kernel takes the
    convolution's output before the bias, and the bias, and the convolution runs without it. (Forced on the
    CPU, where Inductor keeps the bias inside mkldnn's convolution.)"""
    import kforge.ops.families.group_norm._pattern as match

    monkeypatch.setattr(match, "inductor_peels_conv_bias", lambda device: True)
    s, model, x = _captured(_Peel, (2, 4, 9, 7), tmp_path)
    (biased,) = s.cards.by_op("biased_group_norm_silu")
    (plain,) = s.cards.by_op("group_norm_silu")   # the second convolution has two readers: it keeps its bias
    cl = torch.empty(2, 8, 9, 7).to(memory_format=torch.channels_last).stride()
    assert biased.variant.inputs[0].stride == cl and [i.shape for i in biased.variant.inputs[1:]] == [(8,)] * 3
    assert biased.calls == 1 and biased.share > 0
    # its example is the convolution's output before the bias, exactly
    with torch.no_grad():
        conv_out = model.conv(x)
    found = capture_regions(model, [x])
    (rec,) = [r for r in found.records if r.variant.op == "biased_group_norm_silu"]
    ex = rec.examples[0]
    torch.testing.assert_close(ex[0] + model.conv.bias.detach().view(1, -1, 1, 1), conv_out)
    torch.testing.assert_close(ex[1], model.conv.bias.detach())
    kernels = [_kernel(s, biased), _kernel(s, plain)]
    assert all(c.strategy.startswith("biased_group_norm_silu.cpu.") for c in s.store.candidates(biased.key))
    expected = _eager(model, x)
    compiled, got, code = _compile_run(kernels, model, x, code=True)
    s.close()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)   # the bias added once: in the kernel
    assert sorted(compiled.kforge_backend.replaced) == sorted([biased.variant.signature, plain.variant.signature])
    assert code.count("torch.ops.kforge.run_flexible.default(") == 2, code
    assert kernels[0].calls >= 1 and kernels[0].relayouts == 0
    # in a graph Inductor keeps as traced there is no twin, so no prologue: both convolutions keep their biases
    monkeypatch.setattr("kforge.regions._deploy.inductor_lays_out_channels_last", lambda gm: False)
    torch._dynamo.reset()
    found = capture_regions(model, [x])
    assert [(r.variant.op, r.calls) for r in found.records if r.variant.op != "region"] == [("group_norm_silu", 2)]


def test_the_biased_reference_adds_the_bias_in_float32():
    """Where the bias dominates a bf16 convolution's output, x + bias rounded to bf16 before the statistics moves
    the result: a kernel that adds it in float32 (as the convolution's epilogue and Inductor's peeled add do) failed
    the check against such a reference (785 of 65536 elements, found by review). The reference adds it in float32:
    the CPU kernel passes the evaluator's comparison, and the reference is within bf16's rounding of float64."""
    from kforge.evaluate._checks import compare
    from kforge.ops import get_spec
    from kforge.proposers.builtin._strategy import get_strategy

    torch.manual_seed(0)
    spec = get_spec("biased_group_norm_silu")
    x = (torch.randn(1, 64, 32, 32) * 0.05).to(torch.bfloat16)
    bias, w, b = (torch.randn(64) * 8).to(torch.bfloat16), torch.randn(64).to(torch.bfloat16), torch.randn(64).to(torch.bfloat16)
    call = spec.bind(x, bias, 64, w, b, 1e-6)   # a channel a group: the statistics see x's spread, not the bias'
    ref = spec.reference(list(call.inputs), call.params)
    v = spec.variant(call, [ref])
    truth = torch.nn.functional.silu(torch.nn.functional.group_norm(
        x.double() + bias.double().view(1, -1, 1, 1), 64, w.double(), b.double(), 1e-6))
    assert ((ref.double() - truth).abs() <= 1e-2 * truth.abs() + 1e-2).all()
    dev = device_info("cpu")
    strategy = get_strategy("biased_group_norm_silu.cpu.per_group")
    kernel = Kernel(compile_source(strategy.render(v, strategy.default(v, dev), dev), "cpu", "native").path)
    from kforge.kernels import param_vector

    out = torch.empty_like(ref)
    kernel.launch([x, bias, w, b], [out], param_vector(v), workspace=torch.empty(max(kernel.workspace_bytes, 1),
                                                                               dtype=torch.uint8))
    assert compare(spec, out, ref, "output").ok, compare(spec, out, ref, "output").message


@needs_mkldnn
def test_a_kernel_from_before_the_bias_prologue_still_takes_its_calls(tmp_path, monkeypatch):
    """A store searched before the prologue existed has a kernel for the plain fused twin of a call that is now
    ``biased_group_norm_silu``: the ATen pass places it there as before (the convolution keeps its bias), so a
    search a user paid for is not lost."""
    import kforge.ops.families.group_norm._pattern as match
    from kforge.ops import without_prologue
    from kforge.proposers.builtin._strategy import get_strategy

    monkeypatch.setattr(match, "inductor_peels_conv_bias", lambda device: True)
    s, model, x = _captured(_Peel, (2, 4, 9, 7), tmp_path)
    (biased,) = s.cards.by_op("biased_group_norm_silu")
    s.close()
    old = without_prologue(biased.variant)   # the plain twin: same shapes and strides, no bias input
    dev = device_info("cpu")
    strategy = get_strategy("group_norm_silu.cpu.per_group")
    built = compile_source(strategy.render(old, strategy.default(old, dev), dev), "cpu", "native")
    kernel = DeployedKernel(old, Kernel(built.path))
    expected = _eager(model, x)
    compiled, got, code = _compile_run([kernel], model, x, code=True)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # both calls: the one now biased, and the second (its convolution has two readers: plain, of the same shapes)
    assert compiled.kforge_backend.replaced == [old.signature] * 2, code
    assert kernel.calls >= 2 and kernel.relayouts == 0


class _InputRegion(nn.Module):
    """relu(x * 2 + 1) on the graph's own input, then a convolution."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.conv(torch.relu(x * 2.0 + 1.0))


@needs_mkldnn
def test_a_twins_inputs_are_laid_out_by_inductor_not_copied_by_the_kernel(tmp_path, monkeypatch):
    """The ATen pass asks Inductor for a twin's layout (``inductor_force_stride_order`` in front of the call: free
    where Inductor lays the buffer out so anyway, else Inductor writes it so, a copy at worst). On the H200 two
    SD3.5 VAE twins got their 512 MB inputs in another layout and copied them in ``kforge::run`` (5.1 ms a forward).
    Made to happen here: the twin is told its input (the graph's own, which Inductor never lays out anew) will be
    channels-last. With the request the kernel gets its layout; without it, each call pays the kernel's copy. Under
    a compiler other than Inductor nothing is asked (that prim, run as it is, copies every input)."""
    import kforge.regions._deploy as deploy_pass

    real = deploy_pass.channels_last_twin
    monkeypatch.setattr(deploy_pass, "channels_last_twin", lambda variant, given=(): real(variant))
    s, model, x = _captured(_InputRegion, (2, 8, 9, 7), tmp_path)
    (card,) = [c for c in s.cards if c.op == "region"]
    assert card.variant.inputs[0].stride == torch.empty(2, 8, 9, 7).to(memory_format=torch.channels_last).stride()
    kernel = _kernel(s, card)
    s.close()
    expected = _eager(model, x)
    compiled, got, code = _compile_run([kernel], model, x, code=True)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert compiled.kforge_backend.replaced == [card.variant.signature] and "run_flexible" in code
    assert kernel.calls >= 1 and kernel.relayouts == 0, "Inductor laid the input out as the kernel wants"
    monkeypatch.setattr(deploy_pass, "_in_layout", lambda graph, node, sig: node)
    compiled, got, _ = _compile_run([kernel], model, x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert kernel.relayouts >= 1, "without the request the kernel copies its input"
    monkeypatch.undo()
    monkeypatch.setattr(deploy_pass, "channels_last_twin", lambda variant, given=(): real(variant))
    asked = []
    monkeypatch.setattr(deploy_pass, "_in_layout", lambda graph, node, sig: asked.append(node) or node)
    _compile_run([kernel], model, x, backend="aot_eager")
    assert asked == [], "no layout request to a compiler other than Inductor"
