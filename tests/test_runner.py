"""The runner and the judge (CPU): the channel, the sandbox, the clock cross-check, infra failures.

Every attack kernel here computes a correct softmax only when its attack FAILED, so a correct
verdict means the attack was stopped; where the attack leaves a trace (a file), the test looks too.
"""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
import torch

from kforge.capture import Card
from kforge.evaluate import Evaluator, Status
from kforge.evaluate._frames import FRAME_BYTES, Frame, Op, ProtocolError, Sandbox, check_answer
from kforge.evaluate._judge import timing_sets
from kernel_files import kernel_source

SOFTMAX = Card.for_call("softmax", torch.randn(32, 256), -1)

_PRELUDE = r'''
#include "kforge.h"
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
static void softmax_all(const kf_tensor* in, const kf_tensor* out) {
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data;
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1;
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols; float* yr = y + r * cols; float m = KF_NEG_INF, s = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; ++c) yr[c] /= s;
    }
}
static int chan_fd(void) {
    for (int fd = 3; fd < 64; ++fd) { struct stat st; if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) return fd; }
    return -1;
}
'''


def _kernel(body: str, defines: str = "") -> str:
    return (_PRELUDE + defines + "\nKF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, "
            "int n_out, const double* params, int n_params, void* ws, void* stream) {\n" + body + "\n}\n")


@pytest.fixture(scope="module")
def evaluator():
    """A CPU evaluator with a fake API key in its environment and the static screen off (honoured only
    under pytest), so that these attack kernels reach the runner; tests/test_screen.py checks the screen."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KFORGE_TEST_API_KEY", "sk-do-not-leak")
        mp.setenv("KFORGE_SCREEN", "off")
        with Evaluator("cpu", timeout_s=20) as ev:
            yield ev


def _runners(pid: int) -> list[int]:
    """Runner processes whose parent is ``pid`` (not the compiler the judge also starts)."""
    found = []
    for child in _children(pid):
        try:
            if "runner-cpu" in Path(f"/proc/{child}/cmdline").read_text():
                found.append(child)
        except OSError:
            pass
    return found


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


# ---- frames

def test_frames_are_fixed_size_and_checked():
    f = Frame(7, Op.RUN, 0, 3, 4, 5, 1.5)
    assert len(f.encode()) == FRAME_BYTES == 64
    assert Frame.decode(f.encode()) == f
    with pytest.raises(ProtocolError, match="bytes"):
        Frame.decode(f.encode()[:10])
    with pytest.raises(ProtocolError, match="magic"):
        Frame.decode(b"\xab" * FRAME_BYTES)
    with pytest.raises(ProtocolError, match="was due"):
        check_answer(f, 8, Op.RUN)
    with pytest.raises(ProtocolError, match="was due"):
        check_answer(f, 7, Op.PING)


FORGED = [
    ("truncated", "char b[10] = {0}; send(fd, b, sizeof b, 0);"),
    ("wrong magic", "char b[64]; memset(b, 0xab, 64); send(fd, b, 64, 0);"),
    ("wrong sequence", "uint32_t b[16] = {0x4E52464Bu, 99999, 5, 0}; send(fd, b, 64, 0);"),
    ("oversized", "char b[200]; memset(b, 0, 200); *(uint32_t*)b = 0x4E52464Bu; send(fd, b, 200, 0);"),
    ("flood", "uint32_t b[16] = {0x4E52464Bu, 0, 5, 0}; for (int i = 0; i < 1000; ++i) { b[1] = i; "
              "send(fd, b, 64, MSG_DONTWAIT); }"),
    ("forged fault report", "uint32_t b[16] = {0x4E52464Bu, 0, 6, 11}; send(fd, b, 64, 0);"),
]


@pytest.mark.parametrize("name,attack", FORGED, ids=[f[0] for f in FORGED])
def test_forged_frames_give_a_status_not_an_exception(evaluator, name, attack):
    src = _kernel("static int done; int fd = chan_fd(); softmax_all(in, out);\n"
                  f"if (!done && fd >= 0) {{ done = 1; {attack} }}\nreturn 0;")
    ev = evaluator.evaluate(SOFTMAX, src)
    assert ev.status is Status.CRASHED, ev.summary()
    assert "protocol" in ev.message or "channel" in ev.message
    after = evaluator.evaluate(SOFTMAX, kernel_source("cpu", "softmax_rows"))
    assert after.status.is_correct, after.summary()


def test_a_frame_forged_with_the_right_sequence_is_not_a_verdict(evaluator):
    """Answers every timed batch itself, ahead of the runner: outputs are then checked too early,
    or the runner's own answers arrive out of turn."""
    src = _kernel("int fd = chan_fd(); static uint32_t seq = 21;\n"
                  "uint32_t b[16] = {0x4E52464Bu, 0, 5, 0}; b[1] = ++seq; send(fd, b, 64, 0);\n"
                  "softmax_all(in, out); return 0;")
    ev = evaluator.evaluate(SOFTMAX, src)
    assert ev.status.is_failure, ev.summary()


