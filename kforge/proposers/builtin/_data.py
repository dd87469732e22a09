"""pad and embedding: pure data movement, index arithmetic baked in as constants."""
from __future__ import annotations

import math

from ...kernels import DeviceInfo
from ...ops import Variant
from ._prelude import CPU, CUDA, cpu_io, cuda_types
from ._strategy import contiguous, fill, floats_only, strategy, vec_width

# ----------------------------------------------------------------------------- pad


def _pad_ok(v: Variant) -> bool:
    p = v.param_dict
    x, y = v.inputs[0], v.outputs[0]
    return (floats_only(x, y) and y.is_contiguous and y.numel > 0 and x.numel > 0
            and p["mode"] in ("constant", "reflect", "replicate", "circular"))


def _pad_source_offset(v: Variant) -> str:
    """C statements setting `src` (input offset) and `inside` for output linear index `i`."""
    x, y = v.inputs[0], v.outputs[0]
    pad, mode = v.param_dict["pad"], v.param_dict["mode"]
    nd = len(y.shape)
    lines = ["long src = 0; int inside = 1;"]
    for d in range(nd):
        dense = math.prod(y.shape[d + 1:])
        k = nd - 1 - d  # pad pairs start from the last dimension
        left = pad[2 * k] if 2 * k + 1 < len(pad) else 0
        n = x.shape[d]
        lines.append(f"{{ long c = (i / {dense}L) % {y.shape[d]}L - {left};")
        if mode == "constant":
            lines.append(f"  inside &= (c >= 0) & (c < {n});")
        elif mode == "reflect":
            lines.append(f"  if (c < 0) c = -c; if (c >= {n}) c = 2 * ({n} - 1) - c;")
        elif mode == "replicate":
            lines.append(f"  c = c < 0 ? 0 : (c >= {n} ? {n} - 1 : c);")
        else:
            lines.append(f"  c = ((c % {n}) + {n}) % {n};")
        lines.append(f"  src += c * {x.stride[d]}L; }}")
    return "\n        ".join(lines)


_PAD_CUDA = CUDA + r"""
{{types}}#define TOTAL {{TOTAL}}L
#define THREADS {{threads}}
__global__ void __launch_bounds__(THREADS) pad(const x_t* __restrict__ x, y_t* __restrict__ y) {
    for (long i = (long)blockIdx.x * THREADS + threadIdx.x; i < TOTAL; i += (long)gridDim.x * THREADS) {
        {{index}}
        y[i] = inside ? x[src] : from_f<y_t>({{value}});
    }
}

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    long blocks = (TOTAL + THREADS - 1) / THREADS;
    if (blocks > {{max_blocks}}) blocks = {{max_blocks}};
    pad<<<(int)blocks, THREADS, 0, (cudaStream_t)stream>>>((const x_t*)inputs[0].data, (y_t*)outputs[0].data);
    return (int)cudaGetLastError();
}
"""

_PAD_CPU = CPU + r"""
{{io}}#define TOTAL {{TOTAL}}L
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const x_t* x = (const x_t*)inputs[0].data;
    y_t* y = (y_t*)outputs[0].data;
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < TOTAL; ++i) {
        {{index}}
        if (inside) y[i] = x[src]; else y_st(y, i, {{value}});
    }
    return 0;
}
"""


def _pad_fill(v: Variant) -> dict:
    value = v.param_dict["value"]
    return dict(TOTAL=v.outputs[0].numel, index=_pad_source_offset(v), value=float(value or 0.0))


@strategy("pad", "cuda", "gather", level=0,
          doc="one thread per output element: source index (constant, reflect, replicate, circular) from "
              "baked-in extents",
          space={"threads": (128, 256, 512)}, applies=lambda v, d: _pad_ok(v) and v.inputs[0].dtype == v.outputs[0].dtype,
          default=lambda v, d: {"threads": 256})
