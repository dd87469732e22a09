"""``rms_norm_rope``: an RMSNorm over the last dimension, then the rotary embedding in rotate-half form (Gemma 4's
q/k norm and ``apply_rotary_pos_emb``).

out[..., j] = y[j] * cos[j] - y[j + D/2] * sin[j]        for j < D/2
out[..., j] = y[j] * cos[j] + y[j - D/2] * sin[j]        for j >= D/2
with y = (x * rsqrt(mean(x^2) + eps) * w) rounded to x's dtype, as the reference rounds it.

Element j and its partner j +/- D/2 are computed together: the CUDA design gives each lane the same columns of
both halves of a row, so a lane holds every value its outputs need and the row is read and written once. cos and
sin are inputs (the model computes them once a forward for every layer) broadcast over the leading dimensions.
"""
from __future__ import annotations

from ....kernels import DeviceInfo
from ....kernels._offsets import lin
from ....ops import TensorSig, Variant
from ....proposers.builtin._prelude import CPU, CUDA, cpu_io, cpu_round, cuda_types
from ....proposers.builtin._strategy import ITEMSIZE, fill, strategy

_OP = "rms_norm_rope"


def _offset(x: TensorSig, lead: tuple[int, ...], var: str = "r") -> str:
    """A C expression for the first element of row ``var`` (a row: one index of ``lead``, the input's leading
    dimensions, row-major) in tensor ``x``, whose leading dimensions broadcast to ``lead`` (size 1: stride 0)."""
    return lin(var, lead, [0 if x.shape[k] == 1 else x.stride[k] for k in range(len(lead))])


def _applies(v: Variant) -> bool:
    if v.op != _OP or len(v.inputs) != 4 or any(s is None for s in v.inputs) or len(v.outputs) != 1:
        return False
    x, w, c, s = v.inputs
    y = v.outputs[0]
    d = x.shape[-1] if x.shape else 0
    floats = all(t.dtype in ITEMSIZE for t in (x, w, c, s, y))
    return (floats and len(x.shape) >= 2 and d >= 2 and d % 2 == 0 and tuple(w.shape) == (d,)
            and all(t.stride[-1] == 1 for t in (x, c, s, y)) and w.stride[0] == 1
            and tuple(y.shape) == tuple(x.shape))


def _rows(v: Variant) -> int:
    n = 1
    for k in v.inputs[0].shape[:-1]:
        n *= k
    return n


def _common(v: Variant) -> dict:
    x, _, c, s = v.inputs
    lead = tuple(x.shape[:-1])
    return {"D": x.shape[-1], "ROWS": _rows(v), "EPS": repr(float(v.param_dict["eps"])),
            "XOFF": _offset(x, lead), "COFF": _offset(c, lead), "SOFF": _offset(s, lead),
            "YOFF": _offset(v.outputs[0], lead)}


# The entry point of both designs: pointers to x, weight, cos, sin and y.
_ENTRY = r"""
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const x_t* x = (const x_t*)inputs[0].data;
    const w_t* w = (const w_t*)inputs[1].data;
    const c_t* cs = (const c_t*)inputs[2].data;
    const s_t* sn = (const s_t*)inputs[3].data;
    y_t* y = (y_t*)outputs[0].data;
"""

# ----------------------------------------------------------------------------- CPU

_CPU = CPU + "{{io}}" + r"""
#define D {{D}}L
#define H2 (D / 2)
#define ROWS {{ROWS}}L
""" + _ENTRY + r"""    #pragma omp parallel for schedule(static)
    for (long r = 0; r < ROWS; ++r) {
        const long xo = {{XOFF}}, co = {{COFF}}, so = {{SOFF}}, yo = {{YOFF}};
        float ss = 0.f;
        for (long j = 0; j < D; ++j) { const float v = x_ld(x, xo + j); ss += v * v; }
        const float rs = 1.f / sqrtf(ss / (float)D + (float){{EPS}});
        for (long j = 0; j < H2; ++j) {
            /* y rounded to the input's dtype, as the reference rounds it before the rotation */
            const float a = x_rd(x_ld(x, xo + j) * rs * w_ld(w, j));
            const float b = x_rd(x_ld(x, xo + j + H2) * rs * w_ld(w, j + H2));
            y_st(y, yo + j, a * c_ld(cs, co + j) - b * s_ld(sn, so + j));
            y_st(y, yo + j + H2, b * c_ld(cs, co + j + H2) + a * s_ld(sn, so + j + H2));
        }
    }
    return 0;
}
"""



@strategy(_OP, "cpu", "rows", level=0,
          doc="OpenMP over rows: the sum of squares, then each column with its partner half a row away",
          applies=lambda v, d: _applies(v), default=lambda v, d: {})
def _rms_norm_rope_cpu(v: Variant, c: dict, d: DeviceInfo) -> str:
    x, w, cs, sn = v.inputs
    io = "".join(cpu_io(role, sig) for role, sig in (("x", x), ("w", w), ("c", cs), ("s", sn), ("y", v.outputs[0])))
    return fill(_CPU, io=io + cpu_round("x_rd", x.dtype), **_common(v))


# ----------------------------------------------------------------------------- CUDA