# ---- the sandbox, seen from inside a runner

ESCAPES = [
    ("write outside its folder", 'int f = open(ESCAPE_FILE, O_WRONLY | O_CREAT, 0644); escaped = f >= 0;'),
    ("read the judge's environ", 'char p[64]; snprintf(p, 64, "/proc/%d/environ", (int)getppid());\n'
                                 'int f = open(p, O_RDONLY); escaped = f >= 0;'),
    ("read the user's files", 'int f = open(ESCAPE_FILE_READ, O_RDONLY); escaped = f >= 0;'),
    ("see an API key", 'escaped = getenv("KFORGE_TEST_API_KEY") != NULL;'),
    ("open a socket", 'escaped = socket(AF_INET, SOCK_STREAM, 0) >= 0 || socket(AF_UNIX, SOCK_STREAM, 0) >= 0;'),
    ("fork", 'pid_t c = fork(); if (c == 0) _exit(0); escaped = c > 0;'),
    ("execve", 'char* argv[] = {"/bin/true", NULL}; escaped = execve("/bin/true", argv, NULL) == 0;'),
    ("kill its parent", 'escaped = kill(getppid(), SIGTERM) == 0;'),
    ("kill its process group", 'escaped = kill(0, SIGTERM) == 0;'),
    ("leave its session", 'escaped = setsid() >= 0;'),
]


@pytest.mark.parametrize("name,attempt", ESCAPES, ids=[e[0] for e in ESCAPES])
def test_escapes_fail_inside_the_runner(evaluator, tmp_path, name, attempt):
    target = tmp_path / "escaped.txt"
    readable = tmp_path / "secret.txt"
    readable.write_text("secret")
    defines = f'#define ESCAPE_FILE "{target}"\n#define ESCAPE_FILE_READ "{readable}"\n'
    src = _kernel("static int tried, escaped;\nif (!tried) { tried = 1; " + attempt + " }\n"
                  "if (escaped) return 99;\nsoftmax_all(in, out); return 0;", defines)
    judge = evaluator.judge_pid
    ev = evaluator.evaluate(SOFTMAX, src)
    assert ev.status.is_correct, f"{name}: {ev.summary()}"
    assert not target.exists()
    assert evaluator.judge_pid is not None and (judge is None or evaluator.judge_pid == judge)
    assert _children(evaluator.judge_pid) == []  # no runner, no child of one, outlives the evaluation


def test_the_runner_reports_what_holds(evaluator):
    ev = evaluator.evaluate(SOFTMAX, kernel_source("cpu", "softmax_rows"))
    assert ev.status.is_correct, ev.summary()
    held = set(ev.sandbox.split(", "))
    expected = {m.name.lower() for m in Sandbox}
    # NB: this machine (kernel 6.18, Landlock ABI 7, root) holds every step; elsewhere some degrade.
    assert held == expected, expected - held


def test_memory_and_file_size_are_limited(evaluator):
    src = _kernel("static int tried; if (!tried) { tried = 1;\n"
                  "  void* p = malloc((size_t)16 << 30); if (p) return 98;\n"
                  "  FILE* f = fopen(\"big.log\", \"w\"); static char b[1 << 20];\n"
                  "  signal(SIGXFSZ, SIG_IGN); size_t total = 0;\n"
                  "  for (int i = 0; i < 200; ++i) total += fwrite(b, 1, sizeof b, f);\n"
                  "  fclose(f); if (total > ((size_t)100 << 20)) return 97; }\n"
                  "softmax_all(in, out); return 0;")
    ev = evaluator.evaluate(SOFTMAX, src)
    assert ev.status.is_correct, ev.summary()


