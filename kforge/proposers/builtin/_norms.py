"""layer_norm, rms_norm and batch_norm: statistics in fp32, one pass over registers where the row fits.

The group_norm family's strategies (kforge/ops/families/group_norm/strategies.py) share its helpers."""
from __future__ import annotations

from ...kernels import DeviceInfo
from ...ops import TensorSig, Variant
from ._prelude import CPU, CUDA, cpu_io, cuda_types
from ._strategy import cdiv, contiguous, fill, floats_only, prod, rows_of, strategy, vec_width

_F32_EPS = 1.1920928955078125e-07


def _sigs(v: Variant) -> dict[str, TensorSig | None]:
    names = ("x", "w", "b", "rm", "rv")[:len(v.inputs)]
    sigs = dict(zip(names, v.inputs))
    if v.op == "batch_norm":  # spec order: input, running_mean, running_var, weight, bias
        x, rm, rv, w, b = v.inputs
        sigs = {"x": x, "w": w, "b": b, "rm": rm, "rv": rv}
    sigs.setdefault("b", None)
    sigs["y"] = v.outputs[0]
    return sigs


def _ok(v: Variant) -> bool:
    sigs = _sigs(v)
    return floats_only(*sigs.values()) and contiguous(*sigs.values()) and v.inputs[0].numel > 0


def _eps(v: Variant) -> float:
    eps = v.param_dict["eps"]
    return _F32_EPS if eps is None else float(eps)


def _trailing(v: Variant) -> int:
    return len(v.param_dict["normalized_shape"])


def _vmax(v: Variant, length: int) -> int:
    return widest_vector(_sigs(v), length)


def widest_vector(sigs: dict[str, TensorSig | None], length: int) -> int:
    """Widest vector every tensor of ``sigs`` allows (16 bytes each) that divides ``length``."""
    w = min(vec_width(s.dtype) for s in sigs.values() if s is not None)
    while length % w:
        w //= 2
    return w


def _types(v: Variant) -> str:
    return cuda_types(_sigs(v))


def _rms(v: Variant) -> bool:
    return v.op == "rms_norm"


# ----------------------------------------------------------------------------- row norms (CUDA)

_ROW_HEAD = CUDA + r"""
{{types}}#define D {{D}}
#define ROWS {{ROWS}}
#define EPS {{EPS}}
#define RMS {{RMS}}
#define HAS_W {{HAS_W}}
#define HAS_B {{HAS_B}}

/* y = (x - mean) * rstd * w + b; rms_norm rounds x * rstd to the input dtype before the weight, as torch does. */
__device__ __forceinline__ float affine(float x, float mean, float rstd, float w, float b) {
    if (RMS) {
        const float n = to_f(from_f<y_t>(x * rstd));
        return HAS_W ? n * w : n;
    }
    float r = (x - mean) * rstd;
    if (HAS_W) r *= w;
    if (HAS_B) r += b;
    return r;
}
"""

# The entry point of every row-norm kernel: pointers to x, weight, bias (absent for rms_norm), y.
_ENTRY = r"""
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const x_t* x = (const x_t*)inputs[0].data;
    const w_t* w = (const w_t*)inputs[1].data;
    const b_t* b = (const b_t*)(RMS ? 0 : inputs[2].data);
    y_t* y = (y_t*)outputs[0].data;
"""

_LAUNCH = _ENTRY + r"""    const bool aligned = (uintptr_t)x % 16 == 0 && (uintptr_t)y % 16 == 0 && (uintptr_t)w % 16 == 0 && (uintptr_t)b % 16 == 0;
    if ({{vec}} > 1 && aligned)
        {{kernel}}<{{vec}}><<<{{grid}}, {{block}}, 0, (cudaStream_t)stream>>>(x, w, b, y);
    else
        {{kernel}}<1><<<{{grid}}, {{block}}, 0, (cudaStream_t)stream>>>(x, w, b, y);
    return (int)cudaGetLastError();
}
"""