def _pad_cuda(v: Variant, c: dict, d: DeviceInfo) -> str:
    return fill(_PAD_CUDA, types=cuda_types({"x": v.inputs[0], "y": v.outputs[0]}),
                max_blocks=8 * d.sm_count * 2048 // c["threads"], **_pad_fill(v), **c)


@strategy("pad", "cpu", "gather", level=0, doc="OpenMP over output elements, source index per element",
          applies=lambda v, d: _pad_ok(v) and v.inputs[0].dtype == v.outputs[0].dtype, default=lambda v, d: {})
def _pad_cpu(v: Variant, c: dict, d: DeviceInfo) -> str:
    return fill(_PAD_CPU, io=cpu_io("x", v.inputs[0]) + cpu_io("y", v.outputs[0]), **_pad_fill(v))

# ----------------------------------------------------------------------------- embedding


def _emb_ok(v: Variant) -> bool:
    idx, w = v.inputs
    return (idx.dtype in ("int64", "int32") and floats_only(w) and contiguous(idx, w, v.outputs[0])
            and len(w.shape) == 2 and idx.numel > 0 and w.shape[1] > 0)


def _emb_vmax(v: Variant) -> int:
    w = v.inputs[1]
    width = vec_width(w.dtype)
    while w.shape[1] % width:
        width //= 2
    return width


_EMB_CUDA = CUDA + r"""
typedef {{idx_t}} idx_t;
{{types}}#define ROWS {{ROWS}}
#define D {{D}}
#define ROWS_PER_BLOCK {{rows_per_block}}

/* One warp per looked-up row, copied in V-element vectors. */
template <int V>
__global__ void __launch_bounds__(32 * ROWS_PER_BLOCK) embedding(const idx_t* __restrict__ idx, const w_t* __restrict__ w,
                                                                w_t* __restrict__ y) {
    const long row = (long)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= ROWS) return;
    const Vec<w_t, V>* src = reinterpret_cast<const Vec<w_t, V>*>(w + (long)idx[row] * D);
    Vec<w_t, V>* dst = reinterpret_cast<Vec<w_t, V>*>(y + row * D);
    for (int k = threadIdx.x & 31; k < D / V; k += 32) dst[k] = src[k];
}

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const idx_t* idx = (const idx_t*)inputs[0].data;
    const w_t* w = (const w_t*)inputs[1].data;
    w_t* y = (w_t*)outputs[0].data;
    const int blocks = (ROWS + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    if ({{vec}} > 1 && (uintptr_t)w % 16 == 0 && (uintptr_t)y % 16 == 0)
        embedding<{{vec}}><<<blocks, 32 * ROWS_PER_BLOCK, 0, (cudaStream_t)stream>>>(idx, w, y);
    else
        embedding<1><<<blocks, 32 * ROWS_PER_BLOCK, 0, (cudaStream_t)stream>>>(idx, w, y);
    return (int)cudaGetLastError();
}
"""

_EMB_CPU = CPU + r"""
typedef {{idx_t}} idx_t;
typedef {{w_t}} w_t;
#define ROWS {{ROWS}}
#define D {{D}}
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const idx_t* idx = (const idx_t*)inputs[0].data;
    const w_t* w = (const w_t*)inputs[1].data;
    w_t* y = (w_t*)outputs[0].data;
    #pragma omp parallel for schedule(static)
    for (long r = 0; r < ROWS; ++r) memcpy(y + r * D, w + (long)idx[r] * D, sizeof(w_t) * D);
    return 0;
}
"""


def _emb_fill(v: Variant) -> dict:
    idx, w = v.inputs
    return dict(idx_t="int64_t" if idx.dtype == "int64" else "int32_t", ROWS=idx.numel, D=w.shape[1])


@strategy("embedding", "cuda", "warp_gather", level=1, doc="one warp per looked-up row, copied with 16-byte vectors",
          space={"rows_per_block": (1, 2, 4, 8), "vec": (1, 2, 4, 8)}, applies=lambda v, d: _emb_ok(v),
          default=lambda v, d: {"rows_per_block": 4, "vec": _emb_vmax(v)},
          valid=lambda v, c, d: c["vec"] <= _emb_vmax(v))
def _embedding_cuda(v: Variant, c: dict, d: DeviceInfo) -> str:
    return fill(_EMB_CUDA, types=cuda_types({"w": v.inputs[1]}), **_emb_fill(v), **c)


@strategy("embedding", "cpu", "memcpy", level=0, doc="OpenMP over looked-up rows, one memcpy each",
          applies=lambda v, d: _emb_ok(v), default=lambda v, d: {})
def _embedding_cpu(v: Variant, c: dict, d: DeviceInfo) -> str:
    return fill(_EMB_CPU, w_t={"float32": "float"}.get(v.inputs[1].dtype, "uint16_t"), **_emb_fill(v))
