"""The C launch fast path against the ctypes path: same outputs, same errors, safe across threads."""
from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from kforge.deploy import DeployedKernel
from kforge.deploy._fast import launcher_type, unavailable_reason
from kforge.kernels import Kernel, compile_source
from kforge.ops import get_spec
from kernel_files import kernel_source

needs_fast = pytest.mark.skipif(launcher_type() is None, reason=f"no C launcher here: {unavailable_reason()}")


def _softmax_kernel(name: str, x: torch.Tensor, **kw) -> DeployedKernel:
    spec = get_spec("softmax")
    call = spec.bind(x, -1)
    variant = spec.variant(call, [spec.reference(call.inputs, call.params)])
    return DeployedKernel(variant, Kernel(compile_source(kernel_source("cpu", name), "cpu", "native").path), **kw)


@needs_fast
def test_both_launch_paths_give_the_reference_and_count_calls():
    x = torch.randn(16, 300)
    fast, slow = _softmax_kernel("softmax_rows", x), _softmax_kernel("softmax_rows", x, fast=False)
    assert fast.fast and not slow.fast
    for dk in (fast, slow):
        (a,) = dk((x,))
        (b,) = dk([x])
        torch.testing.assert_close(a, torch.softmax(x, -1))
        assert a.data_ptr() != b.data_ptr(), "every call gets fresh outputs"
        assert a.shape == x.shape and a.stride() == x.stride() and a.dtype == x.dtype
        assert dk.calls == 2


@needs_fast
@pytest.mark.parametrize("fast", [True, False], ids=["c", "ctypes"])
def test_a_failed_launch_raises_with_the_code_and_is_not_counted(fast):
    x = torch.randn(4, 8)
    dk = _softmax_kernel("fault_launch_error", x, fast=fast)
    with pytest.raises(RuntimeError, match=r"softmax\(input: f32\[4,8\].*failed to launch \(error 7\)"):
        dk((x,))
    assert dk.calls == 0


@needs_fast
def test_bad_arguments_are_refused_not_crashed():
    x = torch.randn(4, 8)
    dk = _softmax_kernel("softmax_rows", x)
    with pytest.raises(TypeError, match="expected 1 inputs, got 2"):
        dk.launch((x, x))
    with pytest.raises(TypeError, match="sequence"):
        dk.launch(42)
    with pytest.raises(AttributeError):
        dk.launch(("not a tensor",))
    Launcher = launcher_type()
    with pytest.raises(ValueError, match="descriptors"):
        Launcher(1, b"123", 1, b"", 0, b"", None, (), None, 0, "sig", None, False)
    half = Launcher.__new__(Launcher)
    with pytest.raises(ValueError):
        half.__init__(1, b"123", 1, b"", 0, b"", None, (), None, 0, "sig", None, False)
    with pytest.raises(RuntimeError, match="never initialised"):
        half((x,))  # a failed init leaves nothing callable
    with pytest.raises(TypeError, match="initialised once"):
        dk.launch.__init__(1, b"", 0, b"", 0, b"", None, (), None, 0, "sig", None, False)
    torch.testing.assert_close(dk.launch((x,))[0], torch.softmax(x, -1))


@needs_fast
def test_concurrent_calls_do_not_share_pointers():
    dk = _softmax_kernel("softmax_rows", torch.randn(64, 256))
    xs = [torch.randn(64, 256) for _ in range(8)]

    def run(i):
        return all(torch.allclose(dk((xs[i % 8],))[0], torch.softmax(xs[i % 8], -1)) for _ in range(50))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(run, range(16)))
    assert dk.calls == 16 * 50


def test_the_fast_path_can_be_turned_off():
    code = ("from kforge.deploy._fast import launcher_type, unavailable_reason; "
            "assert launcher_type() is None; print(unavailable_reason())")
    out = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, "KFORGE_FASTPATH": "0"},
                         capture_output=True, text=True, check=True).stdout
    assert "KFORGE_FASTPATH=0" in out


WORKSPACE_COPY = r"""
#include "kforge.h"
#include <string.h>
#include <time.h>
/* Copies the input through the shared workspace, pausing in between: two calls running at once
   on one workspace would hand each other's data back. */
KF_ENTRY size_t kf_workspace_bytes(void) { return 64 * 256 * sizeof(float); }
KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    const size_t n = 64 * 256 * sizeof(float);
    memcpy(workspace, in[0].data, n);
    struct timespec pause = {0, 200000};
    nanosleep(&pause, NULL);
    memcpy(out[0].data, workspace, n);
    return 0;
}
"""


