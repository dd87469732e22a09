"""adaptive_avg_pool2d, max_pool2d, avg_pool2d on contiguous NCHW tensors, with torch's window rules."""
from __future__ import annotations

from ...kernels import DeviceInfo
from ...ops import Variant
from ._prelude import CPU, CUDA, cpu_io, cuda_types
from ._strategy import contiguous, fill, floats_only, prod, strategy


def _ok(v: Variant) -> bool:
    x, y = v.inputs[0], v.outputs[0]
    return (floats_only(x, y) and contiguous(x, y) and len(x.shape) in (3, 4) and x.numel > 0
            and y.numel > 0)


def _dims(v: Variant) -> dict:
    x, y = v.inputs[0].shape, v.outputs[0].shape
    return dict(PLANES=prod(x[:-2]), IH=x[-2], IW=x[-1], OH=y[-2], OW=y[-1])


# Window of output (oh, ow): `WINDOW` sets h0, h1, w0, w1 and how an element enters `acc`.
_WINDOWS = {
    "adaptive_avg_pool2d": dict(
        window=r"""const int h0 = (oh * IH) / OH, h1 = ((oh + 1) * IH + OH - 1) / OH;
    const int w0 = (ow * IW) / OW, w1 = ((ow + 1) * IW + OW - 1) / OW;""",
        init="0.f", accum="acc += val;", combine="acc += other;",
        finish="acc / (float)((h1 - h0) * (w1 - w0))"),
    "max_pool2d": dict(
        window=r"""const int hs = oh * SH - PH, ws = ow * SW - PW;
    const int h0 = hs < 0 ? (-hs + DH - 1) / DH : 0, w0 = ws < 0 ? (-ws + DW - 1) / DW : 0;
    const int h1 = min(KH, (IH - hs + DH - 1) / DH), w1 = min(KW, (IW - ws + DW - 1) / DW);""",
        init="KF_NEG_INF", accum="if (val > acc || isnan(val)) acc = val;",
        combine="if (other > acc || isnan(other)) acc = other;", finish="acc"),
    "avg_pool2d": dict(
        window=r"""int hs = oh * SH - PH, ws = ow * SW - PW;
    int he = min(hs + KH, IH + PH), we = min(ws + KW, IW + PW);
    const int pool = (he - hs) * (we - ws);
    hs = max(hs, 0); ws = max(ws, 0); he = min(he, IH); we = min(we, IW);
    const float divisor = DIVISOR > 0 ? (float)DIVISOR : COUNT_PAD ? (float)pool : (float)((he - hs) * (we - ws));
    const int h0 = 0, w0 = 0, h1 = he > hs ? he - hs : 0, w1 = we > ws ? we - ws : 0;""",
        init="0.f", accum="acc += val;", combine="acc += other;",
        finish="(h1 > 0 && w1 > 0 ? acc / divisor : 0.f)"),
}

# Row/column of window element (a, b) in the input.
_INDEX = {
    "adaptive_avg_pool2d": ("a", "b"),
    "max_pool2d": ("hs + a * DH", "ws + b * DW"),
    "avg_pool2d": ("hs + a", "ws + b"),
}


def _constants(v: Variant) -> dict:
    p = v.param_dict
    out = _dims(v)
    if v.op in ("max_pool2d", "avg_pool2d"):
        (kh, kw), (sh, sw), (ph, pw) = p["kernel_size"], p["stride"], p["padding"]
        dh, dw = p.get("dilation", (1, 1))
        out.update(KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw)
    if v.op == "avg_pool2d":
        out.update(DIVISOR=int(p["divisor_override"] or 0), COUNT_PAD=bool(p["count_include_pad"]))
    return out


def _defines(v: Variant) -> str:
    return "".join(f"#define {k} {int(val)}\n" for k, val in _constants(v).items())


def _pieces(v: Variant) -> dict:
    w = _WINDOWS[v.op]
    row, col = _INDEX[v.op]
    return dict(defines=_defines(v), window=w["window"], init=w["init"], accum=w["accum"],
                combine=w["combine"], finish=w["finish"], row=row, col=col)


