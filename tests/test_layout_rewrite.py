"""The channels_last rewrite (kforge.rewrites._layout): convolution chains run channels-last in the model's ATen
graph, eagerly and under torch.compile; the output is eager's, with eager's strides; the weights it converts
follow the model."""
from __future__ import annotations

import tempfile

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import kforge
from kforge.deploy import Deployment
from kforge.deploy._graph import compile_with
from kforge.rewrites import as_rewrites

from test_rewrites import DEEP_RTOL, FOLD, SINGLE_LAYER_RTOL, ConvBnRelu, GroupedAndTransposed, _randomised, _rel
from test_vendor_chains import SmallResNet

CL = "channels_last"


class ConvThenLinear(nn.Module):
    """A convolution chain that leaves through a view (flatten) into a matrix product, and a second output read
    straight from the chain: both must see the strides eager gives them."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        y = self.pool(F.relu(self.bn(self.conv(x))))
        return self.fc(y.view(y.shape[0], -1)), y


class _Convolutions(TorchDispatchMode):
    """Records the memory format of each convolution's input and weight as the graph runs them."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[bool, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution.default:
            x, w = args[0], args[1]
            # NB: channels-last order (a 1x1 or depthwise weight is both orders at once)
            self.seen.append(tuple(t.is_contiguous(memory_format=torch.channels_last) for t in (x, w)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("model,x,convs,rtol", [
    (ConvBnRelu(), torch.randn(2, 3, 12, 12), 2, SINGLE_LAYER_RTOL),
    (SmallResNet(), torch.randn(2, 3, 32, 32), 12, DEEP_RTOL),
    (GroupedAndTransposed(), torch.randn(2, 8, 6, 6), 2, SINGLE_LAYER_RTOL),
])
def test_every_convolution_runs_channels_last_and_the_output_is_eagers(model, x, convs, rtol):
    model = _randomised(model)
    seen = _Convolutions()

    def watched(gm, example_inputs):
        """A compiler that runs the rewritten ATen graph as it is, watching its convolutions."""
        def run(*args):
            with seen:
                return gm(*args)
        return run

    with torch.no_grad():
        eager = model(x)
        with Deployment([], model, rewrites=(CL,)) as dep:
            out = model(x)
        assert len(dep.rewritten) == convs and all(line.startswith(f"{CL}: conv weight") for line in dep.rewritten)
        assert _rel(out, eager) < rtol and out.stride() == eager.stride()
        torch._dynamo.reset()
        compiled = compile_with(model, [], backend=watched, rewrites=(CL,))
        out = compiled(x)
    assert seen.seen == [(True, True)] * convs
    assert _rel(out, eager) < rtol and out.stride() == eager.stride()


def test_a_tensor_leaving_the_chain_has_eagers_strides_and_a_view_of_it_works():
    model = _randomised(ConvThenLinear())
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        logits, feats = model(x)
        with Deployment([], model, rewrites=(CL,)) as dep:
            got_logits, got_feats = model(x)
        assert dep.rewritten and got_feats.stride() == feats.stride() and got_feats.is_contiguous()
        assert _rel(got_logits, logits) < SINGLE_LAYER_RTOL and _rel(got_feats, feats) < SINGLE_LAYER_RTOL


def test_under_torch_compile_with_the_fold_before_it_in_either_order():
    model = _randomised(SmallResNet())
    x = torch.randn(2, 3, 32, 32)
    assert as_rewrites((CL, FOLD)) == (FOLD, CL) == as_rewrites((FOLD, CL, FOLD))
    with torch.no_grad():
        eager = model(x)
        compiled = compile_with(model, [], backend="aot_eager", rewrites=(CL, FOLD))
        out = compiled(x)
        done = {r.rewrite: len(r.sites) for r in compiled.kforge_backend.rewritten}
        assert done == {FOLD: 12, CL: 12}
        assert _rel(out, eager) < DEEP_RTOL and out.stride() == eager.stride()
        model.bn1.running_var.mul_(2.0)   # the fold makes its weight again, and channels_last its copy of it
        assert _rel(compiled(x), model(x)) < DEEP_RTOL


def test_a_weight_changed_after_the_rewrite_reaches_the_next_forward():
    model = _randomised(ConvBnRelu())
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad(), Deployment([], model, rewrites=(CL,)) as dep:
        before = model(x)
        model.conv1.weight.mul_(-1.0)   # in place: its version moves
        after = model(x)
        assert _rel(after, before) > 1e-2 and _rel(after, model.forward.plain(x)) < SINGLE_LAYER_RTOL
        model.load_state_dict({k: v * 0.5 if k.endswith("conv2.weight") else v
                               for k, v in model.state_dict().items()})
        assert _rel(model(x), model.forward.plain(x)) < SINGLE_LAYER_RTOL
        assert dep.rewritten


@pytest.mark.parametrize("faster", [True, False])
def test_apply_keeps_channels_last_only_where_the_model_measures_faster(monkeypatch, faster):
    import kforge.deploy._fallback as fallback

    from test_rewrites import _timer

    arms: list = []
    monkeypatch.setattr(fallback, "interleaved", _timer(faster, arms))
    model = _randomised(ConvBnRelu())
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        eager = model(x)
        session = kforge.Session(model, x, workdir=tempfile.mkdtemp())
        with session.apply(rewrites=(CL, FOLD)) as dep:
            assert arms == [((FOLD,), ()), ((CL,), ())]   # each checked alone, in the registry's order
            assert dep.rewrites == ((FOLD, CL) if faster else ())
            assert (CL in dict(dep.skipped)) != faster
            assert _rel(model(x), eager) < SINGLE_LAYER_RTOL
        session.close()


def test_a_model_without_a_convolution_is_left_as_it_is(monkeypatch):
    import kforge.deploy._fallback as fallback

    from test_rewrites import _timer

    monkeypatch.setattr(fallback, "interleaved", _timer(True, []))
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    session = kforge.Session(model, torch.randn(4, 8), workdir=tempfile.mkdtemp())
    with torch.no_grad(), session.apply(rewrites=(CL,)) as dep:
        assert dep.rewrites == () and "nothing in the model's graph matches it" in dict(dep.skipped)[CL]
    session.close()
