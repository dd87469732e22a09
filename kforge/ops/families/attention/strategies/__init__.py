"""Attention kernels: ``scaled_dot_product_attention`` and the written-out ``softmax_attention`` chain.

For each query row: s_j = q . k_j (float), scaled; the chain soft-caps (cap * tanh(s / cap)); the mask is applied
(boolean: SDPA keeps True places, a ``masked_fill`` fills them; floating: added); is_causal keeps keys j <= i (the
top-left alignment torch uses); out = sum_j softmax(s)_j v_j. Scores are never stored.

Both designs walk the keys with an online softmax (running maximum and sum, the accumulator rescaled when the maximum
grows), accumulate in float and write the output's dtype once. Rounding follows eager: for SDPA the unnormalised
probabilities are rounded to a 16-bit input's dtype before they weigh the values (as torch's flash kernels feed them
to their second product) and a row with no key left is zero (torch's kernels give zero there); for the written-out
chain every step's result is rounded to its dtype as eager's operators round it (the product, the scaling, each step
of the soft-capping, the mask), and a second pass over the keys weighs the values by the normalised probabilities
rounded to the query's dtype, as ``softmax(...).to(query.dtype)`` gives them; a row that is -inf everywhere is NaN,
as eager's softmax makes it.

The C design (CPU) is one OpenMP task per query row. The CUDA design is flash-style: a block takes ``block_q`` query
rows of one head into shared memory, streams ``block_k`` keys and values at a time through shared memory, computes
the tile's scores, the rows' running maximum and sum by warps, and keeps its part of the output rows in registers.
"""
from __future__ import annotations

import math

from .....kernels import DeviceInfo
from .....kernels._offsets import lin
from .....ops import TensorSig, Variant
from .....ops.families.attention._spec import Geometry, geometry, score_dtype
from .....proposers.builtin._prelude import CPU, CUDA, cpu_io, cpu_round, cuda_types
from .....proposers.builtin._strategy import CUDA_TYPES, FLOATS, fill, strategy

_SDPA, _CHAIN = "scaled_dot_product_attention", "softmax_attention"

# The mask's kinds, as the sources name them: none, boolean that keeps (SDPA), boolean that fills (masked_fill), added
MASK_NONE, MASK_KEEP, MASK_FILL, MASK_ADD = 0, 1, 2, 3


def _geometry(v: Variant) -> Geometry | None:
    q, k, val, mask = v.inputs
    try:
        return geometry(q, k, val, mask, gqa=v.op == _SDPA and bool(v.param_dict.get("enable_gqa")))
    except Exception:
        return None


def _applies(v: Variant) -> bool:
    if v.op not in (_SDPA, _CHAIN) or len(v.inputs) != 4 or len(v.outputs) != 1:
        return False
    q, k, val, mask = v.inputs
    if any(t is None for t in (q, k, val)) or not all(t.dtype in FLOATS for t in (q, k, val, v.outputs[0])):
        return False
    if mask is not None and mask.dtype not in (*FLOATS, "bool"):
        return False
    g = _geometry(v)
    return g is not None and tuple(v.outputs[0].shape) == g.out_shape and g.rows > 0 and g.S > 0


def _lead_offset(var: str, lead: tuple[int, ...], strides, group: int = 1) -> str:
    """A C expression for the first element of leading index ``var`` (row-major over the query's leading dimensions
    ``lead``) in a tensor with those ``strides``; its heads (the last leading dimension) ``group`` query heads each."""
    if group == 1:
        return lin(var, lead, strides)
    terms = []
    for d, (n, st) in enumerate(zip(lead, strides)):
        if n == 1 or st == 0:
            continue
        dense = math.prod(lead[d + 1:])
        coord = f"(({var}) / {dense}L)" if dense != 1 else f"({var})"
        if d > 0:
            coord = f"({coord} % {n}L)"
        if d == len(lead) - 1:
            coord = f"({coord} / {group}L)"
        terms.append(f"{coord} * {st}L")
    return "(" + " + ".join(terms) + ")" if terms else "0L"


