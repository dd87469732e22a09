"""Unary activations and broadcasting add/mul: grid-stride loops, 16-byte vectors when the layout allows."""
from __future__ import annotations

import math

from ...kernels import DeviceInfo
from ...ops import TensorSig, Variant
from ._prelude import CPU, CUDA, cpu_io, cuda_types
from ._strategy import fill, floats_only, strategy, vec_width

_UNARY = {
    "relu": "(x < 0.f ? 0.f : x)",
    "silu": "x / (1.f + expf(-x))",
    "sigmoid": "1.f / (1.f + expf(-x))",
    "tanh": "tanhf(x)",
}


def _expr(v: Variant) -> str:
    """The operation on floats ``x`` (and ``z`` for the second operand) as a C expression."""
    p = v.param_dict
    if v.op in _UNARY:
        return _UNARY[v.op]
    if v.op == "gelu":
        if p["approximate"] == "tanh":
            return "0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)))"
        return "0.5f * x * (1.f + erff(x * 0.70710678118654752f))"
    if v.op == "softplus":
        beta, threshold = float(p["beta"]), float(p["threshold"])
        return f"(x * {beta!r}f > {threshold!r}f ? x : log1pf(expf(x * {beta!r}f)) / {beta!r}f)"
    if v.op == "add":
        alpha = p["alpha"]
        return "x + z" if alpha == 1 else f"x + {float(alpha)!r}f * z"
    return "x * z"


def _operands(v: Variant) -> list[tuple[str, TensorSig | None]]:
    """(role, signature) per operand; a binary op's scalar ``other`` has no signature."""
    if v.op in ("add", "mul"):
        return [("x", v.inputs[0]), ("z", v.inputs[1])]
    return [("x", v.inputs[0])]