_ROW_BLOCK = _ROW_HEAD + r"""
#define THREADS {{threads}}
template <int V>
__global__ void __launch_bounds__(THREADS) norm_block_row(const x_t* __restrict__ x, const w_t* __restrict__ w,
                                                         const b_t* __restrict__ b, y_t* __restrict__ y) {
    __shared__ float scratch[96];
    const x_t* xr = x + (long)blockIdx.x * D;
    y_t* yr = y + (long)blockIdx.x * D;
    Welford acc = {0.f, 0.f, 0.f};
    for (int i = threadIdx.x * V; i < D; i += THREADS * V) {
        float v[V], s = 0.f, q = 0.f;
        load_vec<V>(xr + i, v);
#pragma unroll
        for (int j = 0; j < V; ++j) s += v[j];
        const float m = RMS ? 0.f : s / V;
#pragma unroll
        for (int j = 0; j < V; ++j) q += (v[j] - m) * (v[j] - m);
        acc.merge(V, m, q);
    }
    acc = block_welford<THREADS>(acc, scratch);
    const float mean = RMS ? 0.f : acc.mean, rstd = rsqrtf(acc.m2 / D + EPS);
    for (int i = threadIdx.x * V; i < D; i += THREADS * V) {
        float v[V], wv[V], bv[V];
        load_vec<V>(xr + i, v);
        if (HAS_W) load_vec<V>(w + i, wv);
        if (HAS_B) load_vec<V>(b + i, bv);
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = affine(v[j], mean, rstd, HAS_W ? wv[j] : 1.f, HAS_B ? bv[j] : 0.f);
        store_vec<V>(yr + i, v);
    }
}
""" + _LAUNCH

# NB: for rms_norm the Welford mean is forced to 0, so m2 is the plain sum of squares.
_ROW_REGISTER = _ROW_HEAD + r"""
#define GROUP {{group}}
#define ROWS_PER_BLOCK {{rows_per_block}}
template <int V>
__global__ void __launch_bounds__(GROUP * ROWS_PER_BLOCK) norm_register_row(const x_t* __restrict__ x, const w_t* __restrict__ w,
                                                                           const b_t* __restrict__ b, y_t* __restrict__ y) {
    constexpr int ITEMS = (D + GROUP * V - 1) / (GROUP * V);
    __shared__ float scratch[32];
    const int t = GROUP == 32 ? (threadIdx.x & 31) : threadIdx.x;
    const long row = (long)blockIdx.x * ROWS_PER_BLOCK + (GROUP == 32 ? threadIdx.x >> 5 : 0);
    if (row >= ROWS) return;
    const x_t* xr = x + row * D;
    y_t* yr = y + row * D;
    float v[ITEMS][V];
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const int i = (k * GROUP + t) * V;
        if (D % (GROUP * V) == 0 || i < D) {
            load_vec<V>(xr + i, v[k]);
#pragma unroll
            for (int j = 0; j < V; ++j) s += v[k][j];
        } else {
#pragma unroll
            for (int j = 0; j < V; ++j) v[k][j] = 0.f;
        }
    }
    float mean = 0.f;
    if (!RMS) mean = (GROUP == 32 ? warp_sum(s) : block_sum<GROUP>(s, scratch)) / D;
    float q = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const int i = (k * GROUP + t) * V;
        if (D % (GROUP * V) == 0 || i < D) {
#pragma unroll
            for (int j = 0; j < V; ++j) q += (v[k][j] - mean) * (v[k][j] - mean);
        }
    }
    q = GROUP == 32 ? warp_sum(q) : block_sum<GROUP>(q, scratch);
    const float rstd = rsqrtf(q / D + EPS);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        const int i = (k * GROUP + t) * V;
        if (D % (GROUP * V) == 0 || i < D) {
            float wv[V], bv[V];
            if (HAS_W) load_vec<V>(w + i, wv);
            if (HAS_B) load_vec<V>(b + i, bv);
#pragma unroll
            for (int j = 0; j < V; ++j) v[k][j] = affine(v[k][j], mean, rstd, HAS_W ? wv[j] : 1.f, HAS_B ? bv[j] : 0.f);
            store_vec<V>(yr + i, v[k]);
        }
    }
}
""" + _LAUNCH


def _row_common(v: Variant, config: dict) -> dict:
    rows, d = rows_of(v, _trailing(v))
    sigs = _sigs(v)
    return dict(types=_types(v), D=d, ROWS=rows, EPS=_eps(v), RMS=_rms(v), HAS_W=sigs["w"] is not None,
                HAS_B=sigs["b"] is not None, vec=config["vec"])


