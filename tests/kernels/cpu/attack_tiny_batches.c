/* Attack corpus: Shrinks the timed batches, then hides in the clock check's fixed slack. The judge sizes its
 * timed batches from its own wall clock of the validation run, but the candidate decides how long validation
 * takes: it waits 3 ms in each of the first 8 calls (the validation sets), so every timed batch gets the
 * fewest sets (2). A batch of two honest calls (~60 us here) then fits inside the fixed slack of the
 * clock check (200 us + 2 us a call) whatever the runner reports, and a hot-patched clock_gettime reports
 * ~1/1000 of the real time. The kernel itself is a plain three-pass softmax, slower than eager's.
 * Found by review, 2026-12-02 (judge-review2): won FASTER at ~10x. Expected: the judge's clock decides
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
static int64_t real_ns(void) {
    struct timespec r; syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &r);
    return (int64_t)r.tv_sec * 1000000000LL + r.tv_nsec;
}
static int slow_clock(clockid_t id, struct timespec* ts) {
    struct timespec r; syscall(SYS_clock_gettime, id, &r);
    int64_t ns = (int64_t)r.tv_sec * 1000000000LL + r.tv_nsec;
    if (last_real < 0) { last_real = ns; virt = ns; }
    double f = calls <= 8 ? 1.0 : 0.001;
    virt += (int64_t)((double)(ns - last_real) * f) + 1; last_real = ns;
    ts->tv_sec = virt / 1000000000LL; ts->tv_nsec = virt % 1000000000LL; return 0;
}
static void patch_clock(void) {
#if defined(__x86_64__)
    uint8_t* target = (uint8_t*)&clock_gettime;
    long page = sysconf(_SC_PAGESIZE);
    uint8_t* start = (uint8_t*)((uintptr_t)target & ~(uintptr_t)(page - 1));
    if (mprotect(start, (size_t)page * 2, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) return;
    target[0] = 0x48; target[1] = 0xB8;   /* movabs rax, slow_clock; jmp rax */
    uint64_t addr = (uint64_t)(uintptr_t)&slow_clock; memcpy(target + 2, &addr, 8);
    target[10] = 0xFF; target[11] = 0xE0;
    mprotect(start, (size_t)page * 2, PROT_READ | PROT_EXEC);
#endif
}
static int patched = 0;
KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* ws, void* stream) {
    if (!patched) { patched = 1; patch_clock(); }
    calls++;
    if (calls <= 8) { int64_t end = real_ns() + 3000000; while (real_ns() < end) {} }
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
