"""Inference rewrites (kforge.rewrites): batch norm folded into the convolution before it, eagerly (the model's
forward captured as a graph) and under torch.compile, kept only where the model's output stays eager's and the
model measures faster with it."""
from __future__ import annotations

import sys
import tempfile

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kforge
from kforge.deploy import Deployment
from kforge.deploy._fallback import Comparison

from test_vendor_chains import SmallResNet

FOLD = "fold_batch_norm"
_NORM_OPS = ("aten::_native_batch_norm_legit_no_training", "aten::batch_norm", "aten::native_batch_norm")

# NB: the tolerance. A fold changes rounding only: each folded weight is w * s rounded once to float32 (relative
# error at most 2^-24), so a convolution over K products moves by about sqrt(K) * 6e-8 of its output's scale,
# and eager's own batch norm rounds twice more; ~1e-6 a layer for K <= 576. Twelve layers of the small ResNet
# compound that to ~1e-5, so relative L2 1e-4 holds with room, while a fold that drops the mean, the eps (set to
# 0.5 below so that it matters), or scales the wrong channel moves the output by 1e-2 or more.
SINGLE_LAYER_RTOL = 1e-5
DEEP_RTOL = 1e-4


def _randomised(model: nn.Module) -> nn.Module:
    """``model`` in eval mode with batch norm statistics and affine parameters far from their defaults (a fold of
    the defaults is almost the identity and would check nothing)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.running_mean.copy_(torch.rand(c, generator=g) * 2 - 1)
                m.running_var.copy_(torch.rand(c, generator=g) * 1.5 + 0.25)
                if m.affine:
                    m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                    m.bias.copy_(torch.rand(c, generator=g) - 0.5)
    return model.eval()


class ConvBnRelu(nn.Module):
    def __init__(self, bias: bool = True):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 16, 3, padding=1, bias=bias), nn.BatchNorm2d(16, eps=0.5)
        self.conv2, self.bn2 = nn.Conv2d(16, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8, affine=False)

    def forward(self, x):
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class ConvReadTwice(nn.Module):
    """A convolution whose output the batch norm and the residual both read: no fold can keep the residual."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)

    def forward(self, x):
        y = self.conv(x)
        return F.relu(self.bn(y) + y)


class GroupedAndTransposed(nn.Module):
    """A grouped transposed convolution (weight [in, out / groups, k, k]) and a depthwise one, each before a batch
    norm: the fold scales the weight along its output channels, which sit in a different place in each."""

    def __init__(self):
        super().__init__()
        self.up, self.bn1 = nn.ConvTranspose2d(8, 12, 3, stride=2, groups=2), nn.BatchNorm2d(12)
        self.depthwise, self.bn2 = nn.Conv2d(12, 12, 3, padding=1, groups=12), nn.BatchNorm2d(12)

    def forward(self, x):
        return self.bn2(self.depthwise(F.relu(self.bn1(self.up(x)))))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _ops_run(model: nn.Module, x: torch.Tensor) -> dict[str, int]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(x)
    return {e.key: e.count for e in prof.key_averages()}


def _norms(ops: dict[str, int]) -> int:
    """Batch norms run (each reaches some of these names, one inside another)."""
    return max(ops.get(name, 0) for name in _NORM_OPS)


@pytest.mark.parametrize("model,x,sites,rtol", [
    (ConvBnRelu(), torch.randn(2, 3, 12, 12), 2, SINGLE_LAYER_RTOL),
    (SmallResNet(), torch.randn(2, 3, 32, 32), 12, DEEP_RTOL),   # the stem, 3 bottlenecks x 3, 2 downsamples
    (GroupedAndTransposed(), torch.randn(2, 8, 6, 6), 2, SINGLE_LAYER_RTOL),
], ids=["conv_bn_relu", "resnet_bottlenecks", "grouped_and_transposed"])
def test_every_batch_norm_after_a_convolution_is_folded_and_the_output_is_eagers(model, x, sites, rtol):
    model = _randomised(model)
    with torch.no_grad():
        eager = model(x)
        assert _norms(_ops_run(model, x)) == sites
        with Deployment([], model, rewrites=(FOLD,)) as dep:
            out = model(x)
            assert len(dep.rewritten) == sites, dep.rewritten
            ops = _ops_run(model, x)
        assert _norms(ops) == 0 and ops.get("aten::convolution", 0) == sites
        assert _rel(out, eager) < rtol
        assert _norms(_ops_run(model, x)) == sites   # removed: the model's own forward again