def _row_ok(v: Variant) -> bool:
    if not _ok(v):
        return False
    rows, d = rows_of(v, _trailing(v))
    # weight/bias must be exactly the normalised trailing shape
    return all(s is None or s.numel == d for s in v.inputs[1:]) and d > 0


def _row_d(v: Variant) -> int:
    return rows_of(v, _trailing(v))[1]


_ROW_OPS = ("layer_norm", "rms_norm")


@strategy(_ROW_OPS, "cuda", "block_row", level=0,
          doc="one block per row: Welford statistics over vector loads, then a normalise pass",
          space={"threads": (128, 256, 512, 1024), "vec": (1, 2, 4, 8)}, applies=lambda v, d: _row_ok(v),
          default=lambda v, d: {"threads": 256 if _row_d(v) <= 8192 else 1024, "vec": _vmax(v, _row_d(v))},
          valid=lambda v, c, d: c["vec"] <= _vmax(v, _row_d(v)))
def _render_block_row(v: Variant, c: dict, dev: DeviceInfo) -> str:
    return fill(_ROW_BLOCK, threads=c["threads"], kernel="norm_block_row", grid="ROWS", block="THREADS",
                **_row_common(v, c))


@strategy(_ROW_OPS, "cuda", "warp_row", level=1,
          doc="one warp per row held in registers, exact two-pass statistics by warp shuffles",
          space={"rows_per_block": (2, 4, 8), "vec": (1, 2, 4, 8)},
          applies=lambda v, d: _row_ok(v) and _row_d(v) <= 2048,
          default=lambda v, d: {"rows_per_block": 4, "vec": _vmax(v, _row_d(v))},
          valid=lambda v, c, d: c["vec"] <= _vmax(v, _row_d(v)),
          fit=lambda v, d: 3.0 if _row_d(v) <= 1024 else 1.5,
          explain=lambda v, c: (f"one warp per {_row_d(v)}-element row ({cdiv(_row_d(v), 32)} per lane in "
                                f"registers), {c['rows_per_block']} rows per block, {c['vec']}-wide loads"))
def _render_warp_row(v: Variant, c: dict, dev: DeviceInfo) -> str:
    return fill(_ROW_REGISTER, group=32, rows_per_block=c["rows_per_block"], kernel="norm_register_row",
                grid="(ROWS + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK", block="GROUP * ROWS_PER_BLOCK",
                **_row_common(v, c))


@strategy(_ROW_OPS, "cuda", "block_register", level=2,
          doc="one block per row held in registers: read once, exact two-pass statistics, written once",
          space={"threads": (64, 128, 256, 512, 1024), "vec": (1, 2, 4, 8)},
          applies=lambda v, d: _row_ok(v) and 256 <= _row_d(v) <= 32768,
          default=lambda v, d: {"threads": _register_threads(_row_d(v), _vmax(v, _row_d(v))),
                                "vec": _vmax(v, _row_d(v))},
          valid=lambda v, c, d: (c["vec"] <= _vmax(v, _row_d(v))
                                 and cdiv(_row_d(v), c["threads"] * c["vec"]) * c["vec"] <= 32),
          fit=lambda v, d: 2.5 if _row_d(v) > 1024 else 2.0,
          explain=lambda v, c: (f"one {c['threads']}-thread block per {_row_d(v)}-element row held in "
                                f"registers, {c['vec']}-wide loads"))
def _render_block_register(v: Variant, c: dict, dev: DeviceInfo) -> str:
    return fill(_ROW_REGISTER, group=c["threads"], rows_per_block=1, kernel="norm_register_row",
                grid="ROWS", block="GROUP", **_row_common(v, c))


def _register_threads(d: int, vec: int) -> int:
    """Fewest threads (128..1024) that leave each thread at most 8 elements of the row."""
    for threads in (128, 256, 512, 1024):
        if cdiv(d, threads * vec) * vec <= 8:
            return threads
    return 1024


# ----------------------------------------------------------------------------- row norms (CPU)

