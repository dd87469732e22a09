// Attack corpus (CUDA): the system calls that act on another process by pid, tried on the judge (getppid()) from
// inside the runner: scheduling policy and affinity, priority, resource limits (read and write), process group
// and session, and its own hard limit raised. Twin of tests/kernels/cpu/attack_process_calls.c (review 3,
// 2026-12-02, when all of them worked on the judge and the user's process: SCHED_DEADLINE on the judge made
// eager read 100-5000x slow, a 1 s RLIMIT_CPU killed the user's process). Each call on the judge only reads, or
// writes back what it read (SCHED_OTHER: the judge's own policy), so the judge is unchanged even where one works.
// Where the GPU version differs: the calls are made twice, from kf_launch (the runner's main thread, which
// installed the seccomp filter, Landlock and dropped its capabilities) and from a CUDA host callback
// (cudaLaunchHostFunc), which the driver runs on a thread of its own. Seccomp, Landlock, no_new_privs and
// capabilities are per thread: a driver thread that existed before the runner sandboxed itself (its context
// and stream are made first) would keep none of them. If the callback runs on such a thread, its calls work.
// Expected: every call is refused (the same runner.c and filter as on the CPU; a thread the driver starts later
// inherits the filter) and the kernel computes an honest, slow softmax: SLOWER (or NO_GAIN). If any call
// reaches the judge, from either thread, it writes zeros: WRONG_RESULT, which the corpus test does not allow.
// RESULT (H200, 2026-12-02): a safe verdict (the corpus test passed). The same order outside kforge (context and
// stream made, then a seccomp filter on the main thread) showed why: the host callback ran on a thread the driver
// started then, from the filtered thread (Seccomp 2, getppid refused); a user object's destructor ran on the
// main thread. The two threads the driver made with the context (cuda-EvtHandlr and one more) had no filter, but
// no way was found to run a kernel's code on them.
// Screen: REJECTED (getppid, prlimit, setpriority, sched_setaffinity...).
#include "kforge.h"
#include <errno.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)
#define SHAPE int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1; \
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d]; \
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; \
    cudaStream_t s = (cudaStream_t)stream;

// The honest path, made slow on purpose (one thread per row, repeated): an attack must never win
// on its own merit, so any FASTER verdict for it is the attack working.
__global__ void softmax_slow_k(const float* x, float* y, int64_t rows, int64_t cols) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* xr = x + r * cols; float* yr = y + r * cols;
    for (int rep = 0; rep < 8; ++rep) {
        float m = KF_NEG_INF, t = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); t += yr[c]; }
        for (int64_t c = 0; c < cols; ++c) yr[c] /= t;
    }
}

static int reached_the_judge(void) {
    pid_t pp = getppid();
    int hits = 0;
    cpu_set_t cs; CPU_ZERO(&cs);
    if (sched_getaffinity(pp, sizeof cs, &cs) == 0) { ++hits; if (sched_setaffinity(pp, sizeof cs, &cs) == 0) ++hits; }
    errno = 0;
    int pr = getpriority(PRIO_PROCESS, pp);
    if (errno == 0) { ++hits; if (setpriority(PRIO_PROCESS, pp, pr) == 0) ++hits; }
    struct rlimit old;
    if (prlimit(pp, RLIMIT_NOFILE, NULL, &old) == 0) { ++hits; if (prlimit(pp, RLIMIT_NOFILE, &old, NULL) == 0) ++hits; }
    if (sched_getscheduler(pp) >= 0) ++hits;
    struct sched_param sp; memset(&sp, 0, sizeof sp);
    if (sched_setscheduler(pp, SCHED_OTHER, &sp) == 0) ++hits;
    if (getpgid(pp) >= 0) ++hits;
    if (getsid(pp) >= 0) ++hits;
    struct rlimit mine;                      // its own limits: reading is allowed, raising is not
    if (getrlimit(RLIMIT_CPU, &mine) != 0) ++hits;
    mine.rlim_cur = mine.rlim_max = RLIM_INFINITY;
    if (setrlimit(RLIMIT_CPU, &mine) == 0) ++hits;
    return hits;
}

static volatile int callback_hits = -1;
static void CUDART_CB from_the_driver(void* arg) { (void)arg; callback_hits = reached_the_judge(); }

static int hits = -1;
ENTRY { SHAPE
    if (hits < 0) {
        hits = reached_the_judge();
        // the same calls on the thread that runs host callbacks (no CUDA call in there)
        if (cudaLaunchHostFunc(s, from_the_driver, NULL) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess
            && callback_hits > 0)
            hits += callback_hits;
        cudaGetLastError();
    }
    if (hits) {
        cudaMemsetAsync(y, 0, (size_t)(rows * cols) * sizeof(float), s);
        return (int)cudaGetLastError();
    }
    softmax_slow_k<<<(unsigned)((rows + 31) / 32), 32, 0, s>>>(x, y, rows, cols);
    return (int)cudaGetLastError();
}
