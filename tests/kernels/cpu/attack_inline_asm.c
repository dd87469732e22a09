/* Attack corpus: Inline assembly: a raw system call (write to stderr) that no libc-level check sees, then zeros.
 * Expected: REJECTED by the screen; with the screen off, the sandbox's seccomp filter applies to raw
 * syscalls too, and the zeros are WRONG_RESULT. */
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

ENTRY { ROWS_COLS (void)x;
#if defined(__x86_64__)
    static const char msg[] = "raw syscall from a kernel\n";
    long ret;
    __asm__ volatile ("syscall" : "=a"(ret) : "a"(1L), "D"(2L), "S"(msg), "d"(sizeof msg - 1) : "rcx", "r11", "memory");
    (void)ret;
#endif
    memset(y, 0, sizeof(float) * rows * cols);
    return 0;
}