def test_a_train_mode_batch_norm_or_a_convolution_read_twice_is_not_folded():
    x = torch.randn(2, 8, 10, 10)
    twice = _randomised(ConvReadTwice())
    train = _randomised(ConvBnRelu()).train()
    with torch.no_grad():
        for model, inp in ((twice, x), (train, x[:, :3])):
            eager = model(inp)
            stats = [b.clone() for b in model.buffers()]
            with Deployment([], model, rewrites=(FOLD,)) as dep:
                out = model(inp)
                assert dep.rewritten == [] and dep.graph.failure is None
            torch.testing.assert_close(out, eager if not model.training else out)
            if model.training:   # a training batch norm updated its running statistics, as eagerly
                assert any(not torch.equal(a, b) for a, b in zip(stats, model.buffers()))


def test_batch_norm_parameters_changed_after_apply_are_used_at_the_next_forward():
    """The folded weights are constants made when the forward is captured; a later change to any source (in place,
    ``load_state_dict``, ``p.data = ...``, a new parameter object) makes them again before the next run, so the
    model computes what eager computes with its new values."""
    model = _randomised(ConvBnRelu())
    x = torch.randn(2, 3, 12, 12)
    other = _randomised(ConvBnRelu())
    with torch.no_grad():
        other.bn1.running_var.mul_(3.0)
        other.conv1.weight.mul_(-1.0)
    with torch.no_grad(), Deployment([], model, rewrites=(FOLD,)) as dep:
        model(x)
        (folds,) = dep.graph.backend.rewritten
        model(x)
        assert folds.refresh.refolds == 0   # unchanged sources: nothing is made again

        def changed(change):
            change()
            out = model(x)
            assert _rel(out, model.forward.plain(x)) < SINGLE_LAYER_RTOL
            return out

        before = model(x)
        after = changed(lambda: model.bn1.running_mean.add_(0.75))
        assert _rel(after, before) > 1e-2 and folds.refresh.refolds == 1
        changed(lambda: model.load_state_dict(other.state_dict()))
        changed(lambda: setattr(model.bn2.running_var, "data", model.bn2.running_var * 4.0))
        changed(lambda: setattr(model.bn1, "weight", nn.Parameter(model.bn1.weight * 2.0)))
        assert len(dep.rewritten) >= 2


def _timer(faster: bool, arms: list):
    def compare(device, **_):
        def timed(with_arm, without_arm):
            arms.append((getattr(with_arm, "rewrites", ()), getattr(without_arm, "rewrites", ())))
            with_us = 80.0 if faster else 120.0
            return Comparison(with_us, 100.0, 2.0, paired_us=100.0 - with_us)
        return timed
    return compare


@pytest.mark.parametrize("faster", [True, False])
def test_apply_keeps_the_fold_only_where_the_model_measures_faster(monkeypatch, faster):
    import kforge.deploy._fallback as fallback

    arms: list = []
    monkeypatch.setattr(fallback, "interleaved", _timer(faster, arms))
    model = _randomised(ConvBnRelu())
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        eager = model(x)
    session = kforge.Session(model, x, workdir=tempfile.mkdtemp())
    with torch.no_grad(), session.apply(rewrites=FOLD) as dep:
        assert arms == [((FOLD,), ())]
        out = model(x)
        (verdict,) = dep.rewrite_checks
        assert verdict.kept == faster and len(verdict.sites) == 2
        assert dep.rewrites == ((FOLD,) if faster else ())
        assert len(dep.rewritten) == (2 if faster else 0)
        assert (FOLD in dict(dep.skipped)) != faster
        assert _rel(out, eager) < SINGLE_LAYER_RTOL
    with pytest.raises(ValueError, match="no rewrite named"):
        session.apply(rewrites=("fold_layer_norm",))


