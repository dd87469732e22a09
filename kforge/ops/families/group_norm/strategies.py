"""The group_norm family's strategies: group_norm, with a SiLU epilogue (group_norm_silu) and with it and a
per-channel bias prologue (biased_group_norm_silu); statistics in fp32, Welford partials over many blocks where a
group is large, and channels-last designs for the layout twins. Part of the proposers layer (the built-in library
imports it by ``Family.strategies``); it shares the row norms' helpers (kforge/proposers/builtin/_norms.py)."""
from __future__ import annotations

from ....kernels import DeviceInfo
from ....ops import TensorSig, Variant, has_prologue
from ....proposers.builtin._norms import _eps, widest_vector
from ....proposers.builtin._prelude import CPU, CUDA, cpu_io, cuda_types
from ....proposers.builtin._strategy import contiguous, fill, floats_only, prod, strategy


def _sigs(v: Variant) -> dict[str, TensorSig | None]:
    """x, p (a per-channel bias added to x first: biased_group_norm_silu; else absent), w, b and y."""
    x, p, w, b = v.inputs if has_prologue(v.op) else (v.inputs[0], None, *v.inputs[1:])
    return {"x": x, "p": p, "w": w, "b": b, "y": v.outputs[0]}


def _ok(v: Variant) -> bool:
    sigs = _sigs(v)
    return floats_only(*sigs.values()) and contiguous(*sigs.values()) and v.inputs[0].numel > 0


def _vmax(v: Variant, length: int) -> int:
    return widest_vector(_sigs(v), length)


def _types(v: Variant) -> str:
    return cuda_types(_sigs(v))


def _cpu_io(v: Variant) -> str:
    return "".join(cpu_io(role, sig) for role, sig in _sigs(v).items())


# ----------------------------------------------------------------------------- group_norm (CUDA)

# the second with a SiLU epilogue on each output element, the third with it and a per-channel bias prologue
_GN_OPS = ("group_norm", "group_norm_silu", "biased_group_norm_silu")
_GN_PLAIN = ("group_norm", "group_norm_silu")   # the ops of the designs without the prologue

def _gn_dims(v: Variant) -> tuple[int, int, int, int]:
    """(N, C, spatial size, groups)."""
    shape = v.inputs[0].shape
    return shape[0], shape[1], prod(shape[2:]), v.param_dict["num_groups"]


def _channels_last(sig: TensorSig) -> bool:
    """N,C,* laid out as N,*,C (NHWC), densely (a dim of size 1 may have any stride)."""
    shape, stride = sig.shape, sig.stride
    order = [1] + list(range(len(shape) - 1, 1, -1)) + [0]   # fastest first: C, then the spatial dims, then N
    expect = 1
    for d in order:
        if shape[d] != 1 and stride[d] != expect:
            return False
        expect *= shape[d]
    return True


def _gn_nhwc(v: Variant) -> bool:
    """Input and output channels-last (and not also contiguous: then the contiguous form is used)."""
    x, y = v.inputs[0], v.outputs[0]
    return (len(x.shape) >= 3 and not x.is_contiguous and x.stride == y.stride and _channels_last(x)
            and contiguous(*v.inputs[1:]))


def _gn_ok(v: Variant) -> bool:
    if len(v.inputs[0].shape) < 2 or v.inputs[0].numel == 0 or not floats_only(*_sigs(v).values()):
        return False
    if not (_ok(v) or _gn_nhwc(v)):
        return False
    n, c, hw, g = _gn_dims(v)
    return c % g == 0 and all(s is None or s.numel == c for s in v.inputs[1:])


