"""Attention on Hopper's tensor cores (``wgmma_tiles``): ``flash_tiles``' algorithm, ABI and numerics, with both
products on warpgroup matrix instructions (CuTe's GMMA atoms, sm_90a).

A block holds ``block_q`` query rows of one head, 64 a warpgroup (128 threads); values 512 wide take two warpgroups
per 64 rows, each owning 256 of the output's values and computing the rows' scores itself (``value_split``: one GMMA
is at most 256 wide, and a 64 x 512 float accumulator is more registers than a thread has). Key and value tiles of
``block_k`` keys come into shared memory in a ring of ``stages`` buffers (``cp.async``, 16 bytes a thread, where
every stride and base pointer allows it; element by element where not), laid out as the GMMA descriptors read them
(128-byte swizzle; query and key width-contiguous, values key-contiguous). Per tile each warpgroup computes S = Q
K^T into float registers (SS GMMA), scales and masks S where it lies, updates its rows' running maximum and sum (a
row is spread over four lanes), rounds the unnormalised probabilities to the input dtype in registers and adds P V
to its float output (RS GMMA: P never leaves registers). Exactly ``flash_tiles``' online softmax: the sum takes the
float probabilities, the product their 16-bit rounding; a row with no key left is zero.

The written-out chain (``softmax_attention``) as ``flash_tiles`` computes it: two sweeps over the key tiles (the
rows' maximum and sum from S alone, then the values), every step rounded on the fragment as eager's operators round
it (the product, the scaling, the soft-capping's three steps, the mask filled or added in the scores' dtype), the
probabilities normalised in float and rounded to the query's dtype; a row that is -inf everywhere is NaN.

Covered (``applies``; ``flash_tiles`` keeps the rest): on sm_90, bfloat16 or float16 query, key, value and output,
query/key width and value width 64, 128, 256 or 512; SDPA with no mask, ``is_causal``, a boolean mask that keeps or
a floating one that is added (a key tile whose mask removes every key of the block's rows is skipped, and one a
boolean mask keeps whole is not tested element by element, as the values read say, never a window's formula),
grouped or expanded key heads; the chain with or without soft-capping and a mask filled or added; any strides. Not
covered: float32, other widths.
"""
from __future__ import annotations

import math

from .....kernels import DeviceInfo
from .....ops import Variant
from .....proposers.builtin._strategy import fill, strategy
from .._spec import score_dtype
from . import _CHAIN, _DEFINES, _SDPA, _TENSORS, _common, _masked, _scaled
from . import _applies as _family_applies

WIDTHS = (64, 128, 256, 512)
_ELEM = {"bfloat16": "cutlass::bfloat16_t", "float16": "cutlass::half_t"}
_MASK_T = {"bool": "unsigned char", "float32": "float", "bfloat16": "cutlass::bfloat16_t",
           "float16": "cutlass::half_t"}
_SCORE_T = {"float32": "float", "bfloat16": "cutlass::bfloat16_t", "float16": "cutlass::half_t"}