def _bstrides(sig: TensorSig, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``sig``'s strides broadcast against ``shape`` (0 where it is broadcast)."""
    if len(shape) == 1 and sig.numel == shape[0] and sig.is_contiguous:
        return (1,)  # the flat index space: a contiguous operand as large as the output
    pad = len(shape) - len(sig.shape)
    return tuple(0 if d < pad or sig.shape[d - pad] == 1 else sig.stride[d - pad] for d in range(len(shape)))


def _offset(sig: TensorSig, shape: tuple[int, ...]) -> str:
    """C expression for the element offset of ``sig`` at linear index ``i`` of ``shape``."""
    strides = _bstrides(sig, shape)
    dense = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    if strides == tuple(dense) or sig.numel == math.prod(shape) == 1:
        return "(i)"
    terms = []
    for d, (st, size) in enumerate(zip(strides, shape)):
        if st == 0 or size == 1:
            continue
        coord = f"(i / {dense[d]}L)" if d == 0 else f"((i / {dense[d]}L) % {size}L)"
        terms.append(f"{coord} * {st}L")
    return "(" + (" + ".join(terms) or "0L") + ")"


def _ok(v: Variant) -> bool:
    y = v.outputs[0]
    sigs = [s for _, s in _operands(v) if s is not None]
    if not floats_only(y, *sigs) or y.numel == 0:
        return False
    if v.op in ("add", "mul") and v.inputs[1] is None and not (
            isinstance(v.param_dict["scalar"], (int, float)) and math.isfinite(v.param_dict["scalar"])):
        return False  # a non-numeric or non-finite scalar: left to eager
    return all(len(s.shape) <= len(y.shape) for s in sigs)


def _vec_mode(sig: TensorSig | None, shape: tuple[int, ...], width: int) -> str | None:
    """How ``width``-element vectors of the contiguous output read ``sig``: "vec", "bcast" or None."""
    if sig is None or sig.numel == 1:
        return "bcast"
    strides = _bstrides(sig, shape)
    if shape[-1] % width:
        return None
    if strides[-1] == 0:
        return "bcast"
    if strides[-1] == 1 and all(st % width == 0 for st in strides[:-1]):
        return "vec"
    return None


def _shape(v: Variant) -> tuple[int, ...]:
    """The index space: flat when every tensor is contiguous with the output's shape."""
    y = v.outputs[0]
    if all(s is None or s.numel == 1 or (s.shape == y.shape and s.is_contiguous)
           for _, s in _operands(v)) and y.is_contiguous:
        return (y.numel,)
    return y.shape or (1,)


def _vmax(v: Variant) -> int:
    y = v.outputs[0]
    if not y.is_contiguous:
        return 1
    shape = _shape(v)
    ops = _operands(v)
    w = min([vec_width(y.dtype)] + [vec_width(s.dtype) for _, s in ops if s is not None])
    while w > 1 and (shape[-1] % w or not all(_vec_mode(s, shape, w) for _, s in ops)):
        w //= 2  # the output too is written in whole vectors
    return w


_CUDA_EW = CUDA + r"""
{{types}}#define TOTAL {{TOTAL}}L
#define THREADS {{threads}}
#define ITEMS {{items}}

template <int V>
__global__ void __launch_bounds__(THREADS) elementwise({{params}}, y_t* __restrict__ y) {
    const long step = (long)gridDim.x * THREADS * ITEMS * V;
    for (long base = ((long)blockIdx.x * THREADS * ITEMS + threadIdx.x) * V; base < TOTAL; base += step) {
#pragma unroll
        for (int u = 0; u < ITEMS; ++u) {
            const long i = base + (long)u * THREADS * V;
            if (i < TOTAL) {
{{loads}}                float r[V];
#pragma unroll
                for (int j = 0; j < V; ++j) { const float x = vx[j]; {{z}}r[j] = {{expr}}; }
                {{store}}
            }
        }
    }
}

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    y_t* y = (y_t*)outputs[0].data;
    long blocks = (TOTAL / {{vec}} + THREADS * ITEMS - 1) / (THREADS * ITEMS);
    if (blocks > {{max_blocks}}) blocks = {{max_blocks}};
    if (blocks < 1) blocks = 1;
    if ({{vec}} > 1 && (uintptr_t)y % 16 == 0{{aligned}})
        elementwise<{{vec}}><<<(int)blocks, THREADS, 0, (cudaStream_t)stream>>>({{args}}, y);
    else
        elementwise<1><<<(int)((TOTAL + THREADS * ITEMS - 1) / (THREADS * ITEMS) < {{max_blocks}} ? (TOTAL + THREADS * ITEMS - 1) / (THREADS * ITEMS) : {{max_blocks}}),
                        THREADS, 0, (cudaStream_t)stream>>>({{args}}, y);
    return (int)cudaGetLastError();
}
"""


def _reads(v: Variant, shape: tuple[int, ...], vec: int) -> list[tuple[int, str, TensorSig | None, str, str]]:
    """How each operand is read, as (input index, role, signature, how, what): how is "scalar"
    (what: the baked-in value), "vec" (whole vectors at offset what) or "bcast" (one element at
    offset what, repeated along the vector)."""
    out = []
    for k, (role, sig) in enumerate(_operands(v)):
        if sig is None:
            out.append((k, role, sig, "scalar", f"{float(v.param_dict['scalar'])!r}f"))
        else:
            how = "vec" if _vec_mode(sig, shape, vec) == "vec" else "bcast"
            out.append((k, role, sig, how, _offset(sig, shape)))
    return out


_OPS = ("relu", "silu", "sigmoid", "tanh", "gelu", "softplus", "add", "mul")


@strategy(_OPS, "cuda", "grid_stride", level=0,
          doc="one element per thread per step, grid-stride, any strides and broadcasting",
          space={"threads": (128, 256, 512), "waves": (2, 4, 8)}, applies=lambda v, d: _ok(v),
          default=lambda v, d: {"threads": 256, "waves": 4})
def _grid_stride(v: Variant, c: dict, dev: DeviceInfo) -> str:
    return _render_cuda(v, {**c, "vec": 1, "items": 1}, dev)


@strategy(_OPS, "cuda", "vectorized", level=1,
          doc="16-byte vector loads and stores, several vectors in flight per thread, broadcast operands "
              "read once per vector",
          space={"threads": (128, 256, 512), "items": (1, 2, 4), "vec": (2, 4, 8), "waves": (2, 4, 8)},
          applies=lambda v, d: _ok(v) and _vmax(v) > 1,
          default=lambda v, d: {"threads": 256, "items": 2 if v.outputs[0].numel >= (1 << 22) else 1,
                                "vec": _vmax(v), "waves": 4},
          valid=lambda v, c, d: c["vec"] <= _vmax(v))
def _render_cuda(v: Variant, c: dict, dev: DeviceInfo) -> str:
    y = v.outputs[0]
    shape = _shape(v)
    vec = c["vec"]
    params, args, loads, aligned = [], [], [], ""
    roles = {"y": y}
    for k, role, sig, how, what in _reads(v, shape, vec):
        roles[role] = sig
        if how == "scalar":
            loads.append(f"float v{role}[V];\n#pragma unroll\nfor (int j = 0; j < V; ++j) v{role}[j] = {what};")
            continue
        params.append(f"const {role}_t* __restrict__ {role}")
        args.append(f"(const {role}_t*)inputs[{k}].data")
        if how == "vec" or vec == 1:
            loads.append(f"float v{role}[V]; load_vec<V>({role} + {what}, v{role});")
            aligned += f" && (uintptr_t)inputs[{k}].data % 16 == 0"
        else:
            loads.append(f"float v{role}[V]; {{ const float s = to_f({role}[{what}]);\n#pragma unroll\n"
                         f"for (int j = 0; j < V; ++j) v{role}[j] = s; }}")
    store = ("store_vec<V>(y + i, r);" if y.is_contiguous
             else f"y[{_offset(y, shape)}] = from_f<y_t>(r[0]);")
    return fill(_CUDA_EW, types=cuda_types(roles), TOTAL=y.numel, threads=c["threads"], items=c["items"],
                vec=vec, max_blocks=c["waves"] * dev.sm_count * 2048 // c["threads"],
                params=", ".join(params), args=", ".join(args), aligned=aligned,
                loads="".join(" " * 16 + ln.replace("\n", "\n" + " " * 16) + "\n" for ln in loads),
                z="const float z = vz[j]; " if len(_operands(v)) == 2 else "", expr=_expr(v), store=store)


# One tile per block, no grid-stride loop: every load of a thread is issued before its first store
# (ITEMS vectors in flight); only the last tile checks bounds, per vector (the element count is a
# multiple of V).
_CUDA_TILED = CUDA + r"""
{{types}}#define TOTAL {{TOTAL}}L
#define THREADS {{threads}}
#define ITEMS {{items}}
#define STREAM {{stream}}

template <int B> struct Raw;
template <> struct Raw<16> { typedef uint4 t; };
template <> struct Raw<8> { typedef uint2 t; };
template <> struct Raw<4> { typedef unsigned int t; };
template <> struct Raw<2> { typedef unsigned short t; };

/* A vector load / store; with S, the evict-first cache hint (data touched once). */
template <int N, bool S, typename T>
__device__ __forceinline__ void ld(const T* p, float (&out)[N]) {
    typedef typename Raw<sizeof(T) * N>::t R;
    union { R r; Vec<T, N> v; } u;
    u.r = S ? __ldcs(reinterpret_cast<const R*>(p)) : *reinterpret_cast<const R*>(p);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_f(u.v.v[i]);
}

template <int N, bool S, typename T>
__device__ __forceinline__ void st(T* p, const float (&in)[N]) {
    typedef typename Raw<sizeof(T) * N>::t R;
    union { R r; Vec<T, N> v; } u;
#pragma unroll
    for (int i = 0; i < N; ++i) u.v.v[i] = from_f<T>(in[i]);
    if (S) __stcs(reinterpret_cast<R*>(p), u.r); else *reinterpret_cast<R*>(p) = u.r;
}

template <int V>
__global__ void __launch_bounds__(THREADS) tiled({{params}}, y_t* __restrict__ y) {
    const long tile = (long)blockIdx.x * (THREADS * ITEMS * V);
    const bool full = tile + THREADS * ITEMS * V <= TOTAL;
{{decls}}#pragma unroll
    for (int u = 0; u < ITEMS; ++u) {
        const long i = tile + ((long)u * THREADS + threadIdx.x) * V;
        if (full || i < TOTAL) {
{{loads}}        }
    }
#pragma unroll
    for (int u = 0; u < ITEMS; ++u) {
        const long i = tile + ((long)u * THREADS + threadIdx.x) * V;
        if (full || i < TOTAL) {
            float r[V];
#pragma unroll
            for (int j = 0; j < V; ++j) { const float x = vx[u][j]; {{z}}r[j] = {{expr}}; }
            st<V, STREAM>(y + i, r);
        }
    }
}

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    y_t* y = (y_t*)outputs[0].data;
    if ({{vec}} > 1 && (uintptr_t)y % 16 == 0{{aligned}})
        tiled<{{vec}}><<<(int)((TOTAL + THREADS * ITEMS * {{vec}} - 1) / (THREADS * ITEMS * {{vec}})), THREADS, 0,
                         (cudaStream_t)stream>>>({{args}}, y);
    else
        tiled<1><<<(int)((TOTAL + THREADS * ITEMS - 1) / (THREADS * ITEMS)), THREADS, 0, (cudaStream_t)stream>>>({{args}}, y);
    return (int)cudaGetLastError();
}
"""


def _tiled_ok(v: Variant) -> bool:
    """Contiguous output, operands read as whole vectors or broadcast, and a grid that fits an int."""
    return _ok(v) and v.outputs[0].is_contiguous and _vmax(v) > 1 and v.outputs[0].numel < (1 << 37)


@strategy(_OPS, "cuda", "tiled", level=2,
          doc="one tile per block with every load of a thread issued before its first store, bounds checks "
              "only in the last tile, optional evict-first hints on the data read or written once",
          space={"threads": (128, 256, 512), "items": (1, 2, 4, 8), "vec": (2, 4, 8), "cache": ("stream", "plain")},
          applies=lambda v, d: _tiled_ok(v), default=lambda v, d: _tiled_default(v, d),
          valid=lambda v, c, d: c["vec"] <= _vmax(v))
def _render_tiled(v: Variant, c: dict, dev: DeviceInfo) -> str:
    y = v.outputs[0]
    shape = _shape(v)
    vec = c["vec"]
    stream = c["cache"] == "stream"
    params, args, decls, loads, aligned = [], [], [], [], ""
    roles = {"y": y}
    for k, role, sig, how, what in _reads(v, shape, vec):
        roles[role] = sig
        decls.append(f"float v{role}[ITEMS][V];")
        if how == "scalar":
            decls.append(f"#pragma unroll\nfor (int u = 0; u < ITEMS; ++u)\n"
                         f"#pragma unroll\nfor (int j = 0; j < V; ++j) v{role}[u][j] = {what};")
            continue
        params.append(f"const {role}_t* __restrict__ {role}_p")
        args.append(f"(const {role}_t*)inputs[{k}].data")
        if how == "vec":
            # NB: the evict-first hint only for operands read once; a smaller one is reused
            hint = int(stream and sig.numel == y.numel)
            loads.append(f"ld<V, {hint}>({role}_p + {what}, v{role}[u]);")
            aligned += f" && (uintptr_t)inputs[{k}].data % 16 == 0"
        else:  # broadcast along the vector: one read (V == 1 reads every element this way too)
            loads.append(f"{{ const float s = to_f({role}_p[{what}]);\n#pragma unroll\n"
                         f"for (int j = 0; j < V; ++j) v{role}[u][j] = s; }}")

    def block(lines: list[str], indent: int) -> str:
        return "".join(" " * indent + ln.replace("\n", "\n" + " " * indent) + "\n" for ln in lines)

    return fill(_CUDA_TILED, types=cuda_types(roles), TOTAL=y.numel, threads=c["threads"], items=c["items"],
                stream=int(stream), vec=vec, params=", ".join(params), args=", ".join(args),
                aligned=aligned, decls=block(decls, 4), loads=block(loads, 12),
                z="const float z = vz[u][j]; " if len(_operands(v)) == 2 else "", expr=_expr(v))


def _tiled_default(v: Variant, d: DeviceInfo) -> dict:
    """Enough tiles to fill every SM a few times over, as many vectors in flight as that allows."""
    vec = _vmax(v)
    n = v.outputs[0].numel
    items = 4
    while items > 1 and n / (256 * items * vec) < 4 * d.sm_count:
        items //= 2
    return {"threads": 256, "items": items, "vec": vec, "cache": "stream"}


_CPU_FLAT = CPU + r"""
{{io}}#define TOTAL {{TOTAL}}L
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
{{decls}}    y_t* y = (y_t*)outputs[0].data;
    #pragma omp parallel for simd schedule(static)
    for (long i = 0; i < TOTAL; ++i) {
{{loads}}        y_st(y, {{yoff}}, {{expr}});
    }
    return 0;
}
"""

# Blocks of BLOCK elements: operands converted into float buffers, one vectorisable loop, then stored.
_CPU_BLOCKED = CPU + r"""
{{io}}#define TOTAL {{TOTAL}}L
#define BLOCK {{block}}
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
{{decls}}    y_t* y = (y_t*)outputs[0].data;
    #pragma omp parallel for schedule(static)
    for (long start = 0; start < TOTAL; start += BLOCK) {
        const long n = TOTAL - start < BLOCK ? TOTAL - start : BLOCK;
        float bx[BLOCK], bz[BLOCK], r[BLOCK];
        for (long k = 0; k < n; ++k) {
            const long i = start + k;
{{buffer_loads}}        }
        #pragma omp simd
        for (long k = 0; k < n; ++k) { const float x = bx[k]; const float z = bz[k]; r[k] = {{expr}}; }
        for (long k = 0; k < n; ++k) { const long i = start + k; y_st(y, {{yoff}}, r[k]); }
    }
    return 0;
}
"""


def _render_cpu(template: str, v: Variant, c: dict) -> str:
    y = v.outputs[0]
    shape = _shape(v)
    io, decls, loads, buffer_loads = cpu_io("y", y), "", "", ""
    for k, (role, sig) in enumerate(_operands(v)):
        if sig is None:
            value = f"{float(v.param_dict['scalar'])!r}f"
        else:
            io += cpu_io(role, sig)
            decls += f"    const {role}_t* p_{role} = (const {role}_t*)inputs[{k}].data;\n"
            value = f"{role}_ld(p_{role}, {_offset(sig, shape)})"
        loads += f"        const float {role} = {value};\n"
        buffer_loads += f"            b{role}[k] = {value};\n"
    if len(_operands(v)) == 1:
        buffer_loads += "            bz[k] = 0.f;\n"
    return fill(template, io=io, TOTAL=y.numel, decls=decls, loads=loads, buffer_loads=buffer_loads,
                yoff=_offset(y, shape), expr=_expr(v), **c)


@strategy(_OPS, "cpu", "flat", level=0, doc="one OpenMP SIMD loop over every output element, broadcasting by index",
          applies=lambda v, d: _ok(v), default=lambda v, d: {})
def _flat(v: Variant, c: dict, dev: DeviceInfo) -> str:
    return _render_cpu(_CPU_FLAT, v, c)


@strategy(_OPS, "cpu", "blocked", level=1,
          doc="OpenMP over blocks: convert to float buffers, one vectorisable compute loop, store",
          space={"block": (256, 1024, 4096)}, applies=lambda v, d: _ok(v), default=lambda v, d: {"block": 1024})
def _blocked(v: Variant, c: dict, dev: DeviceInfo) -> str:
    return _render_cpu(_CPU_BLOCKED, v, c)