@needs_fast
@pytest.mark.parametrize("fast", [True, False], ids=["c", "ctypes"])
def test_a_shared_workspace_is_used_by_one_call_at_a_time(fast):
    spec = get_spec("relu")
    x = torch.randn(64, 256)
    call = spec.bind(x)
    variant = spec.variant(call, [spec.reference(call.inputs, call.params)])
    dk = DeployedKernel(variant, Kernel(compile_source(WORKSPACE_COPY, "cpu", "native").path), fast=fast)
    xs = [torch.randn(64, 256) for _ in range(4)]

    def run(i):
        return sum(not torch.equal(dk((xs[i],))[0], xs[i]) for _ in range(40))

    with ThreadPoolExecutor(4) as pool:
        assert sum(pool.map(run, range(4))) == 0


@needs_fast
def test_a_list_argument_is_held_until_the_kernel_returns():
    x = torch.randn(16, 300)
    dk = _softmax_kernel("softmax_rows", x)
    inputs = [x.clone()]
    (y,) = dk(inputs)
    torch.testing.assert_close(y, torch.softmax(x, -1))
    with pytest.raises(TypeError, match="expected 1 inputs, got 0"):
        _softmax_kernel("softmax_rows", x, fast=False)(())


# ----------------------------------------------------------------------------- the dispatch front


def _deployment(x: torch.Tensor, model=None):
    from kforge.deploy import Deployment

    return Deployment([_softmax_kernel("softmax_rows", x)], model=model)


def _cache_sizes():
    from kforge.deploy._dispatch import DISPATCHER

    return {f"{p.owner.__name__}.{p.name}": len(p.cache) for p in DISPATCHER.patches.values()}


@needs_fast
def test_repeated_calls_are_decided_once_and_the_decisions_are_dropped_with_the_kernels():
    x, other = torch.randn(16, 300), torch.randn(8, 300)
    ref, ref_other = torch.softmax(x.double(), -1).float(), torch.softmax(other, -1)
    dep = _deployment(x).install()
    try:
        for _ in range(3):
            torch.testing.assert_close(x.softmax(-1), ref)
            torch.testing.assert_close(torch.softmax(x, dim=-1), ref)
        assert dep.kernels[0].calls == 6
        sizes = _cache_sizes()
        assert sizes["Tensor.softmax"] == 1 and sizes["torch.softmax"] == 1
        torch.testing.assert_close(x.softmax(1), ref)  # the same variant, spelled another way
        for _ in range(2):
            torch.testing.assert_close(other.softmax(-1), ref_other)  # another shape: eager at once
        torch.testing.assert_close(x.softmax(-1, dtype=torch.float64), ref.double())  # a miss, cached
        assert dep.kernels[0].calls == 7
        assert _cache_sizes()["Tensor.softmax"] == 3
    finally:
        dep.remove()
    assert _cache_sizes() == {}
    dep.install()
    try:
        assert all(n == 0 for n in _cache_sizes().values()), "a new installation starts with no decisions"
    finally:
        dep.remove()


@needs_fast
def test_per_call_conditions_are_checked_on_every_cached_call():
    x = torch.randn(16, 300)
    model = torch.nn.Softmax(-1)
    dep = _deployment(x, model=model).install()
    try:
        model(x)
        model(x)
        assert dep.kernels[0].calls == 2
        x.softmax(-1)                        # the same call outside the model's forward: eager
        assert dep.kernels[0].calls == 2
        w = x.clone().requires_grad_()
        y = model(w)                         # autograd needs eager
        assert dep.kernels[0].calls == 2 and y.grad_fn is not None
        with torch.no_grad():
            model(w)
        assert dep.kernels[0].calls == 3, "a cached hit still runs once autograd is off"
        model(x)
        assert dep.kernels[0].calls == 4
    finally:
        dep.remove()