def _mask_strides(mask: TensorSig, full: tuple[int, ...]) -> list[int]:
    """The mask's strides broadcast to ``full`` (dimensions it lacks or holds once: 0)."""
    pad = len(full) - len(mask.shape)
    return [0] * pad + [0 if n == 1 else int(st) for n, st in zip(mask.shape, mask.stride)]


def _mask_kind(v: Variant) -> int:
    mask = v.inputs[3]
    if mask is None:
        return MASK_NONE
    if mask.dtype != "bool":
        return MASK_ADD
    return MASK_FILL if v.op == _CHAIN else MASK_KEEP


def _common(v: Variant) -> dict:
    q, k, val, mask = v.inputs
    o = v.outputs[0]
    g = _geometry(v)
    p = v.param_dict
    chain = v.op == _CHAIN
    scale = p["scale"] if p.get("scale") is not None else 1.0 / math.sqrt(g.E)
    softcap = p.get("softcap") if chain else None
    nl = len(g.lead)
    out = dict(BH=math.prod(g.lead), L=g.L, S=g.S, E=g.E, EV=g.EV, CHAIN=chain,
               CAUSAL=bool(p.get("is_causal")) and not chain, MASK=_mask_kind(v), SCALE=float(scale),
               SOFTCAP=softcap is not None, CAP=float(softcap or 1.0),
               FILL=float(p["fill"]) if chain and p.get("fill") is not None else 0.0,
               QOFF=lin("bh", g.lead, q.stride[:nl]), KOFF=_lead_offset("bh", g.lead, k.stride[:nl], g.group),
               VOFF=_lead_offset("bh", g.lead, val.stride[:nl], g.group), OOFF=lin("bh", g.lead, o.stride[:nl]),
               QSL=q.stride[-2], QSE=q.stride[-1], KSS=k.stride[-2], KSE=k.stride[-1], VSS=val.stride[-2],
               VSE=val.stride[-1], OSL=o.stride[-2], OSE=o.stride[-1], MOFF="0L", MSL=0, MSS=0)
    if mask is not None:
        ms = _mask_strides(mask, (*g.lead, g.L, g.S))
        out.update(MOFF=lin("bh", g.lead, ms[:nl]), MSL=ms[-2], MSS=ms[-1])
    return out


_DEFINES = r"""
#define BH {{BH}}L
#define L {{L}}L
#define S {{S}}L
#define E {{E}}
#define EV {{EV}}
#define CHAIN {{CHAIN}}
#define CAUSAL {{CAUSAL}}
#define MASK {{MASK}}
#define SOFTCAP {{SOFTCAP}}
#define SCALE {{SCALE}}
#define CAP {{CAP}}
#define FILL {{FILL}}
#define QOFF(bh) {{QOFF}}
#define KOFF(bh) {{KOFF}}
#define VOFF(bh) {{VOFF}}
#define OOFF(bh) {{OOFF}}
#define MOFF(bh) {{MOFF}}
#define QSL {{QSL}}L
#define QSE {{QSE}}L
#define KSS {{KSS}}L
#define KSE {{KSE}}L
#define VSS {{VSS}}L
#define VSE {{VSE}}L
#define OSL {{OSL}}L
#define OSE {{OSE}}L
#define MSL {{MSL}}L
#define MSS {{MSS}}L
"""

# The entry point's tensors: query, key, value, the mask (NULL when absent), the output.
_TENSORS = r"""    const q_t* q = (const q_t*)inputs[0].data;
    const q_t* k = (const q_t*)inputs[1].data;
    const q_t* v = (const q_t*)inputs[2].data;
    const m_t* mk = (const m_t*)inputs[3].data;
    o_t* o = (o_t*)outputs[0].data;
"""


def _lines(pad: str, *lines: str) -> str:
    """C lines, each but the preprocessor's indented by ``pad``."""
    return "".join(f"{'' if line.startswith('#') else pad}{line}\n" for line in lines)


