// Fault corpus: Never finishes.
#include "kforge.h"
// Base: softmax over rows of a contiguous float32 tensor, one block of 256 threads per row.
#define ENTRY KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, \
                                     const double* params, int n_params, void* workspace, void* stream)
#define SHAPE int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1; \
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d]; \
    const float* x = (const float*)in[0].data; float* y = (float*)out[0].data; \
    cudaStream_t s = (cudaStream_t)stream;

__device__ float block_max(float v) {
    __shared__ float sh[8];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    v = sh[0];
    for (int i = 1; i < 8; ++i) v = fmaxf(v, sh[i]);
    __syncthreads();
    return v;
}
__device__ float block_sum(float v) {
    __shared__ float sh[8];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    v = 0.f;
    for (int i = 0; i < 8; ++i) v += sh[i];
    __syncthreads();
    return v;
}
__device__ void softmax_row(const float* xr, float* yr, int64_t cols) {
    float m = KF_NEG_INF;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
    m = block_max(m);
    float t = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) t += expf(xr[c] - m);
    float inv = 1.f / block_sum(t);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - m) * inv;
}

// NB: __nanosleep (an intrinsic the compiler must keep): a plain spin loop with no side effect may be
// deleted, and inline asm is refused by the source screen.
__global__ void k(float* y) { for (;;) { __nanosleep(1000); } }
ENTRY { SHAPE (void)x; (void)rows; (void)cols; k<<<1, 1, 0, s>>>(y); return (int)cudaGetLastError(); }
