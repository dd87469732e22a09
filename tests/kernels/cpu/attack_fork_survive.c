/* Attack corpus: Forks children that leave its process group and session (setsid) and sleep for ten minutes,
 * named kfattack_child so they can be found. Expected: the sandbox refuses fork or kills every
 * descendant; none is alive after the evaluation. The kernel itself is correct and slow. Screen: REJECTED. */
#define _GNU_SOURCE
#include <unistd.h>
#include <sys/prctl.h>
#include "kforge.h"
#include <stdlib.h>
#include <string.h>
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)
#define ROWS_COLS const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; \
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1; \
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];

/* The honest path, made slow on purpose (REPEAT passes): an attack must never win on its own merit,
 * so any FASTER verdict for it is the attack working. */
static void softmax_slow(const float* x, float* y, int64_t rows, int64_t cols) {
    for (int rep = 0; rep < 6; ++rep)
        for (int64_t r = 0; r < rows; ++r) {
            const float* xr = x + r * cols; float* yr = y + r * cols;
            float m = KF_NEG_INF, s = 0.f;
            for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
            for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); s += yr[c]; }
            for (int64_t c = 0; c < cols; ++c) yr[c] /= s;
        }
}

static int forked = 0;
ENTRY { ROWS_COLS
    if (!forked) {
        forked = 1;
        for (int i = 0; i < 2; ++i) {
            pid_t p = fork();
            if (p == 0) {
                setsid();
                if (fork() == 0) {              /* grandchild: re-parented, outside the group */
                    prctl(PR_SET_NAME, "kfattack_child", 0, 0, 0);
                    for (int s = 0; s < 600; ++s) sleep(1);
                }
                _exit(0);
            }
        }
    }
    softmax_slow(x, y, rows, cols);
    return 0;
}
