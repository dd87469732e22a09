/* Attack corpus: the system calls that act on another process by pid, tried on the judge (getppid())
 * from inside the runner: scheduling policy and affinity, priority, resource limits (read and
 * write), process group and session. Found by review 3 (2026-12-02), when all of them worked on the
 * judge and the user's process: SCHED_DEADLINE on the judge's threads made eager read 100-5000x
 * slow (attack_deadline_judge: FASTER at 5610x), a 1 s RLIMIT_CPU killed the user's process
 * (attack_rlimit_user), an RLIMIT_NOFILE of 8 raised into it (attack_rlimit_judge).
 * If any call reaches the judge, the kernel writes zeros (WRONG_RESULT, which the corpus test does not
 * allow); when every one is refused it computes an honest softmax (SLOWER or NO_GAIN).
 */
#define _GNU_SOURCE
#include "kforge.h"
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/syscall.h>

static int reached_the_judge(void) {
    pid_t pp = getppid();
    int hits = 0;
    cpu_set_t s; CPU_ZERO(&s);
    if (sched_getaffinity(pp, sizeof s, &s) == 0) { ++hits; if (sched_setaffinity(pp, sizeof s, &s) == 0) ++hits; }
    errno = 0;
    int pr = getpriority(PRIO_PROCESS, pp);
    if (errno == 0) { ++hits; if (setpriority(PRIO_PROCESS, pp, pr) == 0) ++hits; }
    struct rlimit old;
    if (prlimit(pp, RLIMIT_NOFILE, NULL, &old) == 0) { ++hits; if (prlimit(pp, RLIMIT_NOFILE, &old, NULL) == 0) ++hits; }
    if (sched_getscheduler(pp) >= 0) ++hits;
    struct sched_param sp = {0};
    if (sched_setscheduler(pp, SCHED_OTHER, &sp) == 0) ++hits;
    if (getpgid(pp) >= 0) ++hits;
    if (getsid(pp) >= 0) ++hits;
    struct rlimit mine;                      /* its own limits: reading is allowed, raising is not */
    if (getrlimit(RLIMIT_CPU, &mine) != 0) ++hits;
    mine.rlim_cur = mine.rlim_max = RLIM_INFINITY;
    if (setrlimit(RLIMIT_CPU, &mine) == 0) ++hits;
    return hits;
}

KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    static int hits = -1;
    if (hits < 0) hits = reached_the_judge();
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data;
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1;
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];
    if (hits) { memset(y, 0, (size_t)(rows * cols) * sizeof(float)); return 0; }
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols; float* yr = y + r * cols;
        float m = KF_NEG_INF, sum = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); sum += yr[c]; }
        for (int64_t c = 0; c < cols; ++c) yr[c] /= sum;
    }
    return 0;
}
