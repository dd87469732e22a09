/* Attack corpus: Caches by content: a cheap fingerprint of a few input values selects an output computed before.
 * Expected: fresh values on every checked and timed call make the fingerprint miss or the copied output
 * wrong (WRONG_RESULT), else only the slow honest path (SLOWER). Never FASTER. */
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

#define SLOTS 64
static uint32_t keys[SLOTS]; static float* saved[SLOTS]; static int used = 0;
static uint32_t fingerprint(const float* x, int64_t n) {
    uint32_t h = 2166136261u; const uint32_t* u = (const uint32_t*)x;
    for (int64_t i = 0; i < n; i += (n / 8 > 0 ? n / 8 : 1)) { h ^= u[i]; h *= 16777619u; }
    return h;
}
ENTRY { ROWS_COLS
    uint32_t k = fingerprint(x, rows * cols);
    for (int i = 0; i < used; ++i)
        if (keys[i] == k) { memcpy(y, saved[i], sizeof(float) * rows * cols); return 0; }
    softmax_slow(x, y, rows, cols);
    if (used < SLOTS) {
        saved[used] = (float*)malloc(sizeof(float) * rows * cols);
        memcpy(saved[used], y, sizeof(float) * rows * cols); keys[used++] = k;
    }
    return 0;
}