# LANES threads cooperate on one output: window elements strided over the lanes, shuffle-combined.
_CUDA_POOL = CUDA + r"""
{{types}}{{defines}}#define THREADS {{threads}}
#define LANES {{lanes}}
#define TOTAL ((long)PLANES * OH * OW)

__global__ void __launch_bounds__(THREADS) pool(const x_t* __restrict__ x, y_t* __restrict__ y) {
    const long o = ((long)blockIdx.x * THREADS + threadIdx.x) / LANES;
    const int lane = threadIdx.x % LANES;
    const bool live = o < TOTAL;
    const long oo = live ? o : TOTAL - 1;
    const int ow = (int)(oo % OW), oh = (int)((oo / OW) % OH);
    const x_t* xp = x + (oo / ((long)OH * OW)) * IH * IW;
    {{window}}
    float acc = {{init}};
    if (LANES == 1) {
        for (int a = h0; a < h1; ++a)
            for (int b = w0; b < w1; ++b) {
                const float val = to_f(xp[({{row}}) * IW + ({{col}})]);
                {{accum}}
            }
    } else {
        const int wn = w1 - w0;
        for (int k = lane; k < (h1 - h0) * wn; k += LANES) {
            const int a = h0 + k / wn, b = w0 + k % wn;
            const float val = to_f(xp[({{row}}) * IW + ({{col}})]);
            {{accum}}
        }
    }
#pragma unroll
    for (int off = LANES / 2; off > 0; off >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, acc, off, LANES);
        {{combine}}
    }
    if (live && lane == 0) y[o] = from_f<y_t>({{finish}});
}

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    pool<<<(int)((TOTAL * LANES + THREADS - 1) / THREADS), THREADS, 0, (cudaStream_t)stream>>>(
        (const x_t*)inputs[0].data, (y_t*)outputs[0].data);
    return (int)cudaGetLastError();
}
"""

_CPU_POOL = CPU + r"""
{{io}}{{defines}}#define min(a, b) ((a) < (b) ? (a) : (b))
#define max(a, b) ((a) > (b) ? (a) : (b))
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const x_t* x = (const x_t*)inputs[0].data;
    y_t* y = (y_t*)outputs[0].data;
    #pragma omp parallel for schedule(static)
    for (long o = 0; o < (long)PLANES * OH * OW; ++o) {
        const int ow = (int)(o % OW), oh = (int)((o / OW) % OH);
        const x_t* xp = x + (o / ((long)OH * OW)) * IH * IW;
        {{window}}
        float acc = {{init}};
        for (int a = h0; a < h1; ++a)
            for (int b = w0; b < w1; ++b) {
                const float val = x_ld(xp, (long)({{row}}) * IW + ({{col}}));
                {{accum}}
            }
        y_st(y, o, {{finish}});
    }
    return 0;
}
"""


def _window_elems(v: Variant) -> int:
    c = _constants(v)
    if v.op == "adaptive_avg_pool2d":
        return -(-c["IH"] // c["OH"]) * -(-c["IW"] // c["OW"])
    return c["KH"] * c["KW"]


def _default_lanes(v: Variant) -> int:
    lanes = 1
    while lanes < 32 and lanes * 4 < _window_elems(v):
        lanes *= 2
    return lanes


_OPS = ("adaptive_avg_pool2d", "max_pool2d", "avg_pool2d")


@strategy(_OPS, "cuda", "lanes_per_output", level=1,
          doc="a group of lanes per output element: the window spread over the lanes (coalesced), combined by shuffles",
          space={"threads": (128, 256, 512), "lanes": (2, 4, 8, 16, 32)}, applies=lambda v, d: _ok(v),
          default=lambda v, d: {"threads": 256, "lanes": max(2, _default_lanes(v))})
def _render_cuda(v: Variant, c: dict, dev: DeviceInfo) -> str:
    return fill(_CUDA_POOL, types=cuda_types({"x": v.inputs[0], "y": v.outputs[0]}), **_pieces(v), **c)


@strategy(_OPS, "cuda", "thread_per_output", level=0,
          doc="one thread per output element, window bounds and divisor as torch computes them",
          space={"threads": (128, 256, 512)}, applies=lambda v, d: _ok(v), default=lambda v, d: {"threads": 256},
          fit=lambda v, d: 2.0 if _window_elems(v) <= 16 else 0.0)
def _thread_per_output(v: Variant, c: dict, dev: DeviceInfo) -> str:
    return _render_cuda(v, {**c, "lanes": 1}, dev)


@strategy(_OPS, "cpu", "direct", level=0, doc="OpenMP over output elements, window loops with torch's bounds",
          applies=lambda v, d: _ok(v), default=lambda v, d: {})
def _render_cpu(v: Variant, c: dict, dev: DeviceInfo) -> str:
    return fill(_CPU_POOL, io=cpu_io("x", v.inputs[0]) + cpu_io("y", v.outputs[0]), **_pieces(v))
