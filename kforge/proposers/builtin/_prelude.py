"""Shared source text: conversions, vector accesses and reductions every family uses."""
from __future__ import annotations

from ...ops import TensorSig

CUDA = r"""#include "kforge.h"
#include <stdint.h>

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }

/* N elements moved as one access (16 bytes at most). */
template <typename T, int N> struct alignas(sizeof(T) * N) Vec { T v[N]; };

template <int N, typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[N]) {
    Vec<T, N> v = *reinterpret_cast<const Vec<T, N>*>(p);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_f(v.v[i]);
}

template <int N, typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[N]) {
    Vec<T, N> v;
#pragma unroll
    for (int i = 0; i < N; ++i) v.v[i] = from_f<T>(in[i]);
    *reinterpret_cast<Vec<T, N>*>(p) = v;
}

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide reductions; every thread gets the result. `scratch` holds 32 floats. */
template <int THREADS>
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    v = warp_sum(v);
    if (THREADS <= 32) return v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < THREADS / 32 ? scratch[lane] : 0.f;
    return warp_sum(v);
}

template <int THREADS>
__device__ __forceinline__ float block_max(float v, float* scratch) {
    v = warp_max(v);
    if (THREADS <= 32) return v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < THREADS / 32 ? scratch[lane] : KF_NEG_INF;
    return warp_max(v);
}

/* Mean and sum of squared deviations of `n` values, merged with Chan's formula. */
struct Welford {
    float n, mean, m2;
    __device__ __forceinline__ void merge(float nb, float mb, float m2b) {
        const float total = n + nb;
        if (nb == 0.f) return;
        const float delta = mb - mean, wb = nb / total;
        mean += delta * wb;
        m2 += m2b + delta * delta * n * wb;
        n = total;
    }
    __device__ __forceinline__ void merge_lanes(int width) {
        for (int o = width / 2; o > 0; o >>= 1)
            merge(__shfl_xor_sync(0xffffffffu, n, o), __shfl_xor_sync(0xffffffffu, mean, o),
                  __shfl_xor_sync(0xffffffffu, m2, o));
    }
};

/* Merge the Welford states of a block; every thread gets the result. `scratch` holds 96 floats. */
template <int THREADS>
__device__ __forceinline__ Welford block_welford(Welford w, float* scratch) {
    w.merge_lanes(32);
    if (THREADS <= 32) return w;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) { scratch[warp] = w.n; scratch[32 + warp] = w.mean; scratch[64 + warp] = w.m2; }
    __syncthreads();
    Welford r = {0.f, 0.f, 0.f};
    if (lane < THREADS / 32) r = {scratch[lane], scratch[32 + lane], scratch[64 + lane]};
    r.merge_lanes(32);
    return r;
}
"""

CPU = r"""#include "kforge.h"
#include <math.h>
#include <stdint.h>
#include <string.h>
"""

_CPU_IO = {
    "float32": ("float", "{p}[{i}]", "{p}[{i}] = ({v})"),
    "float64": ("double", "(float){p}[{i}]", "{p}[{i}] = (double)({v})"),
    "bfloat16": ("uint16_t", "kf_bf16_to_f32({p}[{i}])", "{p}[{i}] = kf_f32_to_bf16({v})"),
    "float16": ("uint16_t", "kf_f16_to_f32({p}[{i}])", "{p}[{i}] = kf_f32_to_f16({v})"),
}


def cpu_io(role: str, sig: TensorSig | None) -> str:
    """C declarations for one tensor role: ``{role}_t`` plus ``{role}_ld(p, i)`` / ``{role}_st(p, i, v)``."""
    dtype = sig.dtype if sig is not None else "float32"
    ctype, ld, st = _CPU_IO[dtype]
    return (f"typedef {ctype} {role}_t;\n"
            f"static inline float {role}_ld(const {role}_t* p, long i) {{ return {ld.format(p='p', i='i')}; }}\n"
            f"static inline void {role}_st({role}_t* p, long i, float v) {{ {st.format(p='p', i='i', v='v')}; }}\n")


_CPU_ROUND = {"float32": "v", "float64": "v", "bfloat16": "kf_bf16_to_f32(kf_f32_to_bf16(v))",
              "float16": "kf_f16_to_f32(kf_f32_to_f16(v))"}


def cpu_round(name: str, dtype: str) -> str:
    """C ``static inline float {name}(float v)``: ``v`` rounded to ``dtype`` and back (a reference's rounding). On
    CUDA the prelude's ``to_f(from_f<T>(v))`` does the same."""
    return f"static inline float {name}(float v) {{ return {_CPU_ROUND[dtype]}; }}\n"


def cuda_types(roles: dict[str, TensorSig | None]) -> str:
    """``typedef <type> {role}_t;`` for each role (float for an absent tensor)."""
    from ._strategy import CUDA_TYPES

    return "".join(f"typedef {CUDA_TYPES[s.dtype] if s is not None else 'float'} {r}_t;\n"
                   for r, s in roles.items())