def test_a_huge_log_is_read_back_capped(evaluator):
    src = _kernel("static char b[1 << 16]; memset(b, 'x', sizeof b);\n"
                  "static int once; if (!once) { once = 1; for (int i = 0; i < 64; ++i) fwrite(b, 1, sizeof b, stderr); }\n"  # 4 MiB
                  "*(volatile int*)16 = 1; return 0;")
    ev = evaluator.evaluate(SOFTMAX, src)
    assert ev.status is Status.CRASHED and "SIGSEGV" in ev.message
    assert len(ev.message) < 4000


# ---- checks the old evaluator missed

def test_softmax_without_max_subtraction_fails_on_large_logits(evaluator):
    src = _kernel("const float* x = (const float*)in[0].data; float* y = (float*)out[0].data;\n"
                  "for (int r = 0; r < 32; ++r) { float s = 0; for (int c = 0; c < 256; ++c) "
                  "{ y[r*256+c] = expf(x[r*256+c]); s += y[r*256+c]; }\n"
                  "for (int c = 0; c < 256; ++c) y[r*256+c] /= s; } return 0;")
    ev = evaluator.evaluate(SOFTMAX, src)
    assert ev.status is Status.WRONG_RESULT
    assert "large magnitudes" in ev.message


def test_timed_calls_are_checked(evaluator):
    """Correct while it is validated (the first 8 calls), then stops working."""
    src = _kernel("static int calls; if (++calls > 8) return 0; softmax_all(in, out); return 0;")
    ev = evaluator.evaluate(SOFTMAX, src)
    assert ev.status is Status.WRONG_RESULT
    assert "timed" in ev.message


def test_caching_by_output_pointer_fails(evaluator):
    src = _kernel("static void* seen[8192]; static int n;\n"
                  "for (int i = 0; i < n; ++i) if (seen[i] == out[0].data) return 0;\n"
                  "if (n < 8192) seen[n++] = out[0].data; softmax_all(in, out); return 0;")
    ev = evaluator.evaluate(SOFTMAX, src)
    assert ev.status is Status.WRONG_RESULT


def test_writes_far_past_the_output_are_caught(evaluator):
    src = _kernel("softmax_all(in, out); float* y = (float*)out[0].data; y[8192 + 3000] = 1.0f; return 0;")
    ev = evaluator.evaluate(SOFTMAX, src)
    assert ev.status is Status.WRONG_RESULT and "outside output 0" in ev.message


def test_the_timing_sets_cover_the_cache_within_the_budget():
    assert timing_sets(1 << 30, "cpu") == 2
    assert timing_sets(64 << 10, "cpu") >= 2
    os.environ["KFORGE_TIMING_MEMORY"] = str(1 << 40)
    try:
        from kforge.evaluate._judge import last_level_cache_bytes

        assert timing_sets(1 << 20, "cpu") * (1 << 20) >= min(3 * last_level_cache_bytes("cpu"), 4096 << 20)
    finally:
        del os.environ["KFORGE_TIMING_MEMORY"]


# ---- the runner's clock against the judge's

def test_a_patched_clock_is_caught(evaluator):
    """attack_clock_patch hot-patches libc's clock_gettime in the runner so every call looks like 1 ns,
    and works for real for milliseconds per call (tests/test_sandbox.py allows it SLOWER too, where the
    patch cannot be made; here it can)."""
    ev = evaluator.evaluate(SOFTMAX, kernel_source("cpu", "attack_clock_patch"))
    assert ev.status is Status.TIMING_MISMATCH, ev.summary()
    assert "clock disagrees" in ev.message


def _agree(threads: int = 2):
    """``_Trial.clocks_agree`` of a CPU trial whose runner may keep ``threads`` threads busy, 12 calls a batch."""
    from types import SimpleNamespace

    from kforge.evaluate._judge import _Trial
    from kforge.evaluate._runner import CpuUse

    trial = SimpleNamespace(job=SimpleNamespace(backend="cpu"), cuda=False, threads=threads)

    def agree(reported, wall, rtt, total=0.0, busiest=None):
        cpu = CpuUse(total, total if busiest is None else busiest)
        return _Trial.clocks_agree(trial, reported, wall, cpu, 12, rtt=rtt)
    return agree