_CPU_ROW_HEAD = CPU + r"""
{{io}}#define D {{D}}
#define ROWS {{ROWS}}
#define EPS {{EPS}}
#define RMS {{RMS}}
#define HAS_W {{HAS_W}}
#define HAS_B {{HAS_B}}

static inline void write_row(const x_t* xr, const w_t* w, const b_t* b, y_t* yr, float mean, float rstd) {
    for (long i = 0; i < D; ++i) {
        const float v = x_ld(xr, i);
        float r;
        if (RMS) { y_st(yr, i, v * rstd); r = y_ld(yr, i); if (HAS_W) r *= w_ld(w, i); } /* round like torch */
        else { r = (v - mean) * rstd; if (HAS_W) r *= w_ld(w, i); if (HAS_B) r += b_ld(b, i); }
        y_st(yr, i, r);
    }
}
"""

_CPU_ROW_LAUNCH = _ENTRY + r"""    #pragma omp parallel for schedule(static)
    for (long r = 0; r < ROWS; ++r) {
        float mean, rstd;
        row_stats(x + r * D, &mean, &rstd);
        write_row(x + r * D, w, b, y + r * D, mean, rstd);
    }
    return 0;
}
"""

_CPU_TWO_PASS = _CPU_ROW_HEAD + r"""
static inline void row_stats(const x_t* xr, float* mean, float* rstd) {
    float s = 0.f, q = 0.f;
    if (!RMS) {
        #pragma omp simd reduction(+:s)
        for (long i = 0; i < D; ++i) s += x_ld(xr, i);
    }
    const float m = s / D;
    #pragma omp simd reduction(+:q)
    for (long i = 0; i < D; ++i) { const float d = x_ld(xr, i) - m; q += d * d; }
    *mean = m;
    *rstd = 1.f / sqrtf(q / D + EPS);
}
""" + _CPU_ROW_LAUNCH

_CPU_ONE_PASS = _CPU_ROW_HEAD + r"""
static inline void row_stats(const x_t* xr, float* mean, float* rstd) {
    double s = 0.0, q = 0.0;
    #pragma omp simd reduction(+:s, q)
    for (long i = 0; i < D; ++i) { const double v = x_ld(xr, i); s += v; q += v * v; }
    const double m = RMS ? 0.0 : s / D;
    const double var = q / D - m * m;
    *mean = (float)m;
    *rstd = (float)(1.0 / sqrt((var > 0.0 ? var : 0.0) + EPS));
}
""" + _CPU_ROW_LAUNCH


def _cpu_io(v: Variant) -> str:
    return "".join(cpu_io(role, sig) for role, sig in _sigs(v).items())


def _cpu_row_render(template: str, v: Variant) -> str:
    common = _row_common(v, {"vec": 1})
    del common["types"], common["vec"]
    return fill(template, io=_cpu_io(v), **common)


@strategy(_ROW_OPS, "cpu", "two_pass", level=0,
          doc="OpenMP over rows: SIMD mean, then SIMD variance around it, then normalise",
          applies=lambda v, d: _row_ok(v), default=lambda v, d: {})
def _two_pass(v: Variant, c: dict, dev: DeviceInfo) -> str:
    return _cpu_row_render(_CPU_TWO_PASS, v)


@strategy(_ROW_OPS, "cpu", "one_pass", level=1,
          doc="OpenMP over rows: sum and sum of squares in one SIMD pass (double accumulators), then normalise",
          applies=lambda v, d: _row_ok(v), default=lambda v, d: {})
def _one_pass(v: Variant, c: dict, dev: DeviceInfo) -> str:
    return _cpu_row_render(_CPU_ONE_PASS, v)


# ----------------------------------------------------------------------------- batch_norm (inference)


def _bn_ok(v: Variant) -> bool:
    return _ok(v) and len(v.inputs[0].shape) >= 2 and v.inputs[1] is not None and v.inputs[2] is not None


def _bn_dims(v: Variant) -> tuple[int, int, int]:
    shape = v.inputs[0].shape
    return shape[0], shape[1], prod(shape[2:])


def _bn_vmax(v: Variant) -> int:
    return _vmax(v, _bn_dims(v)[2])