_CUDA = r"""#include "kforge.h"
#include "cute/tensor.hpp"
#include "cute/atom/mma_atom.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cute/arch/mma_sm90.hpp"
#include "cute/arch/copy_sm80.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/numeric_types.h"

typedef {{ELEM}} q_t;
typedef q_t o_t;
typedef {{MASK_T}} m_t;
typedef {{SCORE_T}} s_t;
""" + _DEFINES + r"""
#define BQ {{BQ}}
#define BK {{BK}}
#define STAGES {{STAGES}}
#define NV {{NV}}
#define EVW (EV / NV)
#define RG (BQ / 64)
#define NWG (RG * NV)
#define NT (128 * NWG)
#define NQT ((L + BQ - 1) / BQ)
#define NKT ((S + BK - 1) / BK)
#define VEC_STRIDES {{VEC}}
#define SKIP_TILES (MASK == 1 || (MASK == 3 && !CHAIN))
#define SWEEPS (CHAIN ? 2 : 1)
#define KEEP_ALL (1 << 24)

namespace kf_wgmma {
using namespace cute;
using T = q_t;

/* Shared memory, as the GMMA descriptors read it: a row group's query rows [64][E] and a key tile [BK][E] with the
   width contiguous, a value tile viewed as NV slices [EVW][BK] (each key's values contiguous), all 128-byte
   swizzled. */
using SmemQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<_64, Int<E>>{}));
using SmemK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<Int<BK>, Int<E>>{}));
using SmemV = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<Int<EVW>, Int<BK>>{}));
/* S = Q K^T: both operands from shared memory; O += P V: P from registers (K-major), V key-contiguous (MN-major). */
using MmaS = decltype(make_tiled_mma(GMMA::ss_op_selector<T, T, float, Shape<_64, Int<BK>, Int<E>>,
                                                          GMMA::Major::K, GMMA::Major::K>()));
using MmaO = decltype(make_tiled_mma(GMMA::rs_op_selector<T, T, float, Shape<_64, Int<EVW>, Int<BK>>,
                                                          GMMA::Major::K, GMMA::Major::MN>()));
constexpr int QN = 64 * E, KN = BK * E, VN = EVW * BK;
static_assert(cosize_v<SmemQ> == QN && cosize_v<SmemK> == KN && cosize_v<SmemV> == VN, "dense tiles");
static_assert(size(MmaS{}) == 128 && size(MmaO{}) == 128, "one warpgroup per MMA");
/* P is S's accumulator converted element by element: for each thread, fragment element x + 8 kb of S (a 64 x BK float
   accumulator) must be element x of P's k-block kb (a 64 x 16 RS operand), the same row and key. Checked on the
   layouts the atoms declare (thread and value to m + 64 n): the same threads, and S's values equal to P's values
   over BK / 16 k-blocks once both are coalesced; a CuTe whose layouts differ refuses to build instead of mixing
   keys. */
using SC = typename MmaS::LayoutC_TV;
using OA = typename MmaO::LayoutA_TV;
static_assert(std::is_same_v<decltype(coalesce(layout<0>(SC{}))), decltype(coalesce(layout<0>(OA{})))>,
              "S's accumulator and P's operand are spread over the threads alike");
static_assert(std::is_same_v<decltype(coalesce(layout<1>(SC{}))),
                             decltype(coalesce(make_layout(layout<1>(OA{}), Layout<Int<BK / 16>, Int<64 * 16>>{})))>,
              "S's accumulator and P's operand list a thread's values in one order");
constexpr size_t SMEM_BYTES = 1024 + sizeof(T) * (size_t)(RG * QN + STAGES * (KN + NV * VN)) + sizeof(int) * NKT;

__device__ __forceinline__ float m_ld(const m_t* p, long i) { return (float)p[i]; }
__device__ __forceinline__ float q_rd(float x) { return float(T(x)); }
__device__ __forceinline__ float s_rd(float x) { return float(s_t(x)); }

/* rows [row0, row0 + ROWS) of a row-major source (row stride rs, element stride es) into the K-major tile s; rows at
   or past nrows are zero. */
template <int ROWS, int W, class STensor>
__device__ __forceinline__ void load_rows(STensor s, const T* g, long base, long row0, long nrows, long rs, long es,
                                          bool vec) {
    if (vec) {
        constexpr int CH = W / 8;
        for (int x = threadIdx.x; x < ROWS * CH; x += NT) {
            const int r = x / CH, e = (x % CH) * 8;
            const bool in = row0 + r < nrows;
            const T* src = g + base + (in ? (row0 + r) * rs : 0L) + e;
            SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>::copy(*reinterpret_cast<const uint128_t*>(src),
                                                             *reinterpret_cast<uint128_t*>(&s(r, e)), in);
        }
    } else {
        for (int x = threadIdx.x; x < ROWS * W; x += NT) {
            const int r = x / W, e = x % W;
            s(r, e) = row0 + r < nrows ? g[base + (row0 + r) * rs + e * es] : T(0.f);
        }
    }
}

/* keys [j0, j0 + BK) of the values into the NV MN-major slices at sv (slice c / EVW, element (c % EVW, j) = value c
   of key j0 + j). */
__device__ __forceinline__ void load_values(T* sv, const T* g, long base, long j0, bool vec) {
    if (vec) {
        constexpr int CH = EV / 8;
        for (int x = threadIdx.x; x < BK * CH; x += NT) {
            const int j = x / CH, c = (x % CH) * 8;
            const bool in = j0 + j < S;
            const T* src = g + base + (in ? (j0 + j) * VSS : 0L) + c;
            Tensor s = make_tensor(make_smem_ptr(sv + (c / EVW) * VN), SmemV{});
            SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>::copy(*reinterpret_cast<const uint128_t*>(src),
                                                             *reinterpret_cast<uint128_t*>(&s(c % EVW, j)), in);
        }
    } else {
        for (int x = threadIdx.x; x < BK * EV; x += NT) {
            const int j = x / EV, c = x % EV;
            Tensor s = make_tensor(make_smem_ptr(sv + (c / EVW) * VN), SmemV{});
            s(c % EVW, j) = j0 + j < S ? g[base + (j0 + j) * VSS + c * VSE] : T(0.f);
        }
    }
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* One block: BQ query rows of one head, 64 a row group; a row group's NV warpgroups each own EVW of the output's
   values (each computes the group's scores itself: the same instructions on the same data, so the same S). The grid
   runs the query tiles of every head, the last tiles (under is_causal the longest) first. */
__global__ void __launch_bounds__(NT, 1) attention_wgmma(const T* __restrict__ q, const T* __restrict__ k,
                                                         const T* __restrict__ v, const m_t* __restrict__ mk,
                                                         T* __restrict__ o, bool vec) {
    extern __shared__ unsigned char smem_raw[];
    T* base = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
    T* pQ = base;
    T* pK = pQ + RG * QN;
    T* pV = pK + STAGES * KN;
    int* tiles = reinterpret_cast<int*>(pV + STAGES * NV * VN);
    const long bh = blockIdx.x % BH, i0 = (NQT - 1 - (long)(blockIdx.x / BH)) * BQ;
    const int wg = threadIdx.x / 128, wt = threadIdx.x % 128, rg = wg / NV, vs = wg % NV;
    const long qb = QOFF(bh), kb = KOFF(bh), vb = VOFF(bh), mb = MOFF(bh);
    (void)mb;

    /* the key tiles this block visits: under is_causal those that reach the diagonal; with a mask those where it
       keeps some key for some of the block's rows (read from the mask, tile by tile), flagged (KEEP_ALL) where a
       boolean mask keeps every key of the tile for every row, so that the tile is not tested element by element */
    const long jend = CAUSAL ? (i0 + BQ < S ? i0 + BQ : S) : S;
    const int nkt = (int)((jend + BK - 1) / BK);
    int ntiles = nkt;
#if SKIP_TILES
    ntiles = 0;
    for (int t = 0; t < nkt; ++t) {
        int live = 0, blocked = 0;
        for (int x = threadIdx.x; x < BQ * BK && !(live && blocked); x += NT) {
            const long i = i0 + x / BK, j = (long)t * BK + x % BK;
            if (i < L && j < S) {
                const float m = m_ld(mk, mb + i * MSL + j * MSS);
                const bool keeps = MASK == 1 ? m != 0.f : m != KF_NEG_INF;
                live |= keeps;
                blocked |= !keeps;
            }
        }
        const int any_live = __syncthreads_or(live), any_blocked = __syncthreads_or(blocked);
        if (any_live) {
            if (threadIdx.x == 0) tiles[ntiles] = t | (MASK == 1 && !any_blocked ? KEEP_ALL : 0);
            ++ntiles;
        }
    }
    __syncthreads();
#endif
    auto tile_of = [&](int t) -> long { return SKIP_TILES ? (long)(tiles[t] & (KEEP_ALL - 1)) : (long)t; };
    /* the steps: the chain sweeps the tiles twice (the rows' maximum and sum, then the values), SDPA once */
    const int nsteps = SWEEPS * ntiles;
    auto load_kv = [&](int step) {
        const int st = step % STAGES;
        const long j0 = tile_of(step % ntiles) * BK;
        load_rows<BK, E>(make_tensor(make_smem_ptr(pK + st * KN), SmemK{}), k, kb, j0, S, KSS, KSE, vec);
        if (step >= (SWEEPS - 1) * ntiles) load_values(pV + st * NV * VN, v, vb, j0, vec);
    };

    for (int w = 0; w < RG; ++w)
        load_rows<64, E>(make_tensor(make_smem_ptr(pQ + w * QN), SmemQ{}), q, qb, i0 + 64 * w, L, QSL, QSE, vec);
    for (int step = 0; step < STAGES - 1; ++step) {
        if (step < nsteps) load_kv(step);
        cp_async_fence();
    }

    MmaS mma_s;
    MmaO mma_o;
    auto thr_s = mma_s.get_thread_slice(wt);
    auto thr_o = mma_o.get_thread_slice(wt);
    Tensor tSrQ = thr_s.partition_fragment_A(make_tensor(make_smem_ptr(pQ + rg * QN), SmemQ{}));
    Tensor tScS = thr_s.partition_C(make_identity_tensor(Shape<_64, Int<BK>>{}));
    Tensor tOcO = thr_o.partition_C(make_identity_tensor(Shape<_64, Int<EVW>>{}));
    Tensor tOrO = partition_fragment_C(mma_o, Shape<_64, Int<EVW>>{});
    Tensor tOrP = make_tensor<T>(partition_shape_A(mma_o, Shape<_64, Int<BK>>{}));
    // NB: a 16-bit RS operand lists a 64 x BK fragment's values in the order the float accumulator lists them
    static_assert(size(tOrP) == size(tScS), "P takes S's fragment element by element");
    clear(tOrO);
    /* a thread holds parts of two rows, 8 apart; the four lanes lane ^ 1, lane ^ 2 hold the rest of them */
    float row_m[2] = {KF_NEG_INF, KF_NEG_INF}, row_l[2] = {0.f, 0.f};
    const long rbase = i0 + 64 * rg;

    for (int step = 0; step < nsteps; ++step) {
        if (step + STAGES - 1 < nsteps) load_kv(step + STAGES - 1);
        cp_async_fence();
        cp_async_wait<STAGES - 1>();
        cutlass::arch::fence_view_async_shared();   // the tiles' generic writes, before the tensor cores read them
        __syncthreads();
        const int st = step % STAGES, t = step % ntiles;
        const bool stats = CHAIN && step < ntiles;   // the chain's first sweep: the rows' maximum and sum only
        const long j0 = tile_of(t) * BK;
        const bool keep_all = SKIP_TILES && (tiles[t] & KEEP_ALL);
        (void)keep_all;
        Tensor tSrK = thr_s.partition_fragment_B(make_tensor(make_smem_ptr(pK + st * KN), SmemK{}));
        Tensor tOrV = thr_o.partition_fragment_B(make_tensor(make_smem_ptr(pV + (st * NV + vs) * VN), SmemV{}));
        Tensor tSrS = partition_fragment_C(mma_s, Shape<_64, Int<BK>>{});

        mma_s.accumulate_ = GMMA::ScaleOut::Zero;
        warpgroup_fence_operand(tSrS);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int kk = 0; kk < size<2>(tSrQ); ++kk) {
            gemm(mma_s, tSrQ(_, _, kk), tSrK(_, _, kk), tSrS);
            mma_s.accumulate_ = GMMA::ScaleOut::One;
        }
        warpgroup_commit_batch();
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrS);

        /* scale (the chain: each step rounded as eager rounds it, soft-capped), mask, the rows' new maxima */
        float mx[2] = {KF_NEG_INF, KF_NEG_INF};
        /* a tile inside the rows and keys, below the causal diagonal and without a mask to read needs no test */
        const bool edge = j0 + BK > S || rbase + 64 > L || (CAUSAL && j0 + BK - 1 > rbase) || (MASK != 0 && !keep_all);
        CUTE_UNROLL
        for (int x = 0; x < size(tSrS); ++x) {
            const int r = get<0>(tScS(x)), c = get<1>(tScS(x));
""" + _scaled("tSrS(x)", "float ", " " * 12) + r"""            if (edge) {
                const long i = rbase + r, j = j0 + c;
                if (i < L && j < S && (!CAUSAL || j <= i)) {
""" + _masked("mb + i * MSL + j * MSS", " " * 20, guard="!keep_all && ") + r"""                } else {
                    s = KF_NEG_INF;
                }
            }
            tSrS(x) = s;
            mx[(r >> 3) & 1] = fmaxf(mx[(r >> 3) & 1], s);
        }
        if (CHAIN && !stats) {
            /* the chain's second sweep: probabilities normalised by the first sweep's maximum and sum, rounded as
               softmax(...).to(dtype) rounds them (a row that is -inf everywhere: NaN, as eager's softmax) */
            CUTE_UNROLL
            for (int x = 0; x < size(tSrS); ++x) {
                const int h = (get<0>(tScS(x)) >> 3) & 1;
                tOrP(x) = T(expf(tSrS(x) - row_m[h]) / row_l[h]);
            }
        } else {
            float mnew[2], corr[2], sum[2] = {0.f, 0.f};
            CUTE_UNROLL
            for (int h = 0; h < 2; ++h) {
                mnew[h] = fmaxf(row_m[h], quad_max(mx[h]));
                corr[h] = mnew[h] == KF_NEG_INF ? 1.f : expf(row_m[h] - mnew[h]);
            }
            /* the probabilities: summed in float, rounded to the input dtype as the product's operand */
            CUTE_UNROLL
            for (int x = 0; x < size(tSrS); ++x) {
                const int h = (get<0>(tScS(x)) >> 3) & 1;
                const float s = tSrS(x);
                const float p = s == KF_NEG_INF ? 0.f : expf(s - mnew[h]);
                sum[h] += p;
                tOrP(x) = T(p);
            }
            CUTE_UNROLL
            for (int h = 0; h < 2; ++h) {
                row_l[h] = row_l[h] * corr[h] + quad_sum(sum[h]);
                row_m[h] = mnew[h];
            }
            if (!CHAIN) {
                CUTE_UNROLL
                for (int x = 0; x < size(tOrO); ++x) tOrO(x) *= corr[(get<0>(tOcO(x)) >> 3) & 1];
            }
        }
        if (stats) {
            __syncthreads();   // every warpgroup is done with this stage before it is loaded again
            continue;
        }

        warpgroup_fence_operand(tOrP);
        warpgroup_fence_operand(tOrO);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int kk = 0; kk < size<2>(tOrP); ++kk) gemm(mma_o, tOrP(_, _, kk), tOrV(_, _, kk), tOrO);
        warpgroup_commit_batch();
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        __syncthreads();   // every warpgroup is done with this stage before it is loaded again
    }
    cp_async_wait<0>();

    CUTE_UNROLL
    for (int x = 0; x < size(tOrO); ++x) {
        const int r = get<0>(tOcO(x)), c = get<1>(tOcO(x));
        const long i = rbase + r;
        if (i < L) {
            const float l = row_l[(r >> 3) & 1];
            o[OOFF(bh) + i * OSL + (c + vs * EVW) * OSE] = T(CHAIN ? tOrO(x) : l > 0.f ? tOrO(x) / l : 0.f);
        }
    }
}

}  // namespace kf_wgmma

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
""" + _TENSORS + r"""    const uintptr_t bases = reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) |
                            reinterpret_cast<uintptr_t>(v);
    const bool vec = VEC_STRIDES && (bases & 15u) == 0;
    const size_t smem = kf_wgmma::SMEM_BYTES;
    cudaError_t err = cudaFuncSetAttribute(kf_wgmma::attention_wgmma, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem);
    if (err != cudaSuccess) return (int)err;
    kf_wgmma::attention_wgmma<<<(unsigned)(BH * NQT), NT, smem, (cudaStream_t)stream>>>(q, k, v, mk, o, vec);
    return (int)cudaGetLastError();
}
"""

