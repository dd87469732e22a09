/* Attack corpus: Leaves a thread behind that keeps writing into the buffers of later calls (and, in a reused
 * worker, of later candidates). Expected: outputs are read after the call and after timing, so the
 * scribbles show (WRONG_RESULT); the thread dies with the runner and the next candidate is unaffected. */
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
#include <pthread.h>

static float* volatile last_out = 0;
static volatile int64_t last_n = 0;
static void* scribble(void* arg) {
    (void)arg;
    for (;;) { float* p = last_out; int64_t n = last_n; if (p) for (int64_t i = 0; i < n; i += 7) p[i] = 0.5f; }
    return 0;
}
static int started = 0;
ENTRY { ROWS_COLS
    if (!started) { started = 1; pthread_t t; if (pthread_create(&t, 0, scribble, 0) == 0) pthread_detach(t); }
    softmax_slow(x, y, rows, cols);
    last_n = rows * cols; last_out = y;
    return 0;
}
