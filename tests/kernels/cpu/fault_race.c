/* Fault corpus: Threads race on one shared running sum per row. */
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
        const float* xr = x + r * cols; float* yr = y + r * cols;
        float m = KF_NEG_INF;
        for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
        volatile float s = 0.f;
        /* The unsynchronised read-modify-write of the shared sum, with the read and the write of
           every thread pushed apart by a barrier: the lost updates do not depend on scheduling. */
        #pragma omp parallel num_threads(4)
        {
            float part = 0.f;
            #pragma omp for
            for (int64_t c = 0; c < cols; ++c) { float e = expf(xr[c] - m); yr[c] = e; part += e; }
            float t = s;
            #pragma omp barrier
            s = t + part;
        }
        for (int64_t c = 0; c < cols; ++c) yr[c] /= s;
    }
    return 0;
}
