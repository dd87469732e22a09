"""Deployed CPU kernels are served by a sandboxed worker (kforge/deploy/_worker.py), never run in the user's process:
the key and the network are out of reach, a constructor runs only in the worker, a worker that dies or hangs costs its
kernel (eager from then on, one warning), never the caller; no worker outlives its deployment or the process; calls
from several threads do not mix."""
from __future__ import annotations

import ctypes
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from attacks import FAKE_KEY
from kforge.capture import Card
from kforge.deploy import DeployedKernel, Deployment
from kforge.deploy import _worker
from kforge.evaluate import Sandbox
from kforge.kernels import compile_source
from kernel_files import kernel_source

X = torch.randn(16, 300)
VARIANT = Card.for_call("softmax", X, -1).variant

# NB: an honest softmax that goes wrong on its CALL-th call: it aborts (the worker dies of SIGABRT) or spins forever
FAILING = r"""
#include "kforge.h"
#include <math.h>
#include <stdlib.h>
static int calls = 0;
KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    if (++calls == CALL) { if (HANG) { volatile int spin = 1; while (spin) {} } else abort(); }
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data;
    int64_t cols = in[0].sizes[1];
    for (int64_t r = 0; r < in[0].sizes[0]; ++r) {
        float m = KF_NEG_INF, s = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = x[r * cols + c] > m ? x[r * cols + c] : m;
        for (int64_t c = 0; c < cols; ++c) { y[r * cols + c] = expf(x[r * cols + c] - m); s += y[r * cols + c]; }
        for (int64_t c = 0; c < cols; ++c) y[r * cols + c] /= s;
    }
    return 0;
}
"""


@pytest.fixture
def no_screen(monkeypatch):
    """The binary wall on, the source screen off (the attacks and the failing kernels are refused by the screen)."""
    monkeypatch.setenv("KFORGE_SCREEN", "off")
    yield
    monkeypatch.setenv("KFORGE_SCREEN", "binary")


def _served(source: str, **kw) -> DeployedKernel:
    built = compile_source(source, "cpu", "native")
    os.environ["KFORGE_SCREEN"] = "binary"   # NB: deployed as the user's process deploys: the wall checks it
    dk = DeployedKernel.from_binary(VARIANT, built.path, **kw)
    assert dk.served is not None and not dk.fast
    return dk


