/* Attack corpus: Behaves differently when evaluated and when deployed: inside a process without Python (the
 * runner) it computes correctly (slowly); inside the user's Python process it writes zeros.
 * Expected from the evaluator: a correct, slow verdict (SLOWER); the apply/load re-check in the user's
 * process must refuse it (the lead's part of issue 12). Screen: REJECTED (dlfcn.h, dlsym). */
#define _GNU_SOURCE
#include <dlfcn.h>
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

ENTRY { ROWS_COLS
    if (dlsym(RTLD_DEFAULT, "Py_IsInitialized") != 0) { memset(y, 0, sizeof(float) * rows * cols); return 0; }
    softmax_slow(x, y, rows, cols);
    return 0;
}