def test_the_clock_bound_takes_the_round_trip_off_the_upper_bound_only():
    """CI once refused an honest kernel in 46 of 50 batches: the least ping (about 200 us on a loaded
    machine) exceeded the batch's own overhead, and ``wall - rtt`` fell below the honest report."""
    agree = _agree()
    assert agree(1061, 1207, rtt=250)                 # the CI case: honest, the ping slower than the batch's overhead
    assert not agree(1300, 1207, rtt=0)               # more than the judge's whole round trip: a lie either way
    busy = 1e6                                         # the runner's CPU time: more than any count of threads explains
    assert not agree(100, 5000, rtt=250, total=busy)   # a fiftieth of the time the batch took
    assert agree(100, 5000, rtt=250, total=200)        # preempted between calls: the runner's CPU time agrees
    assert not agree(100, 5000, rtt=4000, total=busy)  # the round trip is taken off, then the ratio and slack apply
    assert agree(100, 500, rtt=250, total=100)         # within the ratio and slack
    # the wall clock within the bound, the runner busy far beyond its calls: threads working beside the calls
    assert not agree(100, 500, rtt=250, total=busy)


def test_the_cpu_time_bound_is_per_thread_and_by_the_threads_allowed():
    """The review's case: on a busy 2-core machine a single-threaded kernel could report 1/(1.3 x cores)
    of its time, since the whole process's CPU time was bounded by ``cores x 1.3 x reported``."""
    agree = _agree(threads=2)
    # one thread did 4700 us of work and reported a 2.6th of it: within cores x 1.3 x reported, refused now
    assert not agree(1808, 5000, rtt=250, total=4700)
    assert agree(4700, 5000, rtt=250, total=4700)     # the same thread, honest
    # honest and preempted: the runner ran 1000 us of a 5000 us round trip, as it reported
    assert agree(1000, 5000, rtt=250, total=1000)
    assert agree(1000, 5000, rtt=250, total=1000 + 12 * 2 + 150)   # with the runner's own loop around the calls
    # an honest kernel on the two threads it was allowed: each ran as long as the calls
    assert agree(1000, 5000, rtt=250, total=2000, busiest=1000)
    # the work passed along four threads in turn, each under the report: more than two threads explain
    assert not agree(1000, 5000, rtt=250, total=4000, busiest=1000)
    assert _agree(threads=4)(1000, 5000, rtt=250, total=4000, busiest=1000)   # where four were allowed
    # review 7: a second thread computed the sets' outputs beside the calls on the other core, the calls copied them
    # out; the batch's wall time agrees with the calls' (both short), the CPU time does not (one thread allowed)
    one = _agree(threads=1)
    assert not one(400, 700, rtt=100, total=1300, busiest=900)
    assert one(400, 700, rtt=100, total=400 + 12 * 2 + 150, busiest=400)   # honest: the calls and the runner's loop
    # the busiest thread alone ran three times the report
    assert not agree(1000, 5000, rtt=250, total=3000, busiest=3000)


def test_timed_batches_grow_from_the_judges_clock_and_never_shrink():
    """attack_tiny_batches waited in its validation calls so that every timed batch had 2 sets and fit in
    the clock check's slack: the next batch is sized from the judge's wall clock of the last one."""
    from types import SimpleNamespace

    from kforge.evaluate._judge import _CPU_BATCH_S, _Trial

    trial = SimpleNamespace(job=SimpleNamespace(budget_ms=300.0))
    grown = lambda k, cand_us: _Trial._grown(trial, k, 256, cand_us, 10.0)   # noqa: E731
    assert grown(2, 30.0) == int(_CPU_BATCH_S / 30e-6)   # 30 us calls, not the 3 ms validation said
    assert grown(2, 0.5) == 256                          # at most the sets the arenas hold
    assert grown(60, 3000.0) == 60                       # a slow batch never shrinks the next
    assert _Trial._grown(SimpleNamespace(job=SimpleNamespace(budget_ms=7.0)), 2, 256, 30.0, 70.0) == 10   # budget


# ---- failures outside the candidate's control

SLOW_BUT_CORRECT = "struct timespec t = {0, 20000000}; nanosleep(&t, NULL); softmax_all(in, out); return 0;"


def _kill_runners(evaluator, times: int, done: threading.Event, killed: list[int]) -> None:
    while not done.is_set() and len(killed) < times:
        judge = evaluator.judge_pid
        for pid in _runners(judge) if judge else []:
            if pid not in killed:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
                break
        done.wait(0.005)