def _scaled(src: str = "s", decl: str = "", pad: str = "    ") -> str:
    """C statements that give ``s`` the score ``src`` scaled as the operator scales it: the chain's steps rounded as
    eager rounds them (``q_rd``), then soft-capped; SDPA's in float. ``decl`` declares ``s`` where it is new."""
    return _lines(pad, "#if CHAIN", f"{decl}s = q_rd(q_rd({src}) * (float)SCALE);", "#if SOFTCAP",
                  "s = q_rd(s / (float)CAP);", "s = q_rd(tanhf(s));", "s = q_rd(s * (float)CAP);", "#endif",
                  "#else", f"{decl}s = {src} * (float)SCALE;", "#endif")


def _masked(at: str, pad: str = "    ", truth: bool = False, guard: str = "") -> str:
    """C statements that mask the score ``s`` with the mask's element ``at`` (``m_ld``), as ``MASK`` says: a boolean
    one read by its truth (``truth``) or compared with zero; ``guard`` must hold for a keeping mask to remove a key."""
    m = f"m_ld(mk, {at})"
    dropped, filled = (f"!{m}", m) if truth else (f"{m} == 0.f", f"{m} != 0.f")
    return _lines(pad, f"#if MASK == {MASK_KEEP}", f"if ({guard}{dropped}) s = KF_NEG_INF;",
                  f"#elif MASK == {MASK_FILL}", f"if ({filled}) s = q_rd((float)FILL);", f"#elif MASK == {MASK_ADD}",
                  f"s = CHAIN ? s_rd(s + {m}) : s + {m};", "#endif")


def _transform(qualifiers: str, truth: bool = False) -> str:
    """``transform``: key ``j``'s score ``s`` for a query row whose mask row starts at ``mo``, scaled and masked."""
    return (f"{qualifiers} float transform(float s, const m_t* mk, long mo, long j) {{\n" + _scaled()
            + _masked("mo + j * MSS", truth=truth) + "    return s;\n}\n")


# ----------------------------------------------------------------------------- CPU

_CPU = CPU + "{{io}}" + _DEFINES + r"""
/* The score of key j for a query row (its dot product with the key, ``s``), transformed as the operator says:
   scaled; the chain's steps rounded as eager rounds them; soft-capped; masked. */
""" + _transform("static inline", truth=True) + r"""
static inline float dot(const float* qr, const q_t* k, long ko) {
    float s = 0.f;
    for (long e = 0; e < E; ++e) s += qr[e] * q_ld(k, ko + e * KSE);
    return s;
}

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
""" + _TENSORS + r"""    #pragma omp parallel for schedule(dynamic, 4)
    for (long r = 0; r < BH * L; ++r) {
        const long bh = r / L, i = r % L;
        const long qo = QOFF(bh) + i * QSL, ko = KOFF(bh), vo = VOFF(bh), mo = MOFF(bh) + i * MSL;
        const long oo = OOFF(bh) + i * OSL;
        const long jend = CAUSAL ? (i + 1 < S ? i + 1 : S) : S;
        float qr[E], acc[EV];
        for (long e = 0; e < E; ++e) qr[e] = q_ld(q, qo + e * QSE);
        for (long c = 0; c < EV; ++c) acc[c] = 0.f;
        float m = KF_NEG_INF, l = 0.f;
#if CHAIN
        /* first pass: the row's maximum and sum; second: the probabilities, rounded as eager's .to(dtype) */
        for (long j = 0; j < jend; ++j) {
            const float s = transform(dot(qr, k, ko + j * KSS), mk, mo, j);
            if (s > m) { l = m == KF_NEG_INF ? 0.f : l * expf(m - s); m = s; }
            if (m != KF_NEG_INF) l += expf(s - m);
        }
        for (long j = 0; j < jend; ++j) {
            const float p = q_rd(expf(transform(dot(qr, k, ko + j * KSS), mk, mo, j) - m) / l);
            for (long c = 0; c < EV; ++c) acc[c] += p * q_ld(v, vo + j * VSS + c * VSE);
        }
        for (long c = 0; c < EV; ++c) o_st(o, oo + c * OSE, acc[c]);
#else
        for (long j = 0; j < jend; ++j) {
            const float s = transform(dot(qr, k, ko + j * KSS), mk, mo, j);
            if (s == KF_NEG_INF) continue;
            if (s > m) {
                const float corr = m == KF_NEG_INF ? 0.f : expf(m - s);
                l *= corr;
                for (long c = 0; c < EV; ++c) acc[c] *= corr;
                m = s;
            }
            const float p = expf(s - m);
            const float pr = q_rd(p);
            l += p;
            for (long c = 0; c < EV; ++c) acc[c] += pr * q_ld(v, vo + j * VSS + c * VSE);
        }
        const float inv = l > 0.f ? 1.f / l : 0.f;
        for (long c = 0; c < EV; ++c) o_st(o, oo + c * OSE, acc[c] * inv);
#endif
    }
    return 0;
}
"""


