// Attack corpus (CUDA): Leaves work running after it returns: a kernel on a stream of its own keeps writing into an
// output for a long time. Expected: the device-wide sync after each batch and the judge's reading of
// outputs after it catch it (WRONG_RESULT, or the outside-stream check); the next candidate is unaffected.
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

// Keeps writing into the output on a stream of its own long after kf_launch returned.
__global__ void scribble(float* y, int64_t n) {
    for (long it = 0; it < 200000; ++it) {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x * 7) y[i] = 0.5f;
        __nanosleep(1000);
    }
}
static cudaStream_t side = 0;
static int started = 0;
ENTRY { SHAPE
    int rc = softmax_slow(x, y, rows, cols, s);
    if (!started) {
        started = 1;
        cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
        cudaEvent_t done; cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
        cudaEventRecord(done, s); cudaStreamWaitEvent(side, done, 0);
        scribble<<<1, 256, 0, side>>>(y, rows * cols);
    }
    return rc;
}