def _failing(call: int, hang: bool = False) -> str:
    return FAILING.replace("CALL", str(call)).replace("HANG", "1" if hang else "0")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone(pid: int, within: float = 5.0) -> bool:
    end = time.monotonic() + within
    while _alive(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def test_a_served_kernel_computes_in_its_sandboxed_worker_without_the_key(no_screen, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
    dk = _served(kernel_source("cpu", "softmax_rows"))
    try:
        torch.testing.assert_close(dk((X,))[0], X.softmax(-1))
        pid = dk.served.pid
        assert pid is not None and pid != os.getpid()
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
        assert FAKE_KEY.encode() not in environ and b"ANTHROPIC_API_KEY" not in environ
        sandbox = dk.served._worker.sandbox
        assert Sandbox.SECCOMP in sandbox and Sandbox.ENV in sandbox and Sandbox.RO_INPUTS in sandbox, sandbox
        assert dk.calls == 1
    finally:
        dk.close()


def test_the_libc_walk_reaches_nothing_from_a_served_kernel(no_screen, monkeypatch, tmp_path):
    """attack_libc_walk reads the key through getenv and sends it with socket/connect, found from `&abort`: in the
    user's process it did (docs/security.md, eighth pass); served, it runs in the worker, where none of that holds."""
    from attacks import LOOT_PORT, loot_listener, received

    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
    monkeypatch.setenv("HOME", str(tmp_path))
    listener = loot_listener()
    if listener is None:
        pytest.skip(f"port {LOOT_PORT} is taken (another run of the corpus)")
    dk = _served(kernel_source("cpu", "attack_libc_walk"))
    try:
        torch.testing.assert_close(dk((X,))[0], X.softmax(-1))
        assert received(listener) == b""
        assert not list(tmp_path.glob("kforge_attack*"))
    finally:
        listener.close()
        dk.close()


def test_a_constructor_runs_in_the_worker_never_in_this_process(no_screen):
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    dk = _served(kernel_source("cpu", "attack_ctor_walk"))
    try:
        assert getenv(b"KFORGE_ATTACK_CTOR") is None   # built and checked: nothing of it ran yet
        torch.testing.assert_close(dk((X,))[0], X.softmax(-1))
        assert getenv(b"KFORGE_ATTACK_CTOR") is None   # loaded and called by its worker
        with open(f"/proc/{dk.served.pid}/environ", "rb") as f:
            assert b"KFORGE_ATTACK_CTOR" not in f.read()   # NB: setenv changes the worker's own memory only
    finally:
        dk.close()


def test_a_worker_that_dies_mid_call_falls_back_to_eager_with_one_warning(no_screen):
    dk = _served(_failing(3))
    try:
        for _ in range(2):
            torch.testing.assert_close(dk((X,))[0], X.softmax(-1))
        pid = dk.served.pid
        with pytest.warns(UserWarning, match=r"softmax.*runs eagerly from now on: .*crashed during a call .*killed by SIGABRT") as got:
            out = dk((X,))[0]
        assert len(got) == 1 and dk.served.state is _worker.State.FAILED
        torch.testing.assert_close(out, X.softmax(-1))
        with __import__("warnings").catch_warnings():
            __import__("warnings").simplefilter("error")   # no second warning
            torch.testing.assert_close(dk((X * 2,))[0], (X * 2).softmax(-1))
        assert dk.calls == 2 and _gone(pid)
    finally:
        dk.close()


def test_a_worker_that_hangs_is_killed_at_its_deadline_and_the_call_runs_eager(no_screen, monkeypatch):
    monkeypatch.setattr(_worker, "CALL_TIMEOUT_FLOOR_S", 1.0)
    dk = _served(_failing(2, hang=True), kernel_us=1.0)
    try:
        dk((X,))
        pid = dk.served.pid
        start = time.monotonic()
        with pytest.warns(UserWarning, match="gave no answer within 1 s"):
            out = dk((X,))[0]
        assert time.monotonic() - start < 10
        torch.testing.assert_close(out, X.softmax(-1))
        assert _gone(pid)
    finally:
        dk.close()


def test_the_recheck_refuses_a_kernel_whose_worker_dies_instead_of_checking_eager(no_screen):
    from kforge.deploy._recheck import refuse_failing

    dk = _served(_failing(2))
    with pytest.warns(UserWarning, match="refused at apply: .*crashed during a call"):
        kept, refused = refuse_failing([dk])
    assert kept == [] and "SIGABRT" in refused[0][1]
    assert dk.served.state is _worker.State.FAILED


def test_no_worker_outlives_its_deployment_its_kernel_or_the_process(no_screen, tmp_path):
    model = torch.nn.Softmax(-1)
    dk = _served(kernel_source("cpu", "softmax_rows"))
    dep = Deployment([dk], model).install()
    torch.testing.assert_close(model(X), X.softmax(-1))
    pid = dk.served.pid
    assert pid is not None and _alive(pid) and dk.calls == 1
    dep.remove()
    assert _gone(pid) and dk.served.pid is None
    with dep:   # installed again: a fresh worker at the next call
        torch.testing.assert_close(model(X), X.softmax(-1))
        again = dk.served.pid
        assert again not in (None, pid)
    assert _gone(again)
    # a kernel dropped without remove(): its worker goes with it
    other = _served(kernel_source("cpu", "softmax_rows"))
    other((X,))
    third = other.served.pid
    del other
    gc.collect()
    assert _gone(third)
    # a process that exits with a served kernel still installed leaves no worker behind
    script = (
        "import json, os, sys, torch\n"
        "from kforge.capture import Card\n"
        "from kforge.deploy import DeployedKernel, Deployment\n"
        f"dk = DeployedKernel.from_binary(Card.for_call('softmax', torch.randn(16, 300), -1).variant, {str(dk.kernel.path)!r})\n"
        "model = torch.nn.Softmax(-1)\n"
        "Deployment([dk], model).install()\n"
        "model(torch.randn(16, 300))\n"
        "print(json.dumps({'pid': dk.served.pid}), flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    child = json.loads(proc.stdout.strip().splitlines()[-1])["pid"]
    assert _gone(child)


def test_a_worker_started_from_a_short_lived_thread_outlives_it(no_screen):
    dk = _served(kernel_source("cpu", "softmax_rows"))
    try:
        t = threading.Thread(target=lambda: dk((X,)))
        t.start()
        t.join()
        pid = dk.served.pid
        time.sleep(0.2)   # NB: a runner's parent-death signal follows the thread that started it
        assert _alive(pid)
        torch.testing.assert_close(dk((X,))[0], X.softmax(-1))
        assert dk.served.pid == pid and dk.calls == 2
    finally:
        dk.close()


def test_concurrent_calls_of_one_served_kernel_do_not_mix(no_screen):
    dk = _served(kernel_source("cpu", "softmax_rows"))
    errors: list[str] = []

    def caller(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for i in range(150):
            x = torch.randn(16, 300, generator=g) * (1 + seed)
            out = dk((x,))[0]
            if not torch.allclose(out, x.softmax(-1), atol=1e-6, rtol=1e-5):
                errors.append(f"thread {seed}, call {i}")
                return

    try:
        threads = [threading.Thread(target=caller, args=(s,)) for s in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and dk.calls == 450
    finally:
        dk.close()


def test_kill_from_outside_is_a_failure_not_a_hang(no_screen):
    dk = _served(kernel_source("cpu", "softmax_rows"))
    try:
        dk((X,))
        os.kill(dk.served.pid, signal.SIGKILL)
        with pytest.warns(UserWarning, match="runs eagerly from now on"):
            torch.testing.assert_close(dk((X,))[0], X.softmax(-1))
    finally:
        dk.close()
