"""softmax and log_softmax: row kernels from one block per row to rows split over many blocks."""
from __future__ import annotations

from ...kernels import DeviceInfo
from ...ops import Variant
from ._prelude import CPU, CUDA, cpu_io, cuda_types
from ._strategy import cdiv, contiguous, fill, floats_only, prod, strategy, vec_width


def _view(v: Variant) -> tuple[int, int, int]:
    """(outer, reduced length, inner) of the contiguous input."""
    shape, dim = v.inputs[0].shape, v.param_dict["dim"]
    return prod(shape[:dim]), shape[dim], prod(shape[dim + 1:])


def _ok(v: Variant) -> bool:
    x, y = v.inputs[0], v.outputs[0]
    return floats_only(x, y) and contiguous(x, y) and x.numel > 0


def _rows(v: Variant) -> bool:
    return _ok(v) and _view(v)[2] == 1


def _vmax(v: Variant) -> int:
    """Widest vector that divides the row for both the input and the output."""
    d = _view(v)[1]
    w = min(vec_width(v.inputs[0].dtype), vec_width(v.outputs[0].dtype))
    while d % w:
        w //= 2
    return w


def _common(v: Variant, config: dict, log: bool) -> dict:
    outer, d, inner = _view(v)
    return dict(D=d, OUTER=outer, INNER=inner, ROWS=outer * inner, LOG=log,
                types=cuda_types({"in": v.inputs[0], "out": v.outputs[0]}), **config)


_WRITE = r"""
__device__ __forceinline__ float finish(float x, float m, float inv_s, float log_s) {
    return LOG ? x - m - log_s : expf(x - m) * inv_s;
}
"""

_BLOCK_ROW = CUDA + r"""
{{types}}#define D {{D}}
#define ROWS {{ROWS}}
#define THREADS {{threads}}
#define LOG {{LOG}}
""" + _WRITE + r"""
__global__ void __launch_bounds__(THREADS) softmax_block_row(const in_t* __restrict__ x, out_t* __restrict__ y) {
    __shared__ float scratch[32];
    const in_t* xr = x + (long)blockIdx.x * D;
    out_t* yr = y + (long)blockIdx.x * D;
    float m = KF_NEG_INF;
    for (int i = threadIdx.x; i < D; i += THREADS) m = fmaxf(m, to_f(xr[i]));
    m = block_max<THREADS>(m, scratch);
    float s = 0.f;
    for (int i = threadIdx.x; i < D; i += THREADS) s += expf(to_f(xr[i]) - m);
    s = block_sum<THREADS>(s, scratch);
    const float inv_s = 1.f / s, log_s = logf(s);
    for (int i = threadIdx.x; i < D; i += THREADS) yr[i] = from_f<out_t>(finish(to_f(xr[i]), m, inv_s, log_s));
}

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    softmax_block_row<<<ROWS, THREADS, 0, (cudaStream_t)stream>>>((const in_t*)inputs[0].data, (out_t*)outputs[0].data);
    return (int)cudaGetLastError();
}
"""