def _cpu_mask_io(mask: TensorSig | None) -> str:
    if mask is not None and mask.dtype == "bool":
        return ("typedef uint8_t m_t;\n"
                "static inline float m_ld(const m_t* p, long i) { return (float)p[i]; }\n")
    return cpu_io("m", mask)


def _cpu_source(v: Variant) -> str:
    q, _, _, mask = v.inputs
    io = (cpu_io("q", q) + cpu_io("o", v.outputs[0]) + _cpu_mask_io(mask) + cpu_round("q_rd", q.dtype)
          + cpu_round("s_rd", score_dtype(v) if v.op == _CHAIN else "float32"))
    return fill(_CPU, io=io, **_common(v))


@strategy((_SDPA, _CHAIN), "cpu", "rows", level=0,
          doc="OpenMP over query rows: an online softmax over the keys, float accumulation, scores never stored",
          applies=lambda v, d: _applies(v) and v.inputs[0].shape[-1] <= 4096 and v.inputs[2].shape[-1] <= 4096,
          default=lambda v, d: {},
          explain=lambda v, c: "one query row a task, keys streamed with an online softmax")
def _attention_cpu(v: Variant, c: dict, d: DeviceInfo) -> str:
    return _cpu_source(v)


# ----------------------------------------------------------------------------- CUDA

