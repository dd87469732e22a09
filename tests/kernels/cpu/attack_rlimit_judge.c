/* Attack corpus: breaks the JUDGE for every later candidate, from inside the runner, with prlimit64 on
 * the judge's pid (getppid()): not in the seccomp filter, not scoped by Landlock, allowed for a process
 * of the same user. It sets the judge's RLIMIT_NOFILE to 8 (soft and hard: it can never be raised
 * again without CAP_SYS_RESOURCE... which root has, but the judge never tries), so the judge cannot open
 * another file, memfd or socket: the current evaluation, whose memory is already mapped, finishes; the
 * next candidates' evaluations cannot make their shared memory or start a runner. Then it computes an
 * honest softmax. What it gains: every later honest candidate of this judge gets a wrong verdict
 * (an error or infra_error instead of its timing), i.e. one candidate changes the verdicts of the next.
 * Same hole: RLIMIT_AS (the judge's next allocation fails), RLIMIT_CPU (the judge dies of SIGXCPU).
 * RESULT (review 3): WIN 3 of 3: Evaluator.evaluate raised RuntimeError ("the evaluator failed on a
 * candidate (a kforge bug...)": OSError EMFILE in Arenas, or ImportError of resource.so) into the user's
 * process, once for the next honest candidate, twice already for this candidate. Not in the test list.
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
        struct rlimit few = {8, 8};
        prlimit(getppid(), RLIMIT_NOFILE, &few, NULL);
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