@pytest.mark.parametrize("kills,status", [(1, None), (2, Status.INFRA_ERROR)], ids=["once", "twice"])
def test_a_runner_killed_from_outside_is_retried_not_blamed(evaluator, kills, status):
    evaluator.evaluate(SOFTMAX, kernel_source("cpu", "softmax_rows"))  # the judge is up
    done, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_runners, args=(evaluator, kills, done, killed))
    killer.start()
    try:
        ev = evaluator.evaluate(SOFTMAX, _kernel(SLOW_BUT_CORRECT))
    finally:
        done.set()
        killer.join()
    assert len(killed) == kills
    if status is None:
        assert ev.status.is_correct, ev.summary()
    else:
        assert ev.status is status and not ev.status.blames_candidate, ev.summary()
        assert "not the candidate's fault" in ev.message


def test_a_judge_killed_from_outside_does_not_blame_the_candidate(evaluator):
    evaluator.evaluate(SOFTMAX, kernel_source("cpu", "softmax_rows"))
    judge = evaluator.judge_pid
    done = threading.Event()

    def kill_judge() -> None:
        while not done.is_set():
            if _runners(judge):
                os.kill(judge, signal.SIGKILL)
                return
            done.wait(0.005)

    killer = threading.Thread(target=kill_judge)
    killer.start()
    try:
        ev = evaluator.evaluate(SOFTMAX, _kernel(SLOW_BUT_CORRECT))
    finally:
        done.set()
        killer.join()
    assert ev.status.is_correct, ev.summary()
    assert evaluator.judge_pid != judge and evaluator.restarts >= 1
    # the new judge swept the runner folder the killed one left
    from kforge.evaluate._judge import _RUN_NAME, _runs_dir

    owners = [m[2] for p in _runs_dir().iterdir() if (m := _RUN_NAME.fullmatch(p.name))]
    assert str(judge) not in owners


def test_runner_folders_are_swept_only_when_their_judge_is_gone(tmp_path, monkeypatch):
    import subprocess

    from kforge.evaluate._judge import _HOST, _RUN_PREFIX, _run_prefix, _runs_dir, _started, sweep_runs

    monkeypatch.setenv("KFORGE_CACHE", str(tmp_path / "cache"))
    gone = subprocess.Popen(["sleep", "60"])
    gone_started = _started(gone.pid)
    gone.kill()
    gone.wait()
    me = os.getpid()
    other_host = "0" * 8 if _HOST != "0" * 8 else "1" * 8
    names = {
        "dead judge": f"{_RUN_PREFIX}{_HOST}-{gone.pid}-{gone_started}-a1",
        "pid reused": f"{_RUN_PREFIX}{_HOST}-{me}-{_started(me) + 1}-a2",
        "live judge": f"{_run_prefix()}a3",
        "other host": f"{_RUN_PREFIX}{other_host}-{gone.pid}-{gone_started}-a4",
        "no owner": f"{_RUN_PREFIX}a5",
    }
    runs = _runs_dir()
    for name in names.values():
        (runs / name).mkdir()
        library = runs / name / "kernel.so"
        library.write_bytes(b"x")
        library.chmod(0o500)
    assert sorted(sweep_runs()) == sorted([names["dead judge"], names["pid reused"]])
    assert sorted(p.name for p in runs.iterdir()) == sorted(names[k] for k in ("live judge", "other host", "no owner"))


def test_doctor_can_ask_what_the_sandbox_holds():
    from kforge.evaluate import Sandbox, runner_sandbox

    held = runner_sandbox("cpu")
    assert Sandbox.SECCOMP in held and Sandbox.LANDLOCK_FS in held and Sandbox.RO_INPUTS in held


def test_a_batch_at_the_judges_time_counts_at_least_the_runners_cpu_time_over_it():
    """attack_prewindow computed a 2-set batch's outputs in a thread woken by the resume, before the request was
    sent and the judge's wall clock started: the batch counts at least the CPU time the runner's threads spent."""
    from kforge.evaluate._judge import _judged_on_cpu
    from kforge.evaluate._runner import CpuUse

    assert _judged_on_cpu(40.0, 50.0, CpuUse(total_us=75.0, busiest_us=70.0), 2) == 70.0   # the wall saw nothing
    assert _judged_on_cpu(900.0, 50.0, CpuUse(total_us=400.0, busiest_us=300.0), 1) == 850.0   # honest: the wall
    assert _judged_on_cpu(100.0, 50.0, CpuUse(total_us=600.0, busiest_us=200.0), 2) == 300.0   # two threads' work
    assert _judged_on_cpu(10.0, 50.0, CpuUse(total_us=0.0, busiest_us=0.0), 1) == 0.0
