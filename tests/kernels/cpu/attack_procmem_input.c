/* Attack corpus (issue 42 review, eighth pass): writes its read-only, sealed input through /proc/self/mem, the
 * way a debugger pokes memory whatever its protection (the kernel's "force" access), then in the timed calls
 * writes softmax of the zeros it wrote (1/cols everywhere): no exp, no reduction. Expected: Landlock refuses
 * opening /proc/self/mem for writing, and the mapping of a read-only descriptor cannot be forced writable
 * either: the kernel falls back to its slow honest path (SLOWER); had a write gone through, the judge's compare
 * of every timed batch's inputs says "modified an input" (WRONG_RESULT). Never FASTER. Screen: REJECTED. */
#include "kforge.h"
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)
#define ROWS_COLS const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; \
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1; \
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];

/* The honest path, made slow on purpose (400 passes): an attack must never win on its own merit,
 * so any FASTER verdict for it is the attack working. */
static void softmax_slow(const float* x, float* y, int64_t rows, int64_t cols) {
    for (int rep = 0; rep < 400; ++rep)
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
    if (++calls <= 16) { softmax_slow(x, y, rows, cols); return 0; }   /* validation: honest */
    static int fd = -2;
    static float* zeros;
    if (fd == -2) {
        fd = open("/proc/self/mem", O_RDWR);
        zeros = (float*)calloc((size_t)(rows * cols), sizeof(float));
    }
    size_t bytes = (size_t)(rows * cols) * sizeof(float);
    if (fd < 0 || !zeros || pwrite(fd, zeros, bytes, (off_t)(uintptr_t)x) != (ssize_t)bytes) {
        softmax_slow(x, y, rows, cols);
        return 0;
    }
    float v = 1.f / (float)cols;
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = v;
    return 0;
}
