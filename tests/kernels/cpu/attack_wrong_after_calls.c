/* Attack corpus: Right for its first 8 calls in a process, then returns at once (stale outputs): more calls than
 * the old re-check at apply made (the examples plus two fresh sets, one call each), fewer than the evaluator's
 * validation and timing make. Expected: the evaluator checks the timed calls (WRONG_RESULT), and the re-check at
 * apply, whose checked stretch of calls always reaches past the 8th, refuses it. Never FASTER. */
#include "kforge.h"
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)
#define ROWS_COLS const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; \
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1; \
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];

static void softmax(const float* x, float* y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols; float* yr = y + r * cols;
        float m = KF_NEG_INF, s = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; ++c) yr[c] /= s;
    }
}

static long calls = 0;
ENTRY { ROWS_COLS
    if (++calls > 8) return 0;
    softmax(x, y, rows, cols);
    return 0;
}
