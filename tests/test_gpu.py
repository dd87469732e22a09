"""CUDA backend on a real GPU: the fault corpus, hand-written kernels, deploy under graphs and compile.

Skipped cleanly where there is no GPU (CI); run on the device with `pytest tests/test_gpu.py`.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import kforge
from kforge.capture import Card
from kforge.ops import CardStatus, CardVerdict
from kforge.evaluate import Evaluator, Status
from kforge.ops import get_spec
from kernel_files import kernel_source

pytestmark = pytest.mark.gpu




@pytest.fixture(scope="module")
def evaluator():
    with Evaluator("cuda", timeout_s=30) as ev:
        yield ev


@pytest.fixture(scope="module")
def softmax_card():
    return Card.for_call("softmax", torch.randn(32, 256, device="cuda"), -1)


FAULTS = [
    ("fault_oob_write", Status.WRONG_RESULT, "outside output"),
    ("fault_oob_read", Status.WRONG_RESULT, "outside tolerance"),
    ("fault_bad_pointer", Status.CRASHED, ""),
    ("fault_endless", Status.TIMED_OUT, "no result within"),
    ("fault_race", Status.WRONG_RESULT, ""),
    ("fault_partial", Status.WRONG_RESULT, "never written"),
    ("fault_writes_input", Status.WRONG_RESULT, "modified an input"),
    ("fault_nan", Status.WRONG_RESULT, "NaN/Inf"),
    ("fault_previous_call", Status.WRONG_RESULT, ""),
    ("fault_too_much_shared", Status.WRONG_RESULT, "never written"),
    ("fault_other_stream", Status.WRONG_RESULT, "outside the given stream"),
    ("fault_slower", Status.SLOWER, "over eager"),
]


@pytest.mark.parametrize("name,status,message", FAULTS, ids=[f[0] for f in FAULTS])
def test_cuda_fault_gets_its_status_and_the_pool_survives(evaluator, softmax_card, name, status, message):
    ev = evaluator.evaluate(softmax_card, kernel_source("cuda", name))
    print(f"{name}: {ev.summary()}")
    assert ev.status is status, ev.summary()
    assert message in ev.message
    after = evaluator.evaluate(softmax_card, kernel_source("cuda", "softmax_base"))
    assert after.status.is_correct, after.summary()


def test_cuda_memorised_outputs_fail(evaluator, softmax_card):
    spec = get_spec("softmax")
    ref = spec.reference(spec.random_inputs(softmax_card.variant, seed=1), {"dim": 1, "dtype": None}).flatten()
    table = ",".join(f"{v:.9g}f" for v in ref.tolist())
    src = ('#include "kforge.h"\n__device__ const float answer[] = {' + table + '};\n'
           "KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,\n"
           "  const double* p, int np, void* ws, void* stream) {\n"
           "  void* a; cudaGetSymbolAddress(&a, answer);\n"
           "  cudaMemcpyAsync(out[0].data, a, sizeof(answer), cudaMemcpyDeviceToDevice, (cudaStream_t)stream);\n"
           "  return (int)cudaGetLastError(); }\n")
    assert evaluator.evaluate(softmax_card, src).status is Status.WRONG_RESULT


@pytest.mark.parametrize("shape,dtype", [((8, 262144), torch.float32), ((1, 8, 512, 512), torch.bfloat16),
                                         ((512, 256), torch.float32)])
def test_hand_written_softmax(evaluator, shape, dtype):
    card = Card.for_call("softmax", torch.randn(shape, device="cuda", dtype=dtype), -1)
    ev = evaluator.evaluate(card, kernel_source("cuda", "softmax_rows"))
    print(f"softmax {shape} {dtype}: {ev.summary()} roofline {ev.roofline_fraction:.2f}")
    assert ev.status.is_correct, ev.summary()


@pytest.mark.parametrize("shape,dtype", [((1, 512, 128, 128), torch.bfloat16), ((2, 64, 32, 32), torch.float32)])
def test_hand_written_group_norm(evaluator, shape, dtype):
    c = shape[1]
    card = Card.for_call("group_norm", torch.randn(shape, device="cuda", dtype=dtype), 32,
                 torch.randn(c, device="cuda", dtype=dtype), torch.randn(c, device="cuda", dtype=dtype), 1e-6)
    ev = evaluator.evaluate(card, kernel_source("cuda", "group_norm"))
    print(f"group_norm {shape} {dtype}: {ev.summary()} roofline {ev.roofline_fraction:.2f}")
    assert ev.status.is_correct, ev.summary()


class _SoftmaxModel(nn.Module):
    def forward(self, x):
        return torch.tanh(x).softmax(-1) * 2.0


def _winner_session(tmp_path):
    model = _SoftmaxModel()
    s = kforge.Session(model, torch.randn(64, 4096, device="cuda"), device="cuda", workdir=tmp_path / "wd")
    s.capture(timing_budget_ms=20)
    card = s.cards.by_op("softmax")[0]
    src = kernel_source("cuda", "softmax_rows")
    ev = s.evaluator.evaluate(card, src, s.store)
    assert ev.status.is_correct
    cid = s.store.add_candidate(card.key, None, "test", src)
    s.store.set_evaluation(cid, ev)
    s.store.save_result(card.key, CardVerdict(CardStatus.WINNER, "test", winner_id=cid, speedup=ev.speedup,
                                              kernel_us=ev.candidate_us, eager_us=ev.eager_us, candidates=1))
    return s, model


def test_deploy_under_cuda_graph_and_torch_compile(tmp_path):
    s, model = _winner_session(tmp_path)
    x = torch.randn(64, 4096, device="cuda")
    expected = model(x)
    with s.apply() as dep:
        torch.testing.assert_close(model(x), expected)
        assert dep.kernels[0].calls == 1
        static_x = x.clone()
        g = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            model(static_x)  # warm-up on the side stream, as graph capture wants
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(g):
            static_y = model(static_x)
        static_x.copy_(torch.randn_like(static_x))
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(static_y, model(static_x))
        compiled = torch.compile(model, fullgraph=True)
        torch.testing.assert_close(compiled(x), expected)
        calls = dep.kernels[0].calls
        compiled(x)
        assert dep.kernels[0].calls == calls + 1
    s.close()


def test_c_dispatch_launches_on_the_current_stream(tmp_path):
    from kforge.deploy._fast import launcher_type, unavailable_reason

    if launcher_type() is None:
        pytest.skip(f"no C launcher on this machine: {unavailable_reason()}")
    s, model = _winner_session(tmp_path)
    x = torch.randn(64, 4096, device="cuda")
    expected = model(x)
    with s.apply() as dep:
        (dk,) = dep.kernels
        assert dk.fast
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # the second and third calls come from the dispatch cache
                y = model(x)
        side.synchronize()
        torch.testing.assert_close(y, expected)
        assert dk.calls == 3
    s.close()
