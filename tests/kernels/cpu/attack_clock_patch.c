/* Attack corpus: Hot-patches libc's clock_gettime (the clock behind time.perf_counter and the runner's timer) so
 * that time barely moves while the kernel runs, then does the (slow, correct) work. Expected: the judge's
 * own wall clock disagrees (TIMING_MISMATCH) or the honest slow time is seen (SLOWER); never FASTER.
 * With the screen on: REJECTED (mprotect, sys/mman.h). */
#define _GNU_SOURCE
#include <time.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
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

static volatile int64_t fake_ns = 0;
static int fake_clock(clockid_t id, struct timespec* ts) {   /* 1 ns per call: every interval ~0 */
    (void)id; fake_ns += 1; ts->tv_sec = 1000; ts->tv_nsec = (long)(fake_ns % 1000000000); return 0;
}
static int patched = 0;
static void patch_clock(void) {
#if defined(__x86_64__)
    uint8_t* target = (uint8_t*)&clock_gettime;
    long page = sysconf(_SC_PAGESIZE);
    uint8_t* start = (uint8_t*)((uintptr_t)target & ~(uintptr_t)(page - 1));
    if (mprotect(start, (size_t)page * 2, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) return;
    /* movabs rax, fake_clock; jmp rax */
    target[0] = 0x48; target[1] = 0xB8;
    uint64_t addr = (uint64_t)(uintptr_t)&fake_clock; memcpy(target + 2, &addr, 8);
    target[10] = 0xFF; target[11] = 0xE0;
    mprotect(start, (size_t)page * 2, PROT_READ | PROT_EXEC);
#endif
}
ENTRY { ROWS_COLS
    if (!patched) { patched = 1; patch_clock(); }
    softmax_slow(x, y, rows, cols);
    return 0;
}