_SPACE = {"block_q": (64, 128), "block_k": (64, 128, 32), "stages": (2, 1)}


def value_split(v: Variant) -> int:
    """Warpgroups that share a row group's output, each ``EV / n`` values wide: one GMMA is at most 256 wide, and a
    64 x 512 float accumulator is more registers than a thread has."""
    return 2 if v.inputs[2].shape[-1] > 256 else 1


def smem_bytes(v: Variant, c: dict) -> int:
    """Shared memory of ``v`` under configuration ``c``: the query rows, ``stages`` key and value tiles (16-bit), the
    visited tiles' list and 1 KiB to align the swizzled tiles."""
    e, ev, S = v.inputs[0].shape[-1], v.inputs[2].shape[-1], v.inputs[1].shape[-2]
    bq, bk, st = c["block_q"], c["block_k"], c["stages"]
    return 1024 + 2 * (bq * e + st * bk * (e + ev)) + 4 * -(-S // bk)


def _registers_fit(v: Variant, c: dict) -> bool:
    # NB: a thread holds EV / NV / 2 output and BK / 2 score floats plus BK / 4 registers of P (past ~200 ptxas
    # spills), and an SM's 64K registers hold at most 2 warpgroups at that size
    nv = value_split(v)
    return (v.inputs[2].shape[-1] // nv // 2 + c["block_k"] * 3 // 4 <= 176
            and c["block_q"] // 64 * nv <= 2)


def _valid(v: Variant, c: dict, d: DeviceInfo) -> bool:
    # NB: 32-key tiles only for widths past 256, where 64-key tiles leave room for one stage only
    wide = v.inputs[0].shape[-1] + v.inputs[2].shape[-1] > 512
    return (smem_bytes(v, c) <= (d.max_shared_per_block or 48 << 10) and _registers_fit(v, c)
            and all(c[k] in vals for k, vals in _SPACE.items()) and (c["block_k"] != 32 or wide))


def _applies(v: Variant, d: DeviceInfo) -> bool:
    if v.op not in (_SDPA, _CHAIN) or not _family_applies(v) or not d.arch.startswith("sm_90"):
        return False
    q, k, val, mask = v.inputs
    if not q.dtype == k.dtype == val.dtype == v.outputs[0].dtype or q.dtype not in _ELEM:
        return False
    if mask is not None and mask.dtype not in _MASK_T:
        return False
    if q.shape[-1] not in WIDTHS or val.shape[-1] not in WIDTHS:
        return False
    return any(_valid(v, c, d) for c in _configs())


def _configs():
    for st in _SPACE["stages"]:
        for bk in _SPACE["block_k"]:
            for bq in _SPACE["block_q"]:
                yield {"block_q": bq, "block_k": bk, "stages": st}


def _default(v: Variant, d: DeviceInfo) -> dict:
    """Two stages where they fit, the widest key tile the registers allow (128 keys; 64 where the values are 256
    wide, 32 past that); 128 query rows (two warpgroups) where there are enough rows to fill the GPU's SMs twice at
    that size, else 64."""
    rows = math.prod(v.inputs[0].shape[:-1])
    big = rows // 128 >= 2 * max(d.sm_count, 1)
    order = sorted(_configs(), key=lambda c: (-c["stages"], -c["block_k"], c["block_q"] != (128 if big else 64)))
    return next(c for c in order if _valid(v, c, d))


def _vec_strides(v: Variant) -> bool:
    """Whether every row of query, key and value starts on 16 bytes (given 16-byte aligned bases) and its width is
    contiguous: the tiles then come by ``cp.async`` 16 bytes at a time."""
    q, k, val, _ = v.inputs
    return all(t.stride[-1] == 1 and all(int(s) % 8 == 0 for s in t.stride[:-1]) for t in (q, k, val))


def _explain(v: Variant, c: dict) -> str:
    nv = value_split(v)
    wgs = c["block_q"] // 64 * nv
    return (f"tensor cores: {c['block_q']} query rows a block ({wgs} warpgroup{'s' if wgs > 1 else ''}"
            + (f", {nv} on each row's values" if nv > 1 else "") + f"), {c['block_k']} keys a tile, "
            f"{c['stages']} stage{'s' if c['stages'] > 1 else ''}")


@strategy((_SDPA, _CHAIN), "cuda", "wgmma_tiles", level=2,
          doc="flash-style on Hopper's tensor cores: S = Q K^T and O += P V by warpgroup MMA (GMMA) with float "
              "accumulators, P kept in registers, key and value tiles by cp.async into swizzled shared memory",
          space=_SPACE, applies=_applies, default=_default, valid=_valid, explain=_explain)
def _attention_wgmma(v: Variant, c: dict, d: DeviceInfo) -> str:
    mask = v.inputs[3]
    score = score_dtype(v) if v.op == _CHAIN else "float32"
    return fill(_CUDA, ELEM=_ELEM[v.inputs[0].dtype], MASK_T=_MASK_T[mask.dtype] if mask is not None else "float",
                SCORE_T=_SCORE_T[score],
                BQ=c["block_q"], BK=c["block_k"], STAGES=c["stages"], NV=value_split(v), VEC=_vec_strides(v),
                **_common(v))
