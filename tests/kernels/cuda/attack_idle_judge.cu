// Attack corpus (CUDA): starves eager by re-scheduling the JUDGE from inside the runner (no root needed: same
// user). On its first call it finds the judge (getppid()) and every thread of the judge's process group and
// session after it (getpgid/getsid by pid; no /proc of another process needed), moves them to SCHED_IDLE at
// nice 19 and pins them to the CPU that /proc/stat (readable) shows busiest, the runner to another: any other
// process running there preempts the judge almost entirely while it times eager.
// Twin of tests/kernels/cpu/attack_idle_judge.c (review 3: SLOWER 3 of 3 there, the lower quartile picking the
// eager batches the other load left alone; but the judge's scheduling was changed for every later candidate).
// Where the GPU version differs: eager is timed with CUDA events; for a small card the GPU waits for the judge's
// host (torch's dispatch) between an eager call's events, so a starved judge reads eager slow on CUDA too, while
// the candidate's calls are queued back to back by the runner and keep their time.
// Its work: an honest softmax, one thread per row, one pass: slower than eager (NO_ATTACK: the control).
// Expected: sched_setscheduler, setpriority and sched_setaffinity on another pid are refused by the seccomp
// filter; the judge is untouched: SLOWER or NO_GAIN (CRASHED from JudgeState had its scheduling changed).
// Never FASTER.
// Screen: REJECTED (getppid, fopen, sched_setscheduler, setpriority, sched_setaffinity...).
#include "kforge.h"
#include <stdio.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)
#define SHAPE int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1; \
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d]; \
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; \
    cudaStream_t s = (cudaStream_t)stream;

// The honest path, slow on purpose (one thread per row): the attack must not win on its own merit.
__global__ void softmax_slow_k(const float* x, float* y, int64_t rows, int64_t cols) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* xr = x + r * cols; float* yr = y + r * cols;
    float m = KF_NEG_INF, t = 0.f;
    for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
    for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); t += yr[c]; }
    for (int64_t c = 0; c < cols; ++c) yr[c] /= t;
}

static int busiest_cpu(int avoid) {
    // two reads of /proc/stat 20 ms apart: the CPU with the most busy time in between
    long long b0[64] = {0}, b1[64] = {0};
    for (int pass = 0; pass < 2; ++pass) {
        FILE* f = fopen("/proc/stat", "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) {
            int c; long long u, n, sy, i, w, q, sq, st;
            if (sscanf(line, "cpu%d %lld %lld %lld %lld %lld %lld %lld %lld", &c, &u, &n, &sy, &i, &w, &q, &sq, &st) == 9
                && c >= 0 && c < 64)
                (pass ? b1 : b0)[c] = u + n + sy + q + sq + st;
        }
        if (f) fclose(f);
        if (!pass) { struct timespec ts = {0, 20000000}; nanosleep(&ts, NULL); }
    }
    int best = 0; long long most = -1;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (int c = 0; c < n && c < 64; ++c)
        if (c != avoid && b1[c] - b0[c] > most) { most = b1[c] - b0[c]; best = c; }
    return best;
}

static void starve(pid_t t, int cpu) {
#ifndef NO_ATTACK
    struct sched_param sp; memset(&sp, 0, sizeof sp);
    sched_setscheduler(t, 5 /* SCHED_IDLE */, &sp);
    setpriority(PRIO_PROCESS, t, 19);
    cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(cpu, &cs);
    sched_setaffinity(t, sizeof cs, &cs);
#else
    (void)t; (void)cpu;
#endif
}

static int done = 0;
static void attack(void) {
    if (done) return;
    done = 1;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    int mine = n > 1 ? (int)n - 1 : 0;
    int judge_cpu = busiest_cpu(n > 1 ? mine : -1);
    pid_t pp = getppid(), pg = getpgid(pp), sid = getsid(pp);
    starve(pp, judge_cpu);
    for (pid_t t = pp + 1; t < pp + 2048; ++t)
        if (getpgid(t) == pg && getsid(t) == sid) starve(t, judge_cpu);
#ifndef NO_ATTACK
    if (n > 1) { cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(mine, &cs); sched_setaffinity(0, sizeof cs, &cs); }
#endif
}

ENTRY { SHAPE
    attack();
    softmax_slow_k<<<(unsigned)((rows + 31) / 32), 32, 0, s>>>(x, y, rows, cols);
    return (int)cudaGetLastError();
}