@needs_fast
def test_ambiguous_and_uncacheable_calls_still_dispatch_correctly():
    from kforge.deploy import Deployment

    spec = get_spec("add")
    a, b = torch.randn(64, 32), torch.randn(64, 32)
    call = spec.bind(a, b)
    variant = spec.variant(call, [spec.reference(call.inputs, call.params)])
    src = r"""
#include "kforge.h"
KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    const float* x = (const float*)in[0].data; const float* y = (const float*)in[1].data;
    float* z = (float*)out[0].data;
    for (long i = 0; i < 64 * 32; ++i) z[i] = x[i] + y[i];
    return 0;
}
"""
    dk = DeployedKernel(variant, Kernel(compile_source(src, "cpu", "native").path))
    aa, ab, ab2 = a + a, a + b, a + 2 * b
    with Deployment([dk]):
        for _ in range(2):
            torch.testing.assert_close(torch.add(a, a), aa)   # one tensor twice: not cached by position
            torch.testing.assert_close(torch.add(a, b), ab)   # so this call is not answered with (a, a)
            torch.testing.assert_close(torch.add(b, a), ab)
            torch.testing.assert_close(torch.add(a, other=b), ab)
            torch.testing.assert_close(torch.add(a, b, alpha=2), ab2)  # another variant: eager
            torch.testing.assert_close(torch.add(a, [b][0]), ab)
        assert dk.calls == 2 * 5


@needs_fast
def test_call_keys_tell_apart_what_can_change_a_decision():
    from kforge.deploy._dispatch import _KEY_VALUE_TYPES, _PLAIN
    from kforge.deploy._fast import dispatch_type

    front = dispatch_type()({}, object(), print, print, torch.is_grad_enabled, _PLAIN, _KEY_VALUE_TYPES, (), None)
    x = torch.randn(4, 6)
    key = lambda *a, **k: front.key(a, k or None)  # noqa: E731
    assert key(x, -1) == key(torch.randn(4, 6), -1), "values of tensors do not matter, their layout does"
    distinct = [key(x, -1), key(x, 1), key(x, -1.0), key(x, True), key(x.t(), -1), key(x.double(), -1),
                key(torch.randn(4, 7), -1), key(x, dim=-1), key(x, -1, dtype=torch.float32), key(x, (1, 2)),
                key(x, [1, 2]), key(x, None)]
    assert None not in distinct and len(set(distinct)) == len(distinct)
    assert key(torch.nn.Parameter(x), -1) == key(x, -1), "a parameter binds as the plain tensor it is"
    for uncacheable in (key(x, float("nan")), key(x, object()), key(x, [x]), key(x, (1, x)), key(x, {"a": 1}),
                        key(x.as_subclass(_Sub), -1), key(torch._neg_view(x), -1)):
        assert uncacheable is None


class _Sub(torch.Tensor):
    pass


# ----------------------------------------------------------------------------- what must stay eager


@pytest.fixture(params=["c", "python"])
def path(monkeypatch, request):
    """Each test twice: through the C front, and through the Python guard (KFORGE_FASTPATH=0)."""
    if request.param == "python":
        monkeypatch.setenv("KFORGE_FASTPATH", "0")
    elif launcher_type() is None:
        pytest.skip(f"no C front here: {unavailable_reason()}")
    return request.param


def test_a_scalar_of_another_type_is_another_variant(path):
    from kforge.deploy import Deployment

    spec = get_spec("mul")
    x = torch.arange(6, dtype=torch.int64)
    call = spec.bind(x, 2)
    variant = spec.variant(call, [spec.reference(call.inputs, call.params)])
    src = r"""
#include "kforge.h"
KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    const long long* a = (const long long*)in[0].data; long long* y = (long long*)out[0].data;
    for (int i = 0; i < 6; ++i) y[i] = a[i] * 2;
    return 0;
}
"""
    dk = DeployedKernel(variant, Kernel(compile_source(src, "cpu", "native").path))
    twice, twice_f = torch.arange(6) * 2, torch.arange(6) * 2.0
    with Deployment([dk]):
        for _ in range(2):
            assert torch.equal(x * 2, twice)
            y = x * 2.0  # eager: float32
            assert y.dtype == torch.float32 and torch.equal(y, twice_f)
            assert (x * True).dtype == torch.int64
    assert dk.calls == 2


