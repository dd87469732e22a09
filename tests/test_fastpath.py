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
