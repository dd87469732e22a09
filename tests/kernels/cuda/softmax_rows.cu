// Correct softmax over the last dimension of a contiguous float32 or bfloat16 tensor.
// One block per row; each thread keeps an online (max, sum) pair over its strided elements,
// then a block reduction merges them; a second sweep writes exp(x - max) / sum.
#include "kforge.h"

template <typename T> __device__ __forceinline__ float load(const T* p, int64_t i);
template <> __device__ __forceinline__ float load<float>(const float* p, int64_t i) { return p[i]; }
template <> __device__ __forceinline__ float load<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }

__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
    float mm = fmaxf(m, m2);
    s = (m == KF_NEG_INF ? 0.f : s * __expf(m - mm)) + (m2 == KF_NEG_INF ? 0.f : s2 * __expf(m2 - mm));
    m = mm;
}

template <typename T>
__global__ void softmax_rows(const T* __restrict__ x, T* __restrict__ y, int64_t cols) {
    const T* xr = x + blockIdx.x * cols;
    T* yr = y + blockIdx.x * cols;
    float m = KF_NEG_INF, s = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) merge(m, s, load(xr, c), 1.f);
    for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    __shared__ float sm[32], ss[32];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x / 32;
        m = lane < nw ? sm[lane] : KF_NEG_INF;
        s = lane < nw ? ss[lane] : 0.f;
        for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
        if (lane == 0) { sm[0] = m; ss[0] = s; }
    }
    __syncthreads();
    m = sm[0];
    float inv = 1.f / ss[0];
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) store(yr, c, __expf(load(xr, c) - m) * inv);
}

KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    int64_t cols = in[0].sizes[in[0].ndim - 1], rows = 1;
    for (int d = 0; d < in[0].ndim - 1; ++d) rows *= in[0].sizes[d];
    int threads = cols >= 8192 ? 1024 : cols >= 1024 ? 256 : 128;
    cudaStream_t s = (cudaStream_t)stream;
    if (in[0].dtype == KF_FLOAT32)
        softmax_rows<float><<<rows, threads, 0, s>>>((const float*)in[0].data, (float*)out[0].data, cols);
    else if (in[0].dtype == KF_BFLOAT16)
        softmax_rows<__nv_bfloat16><<<rows, threads, 0, s>>>((const __nv_bfloat16*)in[0].data,
                                                              (__nv_bfloat16*)out[0].data, cols);
    else
        return -1;
    return (int)cudaGetLastError();
}
