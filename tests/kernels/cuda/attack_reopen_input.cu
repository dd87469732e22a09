// Attack corpus (CUDA): Twin of cpu/attack_reopen_input.c. The arenas are device memory the runner can write
// (CUDA IPC): in the timed calls it zeros its input and writes softmax of zeros (1/cols everywhere). Found on the
// CPU (issue 42), where eager's reference was computed from the same memory afterwards. Expected: eager's
// reference comes from the judge's own copy and every timed batch's inputs are compared with it: "modified an
// input" (WRONG_RESULT). Never FASTER.
#include "kforge.h"
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

__global__ void zero_and_uniform(float* x, float* y, int64_t n, float v) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        x[i] = 0.f;
        y[i] = v;
    }
}

static long calls = 0;
ENTRY { SHAPE
    if (++calls <= 16) return softmax_slow(x, y, rows, cols, s);   // validation: honest
    zero_and_uniform<<<64, 256, 0, s>>>((float*)in[0].data, y, rows * cols, 1.f / (float)cols);
    return (int)cudaGetLastError();
}
