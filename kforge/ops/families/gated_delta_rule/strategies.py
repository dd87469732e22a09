"""The gated delta rule: a recurrence over the sequence, one state per value head.

Per value head the state S [Dk, Dv] evolves token by token (decay by exp(g), read by the key, corrected
toward the value by beta, read by the query). The tokens are sequential; the heads and the state's
columns are not. The CUDA design gives each block 32 columns of one head's state, held in registers
across the whole sequence (a warp's lanes own the columns, its warps split the rows), and stages the
normalised queries and keys of a run of tokens in shared memory. The CPU design walks one head's state
per thread.
"""
from __future__ import annotations

from ....kernels import DeviceInfo
from ....ops import TensorSig, Variant
from ....proposers.builtin._prelude import CPU, CUDA, cpu_io, cuda_types
from ....proposers.builtin._strategy import FLOATS, fill, strategy

_OP = "gated_delta_rule"


def _dims(v: Variant) -> tuple[int, int, int, int, int, int]:
    b, t, hk, dk = v.inputs[1].shape
    hv, dv = v.inputs[2].shape[2:]
    return b, t, hk, hv, dk, dv


def _strides(prefix: str, sig: TensorSig | None, n: int) -> dict[str, int]:
    stride = sig.stride if sig is not None else (0,) * n
    return {f"{prefix}{i}": int(stride[i]) for i in range(n)}


def _common(v: Variant) -> dict:
    b, t, hk, hv, dk, dv = _dims(v)
    p = v.param_dict
    out = dict(B=b, T=t, HK=hk, HV=hv, DK=dk, DV=dv, REP=hv // hk, L2=int(p["use_qk_l2norm"]),
               FINAL=int(p["output_final_state"]), HAS_S0=int(v.inputs[5] is not None), SCALE=float(dk ** -0.5))
    for prefix, sig, n in (("QS", v.inputs[0], 4), ("KS", v.inputs[1], 4), ("VS", v.inputs[2], 4),
                           ("GS", v.inputs[3], 3), ("BS", v.inputs[4], 3), ("SS", v.inputs[5], 4),
                           ("OS", v.outputs[0], 4), ("FS", v.outputs[1] if len(v.outputs) > 1 else None, 4)):
        out.update(_strides(prefix, sig, n))
    return out


def _applies(v: Variant) -> bool:
    sigs = [s for s in v.inputs if s is not None] + list(v.outputs)
    return (v.op == _OP and all(s.dtype in FLOATS for s in sigs) and all(s.device == sigs[0].device for s in sigs)
            and (len(v.outputs) == 1 or v.outputs[1].dtype == "float32"))


_DEFINES = """#define B {{B}}
#define T {{T}}
#define HK {{HK}}
#define HV {{HV}}
#define DK {{DK}}
#define DV {{DV}}
#define REP {{REP}}
#define L2 {{L2}}
#define FINAL {{FINAL}}
#define HAS_S0 {{HAS_S0}}
#define SCALE {{SCALE}}
#define QIX(b, t, h, d) ((long)(b) * {{QS0}} + (long)(t) * {{QS1}} + (long)(h) * {{QS2}} + (long)(d) * {{QS3}})
#define KIX(b, t, h, d) ((long)(b) * {{KS0}} + (long)(t) * {{KS1}} + (long)(h) * {{KS2}} + (long)(d) * {{KS3}})
#define VIX(b, t, h, d) ((long)(b) * {{VS0}} + (long)(t) * {{VS1}} + (long)(h) * {{VS2}} + (long)(d) * {{VS3}})
#define GIX(b, t, h) ((long)(b) * {{GS0}} + (long)(t) * {{GS1}} + (long)(h) * {{GS2}})
#define BIX(b, t, h) ((long)(b) * {{BS0}} + (long)(t) * {{BS1}} + (long)(h) * {{BS2}})
#define SIX(b, h, i, j) ((long)(b) * {{SS0}} + (long)(h) * {{SS1}} + (long)(i) * {{SS2}} + (long)(j) * {{SS3}})
#define OIX(b, t, h, d) ((long)(b) * {{OS0}} + (long)(t) * {{OS1}} + (long)(h) * {{OS2}} + (long)(d) * {{OS3}})
#define FIX(b, h, i, j) ((long)(b) * {{FS0}} + (long)(h) * {{FS1}} + (long)(i) * {{FS2}} + (long)(j) * {{FS3}})
"""

# ----------------------------------------------------------------------------- CUDA

