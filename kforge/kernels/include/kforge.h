/* kforge kernel contract, version 1.
 *
 * Every candidate kernel, on every backend, is one translation unit that includes this header
 * and defines the entry point
 *
 *     KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs,
 *                            const kf_tensor* outputs, int n_outputs,
 *                            const double* params, int n_params,
 *                            void* workspace, void* stream);
 *
 * - inputs/outputs: in the order of the operator's spec (docs/contract.md). Outputs are allocated
 *   by the harness with the exact shapes, dtypes and strides eager PyTorch produces; a candidate
 *   never allocates them. An absent optional input (e.g. no bias) has data == NULL.
 * - strides are in elements, not bytes.
 * - params: the variant's static parameters as doubles, in the spec's order. A candidate is
 *   specialised to one variant, so it may also bake them in as constants.
 * - workspace: scratch memory of kf_workspace_bytes() bytes (optional export), uninitialised.
 * - stream: a cudaStream_t on the CUDA backend (launch only on it), NULL on the CPU backend.
 * - return 0 on success; on CUDA return (int)cudaGetLastError() after launching.
 *
 * The ABI below (kf_tensor, the dtype codes, the entry points' types) is the only declaration of
 * it: kforge's runner and its dispatch front include this header too, and tests/test_abi.py checks
 * the Python side (kforge/kernels/_library.py, kforge/ops/_signature.py) against it.
 */
#ifndef KFORGE_H
#define KFORGE_H

#include <stdint.h>
#include <stddef.h>

#define KF_CONTRACT_VERSION 1
#define KF_MAX_DIMS 8

typedef struct kf_tensor {
    void* data;
    int32_t ndim;
    int32_t dtype;
    int64_t sizes[KF_MAX_DIMS];
    int64_t strides[KF_MAX_DIMS];
} kf_tensor;

enum kf_dtype {
    KF_FLOAT32 = 0,
    KF_FLOAT16 = 1,
    KF_BFLOAT16 = 2,
    KF_FLOAT64 = 3,
    KF_INT64 = 4,
    KF_INT32 = 5,
    KF_BOOL = 6,
    KF_UINT8 = 7,
    KF_INT8 = 8
};

#ifdef __cplusplus
#define KF_ENTRY extern "C" __attribute__((visibility("default")))
#else
#define KF_ENTRY __attribute__((visibility("default")))
#endif

/* the entry points' types, as the harness finds them (dlsym) */
typedef int (*kf_launch_fn)(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                            const double* params, int n_params, void* workspace, void* stream);
typedef size_t (*kf_workspace_fn)(void);

#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define KF_NEG_INF __int_as_float(0xff800000)
#define KF_POS_INF __int_as_float(0x7f800000)
/* tanh by the hardware approximation (sm_75+, max relative error about 2^-11: far below a 16-bit
 * result's rounding); the accurate tanhf elsewhere. Candidates may not use inline assembly. */
static __device__ __forceinline__ float kf_tanh_approx(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return tanhf(x);
#endif
}
#else
#include <math.h>
#define KF_NEG_INF (-INFINITY)
#define KF_POS_INF (INFINITY)
/* bfloat16 and float16 on the CPU backend: plain bit conversions. */
static inline float kf_bf16_to_f32(uint16_t v) {
    union { uint32_t u; float f; } x; x.u = ((uint32_t)v) << 16; return x.f;
}
static inline uint16_t kf_f32_to_bf16(float f) {
    union { uint32_t u; float f; } x; x.f = f;
    if ((x.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x.u >> 16) | 0x40u);
    uint32_t rounding = 0x7fffu + ((x.u >> 16) & 1u);
    return (uint16_t)((x.u + rounding) >> 16);
}
static inline float kf_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) { u = sign; }
        else { exp = 127 - 15 + 1; while (!(man & 0x400u)) { man <<= 1; exp--; } man &= 0x3ffu; u = sign | (exp << 23) | (man << 13); }
    } else if (exp == 31) { u = sign | 0x7f800000u | (man << 13); }
    else { u = sign | ((exp + 127 - 15) << 23) | (man << 13); }
    union { uint32_t u; float f; } x; x.u = u; return x.f;
}
static inline uint16_t kf_f32_to_f16(float f) {
    union { uint32_t u; float f; } x; x.f = f;
    uint32_t u = x.u, sign = (u >> 16) & 0x8000u; int32_t exp = (int32_t)((u >> 23) & 0xffu) - 127 + 15; uint32_t man = u & 0x7fffffu;
    if (((u >> 23) & 0xffu) == 0xffu) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000u; uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++;
    return (uint16_t)half;
}
#endif

#endif /* KFORGE_H */
