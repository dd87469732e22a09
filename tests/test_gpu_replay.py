"""CUDA kernels deployed as recorded launch plans, replayed by kforge's launcher (issue 42), on a real GPU.

A winner's launches are recorded in the sandboxed runner and replayed here with no candidate host code in this
process: the built-in softmax strategies replay with the outputs their own library gives, inside CUDA graph capture
too; attack_libc_walk, deployed as apply() deploys, computes its softmax and never reads the key; host code a replay
cannot do (a copy to the host, an allocation) is refused at deploy with the reason. Run on the device:
`pytest -q tests/test_gpu_replay.py` (skipped without a GPU). The parts that need no GPU: tests/test_replay_plan.py.
"""
from __future__ import annotations

import pytest
import torch

from attacks import CUDA_ATTACKS, FAKE_KEY, Jail, kill_children, loot_listener, received, surviving_children
from kernel_files import kernel_source
from kforge.capture import Card
from kforge.deploy import ExportedKernel
from kforge.deploy._recheck import refuse_failing
from kforge.deploy._launch import deploy_winners
from kforge.evaluate import Evaluator
from kforge.kernels import CompileError, Kernel, compile_source, device_info, param_vector

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _replay_on(monkeypatch):
    """CUDA replay is on by default; these tests hold it on whatever the environment says (deploy/_replay.py)."""
    monkeypatch.setenv("KFORGE_CUDA_REPLAY", "1")


