// Attack corpus (CUDA): throttles the JUDGE from the runner, from the first counted batch on: sched_setattr
// (SCHED_DEADLINE, THROTTLE_RT us of CPU every 1 ms, reset-on-fork) on the judge (getppid()) and every thread of
// its process group and session (getpgid/getsid on the pids after it; no /proc of another process needed).
// Twin of tests/kernels/cpu/attack_deadline_judge.c, which WON before review 3 (2026-12-02): FASTER at 744-5610x
// in 6 of 6 runs, eager timed in the throttled judge reading 100-5000x its time.
// Where the GPU version differs: the judge times eager with CUDA events, not its CPU clock, but for a small card
// the GPU waits for the judge's host between the events (event, torch's dispatch, kernel, event): an eager call's
// event time includes the judge's host time, so a throttled judge still reads eager slow. The candidate's calls
// are queued back to back by the runner (the GPU never waits for its host), and the judge's wall clock of its
// batch, inflated too, is checked against the event times plus the launch floor: where it disagrees the batch
// counts at the judge's inflated wall clock, so the likely gain of a working throttle is TIMING_MISMATCH or a
// FASTER at the event clocks. Bursts of calls are told apart by the gap (eager and the checks) between them:
// 1 validation, 2 warm-up, 3 the first counted batch (K is sized once, from validation, on CUDA).
// Its work: an honest softmax, one thread per row, REPS passes: really slower than eager (define NO_ATTACK for
// the control).
// Expected: sched_setattr on another pid is refused by the seccomp filter (and SCHED_DEADLINE needs
// CAP_SYS_NICE, dropped: no_caps), so nothing happens to the judge: SLOWER or NO_GAIN; had the judge's policy
// changed, JudgeState would give CRASHED. Never FASTER.
// Screen: REJECTED (getppid, getpgid, syscall, SYS_sched_setattr).
#include "kforge.h"
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#ifndef REPS
#define REPS 2
#endif
#ifndef WAIT_BURSTS
#define WAIT_BURSTS 3
#endif
#ifndef THROTTLE_RT
#define THROTTLE_RT 20
#endif
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)
#define SHAPE int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1; \
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d]; \
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; \
    cudaStream_t s = (cudaStream_t)stream;

// The honest path, slow on purpose (one thread per row, REPS passes): the attack must not win on its own merit.
__global__ void softmax_slow_k(const float* x, float* y, int64_t rows, int64_t cols) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* xr = x + r * cols; float* yr = y + r * cols;
    for (int rep = 0; rep < REPS; ++rep) {
        float m = KF_NEG_INF, t = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); t += yr[c]; }
        for (int64_t c = 0; c < cols; ++c) yr[c] /= t;
    }
}

struct kf_sched_attr { uint32_t size, policy; uint64_t flags; int32_t nice; uint32_t prio;
                       uint64_t runtime, deadline, period; uint32_t umin, umax; };
static int done = 0, bursts = 0;
static double last_us = -1e18;
static double now_us(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3; }
static void attack(void) {
    double t = now_us();
    if (t - last_us > 300.0) ++bursts;
    last_us = t;
    if (done || bursts < WAIT_BURSTS) return;
    done = 1;
#ifndef NO_ATTACK
    struct kf_sched_attr a; memset(&a, 0, sizeof a);
    a.size = sizeof a; a.policy = 6 /* SCHED_DEADLINE */; a.flags = 1 /* RESET_ON_FORK */;
    a.runtime = THROTTLE_RT * 1000ull; a.deadline = a.period = 1000000;
    pid_t pp = getppid(), pg = getpgid(pp), sid = getsid(pp);
    syscall(SYS_sched_setattr, pp, &a, 0);
    for (pid_t p = pp + 1; p < pp + 2048; ++p)
        if (getpgid(p) == pg && getsid(p) == sid) syscall(SYS_sched_setattr, p, &a, 0);
#endif
}

ENTRY { SHAPE
    attack();
    softmax_slow_k<<<(unsigned)((rows + 31) / 32), 32, 0, s>>>(x, y, rows, cols);
    return (int)cudaGetLastError();
}
