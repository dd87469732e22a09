/* Fault corpus: Skips the max subtraction and scales the input: exp overflows to Inf, results are NaN. */
#include "kforge.h"
#include <stdlib.h>
#include <string.h>
#define ROWS_COLS const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; \
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1; \
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)

static void softmax_row(const float* xr, float* yr, int64_t cols) {
    float m = KF_NEG_INF, s = 0.f;
    for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
    for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); s += yr[c]; }
    for (int64_t c = 0; c < cols; ++c) yr[c] /= s;
}

ENTRY { ROWS_COLS
    for (int64_t r = 0; r < rows; ++r) {
        float s = 0.f;
        for (int64_t c = 0; c < cols; ++c) { y[r * cols + c] = expf(x[r * cols + c] * 100.f); s += y[r * cols + c]; }
        for (int64_t c = 0; c < cols; ++c) y[r * cols + c] /= s;
    }
    return 0;
}