def test_transforms_modes_autocast_and_forward_ad_run_eager(path):
    from torch.autograd import forward_ad as fwAD
    from torch.overrides import TorchFunctionMode

    x = torch.randn(16, 300)
    ref = torch.softmax(x, -1)
    batch = torch.randn(3, 16, 300)
    batch_ref = torch.softmax(batch, -1)
    tangent = torch.randn(16, 300)
    dep = _deployment(x).install()
    try:
        torch.testing.assert_close(x.softmax(-1), ref)
        assert dep.kernels[0].calls == 1
        torch.testing.assert_close(torch.func.vmap(lambda t: t.softmax(-1))(batch), batch_ref)
        with fwAD.dual_level():
            out = fwAD.make_dual(x, tangent).softmax(-1)
            assert fwAD.unpack_dual(out).tangent is not None, "the tangent survives"

        seen = []

        class Spy(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                seen.append(getattr(func, "__name__", str(func)))
                return func(*args, **(kwargs or {}))

        with Spy():
            torch.softmax(x, -1)
        assert "softmax" in seen, "a user's mode sees the call"
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.softmax(x, -1)
        assert dep.kernels[0].calls == 1, "none of these ran the kernel"
        torch.testing.assert_close(x.softmax(-1), ref)
        assert dep.kernels[0].calls == 2
    finally:
        dep.remove()


def test_a_model_scoped_kernel_stays_eager_in_other_threads(path):
    import threading

    x = torch.randn(16, 300)
    inside, done = threading.Event(), threading.Event()

    class Waits(torch.nn.Module):
        def forward(self, t):
            y = t.softmax(-1)
            inside.set()
            done.wait(10)
            return y

    model = Waits()
    dep = _deployment(x, model=model).install()
    try:
        worker = threading.Thread(target=model, args=(x,))
        worker.start()
        assert inside.wait(10)
        x.softmax(-1)      # another thread, while the model is in its forward: eager
        done.set()
        worker.join()
        assert dep.kernels[0].calls == 1
    finally:
        dep.remove()


def test_a_graph_compiled_with_the_kernel_runs_eager_once_it_is_removed():
    x = torch.randn(16, 300)
    ref = torch.softmax(x, -1)
    dep = _deployment(x).install()
    compiled = dep.compile(lambda t: torch.softmax(t, -1), backend="aot_eager", fullgraph=True)
    try:
        torch.testing.assert_close(compiled(x), ref)
        assert dep.kernels[0].calls == 1
    finally:
        dep.remove()
    torch.testing.assert_close(compiled(x), ref)
    assert dep.kernels[0].calls == 1, "the compiled graph's kforge::run fell back to eager"
    torch._dynamo.reset()


@needs_fast
def test_a_decision_taken_before_the_kernels_changed_is_not_cached():
    from kforge.deploy._dispatch import _MISS, DISPATCHER, _remember
    from kforge.deploy._fast import dispatch_type
    from kforge.deploy._dispatch import _KEY_VALUE_TYPES, _PLAIN

    front = dispatch_type()({}, _MISS, print, print, torch.is_grad_enabled, _PLAIN, _KEY_VALUE_TYPES, (), None)
    cache: dict = {}
    x = torch.randn(4, 6)
    _remember(front, cache, (x, -1), {}, _MISS, DISPATCHER, DISPATCHER.generation - 1)
    assert cache == {}
    _remember(front, cache, (x, -1), {}, _MISS, DISPATCHER, DISPATCHER.generation)
    assert list(cache.values()) == [_MISS]


def test_compiled_calls_with_dynamic_shapes_run_eager_and_stay_correct():
    x = torch.randn(16, 300)
    dep = _deployment(x).install()
    try:
        for fn in (lambda t: t.softmax(-1), lambda t: torch.softmax(t, -1)):
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend="eager")
            for rows in (16, 8, 4):  # the second size makes dynamo go dynamic
                t = torch.randn(rows, 300)
                torch.testing.assert_close(compiled(t), torch.softmax(t, -1))
    finally:
        dep.remove()
        torch._dynamo.reset()


def test_a_graph_naming_a_kernel_this_process_never_loaded_runs_eager():
    from kforge.deploy._runop import _run_fake, _run_impl

    x = torch.randn(16, 300)
    dk = _softmax_kernel("softmax_rows", x)
    again = _softmax_kernel("softmax_rows", x)
    assert dk.run_name == again.run_name, "the name is the same in every process for the same kernel"
    foreign = "0000-not-loaded|" + dk.run_name.split("|", 1)[1]
    (y,) = _run_impl(foreign, [x])
    torch.testing.assert_close(y, torch.softmax(x, -1))
    (fake,) = _run_fake(foreign, [x])
    assert fake.shape == x.shape and fake.dtype == x.dtype