_CUDA = CUDA + """{{types}}""" + _DEFINES + r"""#define W {{W}}
#define CH {{CH}}
#define R (DK / W)
#define QTOK {{QTOK}}
#define VTOK {{VTOK}}
#define ONEBAR {{ONEBAR}}

__global__ void __launch_bounds__(W * 32) gdn_columns(
        const q_t* __restrict__ q, const q_t* __restrict__ k, const v_t* __restrict__ v, const g_t* __restrict__ g,
        const beta_t* __restrict__ beta, const s0_t* __restrict__ s0, o_t* __restrict__ o, float* __restrict__ fs) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int sl = blockIdx.x % (DV / 32), bh = blockIdx.x / (DV / 32), col = sl * 32 + lane;
    const int b = bh / HV, h = bh % HV, hk = h / REP;
    // NB: rows padded by one float: staged token-major (lanes along tokens) they would all hit one bank
    __shared__ float q_s[CH][DK + 1];
    __shared__ float k_s[CH][DK + 1];
    __shared__ float v_s[CH][33], dec_s[CH], beta_s[CH];
    // NB: ONEBAR: one barrier a token, not two. A token's output partials are summed after the next token's
    // barrier (one token late), so the buffers alternate between tokens: a warp writes a buffer again only two
    // tokens later, past a barrier every reader of it has reached.
    __shared__ float red_kv[2][W][32], red_o[2][W][32];
    float S[R];
#pragma unroll
    for (int r = 0; r < R; ++r) S[r] = HAS_S0 ? to_f(s0[SIX(b, h, w * R + r, col)]) : 0.f;
    for (int t0 = 0; t0 < T; t0 += CH) {
        const int n = T - t0 < CH ? T - t0 : CH;
        // stage a run of tokens, the threads walking whichever index is contiguous in memory (the model's
        // projections are often laid out token-major: Qwen 3.5's come transposed from its convolution)
        for (int x = threadIdx.x; x < CH * DK; x += W * 32) {
            const int i = QTOK ? x % CH : x / DK, d = QTOK ? x / CH : x % DK;
            if (i < n) {
                q_s[i][d] = to_f(q[QIX(b, t0 + i, hk, d)]);
                k_s[i][d] = to_f(k[KIX(b, t0 + i, hk, d)]);
            }
        }
        for (int x = threadIdx.x; x < CH * 32; x += W * 32) {
            const int i = VTOK ? x % CH : x / 32, c = VTOK ? x / CH : x % 32;
            if (i < n) v_s[i][c] = to_f(v[VIX(b, t0 + i, h, sl * 32 + c)]);
        }
        for (int i = threadIdx.x; i < n; i += W * 32) {
            dec_s[i] = expf(to_f(g[GIX(b, t0 + i, h)]));
            beta_s[i] = to_f(beta[BIX(b, t0 + i, h)]);
        }
        __syncthreads();
        // normalise the staged rows: a warp a token (query scaled by Dk^-0.5, both L2-normalised when asked)
        for (int i = w; i < n; i += W) {
            float sq = 0.f, sk = 0.f;
            for (int d = lane; d < DK; d += 32) {
                sq += q_s[i][d] * q_s[i][d];
                sk += k_s[i][d] * k_s[i][d];
            }
            float iq = SCALE, ik = 1.f;
            if (L2) {
                iq = rsqrtf(warp_sum(sq) + 1e-6f) * SCALE;
                ik = rsqrtf(warp_sum(sk) + 1e-6f);
            }
            for (int d = lane; d < DK; d += 32) {
                q_s[i][d] *= iq;
                k_s[i][d] *= ik;
            }
        }
        __syncthreads();
        for (int i = 0; i < n; ++i) {
            const int p = ONEBAR ? (i & 1) : 0;
            const float* kr = &k_s[i][w * R];
            const float* qr = &q_s[i][w * R];
            // the state's prediction of v from this key, four chains at a time
            float kv0 = 0.f, kv1 = 0.f, kv2 = 0.f, kv3 = 0.f;
#pragma unroll
            for (int r = 0; r < R; r += 4) {
                kv0 = fmaf(S[r], kr[r], kv0);
                if (r + 1 < R) kv1 = fmaf(S[r + 1], kr[r + 1], kv1);
                if (r + 2 < R) kv2 = fmaf(S[r + 2], kr[r + 2], kv2);
                if (r + 3 < R) kv3 = fmaf(S[r + 3], kr[r + 3], kv3);
            }
            red_kv[p][w][lane] = (kv0 + kv1) + (kv2 + kv3);
            __syncthreads();
            if (ONEBAR && w == 0 && i > 0) {   // the previous token's output
                float out = 0.f;
#pragma unroll
                for (int x = 0; x < W; ++x) out += red_o[p ^ 1][x][lane];
                o[OIX(b, t0 + i - 1, h, col)] = from_f<o_t>(out);
            }
            float kv = 0.f;
#pragma unroll
            for (int x = 0; x < W; ++x) kv += red_kv[p][x][lane];
            const float dcy = dec_s[i];
            const float delta = (v_s[i][lane] - dcy * kv) * beta_s[i];
            float o0 = 0.f, o1 = 0.f, o2 = 0.f, o3 = 0.f;
#pragma unroll
            for (int r = 0; r < R; r += 4) {
                S[r] = fmaf(S[r], dcy, kr[r] * delta);
                o0 = fmaf(S[r], qr[r], o0);
                if (r + 1 < R) { S[r + 1] = fmaf(S[r + 1], dcy, kr[r + 1] * delta); o1 = fmaf(S[r + 1], qr[r + 1], o1); }
                if (r + 2 < R) { S[r + 2] = fmaf(S[r + 2], dcy, kr[r + 2] * delta); o2 = fmaf(S[r + 2], qr[r + 2], o2); }
                if (r + 3 < R) { S[r + 3] = fmaf(S[r + 3], dcy, kr[r + 3] * delta); o3 = fmaf(S[r + 3], qr[r + 3], o3); }
            }
            // NB: two buffers: red_kv is written again only after the next barrier, red_o after the one after it
            red_o[p][w][lane] = (o0 + o1) + (o2 + o3);
            if (!ONEBAR) {
                __syncthreads();
                if (w == 0) {
                    float out = 0.f;
#pragma unroll
                    for (int x = 0; x < W; ++x) out += red_o[0][x][lane];
                    o[OIX(b, t0 + i, h, col)] = from_f<o_t>(out);
                }
            }
        }
        if (ONEBAR && n > 0) {   // the run's last output
            __syncthreads();
            if (w == 0) {
                float out = 0.f;
#pragma unroll
                for (int x = 0; x < W; ++x) out += red_o[(n - 1) & 1][x][lane];
                o[OIX(b, t0 + n - 1, h, col)] = from_f<o_t>(out);
            }
        }
        __syncthreads();   // the staged run is read; the next one may overwrite it
    }
    if (FINAL) {
#pragma unroll
        for (int r = 0; r < R; ++r) fs[FIX(b, h, w * R + r, col)] = S[r];
    }
}

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    gdn_columns<<<B * HV * (DV / 32), W * 32, 0, (cudaStream_t)stream>>>(
        (const q_t*)inputs[0].data, (const q_t*)inputs[1].data, (const v_t*)inputs[2].data,
        (const g_t*)inputs[3].data, (const beta_t*)inputs[4].data, (const s0_t*)inputs[5].data,
        (o_t*)outputs[0].data, FINAL ? (float*)outputs[1].data : (float*)0);
    return (int)cudaGetLastError();
}
"""


