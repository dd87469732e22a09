/* Wrong on purpose: forgets to normalise the last row. */
#include "kforge.h"

KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    const float* x = (const float*)in[0].data;
    float* y = (float*)out[0].data;
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1;
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];
    for (int64_t r = 0; r < rows; ++r) {
        float m = KF_NEG_INF, s = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = x[r * cols + c] > m ? x[r * cols + c] : m;
        for (int64_t c = 0; c < cols; ++c) { y[r * cols + c] = expf(x[r * cols + c] - m); s += y[r * cols + c]; }
        if (r + 1 < rows) for (int64_t c = 0; c < cols; ++c) y[r * cols + c] /= s;
    }
    return 0;
}