_CUDA = CUDA + "{{types}}" + r"""
#define D {{D}}
#define H2 (D / 2)
#define ROWS {{ROWS}}L
#define RPB {{RPB}}

/* One warp a row: lane l holds columns [k*32*V + l*V, +V) of each half (k < NI), so each output's partner half a
   row away is in the same lane's registers. Sum of squares by warp shuffles, then one store of each column. */
template <int V>
__global__ void __launch_bounds__(RPB * 32) rms_norm_rope_warp(const x_t* __restrict__ x, const w_t* __restrict__ w,
                                                               const c_t* __restrict__ cs, const s_t* __restrict__ sn,
                                                               y_t* __restrict__ y) {
    const long r = (long)blockIdx.x * RPB + (threadIdx.x >> 5);
    if (r >= ROWS) return;
    const int lane = threadIdx.x & 31;
    const long xo = {{XOFF}}, co = {{COFF}}, so = {{SOFF}}, yo = {{YOFF}};
    constexpr int NI = (H2 + 32 * V - 1) / (32 * V);
    float a[NI][V], b[NI][V], ss = 0.f;
#pragma unroll
    for (int k = 0; k < NI; ++k) {
        const int j = k * 32 * V + lane * V;
        if (j < H2) {
            load_vec<V>(x + xo + j, a[k]);
            load_vec<V>(x + xo + j + H2, b[k]);
#pragma unroll
            for (int i = 0; i < V; ++i) ss += a[k][i] * a[k][i] + b[k][i] * b[k][i];
        }
    }
    const float rs = rsqrtf(warp_sum(ss) / (float)D + (float){{EPS}});
#pragma unroll
    for (int k = 0; k < NI; ++k) {
        const int j = k * 32 * V + lane * V;
        if (j >= H2) continue;
        float wa[V], wb[V], ca[V], cb[V], sa[V], sb[V], oa[V], ob[V];
        load_vec<V>(w + j, wa);
        load_vec<V>(w + j + H2, wb);
        load_vec<V>(cs + co + j, ca);
        load_vec<V>(cs + co + j + H2, cb);
        load_vec<V>(sn + so + j, sa);
        load_vec<V>(sn + so + j + H2, sb);
#pragma unroll
        for (int i = 0; i < V; ++i) {
            /* y rounded to the input's dtype, as the reference rounds it before the rotation */
            const float p = to_f(from_f<x_t>(a[k][i] * rs * wa[i]));
            const float q = to_f(from_f<x_t>(b[k][i] * rs * wb[i]));
            oa[i] = p * ca[i] - q * sa[i];
            ob[i] = q * cb[i] + p * sb[i];
        }
        store_vec<V>(y + yo + j, oa);
        store_vec<V>(y + yo + j + H2, ob);
    }
}
""" + _ENTRY + r"""    const bool aligned = ((uintptr_t)x | (uintptr_t)w | (uintptr_t)cs | (uintptr_t)sn | (uintptr_t)y) % 16 == 0;
    const long blocks = (ROWS + RPB - 1) / RPB;
    if ({{VEC}} > 1 && aligned)
        rms_norm_rope_warp<{{VEC}}><<<blocks, RPB * 32, 0, (cudaStream_t)stream>>>(x, w, cs, sn, y);
    else
        rms_norm_rope_warp<1><<<blocks, RPB * 32, 0, (cudaStream_t)stream>>>(x, w, cs, sn, y);
    return (int)cudaGetLastError();
}
"""


def _vec_ok(v: Variant, vec: int) -> bool:
    """Whether ``vec``-wide accesses stay inside one aligned 16-byte unit in every tensor: the half row and every
    leading stride a multiple of ``vec``, and ``vec`` elements at most 16 bytes of each tensor's dtype."""
    x, w, c, s = v.inputs
    tensors = (x, w, c, s, v.outputs[0])
    half = x.shape[-1] // 2
    return (half % vec == 0 and all(vec * ITEMSIZE[t.dtype] <= 16 for t in tensors)
            and all(st % vec == 0 for t in (x, c, s, v.outputs[0]) for st in t.stride[:-1]))


def _vmax(v: Variant) -> int:
    return next(n for n in (8, 4, 2, 1) if _vec_ok(v, n))


def _ni(v: Variant, vec: int) -> int:
    half = v.inputs[0].shape[-1] // 2
    return -(-half // (32 * vec))


@strategy(_OP, "cuda", "warp_halves", level=0,
          doc="one warp a row, each lane holding the same columns of both halves (each output's partner is in its "
              "registers): the row read once, a warp-shuffle sum of squares, each column written once",
          space={"rows_per_block": (4, 8, 2), "vec": (8, 4, 2, 1)},
          applies=lambda v, d: _applies(v) and v.inputs[0].shape[-1] <= 8192,
          default=lambda v, d: {"rows_per_block": 4, "vec": _vmax(v)},
          valid=lambda v, c, d: _vec_ok(v, c["vec"]) and _ni(v, c["vec"]) * c["vec"] <= 64,
          fit=lambda v, d: 3.0,
          explain=lambda v, c: (f"one warp per {v.inputs[0].shape[-1]}-element row, {c['vec']}-wide accesses, "
                                f"{c['rows_per_block']} rows a block"))
def _rms_norm_rope_cuda(v: Variant, c: dict, d: DeviceInfo) -> str:
    x, w, cs, sn = v.inputs
    types = cuda_types({"x": x, "w": w, "c": cs, "s": sn, "y": v.outputs[0]})
    return fill(_CUDA, types=types, RPB=c["rows_per_block"], VEC=c["vec"], **_common(v))
