"""``moe_experts``: a mixture of experts' experts for the few tokens of a decode step (transformers' grouped_mm
experts: each token's K experts, SiLU-gated, summed with their routing weights).

    act[t, k, j] = silu(x[t] . Wgu[e][j]) * (x[t] . Wgu[e][j + I])          e = top_k_index[t, k], j < I
    out[t, h]    = sum_k top_k_weights[t, k] * (act[t, k] . Wdown[e][h])

rounded where transformers rounds: each product to the hidden states' dtype, silu and its product with up too,
the routing weight's product to the promoted dtype, the sum over k in float32. A decode step has one token and
K (8 for Qwen 3.5) of E (256) experts: the work is reading those experts' weights once. The CUDA design is two
launches of matrix-vector products, a warp an output row with 16-byte loads: the gate and up rows of every
(token, expert) pair into a float32 workspace, then each output row over its token's K pairs. An expert index
outside [0, E) contributes nothing (transformers' expert-parallel sentinel).
"""
from __future__ import annotations

import torch

from ....kernels import DeviceInfo
from ....ops import Variant, dtype_name, torch_dtype
from ....proposers.builtin._prelude import CPU, CUDA, cpu_io, cpu_round, cuda_types
from ....proposers.builtin._strategy import CUDA_TYPES, ITEMSIZE, fill, strategy

_OP = "moe_experts"
_IDX = {"int64": "int64_t", "int32": "int32_t"}