def _gn_vmax(v: Variant) -> int:
    """Vector width: dividing the run of one channel (contiguous) or of one group's channels (NHWC)."""
    n, c, hw, g = _gn_dims(v)
    return _vmax(v, c // g if _gn_nhwc(v) else hw)


def _gn_group_size(v: Variant) -> int:
    n, c, hw, g = _gn_dims(v)
    return c // g * hw


_GN = CUDA + r"""
{{types}}#define GROUPS {{GROUPS}}
#define G {{G}}
#define CPG {{CPG}}
#define HW {{HW}}
#define GSIZE ((long)CPG * HW)
#define EPS {{EPS}}
#define HAS_W {{HAS_W}}
#define HAS_B {{HAS_B}}
#define SILU {{SILU}}
#define NHWC {{NHWC}}
#define THREADS {{threads}}
#define SPLIT {{split}}
/* Element i of group grp (i in [0, GSIZE)): where it lives and its channel. Contiguous N,C,*: a group
   is one block of GSIZE elements. Channels-last (NHWC): HW runs of CPG channels, C apart. */
#define CH_ALL ((long)G * CPG)
#define OFF(grp, i) (NHWC ? ((grp) / G) * HW * CH_ALL + ((i) / CPG) * CH_ALL + ((grp) % G) * CPG + (i) % CPG \
                          : (grp) * GSIZE + (i))
#define CHAN(grp, i) ((int)(((grp) % G) * CPG + (NHWC ? (i) % CPG : (i) / HW)))

template <int V> struct Chunk { static constexpr long LEN = ((GSIZE + SPLIT - 1) / SPLIT + V - 1) / V * V; };

/* Welford statistics of [begin, end) of one group, merged over the block. */
template <int V>
__device__ __forceinline__ Welford chunk_stats(const x_t* __restrict__ x, long grp, long begin, long end, float* scratch) {
    Welford acc = {0.f, 0.f, 0.f};
    for (long i = begin + threadIdx.x * V; i < end; i += THREADS * V) {
        float v[V], s = 0.f, q = 0.f;
        load_vec<V>(x + OFF(grp, i), v);
#pragma unroll
        for (int j = 0; j < V; ++j) s += v[j];
        const float m = s / V;
#pragma unroll
        for (int j = 0; j < V; ++j) q += (v[j] - m) * (v[j] - m);
        acc.merge(V, m, q);
    }
    return block_welford<THREADS>(acc, scratch);
}

/* y = x * a + shift with a = rstd * w[c], shift = b[c] - mean * a (per channel, as torch); then
   y * sigmoid(y) where the operator is group_norm_silu. */
template <int V>
__device__ __forceinline__ void normalise(const x_t* __restrict__ x, y_t* __restrict__ y, const w_t* __restrict__ w,
                                          const b_t* __restrict__ b, long grp, long begin, long end, float mean, float rstd) {
    for (long i = begin + threadIdx.x * V; i < end; i += THREADS * V) {
        float v[V];
        const long o = OFF(grp, i);
        load_vec<V>(x + o, v);
        /* NB: V divides HW (contiguous: one channel per vector) or CPG (NHWC: channels c0 .. c0 + V - 1) */
        const int c0 = CHAN(grp, i);
        float a = 0.f, shift = 0.f;
#pragma unroll
        for (int j = 0; j < V; ++j) {
            if (NHWC || j == 0) {
                const int c = c0 + (NHWC ? j : 0);
                a = HAS_W ? rstd * to_f(w[c]) : rstd;
                shift = (HAS_B ? to_f(b[c]) : 0.f) - mean * a;
            }
            v[j] = v[j] * a + shift;
            if (SILU) v[j] = v[j] / (1.f + __expf(-v[j]));
        }
        store_vec<V>(y + o, v);
    }
}

template <int V>
__global__ void __launch_bounds__(THREADS) gn_fused(const x_t* __restrict__ x, const w_t* __restrict__ w,
                                                   const b_t* __restrict__ b, y_t* __restrict__ y) {
    __shared__ float scratch[96];
    const long grp = blockIdx.x;
    const Welford s = chunk_stats<V>(x, grp, 0, GSIZE, scratch);
    normalise<V>(x, y, w, b, grp, 0, GSIZE, s.mean, rsqrtf(s.m2 / GSIZE + EPS));
}

template <int V>
__global__ void __launch_bounds__(THREADS) gn_partials(const x_t* __restrict__ x, float* __restrict__ part) {
    __shared__ float scratch[96];
    const long grp = blockIdx.y, begin = blockIdx.x * Chunk<V>::LEN;
    const long end = begin + Chunk<V>::LEN < GSIZE ? begin + Chunk<V>::LEN : GSIZE;
    const Welford s = chunk_stats<V>(x, grp, begin, end, scratch);
    if (threadIdx.x == 0) {
        float* p = part + 3 * (grp * SPLIT + blockIdx.x);
        p[0] = s.n; p[1] = s.mean; p[2] = s.m2;
    }
}

template <int V>
__global__ void __launch_bounds__(THREADS) gn_normalise(const x_t* __restrict__ x, const float* __restrict__ part,
                                                       const w_t* __restrict__ w, const b_t* __restrict__ b, y_t* __restrict__ y) {
    __shared__ float stats[2];
    const long grp = blockIdx.y, begin = blockIdx.x * Chunk<V>::LEN;
    const long end = begin + Chunk<V>::LEN < GSIZE ? begin + Chunk<V>::LEN : GSIZE;
    if (threadIdx.x < 32) {
        Welford acc = {0.f, 0.f, 0.f};
        for (int k = threadIdx.x; k < SPLIT; k += 32) {
            const float* p = part + 3 * (grp * SPLIT + k);
            acc.merge(p[0], p[1], p[2]);
        }
        acc.merge_lanes(32);
        if (threadIdx.x == 0) { stats[0] = acc.mean; stats[1] = rsqrtf(acc.m2 / GSIZE + EPS); }
    }
    __syncthreads();
    normalise<V>(x, y, w, b, grp, begin, end, stats[0], stats[1]);
}

template <int V> static void run(const x_t* x, const w_t* w, const b_t* b, y_t* y, float* part, cudaStream_t stream) {
    if (SPLIT == 1) {
        gn_fused<V><<<GROUPS, THREADS, 0, stream>>>(x, w, b, y);
    } else {
        const dim3 grid(SPLIT, GROUPS);
        gn_partials<V><<<grid, THREADS, 0, stream>>>(x, part);
        gn_normalise<V><<<grid, THREADS, 0, stream>>>(x, part, w, b, y);
    }
}

KF_ENTRY size_t kf_workspace_bytes(void) { return SPLIT == 1 ? 0 : sizeof(float) * 3 * (size_t)GROUPS * SPLIT; }

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const x_t* x = (const x_t*)inputs[0].data;
    y_t* y = (y_t*)outputs[0].data;
    if ({{vec}} > 1 && (uintptr_t)x % 16 == 0 && (uintptr_t)y % 16 == 0)
        run<{{vec}}>(x, (const w_t*)inputs[1].data, (const b_t*)inputs[2].data, y, (float*)workspace, (cudaStream_t)stream);
    else
        run<1>(x, (const w_t*)inputs[1].data, (const b_t*)inputs[2].data, y, (float*)workspace, (cudaStream_t)stream);
    return (int)cudaGetLastError();
}
"""


def _gn_common(v: Variant, c: dict) -> dict:
    n, ch, hw, g = _gn_dims(v)
    sigs = _sigs(v)
    return dict(types=_types(v), GROUPS=n * g, G=g, CPG=ch // g, HW=hw, EPS=_eps(v),
                HAS_W=sigs["w"] is not None, HAS_B=sigs["b"] is not None, SILU=v.op != "group_norm",
                PRE=sigs["p"] is not None, NHWC=_gn_nhwc(v), **c)


def _gn_default_split(v: Variant, dev: DeviceInfo) -> int:
    groups, size = _gn_dims(v)[0] * _gn_dims(v)[3], _gn_group_size(v)
    split = 1
    while split < 256 and groups * split < 4 * dev.sm_count and size // (split * 2) >= 8192:
        split *= 2
    return split


@strategy(_GN_PLAIN, "cuda", "block_group", level=1,
          doc="one block per (sample, group): Welford statistics over 16-byte loads, then the per-channel affine",
          space={"threads": (256, 512, 1024), "vec": (1, 2, 4, 8)}, applies=lambda v, d: _gn_ok(v),
          default=lambda v, d: {"threads": 512, "vec": _gn_vmax(v)},
          valid=lambda v, c, d: c["vec"] <= _gn_vmax(v),
          fit=lambda v, d: 3.0 if _gn_default_split(v, d) == 1 else 1.0)
def _gn_block_group(v: Variant, c: dict, d: DeviceInfo) -> str:
    return fill(_GN, **_gn_common(v, {**c, "split": 1}))


@strategy(_GN_PLAIN, "cuda", "split", level=3,
          doc="each group split over many blocks: Welford partials in the workspace, merged by the "
              "normalise pass (second read mostly from L2)",
          space={"split": (2, 4, 8, 16, 32, 64, 128, 256), "threads": (256, 512, 1024), "vec": (1, 2, 4, 8)},
          applies=lambda v, d: _gn_ok(v) and _gn_group_size(v) >= 16384,
          default=lambda v, d: {"split": max(2, _gn_default_split(v, d)), "threads": 512, "vec": _gn_vmax(v)},
          valid=lambda v, c, d: c["vec"] <= _gn_vmax(v),
          fit=lambda v, d: 4.0 if _gn_default_split(v, d) >= 4 else 0.5,
          explain=lambda v, c: (f"split each of the {_gn_dims(v)[0] * _gn_dims(v)[3]} groups of "
                                f"{_gn_group_size(v)} elements over {c['split']} blocks of {c['threads']} threads, "
                                "Welford partials then normalise"))
def _gn_split(v: Variant, c: dict, d: DeviceInfo) -> str:
    return fill(_GN, **_gn_common(v, c))

_GN_NHWC = CUDA + r"""
{{types}}#define NB {{N}}
#define G {{G}}
#define CPG {{CPG}}
#define C ((long)G * CPG)
#define HW {{HW}}
#define EPS {{EPS}}
#define HAS_W {{HAS_W}}
#define HAS_B {{HAS_B}}
#define SILU {{SILU}}
#define PRE {{PRE}}
#define THREADS {{threads}}
#define V {{vec}}
#define TILES {{tiles}}
#define UNROLL {{unroll}}
/* Blocks an SM must hold at once (the knob `bound`): the waves of tiles the grid is sized for (at most what the
   SM's threads allow), so the compiler keeps each thread's registers within that; 1 without the bound. NB: at 33-40 registers a thread, 512-thread blocks
   fit 3 to an SM, not the 4 the grid was sized for: a second, mostly empty round of tiles (found reading ptxas'
   register counts after the bias prologue ran 50 us slower than the plain twin of [1,128,1024,1024] on the H200) */
#define MINB {{minb}}
/* Channels-last N,*,C: every position's C channels are one dense run. A thread owns V adjacent channels
   (one group's: V divides CPG) and walks positions, LANES threads covering a position's run (coalesced),
   ROWS positions a block at a time. Statistics: per-thread Welford over its channels, merged per group
   in the block, one partial per (sample, group, tile); a second kernel merges a group's TILES partials;
   the third normalises with each thread's per-channel scale and shift held in registers. PRE: x is a
   convolution's output before its bias, p that bias, added to each element as it is loaded. */
#define LANES ((int)(C / V))
#define ROWS (THREADS / LANES)
#define PT ((HW + TILES - 1) / TILES)

template <bool VEC> __device__ __forceinline__ void load_ch(const x_t* p, float (&v)[V]) {
    if (VEC) { load_vec<V>(p, v); } else {
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = to_f(p[j]);
    }
}

/* The thread's V channels' prologue bias (zeros without one). */
__device__ __forceinline__ void load_pre(const p_t* __restrict__ pb, int c0, float (&pv)[V]) {
#pragma unroll
    for (int j = 0; j < V; ++j) pv[j] = PRE ? to_f(pb[c0 + j]) : 0.f;
}

template <bool VEC>
__global__ void __launch_bounds__(THREADS, MINB) gn_tile_partials(const x_t* __restrict__ x, const p_t* __restrict__ pb,
                                                           float* __restrict__ part) {
    __shared__ float sh[3][THREADS];
    const int lane = threadIdx.x % LANES, row = threadIdx.x / LANES;
    const long n = blockIdx.y, p0 = (long)blockIdx.x * PT;
    const long p1 = p0 + PT < HW ? p0 + PT : HW;
    Welford acc = {0.f, 0.f, 0.f};
    if (row < ROWS) {
        float pv[V];
        load_pre(pb, lane * V, pv);
        const x_t* xs = x + n * HW * C + (long)lane * V;
        /* UNROLL positions' loads in flight before their statistics are merged */
        for (long p = p0 + row; p < p1; p += (long)ROWS * UNROLL) {
            float v[UNROLL][V];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                if (p + (long)u * ROWS < p1) load_ch<VEC>(xs + (p + (long)u * ROWS) * C, v[u]);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (p + (long)u * ROWS >= p1) break;
                float s = 0.f, q = 0.f;
#pragma unroll
                for (int j = 0; j < V; ++j) { v[u][j] += pv[j]; s += v[u][j]; }
                const float m = s / V;
#pragma unroll
                for (int j = 0; j < V; ++j) q += (v[u][j] - m) * (v[u][j] - m);
                acc.merge(V, m, q);
            }
        }
    }
    sh[0][threadIdx.x] = acc.n; sh[1][threadIdx.x] = acc.mean; sh[2][threadIdx.x] = acc.m2;
    __syncthreads();
    /* group gi: lanes [gi * CPG / V, (gi + 1) * CPG / V) of every row */
    for (int gi = threadIdx.x; gi < G; gi += THREADS) {
        Welford w = {0.f, 0.f, 0.f};
        for (int r = 0; r < ROWS; ++r)
            for (int l = gi * (CPG / V); l < (gi + 1) * (CPG / V); ++l) {
                const int t = r * LANES + l;
                w.merge(sh[0][t], sh[1][t], sh[2][t]);
            }
        float* out = part + 3 * ((n * G + gi) * TILES + blockIdx.x);
        out[0] = w.n; out[1] = w.mean; out[2] = w.m2;
    }
}

/* One warp per (sample, group): its TILES partials merged into mean and rstd. */
__global__ void __launch_bounds__(32) gn_tile_stats(const float* __restrict__ part, float* __restrict__ stats) {
    const long ng = blockIdx.x;
    Welford acc = {0.f, 0.f, 0.f};
    for (int k = threadIdx.x; k < TILES; k += 32) {
        const float* p = part + 3 * (ng * TILES + k);
        acc.merge(p[0], p[1], p[2]);
    }
    acc.merge_lanes(32);
    if (threadIdx.x == 0) { stats[2 * ng] = acc.mean; stats[2 * ng + 1] = rsqrtf(acc.m2 / ((float)CPG * HW) + EPS); }
}

template <bool VEC>
__global__ void __launch_bounds__(THREADS, MINB) gn_tile_normalise(const x_t* __restrict__ x, const p_t* __restrict__ pb,
                                                            const float* __restrict__ stats,
                                                            const w_t* __restrict__ w, const b_t* __restrict__ b,
                                                            y_t* __restrict__ y) {
    const int lane = threadIdx.x % LANES, row = threadIdx.x / LANES;
    if (row >= ROWS) return;
    const long n = blockIdx.y, p0 = (long)blockIdx.x * PT;
    const long p1 = p0 + PT < HW ? p0 + PT : HW;
    const int c0 = lane * V, gi = c0 / CPG;
    const float mean = stats[2 * (n * G + gi)], rstd = stats[2 * (n * G + gi) + 1];
    float a[V], shift[V], pv[V];
    load_pre(pb, c0, pv);
#pragma unroll
    for (int j = 0; j < V; ++j) {
        a[j] = HAS_W ? rstd * to_f(w[c0 + j]) : rstd;
        shift[j] = (HAS_B ? to_f(b[c0 + j]) : 0.f) + (pv[j] - mean) * a[j];   /* (x + p - mean) * a + b */
    }
    const long base = n * HW * C + c0;
    for (long p = p0 + row; p < p1; p += (long)ROWS * UNROLL) {
        float v[UNROLL][V];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (p + (long)u * ROWS < p1) load_ch<VEC>(x + base + (p + (long)u * ROWS) * C, v[u]);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const long q = p + (long)u * ROWS;
            if (q >= p1) break;
#pragma unroll
            for (int j = 0; j < V; ++j) {
                v[u][j] = v[u][j] * a[j] + shift[j];
                /* NB: __fdividef (a reciprocal and a multiply; 0 where exp overflows, as the SiLU's limit is), not
                   IEEE division, whose slow-path check sits in the loop that is meant to be bandwidth-bound */
                if (SILU) v[u][j] = __fdividef(v[u][j], 1.f + __expf(-v[u][j]));
            }
            if (VEC) { store_vec<V>(y + base + q * C, v[u]); } else {
#pragma unroll
                for (int j = 0; j < V; ++j) y[base + q * C + j] = from_f<y_t>(v[u][j]);
            }
        }
    }
}

template <bool VEC> static void run(const x_t* x, const p_t* pb, const w_t* w, const b_t* b, y_t* y, float* ws,
                                    cudaStream_t stream) {
    float* part = ws;
    float* stats = ws + 3L * NB * G * TILES;
    const dim3 grid(TILES, NB);
    gn_tile_partials<VEC><<<grid, THREADS, 0, stream>>>(x, pb, part);
    gn_tile_stats<<<NB * G, 32, 0, stream>>>(part, stats);
    gn_tile_normalise<VEC><<<grid, THREADS, 0, stream>>>(x, pb, stats, w, b, y);
}

KF_ENTRY size_t kf_workspace_bytes(void) { return sizeof(float) * (3 * (size_t)NB * G * TILES + 2 * (size_t)NB * G); }

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const x_t* x = (const x_t*)inputs[0].data;
    y_t* y = (y_t*)outputs[0].data;
    const p_t* pb = PRE ? (const p_t*)inputs[1].data : (const p_t*)0;
    const w_t* w = (const w_t*)inputs[1 + PRE].data;
    const b_t* b = (const b_t*)inputs[2 + PRE].data;
    if (V > 1 && (uintptr_t)x % 16 == 0 && (uintptr_t)y % 16 == 0)
        run<true>(x, pb, w, b, y, (float*)workspace, (cudaStream_t)stream);
    else
        run<false>(x, pb, w, b, y, (float*)workspace, (cudaStream_t)stream);
    return (int)cudaGetLastError();
}
"""


def _gn_tile_ok(v: Variant) -> bool:
    """Channels-last group_norm the tile design takes: a position's channels split over at most 1024
    threads in vectors of one group's channels."""
    if not (_gn_ok(v) and _gn_nhwc(v)):
        return False
    n, c, hw, g = _gn_dims(v)
    return c // _gn_vmax(v) <= 1024 and n <= 65535   # NB: the samples are the grid's y dimension


def _gn_tile_threads(v: Variant, vec: int, threads: int) -> int:
    """``threads`` rounded down to a whole number of positions (C / vec lanes each), at least one position
    (``valid`` keeps the result within 1024)."""
    lanes = _gn_dims(v)[1] // vec
    return max(threads // lanes, 1) * lanes


def _gn_tile_config(v: Variant, c: dict, d: DeviceInfo) -> dict:
    # NB: configurations from before a knob (stores, tests) render as they did: one position's loads at a time, no
    # register bound
    c = {"unroll": 1, "bound": 0, **c}
    n, ch, hw, g = _gn_dims(v)
    threads = _gn_tile_threads(v, c["vec"], c["threads"])
    rows = threads // (ch // c["vec"])
    tiles = max(1, min(-(-c["waves"] * d.sm_count // n), -(-hw // rows)))
    minb = max(1, min(c["waves"], 2048 // threads)) if c["bound"] else 1
    return {**c, "threads": threads, "tiles": tiles, "minb": minb}


@strategy(_GN_OPS, "cuda", "nhwc_tiles", level=1,
          doc="channels-last: each thread owns adjacent channels of one group and walks positions (coalesced "
              "runs of C), per-tile Welford partials per group, merged, then normalised with per-thread scale",
          space={"threads": (128, 256, 512, 1024), "vec": (1, 2, 4, 8), "waves": (2, 4, 8, 16), "unroll": (1, 4),
                 "bound": (1, 0)},
          applies=lambda v, d: _gn_tile_ok(v),
          # NB: 512 threads, 4 blocks an SM: the fastest of three configurations timed on three of the four SD3.5
          # VAE twins on the H200, 9% behind 1024 threads on the fourth (gn_twins_h200_2026-12-03l.json)
          # "bound": registers capped so the blocks the grid is sized for fit an SM at once (ptxas counted 33-39
          # registers a thread in the prologue's kernels). On the H200 it made the biased twins 1.2-18.8% faster
          # (275.3 -> 231.8 us at [1,128,1024,1024]) and the plain ones 0-5.9% slower (75.5 -> 80.0 us at
          # [1,512,256,256]; gn_twins_*_h200_2026-12-03q.txt): on where the operator has the prologue
          default=lambda v, d: {"threads": 512, "vec": _gn_vmax(v), "waves": 4, "unroll": 1,
                                "bound": int(has_prologue(v.op))},
          valid=lambda v, c, d: (c["vec"] <= _gn_vmax(v) and _gn_dims(v)[1] // c["vec"] <= 1024
                                 and _gn_tile_threads(v, c["vec"], c["threads"]) <= 1024),
          fit=lambda v, d: 6.0,
          explain=lambda v, c: (f"{c['vec']} channels a thread, {c['threads']}-thread blocks, "
                                f"{c['waves']} blocks per SM over the positions, {c.get('unroll', 1)} positions' "
                                "loads in flight" + (", registers bounded so they fit at once" if c.get("bound") else "")
                                + "; three kernels"))
def _gn_nhwc_tiles(v: Variant, c: dict, d: DeviceInfo) -> str:
    n = _gn_dims(v)[0]
    return fill(_GN_NHWC, **_gn_common(v, _gn_tile_config(v, c, d)), N=n)


# ----------------------------------------------------------------------------- group_norm (CPU)

_CPU_GN_HEAD = CPU + r"""
#include <stdlib.h>
{{io}}#define GROUPS {{GROUPS}}
#define G {{G}}
#define CPG {{CPG}}
#define HW {{HW}}
#define GSIZE ((long)CPG * HW)
#define EPS {{EPS}}
#define HAS_W {{HAS_W}}
#define HAS_B {{HAS_B}}
#define SILU {{SILU}}
#define PRE {{PRE}}
#define NHWC {{NHWC}}
#define CH_ALL ((long)G * CPG)
/* Where channel cl (of the group's CPG) of group grp is at spatial position i: contiguous N,C,* or
   channels-last (NHWC). */
#define AT(grp, cl, i) (NHWC ? ((grp) / G) * HW * CH_ALL + (i) * CH_ALL + ((grp) % G) * CPG + (cl) \
                             : (grp) * GSIZE + (cl) * HW + (i))
/* The value normalised there: x, plus the per-channel prologue bias p where the operator has one. */
#define XV(grp, cl, i) (x_ld(x, AT(grp, cl, i)) + (PRE ? p_ld(p, ((grp) % G) * CPG + (cl)) : 0.f))

static inline float epilogue(float y) { return SILU ? y / (1.f + expf(-y)) : y; }

/* Normalise channels [c_begin, c_end) of group `grp` with its statistics. */
static inline void write_channels(const x_t* x, const p_t* p, const w_t* w, const b_t* b, y_t* y, long grp,
                                  long c_begin, long c_end, double mean, double var) {
    const float rstd = (float)(1.0 / sqrt((var > 0.0 ? var : 0.0) + EPS));
#if NHWC
    /* channels-last: a group's channels are adjacent at each position, so position outer, channel inner */
    float a[CPG], shift[CPG];
    for (long cl = c_begin; cl < c_end; ++cl) {
        const long c = (grp % G) * CPG + cl;
        a[cl] = HAS_W ? rstd * w_ld(w, c) : rstd;
        shift[cl] = (HAS_B ? b_ld(b, c) : 0.f) - (float)mean * a[cl];
    }
    for (long i = 0; i < HW; ++i) {
        #pragma omp simd
        for (long cl = c_begin; cl < c_end; ++cl) y_st(y, AT(grp, cl, i), epilogue(XV(grp, cl, i) * a[cl] + shift[cl]));
    }
#else
    for (long cl = c_begin; cl < c_end; ++cl) {
        const long c = (grp % G) * CPG + cl;
        const float a = HAS_W ? rstd * w_ld(w, c) : rstd;
        const float shift = (HAS_B ? b_ld(b, c) : 0.f) - (float)mean * a;
        for (long i = 0; i < HW; ++i) y_st(y, AT(grp, cl, i), epilogue(XV(grp, cl, i) * a + shift));
    }
#endif
}

/* The sum and sum of squares of group `grp`, in the order its elements lie in memory. */
static inline void group_sums(const x_t* x, const p_t* p, long grp, double* s_out, double* q_out) {
    double s = 0.0, q = 0.0;
#if NHWC
    for (long i = 0; i < HW; ++i) {
        #pragma omp simd reduction(+:s, q)
        for (long cl = 0; cl < CPG; ++cl) { const double v = XV(grp, cl, i); s += v; q += v * v; }
    }
#else
    for (long cl = 0; cl < CPG; ++cl) {
        #pragma omp simd reduction(+:s, q)
        for (long i = 0; i < HW; ++i) { const double v = XV(grp, cl, i); s += v; q += v * v; }
    }
#endif
    *s_out = s; *q_out = q;
}
"""

# One thread per group: one double-precision pass for the statistics, one to normalise.
_CPU_GN_PER_GROUP = _CPU_GN_HEAD + r"""
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const x_t* x = (const x_t*)inputs[0].data;
    const p_t* p = PRE ? (const p_t*)inputs[1].data : (const p_t*)0;
    y_t* y = (y_t*)outputs[0].data;
    #pragma omp parallel for schedule(static)
    for (long grp = 0; grp < GROUPS; ++grp) {
        double s, q;
        group_sums(x, p, grp, &s, &q);
        const double mean = s / GSIZE;
        write_channels(x, p, (const w_t*)inputs[1 + PRE].data, (const b_t*)inputs[2 + PRE].data, y, grp, 0, CPG, mean,
                       q / GSIZE - mean * mean);
    }
    return 0;
}
"""

# Channels of every group spread over all threads: partial sums per channel, then normalise per channel.
_CPU_GN_PER_CHANNEL = _CPU_GN_HEAD + r"""
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const x_t* x = (const x_t*)inputs[0].data;
    const p_t* p = PRE ? (const p_t*)inputs[1].data : (const p_t*)0;
    y_t* y = (y_t*)outputs[0].data;
    double* part = (double*)malloc(sizeof(double) * 2 * GROUPS * CPG);
    if (!part) return 1;
    #pragma omp parallel for schedule(static)
    for (long k = 0; k < (long)GROUPS * CPG; ++k) {
        double s = 0.0, q = 0.0;
        #pragma omp simd reduction(+:s, q)
        for (long i = 0; i < HW; ++i) { const double v = XV(k / CPG, k % CPG, i); s += v; q += v * v; }
        part[2 * k] = s; part[2 * k + 1] = q;
    }
    #pragma omp parallel for schedule(static)
    for (long k = 0; k < (long)GROUPS * CPG; ++k) {
        const long grp = k / CPG;
        double s = 0.0, q = 0.0;
        for (long j = 0; j < CPG; ++j) { s += part[2 * (grp * CPG + j)]; q += part[2 * (grp * CPG + j) + 1]; }
        const double mean = s / GSIZE;
        write_channels(x, p, (const w_t*)inputs[1 + PRE].data, (const b_t*)inputs[2 + PRE].data, y, grp, k % CPG,
                       k % CPG + 1, mean, q / GSIZE - mean * mean);
    }
    free(part);
    return 0;
}
"""


def _cpu_gn_render(template: str, v: Variant) -> str:
    common = _gn_common(v, {})
    del common["types"]
    return fill(template, io=_cpu_io(v), **common)


@strategy(_GN_OPS, "cpu", "per_group", level=0,
          doc="OpenMP over (sample, group): one double-precision statistics pass, then the per-channel affine",
          applies=lambda v, d: _gn_ok(v), default=lambda v, d: {})
def _gn_per_group(v: Variant, c: dict, d: DeviceInfo) -> str:
    return _cpu_gn_render(_CPU_GN_PER_GROUP, v)


@strategy(_GN_OPS, "cpu", "per_channel", level=1,
          doc="OpenMP over channels (parallel even with few groups): per-channel partial sums, then normalise",
          applies=lambda v, d: _gn_ok(v), default=lambda v, d: {},
          fit=lambda v, d: 1.0 if _gn_dims(v)[0] * _gn_dims(v)[3] < 4 * d.sm_count else 0.0)
def _gn_per_channel(v: Variant, c: dict, d: DeviceInfo) -> str:
    return _cpu_gn_render(_CPU_GN_PER_CHANNEL, v)