@needs_fast
def test_a_per_call_workspace_is_fresh_for_every_call():
    # NB: what CUDA launches use (a workspace from the caching allocator per call), exercised on the
    # CPU: with no shared workspace and the GIL released, concurrent calls must still not mix.
    import ctypes

    from kforge.kernels._library import KfTensor

    spec = get_spec("relu")
    x = torch.randn(64, 256)
    call = spec.bind(x)
    variant = spec.variant(call, [spec.reference(call.inputs, call.params)])
    dk = DeployedKernel(variant, Kernel(compile_source(WORKSPACE_COPY, "cpu", "native").path))
    made = []

    def workspace():
        t = torch.empty(dk.kernel.workspace_bytes, dtype=torch.uint8)
        made.append(t.data_ptr())
        return t

    launcher = launcher_type()(
        ctypes.cast(dk._fn, ctypes.c_void_p).value, bytes(dk._ins)[:ctypes.sizeof(KfTensor)], 1,
        bytes(dk._out_structs)[:ctypes.sizeof(KfTensor)], 1, b"", workspace,
        (lambda: torch.empty(64, 256),), None, 0, "relu", dk.kernel, True)
    xs = [torch.randn(64, 256) for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        wrong = sum(pool.map(lambda i: sum(not torch.equal(launcher((xs[i],))[0], xs[i]) for _ in range(30)),
                             range(4)))
    assert wrong == 0 and len(made) == 120 and launcher.calls == 120


@pytest.mark.slow
def test_inductor_keeps_the_kernel_between_fused_neighbours():
    x = torch.randn(16, 300)
    fn = lambda t: torch.softmax(torch.tanh(t), -1) * 2  # noqa: E731
    ref = fn(x)
    dep = _deployment(x).install()
    try:
        torch._dynamo.reset()
        compiled = dep.compile(fn, fullgraph=True)
        for _ in range(2):
            torch.testing.assert_close(compiled(x), ref)
        assert dep.kernels[0].calls == 2, "the compiled graph calls the kernel through kforge::run"
    finally:
        dep.remove()
        torch._dynamo.reset()


def test_a_graph_call_in_another_layout_is_copied_into_the_kernels_and_another_shape_runs_the_operator():
    """kforge::run launches a kernel only on inputs laid out as its variant: a compiled graph can hand the
    call other strides than the lookup that placed the kernel saw (its own trace's), and the kernel reads
    memory by the variant's strides. Another layout is copied into the variant's (counted); another
    shape or dtype runs the operator itself."""
    from kforge.deploy._runop import RUN_TABLE

    x = torch.randn(16, 300)
    dk = _softmax_kernel("softmax_rows", x)
    RUN_TABLE.register(dk)
    try:
        run = torch.ops.kforge.run.default
        (a,) = run(dk.run_name, [x])
        assert dk.calls == 1 and dk.relayouts == 0
        strided = torch.randn(300, 16).t()   # same shape, column-major
        (b,) = run(dk.run_name, [strided])
        torch.testing.assert_close(b, torch.softmax(strided, -1))
        assert dk.calls == 2 and dk.relayouts == 1
        y = torch.randn(8, 300)
        (c,) = run(dk.run_name, [y])
        torch.testing.assert_close(c, torch.softmax(y, -1))
        assert dk.calls == 2, "another shape is not the kernel's: the operator ran"
        (d,) = run(dk.run_name, [x.double()])
        torch.testing.assert_close(d, torch.softmax(x.double(), -1))
        assert dk.calls == 2
    finally:
        RUN_TABLE.release(dk)
    # no kernel here for a name (a graph compiled elsewhere): the operator runs, its outputs laid out as the
    # variant says, since the graph reads them so (a channels-last twin's, where eager's would differ)
    import dataclasses
    import json

    spec = get_spec("softmax")
    call = spec.bind(x, -1)
    variant = spec.variant(call, [spec.reference(call.inputs, call.params)])
    column_major = dataclasses.replace(variant, outputs=(dataclasses.replace(variant.outputs[0], stride=(1, 16)),))
    (f,) = torch.ops.kforge.run.default("nokernel|" + json.dumps(column_major.to_json()), [x])
    torch.testing.assert_close(f, torch.softmax(x, -1))
    assert f.stride() == (1, 16)
    # a kernel made for a broadcast input (stride 0): a dense call cannot be copied into that layout
    row = torch.randn(1, 300).expand(16, 300)
    bk = _softmax_kernel("softmax_rows", row)
    RUN_TABLE.register(bk)
    try:
        dense = torch.randn(16, 300)
        (e,) = torch.ops.kforge.run.default(bk.run_name, [dense])
        torch.testing.assert_close(e, torch.softmax(dense, -1))
        assert bk.calls == 0 and bk.relayouts == 0
    finally:
        RUN_TABLE.release(bk)