_CUDA = CUDA + "{{types}}" + _DEFINES + r"""
#define BQ {{BQ}}
#define BK {{BK}}
#define NT {{NT}}
#define NW (NT / 32)
#define EP (E + 1)
#define NO ((BQ * EV + NT - 1) / NT)
#define NQT ((L + BQ - 1) / BQ)

__device__ __forceinline__ float q_rd(float v) { return to_f(from_f<q_t>(v)); }
__device__ __forceinline__ float s_rd(float v) { return to_f(from_f<s_t>(v)); }
__device__ __forceinline__ float m_ld(const m_t* p, long i) { return {{MLOAD}}; }

""" + _transform("__device__ __forceinline__") + r"""
/* One block: BQ query rows of one head. Shared memory (floats): the query tile [BQ][E], a key tile [BK][E + 1],
   a value tile [BK][EV], the tile's scores then probabilities [BQ][BK], and per row its running maximum, sum and
   this tile's rescaling. Thread t keeps output elements t, t + NT, ... of the block's [BQ][EV] rows. The chain takes
   two sweeps over the keys (the rows' maximum and sum, then the normalised, rounded probabilities); SDPA one. */
__global__ void __launch_bounds__(NT) attention_tiles(const q_t* __restrict__ q, const q_t* __restrict__ k,
                                                      const q_t* __restrict__ v, const m_t* __restrict__ mk,
                                                      o_t* __restrict__ o) {
    extern __shared__ float smem[];
    float* Qs = smem;
    float* Ks = Qs + BQ * E;
    float* Vs = Ks + BK * EP;
    float* Ps = Vs + BK * EV;
    float* rowm = Ps + BQ * BK;
    float* rowl = rowm + BQ;
    float* rowc = rowl + BQ;
    const long bh = blockIdx.x / NQT, i0 = (blockIdx.x % NQT) * (long)BQ;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const long qb = QOFF(bh), kb = KOFF(bh), vb = VOFF(bh), mb = MOFF(bh);
    for (int x = tid; x < BQ * E; x += NT) {
        const long i = i0 + x / E;
        Qs[x] = i < L ? to_f(q[qb + i * QSL + (x % E) * QSE]) : 0.f;
    }
    for (int r = tid; r < BQ; r += NT) { rowm[r] = KF_NEG_INF; rowl[r] = 0.f; rowc[r] = 1.f; }
    float acc[NO];
#pragma unroll
    for (int n = 0; n < NO; ++n) acc[n] = 0.f;
    const long jend = CAUSAL ? (i0 + BQ < S ? i0 + BQ : S) : S;
    for (int sweep = CHAIN ? 0 : 1; sweep < 2; ++sweep) {
        const bool stats = CHAIN && sweep == 0, accumulate = sweep == 1;
        for (long j0 = 0; j0 < jend; j0 += BK) {
            __syncthreads();
            for (int x = tid; x < BK * E; x += NT) {
                const long j = j0 + x / E;
                Ks[(x / E) * EP + x % E] = j < S ? to_f(k[kb + j * KSS + (x % E) * KSE]) : 0.f;
            }
            if (accumulate)
                for (int x = tid; x < BK * EV; x += NT) {
                    const long j = j0 + x / EV;
                    Vs[x] = j < S ? to_f(v[vb + j * VSS + (x % EV) * VSE]) : 0.f;
                }
            __syncthreads();
            for (int x = tid; x < BQ * BK; x += NT) {
                const int r = x / BK, c = x % BK;
                const long i = i0 + r, j = j0 + c;
                float s = KF_NEG_INF;
                if (i < L && j < S && (!CAUSAL || j <= i)) {
                    float d = 0.f;
                    const float* qr = Qs + r * E;
                    const float* kr = Ks + c * EP;
#pragma unroll 8
                    for (int e = 0; e < E; ++e) d += qr[e] * kr[e];
                    s = transform(d, mk, mb + i * MSL, j);
                }
                Ps[x] = s;
            }
            __syncthreads();
            for (int r = warp; r < BQ; r += NW) {
                float* pr = Ps + r * BK;
                if (CHAIN && !stats) {
                    /* the second sweep: probabilities normalised by the first's maximum and sum, rounded */
                    const float m = rowm[r], l = rowl[r];
                    for (int c = lane; c < BK; c += 32) pr[c] = q_rd(expf(pr[c] - m) / l);
                    continue;
                }
                float mx = KF_NEG_INF;
                for (int c = lane; c < BK; c += 32) mx = fmaxf(mx, pr[c]);
                mx = warp_max(mx);
                const float mold = rowm[r], mnew = fmaxf(mold, mx);
                const float corr = mnew == KF_NEG_INF ? 1.f : expf(mold - mnew);
                float sum = 0.f;
                for (int c = lane; c < BK; c += 32) {
                    const float p = pr[c] == KF_NEG_INF ? 0.f : expf(pr[c] - mnew);
                    sum += p;
                    pr[c] = q_rd(p);
                }
                sum = warp_sum(sum);
                __syncwarp();
                if (lane == 0) { rowm[r] = mnew; rowl[r] = rowl[r] * corr + sum; rowc[r] = corr; }
            }
            __syncthreads();
            if (!accumulate) continue;
#pragma unroll
            for (int n = 0; n < NO; ++n) {
                const int x = tid + n * NT;
                if (x < BQ * EV) {
                    const int r = x / EV, c = x % EV;
                    float a = CHAIN ? acc[n] : acc[n] * rowc[r];
                    const float* pr = Ps + r * BK;
                    for (int j = 0; j < BK; ++j) a += pr[j] * Vs[j * EV + c];
                    acc[n] = a;
                }
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int n = 0; n < NO; ++n) {
        const int x = tid + n * NT;
        const long i = i0 + x / EV;
        if (x < BQ * EV && i < L) {
            const float l = rowl[x / EV];
            const float out = CHAIN ? acc[n] : (l > 0.f ? acc[n] / l : 0.f);
            o[OOFF(bh) + i * OSL + (x % EV) * OSE] = from_f<o_t>(out);
        }
    }
}

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
""" + _TENSORS + r"""    const size_t smem = {{SMEM}};
    if (smem > 48 * 1024) {
        const cudaError_t err = cudaFuncSetAttribute(attention_tiles, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     (int)smem);
        if (err != cudaSuccess) return (int)err;
    }
    attention_tiles<<<(unsigned)(BH * NQT), NT, smem, (cudaStream_t)stream>>>(q, k, v, mk, o);
    return (int)cudaGetLastError();
}
"""