def _dims(v: Variant) -> dict:
    h, idx, _, gu, _ = v.inputs
    return {"T": idx.shape[0], "K": idx.shape[1], "E": gu.shape[0], "H": h.shape[1], "I": gu.shape[1] // 2}


def _applies(v: Variant) -> bool:
    if v.op != _OP or len(v.inputs) != 5 or any(s is None for s in v.inputs) or len(v.outputs) != 1:
        return False
    h, idx, w, gu, dn = v.inputs
    out = v.outputs[0]
    return (h.dtype in ITEMSIZE and gu.dtype == h.dtype and dn.dtype == h.dtype and out.dtype == h.dtype
            and w.dtype in ITEMSIZE and idx.dtype in _IDX and all(s.is_contiguous for s in (h, idx, w, gu, dn, out))
            and len(h.shape) == 2 and len(gu.shape) == 3 and gu.shape[1] % 2 == 0
            and min(idx.shape[0], idx.shape[1], h.shape[1], gu.shape[0], gu.shape[1]) > 0)


def _promoted(v: Variant) -> str:
    """The dtype the routing weight's product is rounded to (as the reference promotes it)."""
    return dtype_name(torch.promote_types(torch_dtype(v.inputs[0].dtype), torch_dtype(v.inputs[2].dtype)))


_ENTRY = r"""
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const x_t* x = (const x_t*)inputs[0].data;
    const i_t* idx = (const i_t*)inputs[1].data;
    const w_t* rw = (const w_t*)inputs[2].data;
    const x_t* gu = (const x_t*)inputs[3].data;
    const x_t* dn = (const x_t*)inputs[4].data;
    x_t* y = (x_t*)outputs[0].data;
"""

_DIMS = r"""
#define T {{T}}L
#define K {{K}}L
#define E {{E}}L
#define H {{H}}L
#define I {{I}}L
typedef {{IDX}} i_t;
"""

# ----------------------------------------------------------------------------- CPU

_CPU = CPU + "{{io}}" + _DIMS + _ENTRY + r"""    #pragma omp parallel for schedule(static)
    for (long t = 0; t < T; ++t) {
        float acc[H], act[I];
        for (long h = 0; h < H; ++h) acc[h] = 0.f;
        for (long k = 0; k < K; ++k) {
            const long e = (long)idx[t * K + k];
            if (e < 0 || e >= E) continue;
            const x_t* wg = gu + e * 2 * I * H;
            for (long j = 0; j < I; ++j) {
                float g = 0.f, u = 0.f;
                for (long c = 0; c < H; ++c) {
                    const float xv = x_ld(x, t * H + c);
                    g += xv * x_ld(wg, j * H + c);
                    u += xv * x_ld(wg, (j + I) * H + c);
                }
                g = x_rd(g);
                u = x_rd(u);
                act[j] = x_rd(x_rd(g / (1.f + expf(-g))) * u);
            }
            const x_t* wd = dn + e * H * I;
            const float r = w_ld(rw, t * K + k);
            for (long h = 0; h < H; ++h) {
                float d = 0.f;
                for (long j = 0; j < I; ++j) d += act[j] * x_ld(wd, h * I + j);
                acc[h] += p_rd(x_rd(d) * r);
            }
        }
        for (long h = 0; h < H; ++h) x_st(y, t * H + h, acc[h]);
    }
    return 0;
}
"""


@strategy(_OP, "cpu", "token_loop", level=0,
          doc="OpenMP over tokens: each of a token's experts' gate and up rows, then its down rows into the sum",
          applies=lambda v, d: _applies(v) and v.inputs[0].shape[1] <= 16384 and v.inputs[3].shape[1] <= 16384,
          default=lambda v, d: {})
def _moe_experts_cpu(v: Variant, c: dict, d: DeviceInfo) -> str:
    h, idx, w, _, _ = v.inputs
    io = cpu_io("x", h) + cpu_io("w", w) + cpu_round("x_rd", h.dtype) + cpu_round("p_rd", _promoted(v))
    return fill(_CPU, io=io, IDX=_IDX[idx.dtype], **_dims(v))


# ----------------------------------------------------------------------------- CUDA: what both designs share

# the first pass's kernel up to its dot products (each design's own)
_GATE_UP_HEAD = r"""/* Pass 1: a warp a gate/up row pair j of one (token, expert) pair p: act[p][j] in the workspace. */
template <int V>
__global__ void __launch_bounds__(WARPS * 32) moe_gate_up(const x_t* __restrict__ x, const i_t* __restrict__ idx,
                                                          const x_t* __restrict__ gu, float* __restrict__ act) {
    const long p = blockIdx.y;
    const long j = (long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (j >= I) return;
    const long e = (long)idx[p];
    float a = 0.f;
    if (e >= 0 && e < E) {
"""

# the workspace and the two launches (DOWN_ROWS output rows a block of the down pass, DOWN_THREADS its threads)
_LAUNCH = r"""KF_ENTRY size_t kf_workspace_bytes(void) { return sizeof(float) * (size_t)T * K * I; }
""" + _ENTRY + r"""    float* act = (float*)workspace;
    cudaStream_t s = (cudaStream_t)stream;
    const bool aligned = ((uintptr_t)x | (uintptr_t)gu | (uintptr_t)dn) % 16 == 0;
    const dim3 up((unsigned)((I + WARPS - 1) / WARPS), (unsigned)(T * K));
    const dim3 down((unsigned)((H + DOWN_ROWS - 1) / DOWN_ROWS), (unsigned)T);
    if ({{VEC}} > 1 && aligned) {
        moe_gate_up<{{VEC}}><<<up, WARPS * 32, 0, s>>>(x, idx, gu, act);
        moe_down<{{VEC}}><<<down, DOWN_THREADS, 0, s>>>(idx, rw, dn, act, y);
    } else {
        moe_gate_up<1><<<up, WARPS * 32, 0, s>>>(x, idx, gu, act);
        moe_down<1><<<down, DOWN_THREADS, 0, s>>>(idx, rw, dn, act, y);
    }
    return (int)cudaGetLastError();
}
"""

# ----------------------------------------------------------------------------- CUDA

_CUDA = CUDA + "{{types}}" + _DIMS + r"""
#define WARPS {{WARPS}}
__device__ __forceinline__ float x_rd(float v) { return to_f(from_f<x_t>(v)); }
__device__ __forceinline__ float p_rd(float v) { return to_f(from_f<p_t>(v)); }

/* A warp's dot product of n elements of a and b (V-wide loads where the caller checked alignment). */
template <int V>
__device__ __forceinline__ float warp_dot(const x_t* __restrict__ a, const x_t* __restrict__ b, long n) {
    const int lane = threadIdx.x & 31;
    float s = 0.f;
    for (long c = (long)lane * V; c < n; c += 32L * V) {
        float av[V], bv[V];
        load_vec<V>(a + c, av);
        load_vec<V>(b + c, bv);
#pragma unroll
        for (int i = 0; i < V; ++i) s += av[i] * bv[i];
    }
    return warp_sum(s);
}

""" + _GATE_UP_HEAD + r"""        const x_t* xt = x + (p / K) * H;
        const x_t* wg = gu + e * 2 * I * H;
        const float g = x_rd(warp_dot<V>(xt, wg + j * H, H));
        const float u = x_rd(warp_dot<V>(xt, wg + (j + I) * H, H));
        a = x_rd(x_rd(g / (1.f + expf(-g))) * u);
    }
    if ((threadIdx.x & 31) == 0) act[p * I + j] = a;
}

/* Pass 2: a warp an output row h of one token t: its K experts' down rows against their act, weighted, summed. */
template <int V>
__global__ void __launch_bounds__(WARPS * 32) moe_down(const i_t* __restrict__ idx, const w_t* __restrict__ rw,
                                                       const x_t* __restrict__ dn, const float* __restrict__ act,
                                                       x_t* __restrict__ y) {
    const long t = blockIdx.y;
    const long h = (long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (h >= H) return;
    const int lane = threadIdx.x & 31;
    float acc = 0.f;
    for (long k = 0; k < K; ++k) {
        const long e = (long)idx[t * K + k];
        if (e < 0 || e >= E) continue;
        const x_t* row = dn + (e * H + h) * I;
        const float* a = act + (t * K + k) * I;
        float s = 0.f;
        for (long c = (long)lane * V; c < I; c += 32L * V) {
            float wv[V];
            load_vec<V>(row + c, wv);
#pragma unroll
            for (int i = 0; i < V; ++i) s += wv[i] * a[c + i];
        }
        acc += p_rd(x_rd(warp_sum(s)) * to_f(rw[t * K + k]));
    }
    if (lane == 0) y[t * H + h] = from_f<x_t>(acc);
}

""" + _LAUNCH.replace("DOWN_ROWS", "WARPS").replace("DOWN_THREADS", "WARPS * 32")


# The second design: the same two passes, the gate and up rows in one pass over x with constant trip counts (several
# steps' loads in flight a lane: unroll), and the down pass a warp for each (output row, expert) pair, a row's K
# warps in one block summing in order (8x the warps of the first design's down pass at a decode step). Correct on
# the H200 at Qwen 3.5's decode step (2026-12-04v); not yet timed against the first design in one run.
_CUDA_PAIRS = CUDA + "{{types}}" + _DIMS + r"""
#define WARPS {{WARPS}}
#define ROWS {{ROWS}}
__device__ __forceinline__ float x_rd(float v) { return to_f(from_f<x_t>(v)); }
__device__ __forceinline__ float p_rd(float v) { return to_f(from_f<p_t>(v)); }

/* A warp's dot products of x with rows a and b (H elements each: an expert's gate row and up row), x read once for
   both. The trip count is a constant: unrolled UNROLL steps, a lane has that many steps' loads in flight. */
template <int V>
__device__ __forceinline__ void warp_dot2(const x_t* __restrict__ x, const x_t* __restrict__ a,
                                          const x_t* __restrict__ b, float& sa, float& sb) {
    constexpr long STEP = 32L * V, FULL = H / STEP;
    const long lane = threadIdx.x & 31;
    float s0 = 0.f, s1 = 0.f;
    auto step = [&](long c) {
        float xv[V], av[V], bv[V];
        load_vec<V>(x + c, xv);
        load_vec<V>(a + c, av);
        load_vec<V>(b + c, bv);
#pragma unroll
        for (int i = 0; i < V; ++i) {
            s0 += xv[i] * av[i];
            s1 += xv[i] * bv[i];
        }
    };
#pragma unroll {{UNROLL}}
    for (long it = 0; it < FULL; ++it) step(it * STEP + lane * V);
    if (FULL * STEP + lane * V < H) step(FULL * STEP + lane * V);   /* the rest of the row (H: a multiple of V) */
    sa = warp_sum(s0);
    sb = warp_sum(s1);
}

/* V floats of the workspace (at a multiple of V: 16-byte loads where V allows). */
template <int V>
__device__ __forceinline__ void load_act(const float* __restrict__ p, float (&out)[V]) {
    constexpr int W = V % 4 == 0 ? 4 : (V % 2 == 0 ? 2 : 1);
#pragma unroll
    for (int i = 0; i < V; i += W) {
        float part[W];
        load_vec<W>(p + i, part);
#pragma unroll
        for (int j = 0; j < W; ++j) out[i + j] = part[j];
    }
}

""" + _GATE_UP_HEAD + r"""        const x_t* wg = gu + e * 2 * I * H;
        float g, u;
        warp_dot2<V>(x + (p / K) * H, wg + j * H, wg + (j + I) * H, g, u);
        g = x_rd(g);
        a = x_rd(x_rd(g / (1.f + expf(-g))) * x_rd(u));
    }
    if ((threadIdx.x & 31) == 0) act[p * I + j] = a;
}

/* Pass 2: a warp one (output row h, expert slot k) pair of token t: the expert's down row against its act, times
   the routing weight. A block holds ROWS rows' K warps; they leave their products in shared memory, and each row's
   thread sums them over k in order (in float32, as the reference). */
template <int V>
__global__ void __launch_bounds__(ROWS * K * 32) moe_down(const i_t* __restrict__ idx, const w_t* __restrict__ rw,
                                                          const x_t* __restrict__ dn, const float* __restrict__ act,
                                                          x_t* __restrict__ y) {
    constexpr long STEP = 32L * V, FULL = I / STEP;
    __shared__ float part[ROWS * K];
    const long t = blockIdx.y;
    const int warp = threadIdx.x >> 5;
    const long h = (long)blockIdx.x * ROWS + warp / K;
    const long k = warp % K;
    const long lane = threadIdx.x & 31;
    float r = 0.f;
    const long e = h < H ? (long)idx[t * K + k] : -1L;
    if (e >= 0 && e < E) {   /* the same for the whole warp */
        const x_t* row = dn + (e * H + h) * I;
        const float* a = act + (t * K + k) * I;
        float s = 0.f;
        auto step = [&](long c) {
            float wv[V], av[V];
            load_vec<V>(row + c, wv);
            load_act<V>(a + c, av);
#pragma unroll
            for (int i = 0; i < V; ++i) s += wv[i] * av[i];
        };
#pragma unroll {{UNROLL}}
        for (long it = 0; it < FULL; ++it) step(it * STEP + lane * V);
        if (FULL * STEP + lane * V < I) step(FULL * STEP + lane * V);
        r = p_rd(x_rd(warp_sum(s)) * to_f(rw[t * K + k]));
    }
    if (lane == 0) part[warp] = r;
    __syncthreads();
    const long mine = (long)blockIdx.x * ROWS + threadIdx.x;
    if (threadIdx.x < ROWS && mine < H) {
        float acc = 0.f;
        for (long j = 0; j < K; ++j) acc += part[threadIdx.x * K + j];
        y[t * H + mine] = from_f<x_t>(acc);
    }
}

""" + _LAUNCH.replace("DOWN_ROWS", "ROWS").replace("DOWN_THREADS", "ROWS * K * 32")


def _vmax(v: Variant) -> int:
    """The widest access (elements) that keeps every row of the hidden states and both weights on 16-byte
    boundaries: H and I multiples of it, 16 bytes at most."""
    dims = _dims(v)
    size = ITEMSIZE[v.inputs[0].dtype]
    return next(n for n in (8, 4, 2, 1) if n * size <= 16 and dims["H"] % n == 0 and dims["I"] % n == 0)


@strategy(_OP, "cuda", "gemv_two_pass", level=0,
          doc="two launches of warp-per-row matrix-vector products for the few tokens of a decode step: every "
              "(token, expert) pair's gate and up rows into a float32 workspace, then each output row over its "
              "token's experts, weighted and summed; each used expert's weights read once, 16-byte loads",
          space={"warps": (4, 8, 2)},
          applies=lambda v, d: _applies(v) and v.inputs[1].shape[0] * v.inputs[1].shape[1] <= 256
          and v.inputs[1].shape[0] <= 64,
          default=lambda v, d: {"warps": 4},
          fit=lambda v, d: 3.0,
          explain=lambda v, c: (f"a warp a row, {c['warps']} warps a block, {_vmax(v)}-element loads"))
def _moe_experts_cuda(v: Variant, c: dict, d: DeviceInfo) -> str:
    h, idx, w, _, _ = v.inputs
    types = cuda_types({"x": h, "w": w}) + f"typedef {CUDA_TYPES[_promoted(v)]} p_t;\n"
    return fill(_CUDA, types=types, IDX=_IDX[idx.dtype], WARPS=c["warps"], VEC=_vmax(v), **_dims(v))


@strategy(_OP, "cuda", "gemv_pairs", level=0,
          doc="gemv_two_pass's two passes, their loads unrolled, and the down pass a warp for each output row "
              "and expert, the row's K warps in one block summing in order (more warps in flight at one token)",
          space={"warps": (4, 8, 2), "unroll": (4, 1, 8)},
          applies=lambda v, d: _applies(v) and v.inputs[1].shape[0] * v.inputs[1].shape[1] <= 256
          and v.inputs[1].shape[0] <= 64 and v.inputs[1].shape[1] <= 32,
          default=lambda v, d: {"warps": 4, "unroll": 4},
          fit=lambda v, d: 2.0,
          explain=lambda v, c: (f"a warp a row, {c['warps']} warps a block, {_vmax(v)}-element loads, "
                                f"{c.get('unroll', 1)} steps in flight"))
def _moe_experts_cuda_pairs(v: Variant, c: dict, d: DeviceInfo) -> str:
    h, idx, w, _, _ = v.inputs
    types = cuda_types({"x": h, "w": w}) + f"typedef {CUDA_TYPES[_promoted(v)]} p_t;\n"
    return fill(_CUDA_PAIRS, types=types, IDX=_IDX[idx.dtype], WARPS=c["warps"], UNROLL=c.get("unroll", 1), VEC=_vmax(v),
                ROWS=_rows(v), **_dims(v))


def _rows(v: Variant) -> int:
    """Output rows a block of the down pass: each row's K warps in one block, at most 8 warps unless K is more."""
    return max(1, 8 // v.inputs[1].shape[1])