# Row held in registers: GROUP threads (a warp or a whole block) own one row, each thread ITEMS
# vectors of V elements; the row is read once and written once.
_REGISTER_ROW = CUDA + r"""
{{types}}#define D {{D}}
#define ROWS {{ROWS}}
#define GROUP {{group}}
#define ROWS_PER_BLOCK {{rows_per_block}}
#define LOG {{LOG}}
""" + _WRITE + r"""
template <int V>
__global__ void __launch_bounds__(GROUP * ROWS_PER_BLOCK) softmax_register_row(const in_t* __restrict__ x, out_t* __restrict__ y) {
    constexpr int ITEMS = (D + GROUP * V - 1) / (GROUP * V);
    __shared__ float scratch[32];
    const int t = GROUP == 32 ? (threadIdx.x & 31) : threadIdx.x;
    const long row = (long)blockIdx.x * ROWS_PER_BLOCK + (GROUP == 32 ? threadIdx.x >> 5 : 0);
    if (row >= ROWS) return;
    const in_t* xr = x + row * D;
    out_t* yr = y + row * D;
    float v[ITEMS][V];
    float m = KF_NEG_INF;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const int i = (k * GROUP + t) * V;
        if (D % (GROUP * V) == 0 || i < D) {
            load_vec<V>(xr + i, v[k]);
#pragma unroll
            for (int j = 0; j < V; ++j) m = fmaxf(m, v[k][j]);
        }
    }
    m = GROUP == 32 ? warp_max(m) : block_max<GROUP>(m, scratch);
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const int i = (k * GROUP + t) * V;
        if (D % (GROUP * V) == 0 || i < D) {
#pragma unroll
            for (int j = 0; j < V; ++j) s += expf(v[k][j] - m);
        }
    }
    s = GROUP == 32 ? warp_sum(s) : block_sum<GROUP>(s, scratch);
    const float inv_s = 1.f / s, log_s = logf(s);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const int i = (k * GROUP + t) * V;
        if (D % (GROUP * V) == 0 || i < D) {
#pragma unroll
            for (int j = 0; j < V; ++j) v[k][j] = finish(v[k][j], m, inv_s, log_s);
            store_vec<V>(yr + i, v[k]);
        }
    }
}

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const in_t* x = (const in_t*)inputs[0].data;
    out_t* y = (out_t*)outputs[0].data;
    const int blocks = (ROWS + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    if ({{vec}} > 1 && ((uintptr_t)x % 16 == 0) && ((uintptr_t)y % 16 == 0))
        softmax_register_row<{{vec}}><<<blocks, GROUP * ROWS_PER_BLOCK, 0, (cudaStream_t)stream>>>(x, y);
    else
        softmax_register_row<1><<<blocks, GROUP * ROWS_PER_BLOCK, 0, (cudaStream_t)stream>>>(x, y);
    return (int)cudaGetLastError();
}
"""

# One long row split over SPLIT blocks: pass 1 writes each chunk's (max, sum of exp) computed
# online, pass 2 merges a row's partials and normalises its chunk (a second read, mostly from L2).
_ONLINE_SPLIT = CUDA + r"""
{{types}}#define D {{D}}
#define ROWS {{ROWS}}
#define THREADS {{threads}}
#define SPLIT {{split}}
#define LOG {{LOG}}
""" + _WRITE + r"""
template <int V> struct Chunk {
    static constexpr long LEN = ((D + SPLIT - 1) / SPLIT + V - 1) / V * V;
};

/* Fold V values into a running (max, sum of exp): rescale at most once per vector. */
template <int V>
__device__ __forceinline__ void online(float& m, float& s, const float (&v)[V]) {
    float vm = v[0];
#pragma unroll
    for (int j = 1; j < V; ++j) vm = fmaxf(vm, v[j]);
    if (vm > m) { s *= expf(m - vm); m = vm; }
#pragma unroll
    for (int j = 0; j < V; ++j) s += expf(v[j] - m);
}

template <int V>
__global__ void __launch_bounds__(THREADS) softmax_partials(const in_t* __restrict__ x, float2* __restrict__ part) {
    __shared__ float scratch[32];
    const long row = blockIdx.y, begin = blockIdx.x * Chunk<V>::LEN;
    const long end = begin + Chunk<V>::LEN < D ? begin + Chunk<V>::LEN : D;
    const in_t* xr = x + row * D;
    float m = KF_NEG_INF, s = 0.f;
    for (long i = begin + threadIdx.x * V; i < end; i += THREADS * V) {
        float v[V];
        load_vec<V>(xr + i, v);
        online<V>(m, s, v);
    }
    const float bm = block_max<THREADS>(m, scratch);
    s = bm == KF_NEG_INF ? 0.f : s * expf(m - bm);
    s = block_sum<THREADS>(s, scratch);
    if (threadIdx.x == 0) part[row * SPLIT + blockIdx.x] = make_float2(bm, s);
}

template <int V>
__global__ void __launch_bounds__(THREADS) softmax_normalise(const in_t* __restrict__ x, const float2* __restrict__ part,
                                                            out_t* __restrict__ y) {
    __shared__ float stats[2];
    const long row = blockIdx.y, begin = blockIdx.x * Chunk<V>::LEN;
    const long end = begin + Chunk<V>::LEN < D ? begin + Chunk<V>::LEN : D;
    if (threadIdx.x < 32) {
        float m = KF_NEG_INF, s = 0.f;
        for (int k = threadIdx.x; k < SPLIT; k += 32) {
            const float2 p = part[row * SPLIT + k];
            const float nm = fmaxf(m, p.x);
            if (nm != KF_NEG_INF) s = s * expf(m - nm) + p.y * expf(p.x - nm);
            m = nm;
        }
        const float gm = warp_max(m);
        s = warp_sum(m == KF_NEG_INF ? 0.f : s * expf(m - gm));
        if (threadIdx.x == 0) { stats[0] = gm; stats[1] = s; }
    }
    __syncthreads();
    const float m = stats[0], inv_s = 1.f / stats[1], log_s = logf(stats[1]);
    const in_t* xr = x + row * D;
    out_t* yr = y + row * D;
    for (long i = begin + threadIdx.x * V; i < end; i += THREADS * V) {
        float v[V];
        load_vec<V>(xr + i, v);
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = finish(v[j], m, inv_s, log_s);
        store_vec<V>(yr + i, v);
    }
}

template <int V> static void run(const in_t* x, float2* part, out_t* y, cudaStream_t stream) {
    const dim3 grid(SPLIT, ROWS);
    softmax_partials<V><<<grid, THREADS, 0, stream>>>(x, part);
    softmax_normalise<V><<<grid, THREADS, 0, stream>>>(x, part, y);
}

KF_ENTRY size_t kf_workspace_bytes(void) { return sizeof(float2) * (size_t)ROWS * SPLIT; }

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const in_t* x = (const in_t*)inputs[0].data;
    out_t* y = (out_t*)outputs[0].data;
    if ({{vec}} > 1 && ((uintptr_t)x % 16 == 0) && ((uintptr_t)y % 16 == 0))
        run<{{vec}}>(x, (float2*)workspace, y, (cudaStream_t)stream);
    else
        run<1>(x, (float2*)workspace, y, (cudaStream_t)stream);
    return (int)cudaGetLastError();
}
"""