def _cuda_smem(v: Variant, c: dict) -> int:
    dk = _dims(v)[4]
    return 4 * (2 * c["chunk"] * (dk + 1) + c["chunk"] * 35 + 4 * c["warps"] * 32)


def _cuda_ok(v: Variant) -> bool:
    if not _applies(v):
        return False
    b, t, hk, hv, dk, dv = _dims(v)
    return dv % 32 == 0 and dk % 4 == 0 and dk <= 256


@strategy(_OP, "cuda", "state_columns", level=1,
          doc="each block holds 32 columns of one head's state in registers for the whole sequence (lanes own "
              "columns, warps split the rows); runs of tokens staged in shared memory, normalised there",
          # NB: barriers=1 (one a token, outputs summed a token late) is untimed on the H200 as yet: the search tries it
          space={"warps": (4, 2, 8, 1), "chunk": (32, 16, 64), "barriers": (2, 1)},
          applies=lambda v, d: _cuda_ok(v),
          # NB: 8 warps fastest at Qwen 3.5's Dk = 128 on the H200 (280 us against 357 us for 4; gated_delta_h200_2026-12-03w)
          default=lambda v, d: {"warps": 8 if _dims(v)[4] % 32 == 0 else 4 if _dims(v)[4] % 16 == 0 else 1,
                                "chunk": 32 if _dims(v)[4] <= 128 else 16, "barriers": 2},
          valid=lambda v, c, d: (_dims(v)[4] % (4 * c["warps"]) == 0 and _cuda_smem(v, c) <= 48 << 10),
          fit=lambda v, d: 5.0,
          explain=lambda v, c: (f"{c['warps']} warp(s) split each column's {_dims(v)[4]} rows "
                                f"({_dims(v)[4] // c['warps']} registers a thread), {c['chunk']} tokens staged at a time, "
                                f"{c.get('barriers', 2)} barrier(s) a token"))