def smem_bytes(v: Variant, c: dict) -> int:
    """The CUDA design's shared memory for ``v`` under configuration ``c``."""
    e, ev = v.inputs[0].shape[-1], v.inputs[2].shape[-1]
    bq, bk = c["block_q"], c["block_k"]
    return 4 * (bq * e + bk * (e + 1) + bk * ev + bq * bk + 3 * bq)


def _per_thread(v: Variant, c: dict) -> int:
    return -(-c["block_q"] * v.inputs[2].shape[-1] // (32 * c["warps"]))


def _smem_limit(d: DeviceInfo) -> int:
    return d.max_shared_per_block or 48 << 10


def _valid(v: Variant, c: dict, d: DeviceInfo) -> bool:
    return smem_bytes(v, c) <= _smem_limit(d) and _per_thread(v, c) <= 64


_SPACE = {"block_q": (64, 32, 16, 8), "block_k": (32, 64, 16), "warps": (4, 8)}


def _default(v: Variant, d: DeviceInfo) -> dict:
    """The largest query tile that fits (shared memory, registers) with 32-key tiles and four warps; the query
    count caps it."""
    L = v.inputs[0].shape[-2]
    for bq in _SPACE["block_q"]:
        c = {"block_q": bq, "block_k": 32, "warps": 4}
        if _valid(v, c, d) and (bq <= max(L, 8) or bq == 8):
            return c
    return {"block_q": 8, "block_k": 16, "warps": 4}


def _cuda_types(v: Variant) -> str:
    q, _, _, mask = v.inputs
    types = cuda_types({"q": q, "o": v.outputs[0]})
    types += f"typedef {CUDA_TYPES[score_dtype(v) if v.op == _CHAIN else 'float32']} s_t;\n"
    types += "typedef unsigned char m_t;\n" if mask is not None and mask.dtype == "bool" else \
        f"typedef {CUDA_TYPES[mask.dtype] if mask is not None else 'float'} m_t;\n"
    return types


@strategy((_SDPA, _CHAIN), "cuda", "flash_tiles", level=1,
          doc="flash-style: a block's query tile in shared memory, key and value tiles streamed through it, an "
              "online softmax by warps, the output rows in registers, scores never written to memory",
          space=_SPACE,
          applies=lambda v, d: _applies(v) and _valid(v, _default(v, d), d),
          default=_default, valid=_valid,
          explain=lambda v, c: (f"{c['block_q']} query rows a block, {c['block_k']} keys a tile, "
                                f"{c['warps']} warps"))
def _attention_cuda(v: Variant, c: dict, d: DeviceInfo) -> str:
    mask = v.inputs[3]
    mload = "(float)p[i]" if mask is not None and mask.dtype == "bool" else "to_f(p[i])"
    return fill(_CUDA, types=_cuda_types(v), BQ=c["block_q"], BK=c["block_k"], NT=32 * c["warps"],
                SMEM=smem_bytes(v, c), MLOAD=mload, **_common(v))