# Reduced dimension not innermost: one thread per (outer, inner) column, coalesced across inner.
_STRIDED = CUDA + r"""
{{types}}#define D {{D}}
#define INNER {{INNER}}
#define ROWS {{ROWS}}
#define THREADS {{threads}}
#define LOG {{LOG}}
""" + _WRITE + r"""
__global__ void __launch_bounds__(THREADS) softmax_strided(const in_t* __restrict__ x, out_t* __restrict__ y) {
    const long r = (long)blockIdx.x * THREADS + threadIdx.x;
    if (r >= ROWS) return;
    const long base = (r / INNER) * D * INNER + r % INNER;
    float m = KF_NEG_INF, s = 0.f;
    for (int d = 0; d < D; ++d) m = fmaxf(m, to_f(x[base + (long)d * INNER]));
    for (int d = 0; d < D; ++d) s += expf(to_f(x[base + (long)d * INNER]) - m);
    const float inv_s = 1.f / s, log_s = logf(s);
    for (int d = 0; d < D; ++d)
        y[base + (long)d * INNER] = from_f<out_t>(finish(to_f(x[base + (long)d * INNER]), m, inv_s, log_s));
}

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    softmax_strided<<<(ROWS + THREADS - 1) / THREADS, THREADS, 0, (cudaStream_t)stream>>>(
        (const in_t*)inputs[0].data, (out_t*)outputs[0].data);
    return (int)cudaGetLastError();
}
"""

_CPU_HEAD = CPU + r"""
{{io}}#define OUTER {{OUTER}}
#define D {{D}}
#define INNER {{INNER}}
#define LOG {{LOG}}
#define AT(o, d, i) (((long)(o) * D + (d)) * INNER + (i))
"""