def test_a_fold_that_moves_the_output_is_left_out(monkeypatch):
    """The output check runs before any timing: a wrong fold (here its channels' scales reversed) is refused."""
    import kforge.deploy._fallback as fallback
    import kforge.rewrites._batch_norm as batch_norm

    arms: list = []
    monkeypatch.setattr(fallback, "interleaved", _timer(True, arms))
    right = batch_norm.folded
    monkeypatch.setattr(batch_norm, "folded", lambda site, values: tuple(
        t.flip(0) for t in right(site, values)))
    model = _randomised(ConvBnRelu())
    session = kforge.Session(model, torch.randn(2, 3, 12, 12), workdir=tempfile.mkdtemp())
    with torch.no_grad(), session.apply(rewrites=(FOLD,)) as dep:
        assert dep.rewrites == () and arms == []
        assert "differs from eager's" in dict(dep.skipped)[FOLD]


def test_the_fold_under_torch_compile_is_checked_and_kept(monkeypatch):
    import kforge.deploy._fallback as fallback

    arms: list = []
    monkeypatch.setattr(fallback, "interleaved", _timer(True, arms))
    model = _randomised(SmallResNet())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        eager = model(x)
    session = kforge.Session(model, x, workdir=tempfile.mkdtemp())
    with torch.no_grad():
        compiled = session.compile(rewrites=(FOLD,))
        out = compiled(x)
        (verdict,) = compiled.kforge_rewrites
        assert verdict.kept and verdict.mode == "default" and len(verdict.sites) == 12
        assert arms == [((FOLD,), ())]
        assert sum(line.startswith(FOLD) for line in compiled.kforge_backend.replaced) == 12
        assert _rel(out, eager) < DEEP_RTOL
        model.bn1.running_var.mul_(2.0)   # the compiled graph reads the new statistics too
        assert _rel(compiled(x), model(x)) < DEEP_RTOL


def test_a_graph_that_records_gradients_is_not_rewritten():
    """A folded weight has no gradient: with grad mode on and parameters that need it, the graph stays as traced."""
    from kforge.deploy._graph import compile_with

    model = _randomised(ConvBnRelu())
    x = torch.randn(2, 3, 12, 12)
    compiled = compile_with(model, [], backend="eager", rewrites=(FOLD,))
    out = compiled(x)
    out.sum().backward()
    assert compiled.kforge_backend.rewritten == [] and model.conv1.weight.grad is not None
    with torch.no_grad():
        torch._dynamo.reset()
        compiled = compile_with(model, [], backend="eager", rewrites=(FOLD,))
        compiled(x)
        assert len(compiled.kforge_backend.rewritten[0].sites) == 2


def test_the_folded_constants_have_static_shapes_in_the_compiled_graph(monkeypatch):
    """The fold's new weight and bias are described to the compiler with their sizes as numbers: a symbol per size
    (what dynamo's fake mode gives a tensor by default) has no source, and a guard on it broke dynamo's guard build."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kforge.deploy._graph import compile_with

    made: list = []
    plain = FakeTensorMode.from_tensor

    def spy(self, t, *a, **kw):
        fake = plain(self, t, *a, **kw)
        if sys._getframe(1).f_globals.get("__name__") == "kforge.rewrites._batch_norm":
            made.append(fake)
        return fake

    monkeypatch.setattr(FakeTensorMode, "from_tensor", spy)
    model = _randomised(ConvBnRelu())
    with torch.no_grad():
        compiled = compile_with(model, [], backend="eager", rewrites=(FOLD,))
        compiled(torch.randn(2, 3, 12, 12))
    assert len(made) == 4   # two folds, a weight and a bias each
    assert all(type(d) is int for fake in made for d in fake.shape)


def test_a_rewrite_whose_compile_fails_is_left_out_and_the_compile_goes_on(monkeypatch):
    import kforge.deploy._fallback as fallback
    import kforge.deploy._rewrites as rewrites

    arms: list = []
    monkeypatch.setattr(fallback, "interleaved", _timer(True, arms))

    def broken(*a, **kw):
        def run(*args, **kwargs):
            raise IndexError("list index out of range")
        run.kforge_backend = None
        return run

    monkeypatch.setattr(rewrites, "compile_with", broken)
    model = _randomised(ConvBnRelu())
    x = torch.randn(2, 3, 12, 12)
    session = kforge.Session(model, x, workdir=tempfile.mkdtemp())
    with torch.no_grad():
        eager = model(x)
        compiled = session.compile(rewrites=(FOLD,), backend="eager")
        (verdict,) = compiled.kforge_rewrites
        assert not verdict.kept and arms == []
        assert verdict.why == "compiling the model with it failed: IndexError: list index out of range"
        assert _rel(compiled(x), eager) < SINGLE_LAYER_RTOL
