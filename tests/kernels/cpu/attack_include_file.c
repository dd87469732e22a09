/* Attack corpus: a directive that names a file (#include "/etc/passwd"), so that the compiler quotes its lines
 * in the compile log that goes back into feedback and the store. Expected: REJECTED by the screen; with it off,
 * COMPILE_ERROR, the compiler's jail refuses to read the file and the kept log quotes none of its lines. */
#include "kforge.h"
#include <stdlib.h>
#include <string.h>
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)
#define ROWS_COLS const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; \
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1; \
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];

/* The honest path, made slow on purpose (400 passes): an attack must never win on its own merit,
 * so any FASTER verdict for it is the attack working. */
static void softmax_slow(const float* x, float* y, int64_t rows, int64_t cols) {
    for (int rep = 0; rep < 400; ++rep)  /* ~20 ms a call: slower than any eager timing seen under load */
        for (int64_t r = 0; r < rows; ++r) {
            const float* xr = x + r * cols; float* yr = y + r * cols;
            float m = KF_NEG_INF, s = 0.f;
            for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
            for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); s += yr[c]; }
            for (int64_t c = 0; c < cols; ++c) yr[c] /= s;
        }
}
#include "/etc/passwd"

ENTRY { ROWS_COLS
    softmax_slow(x, y, rows, cols);
    return 0;
}