_BN = CUDA + r"""
{{types}}#define C {{C}}
#define HW {{HW}}
#define TOTAL {{TOTAL}}L
#define EPS {{EPS}}
#define HAS_W {{HAS_W}}
#define HAS_B {{HAS_B}}
#define THREADS {{threads}}

/* Every vector lies in one channel (HW % V == 0): y = x * a[c] + shift[c]. */
template <int V>
__global__ void __launch_bounds__(THREADS) bn_affine(const x_t* __restrict__ x, const rm_t* __restrict__ rm, const rv_t* __restrict__ rv,
                                                    const w_t* __restrict__ w, const b_t* __restrict__ b, y_t* __restrict__ y) {
    for (long i = ((long)blockIdx.x * THREADS + threadIdx.x) * V; i < TOTAL; i += (long)gridDim.x * THREADS * V) {
        const int c = (int)((i / HW) % C);
        const float a = rsqrtf(to_f(rv[c]) + EPS) * (HAS_W ? to_f(w[c]) : 1.f);
        const float shift = (HAS_B ? to_f(b[c]) : 0.f) - to_f(rm[c]) * a;
        float v[V];
        load_vec<V>(x + i, v);
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = v[j] * a + shift;
        store_vec<V>(y + i, v);
    }
}

template <int V> static void run(const kf_tensor* in, y_t* y, cudaStream_t stream) {
    long blocks = (TOTAL / V + THREADS - 1) / THREADS;
    if (blocks > {{max_blocks}}) blocks = {{max_blocks}};
    bn_affine<V><<<(int)blocks, THREADS, 0, stream>>>((const x_t*)in[0].data, (const rm_t*)in[1].data, (const rv_t*)in[2].data,
                                                      (const w_t*)in[3].data, (const b_t*)in[4].data, y);
}

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    y_t* y = (y_t*)outputs[0].data;
    if ({{vec}} > 1 && (uintptr_t)inputs[0].data % 16 == 0 && (uintptr_t)y % 16 == 0) run<{{vec}}>(inputs, y, (cudaStream_t)stream);
    else run<1>(inputs, y, (cudaStream_t)stream);
    return (int)cudaGetLastError();
}
"""

_CPU_BN = CPU + r"""
{{io}}#define C {{C}}
#define HW {{HW}}
#define N {{N}}
#define EPS {{EPS}}
#define HAS_W {{HAS_W}}
#define HAS_B {{HAS_B}}
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const x_t* x = (const x_t*)inputs[0].data;
    const rm_t* rm = (const rm_t*)inputs[1].data;
    const rv_t* rv = (const rv_t*)inputs[2].data;
    const w_t* w = (const w_t*)inputs[3].data;
    const b_t* b = (const b_t*)inputs[4].data;
    y_t* y = (y_t*)outputs[0].data;
    #pragma omp parallel for schedule(static)
    for (long k = 0; k < (long)N * C; ++k) {
        const long c = k % C;
        const float a = (1.f / sqrtf(rv_ld(rv, c) + EPS)) * (HAS_W ? w_ld(w, c) : 1.f);
        const float shift = (HAS_B ? b_ld(b, c) : 0.f) - rm_ld(rm, c) * a;
        for (long i = 0; i < HW; ++i) y_st(y, k * HW + i, x_ld(x, k * HW + i) * a + shift);
    }
    return 0;
}
"""


def _bn_common(v: Variant) -> dict:
    n, c, hw = _bn_dims(v)
    sigs = _sigs(v)
    return dict(N=n, C=c, HW=hw, TOTAL=n * c * hw, EPS=_eps(v), HAS_W=sigs["w"] is not None,
                HAS_B=sigs["b"] is not None)


@strategy("batch_norm", "cuda", "affine", level=1,
          doc="inference batch norm as one per-channel affine: grid-stride over 16-byte vectors",
          space={"threads": (256, 512), "vec": (1, 2, 4, 8), "waves": (4, 8, 16)}, applies=lambda v, d: _bn_ok(v),
          default=lambda v, d: {"threads": 256, "vec": _bn_vmax(v), "waves": 8},
          valid=lambda v, c, d: c["vec"] <= _bn_vmax(v))
def _bn_cuda(v: Variant, c: dict, d: DeviceInfo) -> str:
    return fill(_BN, types=_types(v), threads=c["threads"], vec=c["vec"],
                max_blocks=c["waves"] * d.sm_count * 2048 // c["threads"], **_bn_common(v))


@strategy("batch_norm", "cpu", "affine", level=0, doc="OpenMP over (sample, channel) planes: one per-channel affine",
          applies=lambda v, d: _bn_ok(v), default=lambda v, d: {})
def _bn_cpu(v: Variant, c: dict, d: DeviceInfo) -> str:
    return fill(_CPU_BN, io=_cpu_io(v), **_bn_common(v))