# Three passes per row: max, exp(x - max) into a float buffer with its sum, then scale.
_CPU_THREE_PASS = _CPU_HEAD + r"""
#include <stdlib.h>
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const in_t* x = (const in_t*)inputs[0].data;
    out_t* y = (out_t*)outputs[0].data;
    int failed = 0;
    #pragma omp parallel
    {
        float* e = (float*)malloc(sizeof(float) * D);
        if (!e) { failed = 1; } else {
            #pragma omp for schedule(static)
            for (long r = 0; r < (long)OUTER * INNER; ++r) {
                const long o = r / INNER, i = r % INNER;
                float m = -INFINITY, s = 0.f;
                for (long d = 0; d < D; ++d) { float v = in_ld(x, AT(o, d, i)); m = v > m ? v : m; }
                for (long d = 0; d < D; ++d) { e[d] = in_ld(x, AT(o, d, i)) - m; s += expf(e[d]); }
                const float inv_s = 1.f / s, log_s = logf(s);
                for (long d = 0; d < D; ++d) out_st(y, AT(o, d, i), LOG ? e[d] - log_s : expf(e[d]) * inv_s);
            }
            free(e);
        }
    }
    return failed;
}
"""

# Online: one pass keeps a running max and a sum rescaled when the max grows, then one write pass.
_CPU_ONLINE = _CPU_HEAD + r"""
#define LANES 16
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const in_t* x = (const in_t*)inputs[0].data;
    out_t* y = (out_t*)outputs[0].data;
    #pragma omp parallel for schedule(static)
    for (long r = 0; r < (long)OUTER * INNER; ++r) {
        const long o = r / INNER, i = r % INNER;
        float m = -INFINITY, s = 0.f;
        long d = 0;
        for (; d + LANES <= D; d += LANES) {
            float v[LANES], bm = -INFINITY, bs = 0.f;
            for (int j = 0; j < LANES; ++j) { v[j] = in_ld(x, AT(o, d + j, i)); bm = v[j] > bm ? v[j] : bm; }
            for (int j = 0; j < LANES; ++j) bs += expf(v[j] - bm);
            if (bm > m) { s = s * expf(m - bm) + bs; m = bm; } else { s += bs * expf(bm - m); }
        }
        for (; d < D; ++d) {
            const float v = in_ld(x, AT(o, d, i));
            if (v > m) { s = s * expf(m - v) + 1.f; m = v; } else { s += expf(v - m); }
        }
        const float inv_s = 1.f / s, log_s = logf(s);
        for (d = 0; d < D; ++d) {
            const float v = in_ld(x, AT(o, d, i)) - m;
            out_st(y, AT(o, d, i), LOG ? v - log_s : expf(v) * inv_s);
        }
    }
    return 0;
}
"""


def _cpu_render(template: str, v: Variant) -> str:
    outer, d, inner = _view(v)
    io = cpu_io("in", v.inputs[0]) + cpu_io("out", v.outputs[0])
    return fill(template, io=io, OUTER=outer, D=d, INNER=inner, LOG=_log(v))


def _default_split(v: Variant, dev: DeviceInfo) -> int:
    rows, d = _view(v)[0], _view(v)[1]
    split = 1
    while split < 128 and rows * split < 2 * dev.sm_count and d // (split * 2) >= 2048:
        split *= 2
    return split


_OPS = ("softmax", "log_softmax")


def _log(v: Variant) -> bool:
    return v.op == "log_softmax"


@strategy(_OPS, "cuda", "block_row", level=0,
          doc="one block per row, three passes over global memory with block-wide max and sum reductions",
          space={"threads": (128, 256, 512, 1024)}, applies=lambda v, d: _rows(v),
          default=lambda v, d: {"threads": 256 if _view(v)[1] <= 4096 else 1024})
def _block_row(v: Variant, c: dict, d: DeviceInfo) -> str:
    return fill(_BLOCK_ROW, **_common(v, c, _log(v)))


