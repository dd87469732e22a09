// Correct group_norm for a contiguous N,C,* float32 or bfloat16 input with optional per-channel
// weight and bias. Each (sample, group) is split over many blocks: pass one writes per-block
// Welford partials (count, mean, M2) to the workspace; pass two merges a group's partials
// (Chan's formula) and normalises its chunk.
#include "kforge.h"

#define BLOCKS_PER_GROUP 64
#define MAX_GROUPS 4096

struct Partial { float n, mean, m2; };

template <typename T> __device__ __forceinline__ float load(const T* p, int64_t i);
template <> __device__ __forceinline__ float load<float>(const float* p, int64_t i) { return p[i]; }
template <> __device__ __forceinline__ float load<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }

__device__ __forceinline__ Partial combine(Partial a, Partial b) {
    float n = a.n + b.n;
    if (n == 0.f) return a;
    float d = b.mean - a.mean, fb = b.n / n;
    return {n, a.mean + d * fb, a.m2 + b.m2 + d * d * a.n * fb};
}

__device__ Partial block_reduce(Partial p) {
    for (int o = 16; o > 0; o >>= 1) {
        Partial q{__shfl_xor_sync(0xffffffffu, p.n, o), __shfl_xor_sync(0xffffffffu, p.mean, o),
                  __shfl_xor_sync(0xffffffffu, p.m2, o)};
        p = combine(p, q);
    }
    __shared__ Partial sh[32];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) sh[warp] = p;
    __syncthreads();
    if (warp == 0) {
        p = lane < (int)(blockDim.x / 32) ? sh[lane] : Partial{0.f, 0.f, 0.f};
        for (int o = 16; o > 0; o >>= 1) {
            Partial q{__shfl_xor_sync(0xffffffffu, p.n, o), __shfl_xor_sync(0xffffffffu, p.mean, o),
                      __shfl_xor_sync(0xffffffffu, p.m2, o)};
            p = combine(p, q);
        }
        if (lane == 0) sh[0] = p;
    }
    __syncthreads();
    return sh[0];
}

template <typename T>
__global__ void stats(const T* __restrict__ x, Partial* __restrict__ part, int64_t len) {
    int64_t group = blockIdx.y, chunk = (len + gridDim.x - 1) / gridDim.x;
    int64_t lo = blockIdx.x * chunk, hi = min(len, lo + chunk);
    const T* xg = x + group * len;
    Partial p{0.f, 0.f, 0.f};
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float v = load(xg, i);
        p.n += 1.f;
        float d = v - p.mean;
        p.mean += d / p.n;
        p.m2 += d * (v - p.mean);
    }
    p = block_reduce(p);
    if (threadIdx.x == 0) part[group * gridDim.x + blockIdx.x] = p;
}

template <typename T>
__global__ void normalize(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                          T* __restrict__ y, const Partial* __restrict__ part, int64_t len, int64_t hw,
                          int64_t cpg, int64_t groups, float eps) {
    int64_t group = blockIdx.y, chunk = (len + gridDim.x - 1) / gridDim.x;
    __shared__ float mean_rstd[2];
    if (threadIdx.x < 32) {
        Partial p{0.f, 0.f, 0.f};
        for (int i = threadIdx.x; i < (int)gridDim.x; i += 32) p = combine(p, part[group * gridDim.x + i]);
        for (int o = 16; o > 0; o >>= 1) {
            Partial q{__shfl_xor_sync(0xffffffffu, p.n, o), __shfl_xor_sync(0xffffffffu, p.mean, o),
                      __shfl_xor_sync(0xffffffffu, p.m2, o)};
            p = combine(p, q);
        }
        if (threadIdx.x == 0) { mean_rstd[0] = p.mean; mean_rstd[1] = rsqrtf(p.m2 / p.n + eps); }
    }
    __syncthreads();
    float mean = mean_rstd[0], rstd = mean_rstd[1];
    int64_t g = group % groups, lo = blockIdx.x * chunk, hi = min(len, lo + chunk);
    const T* xg = x + group * len;
    T* yg = y + group * len;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        int64_t ch = g * cpg + i / hw;
        float scale = rstd * (w ? load(w, ch) : 1.f), shift = (b ? load(b, ch) : 0.f) - mean * scale;
        store(yg, i, load(xg, i) * scale + shift);
    }
}

KF_ENTRY size_t kf_workspace_bytes(void) { return sizeof(Partial) * BLOCKS_PER_GROUP * MAX_GROUPS; }

template <typename T>
static int run(const kf_tensor* in, const kf_tensor* out, const double* params, void* ws, cudaStream_t s) {
    int64_t n = in[0].sizes[0], c = in[0].sizes[1], hw = 1;
    for (int d = 2; d < in[0].ndim; ++d) hw *= in[0].sizes[d];
    int64_t groups = (int64_t)params[0], cpg = c / groups, len = cpg * hw;
    if (n * groups > MAX_GROUPS) return -2;
    dim3 grid(BLOCKS_PER_GROUP, (unsigned)(n * groups));
    stats<T><<<grid, 512, 0, s>>>((const T*)in[0].data, (Partial*)ws, len);
    normalize<T><<<grid, 512, 0, s>>>((const T*)in[0].data, (const T*)in[1].data, (const T*)in[2].data,
                                      (T*)out[0].data, (const Partial*)ws, len, hw, cpg, groups, (float)params[1]);
    return (int)cudaGetLastError();
}

KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out,
                       const double* params, int n_params, void* workspace, void* stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (in[0].dtype == KF_FLOAT32) return run<float>(in, out, params, workspace, s);
    if (in[0].dtype == KF_BFLOAT16) return run<__nv_bfloat16>(in, out, params, workspace, s);
    return -1;
}
