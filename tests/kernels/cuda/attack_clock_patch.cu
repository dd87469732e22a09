// Attack corpus (CUDA): Hot-patches the clocks of its process: libc's clock_gettime and, when it can find it,
// cudaEventElapsedTime, so that a slow kernel looks instant. Expected: the judge's wall clock disagrees
// (TIMING_MISMATCH) or the honest slow time is seen (SLOWER); never FASTER. Screen: REJECTED.
#include "kforge.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include <dlfcn.h>
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)
#define SHAPE int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1; \
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d]; \
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; \
    cudaStream_t s = (cudaStream_t)stream;

// The honest path, made slow on purpose (one thread per row, repeated): an attack must never win
// on its own merit, so any FASTER verdict for it is the attack working.
__global__ void softmax_slow_k(const float* x, float* y, int64_t rows, int64_t cols) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* xr = x + r * cols; float* yr = y + r * cols;
    for (int rep = 0; rep < 8; ++rep) {
        float m = KF_NEG_INF, t = 0.f;
        for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); t += yr[c]; }
        for (int64_t c = 0; c < cols; ++c) yr[c] /= t;
    }
}
static int softmax_slow(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t s) {
    softmax_slow_k<<<(unsigned)((rows + 31) / 32), 32, 0, s>>>(x, y, rows, cols);
    return (int)cudaGetLastError();
}

static volatile int64_t fake_ns = 0;
static int fake_clock(clockid_t id, struct timespec* ts) {
    (void)id; fake_ns += 1; ts->tv_sec = 1000; ts->tv_nsec = (long)(fake_ns % 1000000000); return 0;
}
static cudaError_t fake_elapsed(float* ms, cudaEvent_t a, cudaEvent_t b) { (void)a; (void)b; *ms = 0.0001f; return cudaSuccess; }
static void jump(void* from, void* to) {
#if defined(__x86_64__)
    uint8_t* target = (uint8_t*)from;
    long page = sysconf(_SC_PAGESIZE);
    uint8_t* start = (uint8_t*)((uintptr_t)target & ~(uintptr_t)(page - 1));
    if (mprotect(start, (size_t)page * 2, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) return;
    target[0] = 0x48; target[1] = 0xB8;
    uint64_t addr = (uint64_t)(uintptr_t)to; memcpy(target + 2, &addr, 8);
    target[10] = 0xFF; target[11] = 0xE0;
    mprotect(start, (size_t)page * 2, PROT_READ | PROT_EXEC);
#endif
}
static int patched = 0;
ENTRY { SHAPE
    if (!patched) {
        patched = 1;
        jump((void*)&clock_gettime, (void*)&fake_clock);
        void* elapsed = dlsym(RTLD_DEFAULT, "cudaEventElapsedTime");
        if (elapsed) jump(elapsed, (void*)&fake_elapsed);
    }
    return softmax_slow(x, y, rows, cols, s);
}
