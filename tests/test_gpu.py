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
    """A CUDA evaluator with the static screen off (honoured only under pytest), so that the fault and
    escape kernels below reach the runner; tests/test_screen.py checks the screen."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KFORGE_SCREEN", "off")
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
    ("fault_other_stream", Status.TIMING_MISMATCH, "outside the given stream"),
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


_CUDA_PRELUDE = r'''
#include "kforge.h"
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/stat.h>
__global__ void kf_softmax_rows(const float* x, float* y, int cols) {
    const float* xr = x + blockIdx.x * cols; float* yr = y + blockIdx.x * cols;
    if (threadIdx.x) return;
    float m = KF_NEG_INF, s = 0.f;
    for (int c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
    for (int c = 0; c < cols; ++c) s += expf(xr[c] - m);
    for (int c = 0; c < cols; ++c) yr[c] = expf(xr[c] - m) / s;
}
static int chan_fd(void) {
    for (int fd = 3; fd < 1024; ++fd) { struct stat st; if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) return fd; }
    return -1;
}
'''


def _cuda_kernel(attempt: str, defines: str = "") -> str:
    """A correct softmax (32 x 256) that first tries ``attempt`` on the host; wrong if it worked."""
    return (_CUDA_PRELUDE + defines + "KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, "
            "int n_out, const double* p, int np, void* ws, void* stream) {\n"
            "  static int tried, escaped; if (!tried) { tried = 1; " + attempt + " }\n"
            "  if (escaped) return 99;\n"
            "  kf_softmax_rows<<<32, 32, 0, (cudaStream_t)stream>>>((const float*)in[0].data, (float*)out[0].data, 256);\n"
            "  return (int)cudaGetLastError(); }\n")


CUDA_ESCAPES = [
    ("write outside its folder", 'int f = open(ESCAPE_FILE, O_WRONLY | O_CREAT, 0644); escaped = f >= 0;'),
    ("read the judge's environ", 'char q[64]; snprintf(q, 64, "/proc/%d/environ", (int)getppid()); '
                                 'escaped = open(q, O_RDONLY) >= 0;'),
    ("open a socket", 'escaped = socket(AF_INET, SOCK_STREAM, 0) >= 0;'),
    ("fork", 'pid_t c = fork(); if (c == 0) _exit(0); escaped = c > 0;'),
    ("kill its parent", 'escaped = kill(getppid(), SIGTERM) == 0;'),
    ("none (control)", 'escaped = 0;'),
]


@pytest.mark.parametrize("name,attempt", CUDA_ESCAPES, ids=[e[0] for e in CUDA_ESCAPES])
def test_cuda_runner_sandbox_holds(evaluator, softmax_card, tmp_path, name, attempt):
    target = tmp_path / "escaped.txt"
    ev = evaluator.evaluate(softmax_card, _cuda_kernel(attempt, f'#define ESCAPE_FILE "{target}"\n'))
    print(f"{name}: {ev.summary()} | sandbox: {ev.sandbox}")
    assert ev.status.is_correct, ev.summary()
    assert not target.exists()


def test_cuda_ipc_round_trip_and_what_holds(evaluator, softmax_card):
    """Inputs reach the runner and outputs come back through CUDA IPC; the report says what held."""
    ev = evaluator.evaluate(softmax_card, kernel_source("cuda", "softmax_base"))
    print(f"CUDA runner sandbox: {ev.sandbox}; checks: {ev.checks}")
    assert ev.status.is_correct, ev.summary()
    assert ev.max_rel_error < 1e-4 and "runner clock cross-checked" in ev.checks
    assert {"session", "no_new_privs", "rlimits", "seccomp", "no_caps"} <= set(ev.sandbox.split(", "))


def test_cuda_forged_frame_is_a_status(evaluator, softmax_card):
    # NB: the CUDA driver opens sockets of its own in the runner: forge on every socket, as an attacker would.
    attempt = ("char b[64]; memset(b, 0xab, 64); for (int fd = 3; fd < 1024; ++fd) { struct stat st; "
               "if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) send(fd, b, 64, MSG_NOSIGNAL); }")
    ev = evaluator.evaluate(softmax_card, _cuda_kernel(attempt))
    assert ev.status is Status.CRASHED and "protocol" in ev.message, ev.summary()
    after = evaluator.evaluate(softmax_card, kernel_source("cuda", "softmax_base"))
    assert after.status.is_correct, after.summary()


def test_cuda_timed_calls_are_checked(evaluator, softmax_card):
    src = _cuda_kernel("escaped = 0;").replace("if (escaped) return 99;",
                                              "static int calls; if (escaped || ++calls > 8) return 0;")
    ev = evaluator.evaluate(softmax_card, src)
    assert ev.status is Status.WRONG_RESULT and "timed" in ev.message, ev.summary()


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
    s.store.save_result(card.key, CardVerdict(CardStatus.WINNER, "test", winner_id=cid, winner_speedup=ev.speedup,
                                              kernel_us=ev.candidate_us, eager_us=ev.eager_us, candidates=1))
    return s, model


def test_deploy_under_cuda_graph_and_torch_compile(tmp_path):
    s, model = _winner_session(tmp_path)
    x = torch.randn(64, 4096, device="cuda")
    expected = model(x)
    with s.apply(all_winners=True) as dep:   # NB: whether it saves more than its dispatch costs is not the point here
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
        # NB: plain torch.compile traces the originals (tests/test_compile.py); graph mode is dep.compile()
        compiled = dep.compile(fullgraph=True)
        torch.testing.assert_close(compiled(x), expected)
        calls = dep.kernels[0].calls
        compiled(x)
        assert dep.kernels[0].calls == calls + 1
    s.close()


@pytest.mark.parametrize("replay", ["1", "0"])
def test_a_deployed_cuda_kernel_launches_on_the_current_stream(tmp_path, monkeypatch, replay):
    # NB: both ways a CUDA winner is served: its recorded plan replayed by kforge's launcher (the default), and the
    # library loaded in this process behind the C launcher (KFORGE_CUDA_REPLAY=0)
    from kforge.deploy._fast import launcher_type, unavailable_reason
    from kforge.deploy._replay import REPLAY_ENV, PlanReplay

    monkeypatch.setenv(REPLAY_ENV, replay)
    if replay == "0" and launcher_type() is None:
        pytest.skip(f"no C launcher on this machine: {unavailable_reason()}")
    s, model = _winner_session(tmp_path)
    x = torch.randn(64, 4096, device="cuda")
    expected = model(x)
    with s.apply(all_winners=True) as dep:
        (dk,) = dep.kernels
        assert isinstance(dk.served, PlanReplay) if replay == "1" else dk.fast
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # the second and third calls come from the dispatch cache
                y = model(x)
        side.synchronize()
        torch.testing.assert_close(y, expected)
        assert dk.calls == 3
    s.close()
