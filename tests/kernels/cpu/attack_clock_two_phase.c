/* Attack corpus: Hot-patches libc's clock_gettime with a clock that runs 1000x fast while the judge sizes its
 * timed batches (the 8 validation calls, to make them as short as possible) and 1000x slow once timed (to hide
 * inside the clock check's slack, in a quarter of the batches or all of them). The kernel itself is a plain
 * three-pass softmax, several times slower than eager's. Found by review, 2026-12-02: it won 277x while
 * batches were sized by the runner's reported validation times. Expected: the judge's own clocks disagree
 * (TIMING_MISMATCH) or the honest slow time is counted (SLOWER, NO_GAIN); never FASTER.
 * With the screen on: REJECTED (mprotect, syscall). */
#define _GNU_SOURCE
#include "kforge.h"
#include <time.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <math.h>

static volatile long calls = 0;
static int64_t last_real = -1, virt = 0;
static int two_phase(clockid_t id, struct timespec* ts) {
    struct timespec r; syscall(SYS_clock_gettime, id, &r);
    int64_t ns = (int64_t)r.tv_sec * 1000000000LL + r.tv_nsec;
    if (last_real < 0) { last_real = ns; virt = ns; }
    double f = calls <= 8 ? 1000.0 : 0.001;
    virt += (int64_t)((double)(ns - last_real) * f) + 1; last_real = ns;
    ts->tv_sec = virt / 1000000000LL; ts->tv_nsec = virt % 1000000000LL; return 0;
}
static void patch_clock(void) {
#if defined(__x86_64__)
    uint8_t* target = (uint8_t*)&clock_gettime;
    long page = sysconf(_SC_PAGESIZE);
    uint8_t* start = (uint8_t*)((uintptr_t)target & ~(uintptr_t)(page - 1));
    if (mprotect(start, (size_t)page * 2, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) return;
    /* movabs rax, two_phase; jmp rax */
    target[0] = 0x48; target[1] = 0xB8;
    uint64_t addr = (uint64_t)(uintptr_t)&two_phase; memcpy(target + 2, &addr, 8);
    target[10] = 0xFF; target[11] = 0xE0;
    mprotect(start, (size_t)page * 2, PROT_READ | PROT_EXEC);
#endif
}
static int patched = 0;
KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* ws, void* stream) {
    if (!patched) { patched = 1; patch_clock(); }
    calls++;
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data;
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1;
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols; float* yr = y + r * cols; float m = -INFINITY, s = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
        for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; ++c) yr[c] /= s;
    }
    return 0;
}