def _gdn_cuda(v: Variant, c: dict, d: DeviceInfo) -> str:
    types = cuda_types({"q": v.inputs[0], "v": v.inputs[2], "g": v.inputs[3], "beta": v.inputs[4],
                        "s0": v.inputs[5], "o": v.outputs[0]})
    q, val = v.inputs[0], v.inputs[2]
    return fill(_CUDA, types=types, W=c["warps"], CH=c["chunk"], QTOK=int(q.stride[1] < q.stride[3]),
                VTOK=int(val.stride[1] < val.stride[3]), ONEBAR=int(c.get("barriers", 2) == 1), **_common(v))


# ----------------------------------------------------------------------------- CPU

_CPU = CPU + "#include <stdlib.h>\n{{io}}" + _DEFINES + r"""
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {
    const q_t* q = (const q_t*)inputs[0].data;
    const q_t* k = (const q_t*)inputs[1].data;
    const v_t* v = (const v_t*)inputs[2].data;
    const g_t* g = (const g_t*)inputs[3].data;
    const beta_t* beta = (const beta_t*)inputs[4].data;
    const s0_t* s0 = (const s0_t*)inputs[5].data;
    o_t* o = (o_t*)outputs[0].data;
    fs_t* fs = FINAL ? (fs_t*)outputs[1].data : 0;
    int failed = 0;
    #pragma omp parallel for schedule(static)
    for (long bh = 0; bh < (long)B * HV; ++bh) {
        const int b = (int)(bh / HV), h = (int)(bh % HV), hk = h / REP;
        float* S = (float*)malloc(sizeof(float) * ((size_t)DK * DV + 2 * DK + DV));
        if (!S) { failed = 1; continue; }
        float* qn = S + (size_t)DK * DV;
        float* kn = qn + DK;
        float* kv = kn + DK;
        for (int i = 0; i < DK; ++i)
            for (int j = 0; j < DV; ++j) S[(long)i * DV + j] = HAS_S0 ? s0_ld(s0, SIX(b, h, i, j)) : 0.f;
        for (int t = 0; t < T; ++t) {
            float sq = 0.f, sk = 0.f;
            for (int d = 0; d < DK; ++d) {
                qn[d] = q_ld(q, QIX(b, t, hk, d));
                kn[d] = q_ld(k, KIX(b, t, hk, d));
                sq += qn[d] * qn[d];
                sk += kn[d] * kn[d];
            }
            const float iq = L2 ? SCALE / sqrtf(sq + 1e-6f) : SCALE, ik = L2 ? 1.f / sqrtf(sk + 1e-6f) : 1.f;
            for (int d = 0; d < DK; ++d) { qn[d] *= iq; kn[d] *= ik; }
            const float dcy = expf(g_ld(g, GIX(b, t, h))), be = beta_ld(beta, BIX(b, t, h));
            for (int j = 0; j < DV; ++j) kv[j] = 0.f;
            for (int i = 0; i < DK; ++i)
                for (int j = 0; j < DV; ++j) kv[j] += S[(long)i * DV + j] * kn[i];
            float* delta = kv;   /* the prediction's error, scaled by beta, in its place */
            for (int j = 0; j < DV; ++j) delta[j] = (v_ld(v, VIX(b, t, h, j)) - dcy * kv[j]) * be;
            for (int i = 0; i < DK; ++i)
                for (int j = 0; j < DV; ++j) S[(long)i * DV + j] = S[(long)i * DV + j] * dcy + kn[i] * delta[j];
            for (int j = 0; j < DV; ++j) {
                float out = 0.f;
                for (int i = 0; i < DK; ++i) out += S[(long)i * DV + j] * qn[i];
                o_st(o, OIX(b, t, h, j), out);
            }
        }
        if (FINAL)
            for (int i = 0; i < DK; ++i)
                for (int j = 0; j < DV; ++j) fs_st(fs, FIX(b, h, i, j), S[(long)i * DV + j]);
        free(S);
    }
    return failed;
}
"""


@strategy(_OP, "cpu", "per_head", level=0,
          doc="one thread walks one head's state through the sequence (float32 state, rows then columns)",
          applies=lambda v, d: _applies(v),
          default=lambda v, d: {})
def _gdn_cpu(v: Variant, c: dict, d: DeviceInfo) -> str:
    io = "".join(cpu_io(role, sig) for role, sig in (
        ("q", v.inputs[0]), ("v", v.inputs[2]), ("g", v.inputs[3]), ("beta", v.inputs[4]), ("s0", v.inputs[5]),
        ("o", v.outputs[0]), ("fs", v.outputs[1] if len(v.outputs) > 1 else None)))
    return fill(_CPU, io=io, **_common(v))
