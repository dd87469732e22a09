// Attack corpus (CUDA): slows the JUDGE down instead of speeding itself up. On its first call it finds the judge
// (getppid()) and every thread of the judge's process group and session (getpgid/getsid on pids after the
// judge's: no /proc needed) and changes their scheduling from outside:
//   - sched_setattr(SCHED_DEADLINE, 100 us every 1 ms, reset-on-fork): the judge at a tenth of a core;
//   - if that fails: SCHED_IDLE + nice 19 and all of them pinned to CPU 0, so any other process there preempts
//     the judge; the runner pins itself to the last CPU.
// Twin of tests/kernels/cpu/attack_sched_judge.c (review 3: SLOWER 3 of 3 there, but the judge stayed throttled
// and the next honest candidate's verdict changed).
// Where the GPU version differs: eager is timed with CUDA events, whose intervals include the judge's host time
// for a small card (the GPU waits for torch's dispatch between the events), so a throttled judge reads eager slow
// on CUDA too; the candidate's calls are queued back to back by the runner and are not affected. The runner's own
// threads (the CUDA driver's among them) are not the judge's: throttling them is not the attack.
// Its work: an honest softmax, one thread per row, 3 passes: really slower than eager (NO_ATTACK: the control).
// Expected: every call on another pid is refused by the seccomp filter (SCHED_DEADLINE also needs CAP_SYS_NICE,
// dropped), the judge is untouched: SLOWER or NO_GAIN; a judge whose scheduling changed would make JudgeState
// give CRASHED. Never FASTER.
// Screen: REJECTED (getppid, syscall, sched_setscheduler, setpriority, sched_setaffinity...).
#include "kforge.h"
#include <stdint.h>
#include <string.h>
#include <sched.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)
#define SHAPE int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1; \
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d]; \
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; \
    cudaStream_t s = (cudaStream_t)stream;

// The honest path, slow on purpose (one thread per row, 3 passes): the attack must not win on its own merit.
__global__ void softmax_slow_k(const float* x, float* y, int64_t rows, int64_t cols) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* xr = x + r * cols; float* yr = y + r * cols;
    for (int rep = 0; rep < 3; ++rep) {
        float m = KF_NEG_INF, t = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); t += yr[c]; }
        for (int64_t c = 0; c < cols; ++c) yr[c] /= t;
    }
}

struct kf_sched_attr { uint32_t size, policy; uint64_t flags; int32_t nice; uint32_t prio;
                       uint64_t runtime, deadline, period; uint32_t umin, umax; };

static void throttle(pid_t t) {
#ifndef NO_ATTACK
    struct kf_sched_attr a; memset(&a, 0, sizeof a);
    a.size = sizeof a; a.policy = 6 /* SCHED_DEADLINE */; a.flags = 1 /* RESET_ON_FORK */;
    a.runtime = 100000; a.deadline = 1000000; a.period = 1000000;
    if (syscall(SYS_sched_setattr, t, &a, 0) == 0) return;
    struct sched_param sp; memset(&sp, 0, sizeof sp);
    sched_setscheduler(t, 5 /* SCHED_IDLE */, &sp);
    setpriority(PRIO_PROCESS, t, 19);
    cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(0, &cs);
    sched_setaffinity(t, sizeof cs, &cs);
#else
    (void)t;
#endif
}

static int done = 0;
static void attack(void) {
    if (done) return;
    done = 1;
    pid_t pp = getppid(), pg = getpgid(pp), sid = getsid(pp);
    throttle(pp);
    for (pid_t t = pp + 1; t < pp + 2048; ++t)
        if (getpgid(t) == pg && getsid(t) == sid) throttle(t);
#ifndef NO_ATTACK
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(n > 1 ? n - 1 : 0, &cs);
    sched_setaffinity(0, sizeof cs, &cs);
#endif
}

ENTRY { SHAPE
    attack();
    softmax_slow_k<<<(unsigned)((rows + 31) / 32), 32, 0, s>>>(x, y, rows, cols);
    return (int)cudaGetLastError();
}