@pytest.fixture(scope="module")
def jail(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    jail = Jail.make(tmp_path_factory.mktemp("gpu-replay"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(jail.home))
        mp.setenv("KFORGE_CACHE", str(jail.cache))
        mp.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        yield jail
    kill_children(surviving_children(jail.root))
    jail.clean()


@pytest.fixture(scope="module")
def evaluator(jail):
    with Evaluator("cuda", timeout_s=60) as ev:
        yield ev


def _deploy(evaluator, variant, source):
    arch = device_info(variant.device).arch
    built = compile_source(source, "cuda", arch)
    kernels, left = deploy_winners([ExportedKernel(variant, source, built.path, None, None)], evaluator, warn=False)
    return built, kernels, left


def _builtin_sources(variant):
    from kforge.proposers.builtin._strategy import strategies_for

    device = device_info(variant.device)
    return [(s.name, s.render(variant, s.default(variant, device), device))
            for s in strategies_for("softmax", "cuda") if s.applies(variant, device)]


@pytest.mark.parametrize("shape", [(64, 1024), (4, 131072)])
def test_builtin_softmax_winners_replay_with_their_librarys_outputs(jail, evaluator, shape):
    card = Card.for_call("softmax", torch.randn(*shape, device="cuda"), -1)
    sources = _builtin_sources(card.variant)
    assert sources
    for name, source in sources:
        built, kernels, left = _deploy(evaluator, card.variant, source)
        assert left == [] and len(kernels) == 1, (name, left)
        dk = kernels[0]
        x = torch.randn(*shape, device="cuda") * 3
        y = dk((x,))[0]
        # NB: the kernel's own library (kforge's built-in strategy, trusted here) on the same input
        lib = Kernel(built.path)
        ws = torch.empty(lib.workspace_bytes, dtype=torch.uint8, device="cuda") if lib.workspace_bytes else None
        ref = torch.empty_like(y)
        lib.launch([x], [ref], param_vector(card.variant), ws, torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        assert torch.equal(y, ref), name
        torch.testing.assert_close(y, torch.softmax(x, -1), rtol=1e-4, atol=1e-5)
        assert dk.calls == 1 and dk.served.plan.launches >= 1


def test_a_replay_is_captured_by_a_cuda_graph(jail, evaluator):
    card = Card.for_call("softmax", torch.randn(4, 131072, device="cuda"), -1)
    _name, source = _builtin_sources(card.variant)[-1]
    _built, (dk,), _ = _deploy(evaluator, card.variant, source)
    x = torch.randn(4, 131072, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dk((x,))   # warm-up off the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = dk((x,))[0]
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, torch.softmax(x, -1), rtol=1e-4, atol=1e-5)


def test_attack_libc_walk_deployed_as_apply_deploys_it_never_runs_its_host_code(jail, evaluator):
    """The hole of the eighth pass: its host code walks libc from an allowed import to getenv/socket/connect. Deployed
    as its plan, it computes its (honest) softmax here and the key is never read: no file, nothing sent."""
    card = Card.for_call("softmax", torch.randn(32, 256, device="cuda"), -1)
    listener = loot_listener()
    try:
        _built, kernels, left = _deploy(evaluator, card.variant, kernel_source("cuda", "attack_libc_walk"))
        assert left == [] and len(kernels) == 1, left
        kept, refused = refuse_failing(kernels)
        x = torch.randn(32, 256, device="cuda")
        y = kernels[0]((x,))[0]
        torch.cuda.synchronize()
        loot = received(listener)
    finally:
        if listener is not None:
            listener.close()
    assert refused == [] and kept == kernels
    torch.testing.assert_close(y, torch.softmax(x, -1), rtol=1e-4, atol=1e-5)
    assert loot == b"", "the attack reached a local port from this process"
    assert jail.dropped_files() == [] and jail.files_with_secret() == []


_D2H = r'''
#include "kforge.h"
__global__ void copy_k(const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    int64_t n = in[0].sizes[0] * in[0].sizes[1];
    float first = 0.f;
    cudaMemcpyAsync(&first, in[0].data, sizeof first, cudaMemcpyDeviceToHost, (cudaStream_t)stream);
    cudaStreamSynchronize((cudaStream_t)stream);
    copy_k<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>((const float*)in[0].data,
                                                                          (float*)out[0].data, n);
    return (int)cudaGetLastError();
}
'''

_MALLOC = r'''
#include "kforge.h"
__global__ void copy_k(const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    int64_t n = in[0].sizes[0] * in[0].sizes[1];
    float* tmp = 0;
    cudaMalloc((void**)&tmp, n * sizeof(float));
    copy_k<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>((const float*)in[0].data, tmp, n);
    copy_k<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(tmp, (float*)out[0].data, n);
    return (int)cudaGetLastError();
}
'''


@pytest.fixture(scope="module")
def unwalled(jail):
    """An evaluator whose judge builds with the screen and the binary wall off (kforge's tests only), so that the
    recorder, behind them, is what a kernel meets."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KFORGE_SCREEN", "off")
        with Evaluator("cuda", timeout_s=60) as ev:
            yield ev


@pytest.mark.parametrize("source, reason", [(_D2H, "a copy to or from host memory"),
                                            (_MALLOC, "it allocates device memory (cudaMalloc)")])
def test_host_code_a_replay_cannot_do_is_refused_at_deploy(jail, unwalled, monkeypatch, source, reason):
    monkeypatch.setenv("KFORGE_SCREEN", "off")   # NB: the wall refuses cudaMalloc's import: off, to reach the recorder
    card = Card.for_call("softmax", torch.randn(16, 128, device="cuda"), -1)
    _built, kernels, left = _deploy(unwalled, card.variant, source)
    assert kernels == []
    ((_sig, why),) = left
    assert why.startswith("not replayable: ") and reason in why, why


@pytest.mark.parametrize("name", sorted(CUDA_ATTACKS))
def test_the_cuda_attack_corpus_deployed_without_screen_or_wall_reaches_nothing(jail, unwalled, monkeypatch, name):
    """Every CUDA attack, built with the screen and the wall off, deployed as apply() deploys (recorded in the
    sandbox, replayed here, re-checked, called): no file written, no key read, nothing sent, no child left."""
    monkeypatch.setenv("KFORGE_SCREEN", "off")
    card = Card.for_call("softmax", torch.randn(32, 256, device="cuda"), -1)
    listener = loot_listener()
    try:
        try:
            _built, kernels, left = _deploy(unwalled, card.variant, kernel_source("cuda", name))
        except CompileError:
            kernels, left = [], [("", "does not build")]
        kept, refused = refuse_failing(kernels)
        for dk in kept:
            dk((torch.randn(32, 256, device="cuda"),))
        torch.cuda.synchronize()
        loot = received(listener)
    finally:
        if listener is not None:
            listener.close()
    children = surviving_children(jail.root)
    kill_children(children)
    print(f"{name}: kept {len(kept)}, not replayable {left}, refused {refused}")
    assert loot == b"", "the attack reached a local port from this process"
    assert jail.dropped_files() == [] and jail.files_with_secret() == []
    assert children == []