@strategy(_OPS, "cuda", "warp_row", level=1,
          doc="one warp per row held in registers, 16-byte loads, warp-shuffle max and sum",
          space={"rows_per_block": (2, 4, 8), "vec": (1, 2, 4, 8)},
          applies=lambda v, d: _rows(v) and _view(v)[1] <= 2048,
          default=lambda v, d: {"rows_per_block": 4, "vec": _vmax(v)},
          valid=lambda v, c, d: c["vec"] <= _vmax(v),
          fit=lambda v, d: 3.0 if _view(v)[1] <= 1024 else 1.0,
          explain=lambda v, c: (f"one warp per {_view(v)[1]}-element row ({cdiv(_view(v)[1], 32)} per lane in "
                                f"registers), {c['rows_per_block']} rows per block, {c['vec']}-wide loads"))
def _warp_row(v: Variant, c: dict, d: DeviceInfo) -> str:
    return fill(_REGISTER_ROW, group=32, **_common(v, c, _log(v)))


@strategy(_OPS, "cuda", "block_register", level=2,
          doc="one block per row held in registers (read once, written once), 16-byte loads",
          space={"threads": (128, 256, 512, 1024), "vec": (1, 2, 4, 8)},
          applies=lambda v, d: _rows(v) and 256 <= _view(v)[1] <= 1024 * 32,
          default=lambda v, d: {"threads": max(128, min(1024, 1 << (cdiv(_view(v)[1], 8) - 1).bit_length())),
                                "vec": _vmax(v)},
          valid=lambda v, c, d: c["vec"] <= _vmax(v) and cdiv(_view(v)[1], c["threads"] * c["vec"]) * c["vec"] <= 32,
          fit=lambda v, d: 2.5 if _view(v)[1] > 1024 else 1.5,
          explain=lambda v, c: (f"one {c['threads']}-thread block per {_view(v)[1]}-element row held in "
                                f"registers, {c['vec']}-wide loads"))
def _block_register(v: Variant, c: dict, d: DeviceInfo) -> str:
    return fill(_REGISTER_ROW, group=c["threads"], rows_per_block=1, **_common(v, c, _log(v)))


@strategy(_OPS, "cuda", "online_split", level=3,
          doc="each long row split over many blocks: online (max, sum) partials in the workspace, "
              "then a merge-and-normalise pass",
          space={"split": (2, 4, 8, 16, 32, 64, 128), "threads": (256, 512, 1024), "vec": (1, 2, 4, 8)},
          applies=lambda v, d: _rows(v) and _view(v)[1] >= 4096,
          default=lambda v, d: {"split": max(2, _default_split(v, d)), "threads": 512, "vec": _vmax(v)},
          valid=lambda v, c, d: c["vec"] <= _vmax(v),
          fit=lambda v, d: 4.0 if _default_split(v, d) >= 4 else 0.5,
          explain=lambda v, c: (f"split each {_view(v)[1]}-element row over {c['split']} blocks of {c['threads']} "
                                f"threads ({_view(v)[0] * c['split']} blocks), online partials then normalise"))
def _online_split(v: Variant, c: dict, d: DeviceInfo) -> str:
    return fill(_ONLINE_SPLIT, **_common(v, c, _log(v)))


@strategy(_OPS, "cuda", "strided", level=0,
          doc="reduced dimension not innermost: one thread per column, coalesced across the inner dims",
          space={"threads": (128, 256, 512)}, applies=lambda v, d: _ok(v) and _view(v)[2] > 1,
          default=lambda v, d: {"threads": 256})
def _strided(v: Variant, c: dict, d: DeviceInfo) -> str:
    return fill(_STRIDED, **_common(v, c, _log(v)))


@strategy(_OPS, "cpu", "three_pass", level=0,
          doc="OpenMP over rows: max, exponentials into a per-thread buffer with their sum, then scale",
          applies=lambda v, d: _ok(v), default=lambda v, d: {})
def _three_pass(v: Variant, c: dict, d: DeviceInfo) -> str:
    return _cpu_render(_CPU_THREE_PASS, v)


@strategy(_OPS, "cpu", "online", level=1,
          doc="OpenMP over rows: single-pass online max and rescaled sum in 16-wide blocks, then write",
          applies=lambda v, d: _ok(v), default=lambda v, d: {})
def _online(v: Variant, c: dict, d: DeviceInfo) -> str:
    return _cpu_render(_CPU_ONLINE, v)
