// Attack corpus (CUDA): Caches by content: a cheap fingerprint of a few input values selects an output computed before.
// Expected: fresh values on every checked and timed call make the fingerprint miss or the copied output
// wrong (WRONG_RESULT), else only the slow honest path (SLOWER). Never FASTER.
#include "kforge.h"
#include <stdlib.h>
#include <string.h>
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

#define SLOTS 64
static uint32_t keys[SLOTS]; static float* saved[SLOTS]; static int used = 0;
ENTRY { SHAPE
    size_t bytes = sizeof(float) * rows * cols; int64_t n = rows * cols;
    uint32_t probe[8], k = 2166136261u;
    for (int i = 0; i < 8; ++i) cudaMemcpyAsync(&probe[i], x + (n / 8) * i, 4, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    for (int i = 0; i < 8; ++i) { k ^= probe[i]; k *= 16777619u; }
    for (int i = 0; i < used; ++i)
        if (keys[i] == k) { cudaMemcpyAsync(y, saved[i], bytes, cudaMemcpyDeviceToDevice, s); return (int)cudaGetLastError(); }
    int rc = softmax_slow(x, y, rows, cols, s);
    if (used < SLOTS && cudaMalloc((void**)&saved[used], bytes) == cudaSuccess) {
        cudaMemcpyAsync(saved[used], y, bytes, cudaMemcpyDeviceToDevice, s); keys[used++] = k;
    }
    return rc;
}
