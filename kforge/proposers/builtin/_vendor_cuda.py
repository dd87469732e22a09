"""CUDA kernels of vendor-headed chains on CUTLASS 3.x for Hopper (sm_90a).

Three designs, chosen by the chain (a ``kforge.regions.VendorChain``, read without importing the regions package,
which sits above the proposers in kforge's layers):

- ``evt``: a GEMM head (mm, addmm, bmm, baddbmm) with a pointwise tail whose inputs are per-column vectors
  (a bias), per-row vectors, scalars or full tensors (a residual): one TMA warp-specialised GEMM whose epilogue
  visitor tree computes the tail. The whole tail is one N-ary compute node (``KfTail``) whose scalar function is
  the tail's IR written out (``_vendor_tail``), fed by the accumulator, the head's bias and the tail's inputs
  (``Sm90RowBroadcast``, ``Sm90ColBroadcast``, ``Sm90ScalarBroadcast``, the first full tensor as the epilogue's
  source C through TMA, further ones by ``Sm90AuxLoad``), so the product is never written.
- ``gemm_then_rows``: a GEMM head whose tail holds a reduction (softmax, layer or group norm) or reads what an
  epilogue cannot: the GEMM writes its float product to the workspace, then one kernel computes the tail (one
  block per row for a reduction, a grid-stride loop otherwise).
- ``conv``: a 2-d convolution as CUTLASS's implicit GEMM (fprop, NHWC activations and KRSC filters; NCHW inputs
  are packed first, channels padded to 8 for TMA), its float product in the workspace, then the tail kernel,
  which adds the bias and writes the model's layout.

Parameters (``CutlassConfig``): tile shape, pipeline stages (0: as many as shared memory holds), cluster shape,
tile-scheduler swizzle and raster order, and the warp-specialised schedule (cooperative or ping-pong).

Numerics are eager's: 16-bit operands with float accumulation; a float32 product would need TF32 on the tensor
cores, which eager does not use by default, so float32 chains are left to other designs (``Unsupported``).

Built sources need the CUTLASS headers (``pip install nvidia-cutlass``), ``-gencode=arch=compute_90a,code=sm_90a``
and ``--expt-relaxed-constexpr``: ``compile_source`` adds them for any source that includes CUTLASS or CuTe
(kernels/_cutlass.py), and ``build_cutlass`` goes through it, as the judge does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from typing import Any

from ...kernels._cutlass import cutlass_root, driver_library
from ...ops import TensorSig, Unsupported, torch_dtype
from ._vendor_tail import CUDA_ROUNDING, ROUND, literal, load_expr, offset_expr, store_stmt, tail_lines

_CUTLASS_TYPES = {"bfloat16": "cutlass::bfloat16_t", "float16": "cutlass::half_t", "float32": "float"}
_BITS = {"bfloat16": 16, "float16": 16, "float32": 32}
CUTLASS_WORKSPACE = 4 << 20   # NB: what the GEMM's own workspace may take (tile scheduler); checked at launch


@dataclass(frozen=True)
class CutlassConfig:
    """One point of a chain's search space on Hopper."""

    tile: tuple[int, int, int] = (128, 128, 64)
    cluster: tuple[int, int] = (1, 2)
    stages: int = 0
    swizzle: int = 1
    raster: str = "heuristic"       # "heuristic" | "m" | "n"
    schedule: str = "cooperative"   # "cooperative" | "pingpong"

    def label(self) -> str:
        t, c = self.tile, self.cluster
        return (f"{t[0]}x{t[1]}x{t[2]}_c{c[0]}x{c[1]}_s{self.stages or 'auto'}_sw{self.swizzle}_"
                f"{self.raster}_{self.schedule}")


def config_space(chain: Any) -> list[CutlassConfig]:
    """The configurations a search may try for ``chain`` (cooperative tiles need M >= 128)."""
    out = []
    for tile in ((128, 128, 64), (128, 256, 64), (256, 128, 64), (64, 128, 64), (128, 64, 64), (64, 256, 64)):
        for cluster in ((1, 1), (1, 2), (2, 1)):
            for schedule in ("cooperative", "pingpong"):
                if schedule == "cooperative" and tile[0] < 128:
                    continue
                if schedule == "pingpong" and tile[0] * tile[1] > 128 * 128:
                    continue
                for swizzle in (1, 2, 4, 8):
                    out.append(CutlassConfig(tile, cluster, 0, swizzle, "heuristic", schedule))
    return out


def default_config(chain: Any) -> CutlassConfig:
    h = chain.head
    if h.m * h.batch <= 256 or h.n <= 64:
        return CutlassConfig((64, 128, 64), (1, 1), 0, 1, "heuristic", "pingpong")
    return CutlassConfig()


# ----------------------------------------------------------------------------- shared source text


PRELUDE = r"""#define NDEBUG 1
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "kforge.h"
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
KF_CUTLASS_INCLUDES
""" + CUDA_ROUNDING + r"""
using namespace cute;
namespace kf_fus = cutlass::epilogue::fusion;

static __device__ __forceinline__ float kf_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float kf_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) { float w = __shfl_xor_sync(0xffffffffu, v, o); v = (w > v || w != w) ? w : v; }
    return v;
}
static __device__ __forceinline__ float kf_warp_min(float v) {
    for (int o = 16; o > 0; o >>= 1) { float w = __shfl_xor_sync(0xffffffffu, v, o); v = (w < v || w != w) ? w : v; }
    return v;
}
/* 256 threads; every thread gets the result */
template <int OP> static __device__ __forceinline__ float kf_block(float v, float* scratch) {
    v = OP == 0 ? kf_warp_sum(v) : OP == 1 ? kf_warp_max(v) : kf_warp_min(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[lane & 7];
    v = OP == 0 ? kf_warp_sum(lane < 8 ? v : 0.0f) : OP == 1 ? kf_warp_max(v) : kf_warp_min(v);
    return v;
}
static int kf_sm_count() {
    static int count = 0;
    if (count == 0) {
        int dev = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev);
    }
    return count;
}
"""


GEMM_INCLUDES = """#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
"""
# NB: without the GEMM adapter: it brings CUTLASS 2's GemmUniversal, whose partial specialisation also matches a
# convolution's kernel (nvcc: "more than one partial specialization matches")
CONV_INCLUDES = """#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/device/conv_universal_adapter.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
"""


def _prelude(includes: str) -> str:
    return PRELUDE.replace("KF_CUTLASS_INCLUDES", includes)


def _ctype(dtype: str) -> str:
    try:
        return _CUTLASS_TYPES[dtype]
    except KeyError:
        raise Unsupported(f"a {dtype} operand") from None


def _align(n: int, bits: int) -> int:
    """The widest access (elements, at most 16 bytes) that ``n`` elements divide into."""
    for a in (128 // bits, 64 // bits, 32 // bits, 1):
        if a >= 1 and n % a == 0:
            return a
    return 1


def _schedules(config: CutlassConfig) -> tuple[str, str]:
    if config.schedule == "pingpong":
        return "cutlass::gemm::KernelTmaWarpSpecializedPingpong", "cutlass::epilogue::TmaWarpSpecialized"
    return "cutlass::gemm::KernelTmaWarpSpecializedCooperative", "cutlass::epilogue::TmaWarpSpecializedCooperative"


def _stage_count(config: CutlassConfig, carveout: str) -> str:
    if config.stages:
        return f"cutlass::gemm::collective::StageCount<{config.stages}>"
    return f"cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename {carveout}::SharedStorage))>"


def _mnl(chain: Any, sig: TensorSig) -> tuple[int, int, int] | None:
    """A frame signature's strides along the GEMM's (m, n, l), or None where it is no view of the product's shape."""
    out = chain.head.out
    meta = torch.empty_strided(sig.shape, sig.stride, dtype=torch_dtype(sig.dtype), device="meta")
    try:
        v = meta.view(out.shape)
    except RuntimeError:
        return None
    st = v.stride()
    return (st[-2], st[-1], st[0] if len(st) == 3 else 0)


@dataclass(frozen=True)
class _EvtInput:
    kind: str     # "row" | "col" | "scalar" | "src" | "aux"
    source: int   # chain input index
    dtype: str
    stride: tuple[int, int, int]


def _classify(chain: Any, source: int, sig: TensorSig, have_src: bool) -> _EvtInput | None:
    mnl = _mnl(chain, sig)
    if mnl is None:
        return None
    sm, sn, sl = mnl
    h = chain.head
    if sm == 0 and sn == 0:
        return _EvtInput("scalar", source, sig.dtype, mnl)
    if sm == 0 and (sn == 1 or h.n == 1):
        return _EvtInput("row", source, sig.dtype, (0, 1, sl))
    if sn == 0 and (sm == 1 or h.m == 1):
        return _EvtInput("col", source, sig.dtype, (1, 0, sl))
    vec = 128 // _BITS[sig.dtype]
    if sn == 1 and h.n % vec == 0 and sm % vec == 0 and sl % vec == 0:
        return _EvtInput("aux" if have_src else "src", source, sig.dtype, mnl)
    return None


def evt_inputs(chain: Any) -> list[_EvtInput] | None:
    """The epilogue's inputs after the accumulator (the head's bias first), or None where the tail is not one an
    epilogue visitor tree computes (a reduction, an input it cannot read, another output layout)."""
    h = chain.head
    if h.is_conv or chain.ir is None or chain.ir.reduction is not None or chain.groups:
        return None
    out = chain.out_frames[0]
    mnl = _mnl(chain, out)
    if mnl is None or mnl[1] != 1 or out.dtype not in _BITS:
        return None
    vec = 128 // _BITS[out.dtype]
    if h.n % vec or mnl[0] % vec or mnl[2] % vec:   # NB: the TMA store of D needs 16-byte rows
        return None
    got: list[_EvtInput] = []
    have_src = False
    if h.bias is not None:
        st = [0, 0, 0]
        pad = 3 - len(h.bias.shape)
        for d in range(3):
            if d >= pad and h.bias.shape[d - pad] != 1:
                st[d] = h.bias.stride[d - pad]
        meta_sig = TensorSig(h.out.shape, h.bias.dtype,
                             tuple(st[1:]) if len(h.out.shape) == 2 else tuple(st), "cpu")
        e = _classify(chain, 2, meta_sig, have_src)
        if e is None:
            return None
        have_src = have_src or e.kind == "src"
        got.append(e)
    for t in chain.tail_inputs:
        if t.source < 0:
            continue
        meta_sig = TensorSig(t.sig.shape, t.sig.dtype, t.sig.stride, "cpu")
        e = _classify(chain, t.source, meta_sig, have_src)
        if e is None or e.dtype not in _BITS:
            return None
        have_src = have_src or e.kind == "src"
        got.append(e)
    return got


def design(chain: Any) -> str:
    """Which design ``render_cuda`` writes for ``chain`` ("evt", "gemm_then_rows", "conv"), or Unsupported."""
    h = chain.head
    if h.dtype not in ("bfloat16", "float16"):
        raise Unsupported(f"a {h.dtype} product: CUTLASS's Hopper tensor cores would compute it in TF32, which eager "
                          "does not use by default")
    if h.is_conv:
        c = h.conv
        if c.transposed or c.groups != 1 or c.spatial != 2:
            raise Unsupported("CUTLASS designs cover 2-d, ungrouped, forward convolutions")
        if h.n % 8:
            raise Unsupported(f"{h.n} output channels (TMA stores need a multiple of 8)")
        return "conv"
    if h.a_major == "none" or h.b_major == "none":
        raise Unsupported("an operand with neither of its last two dims dense")
    for sig, major in ((h.a, h.a_major), (h.b, h.b_major)):
        lead = sig.stride[-2] if major == "row" else sig.stride[-1]
        if lead % 8 or (len(sig.shape) == 3 and sig.stride[0] % 8 and sig.shape[0] > 1):
            raise Unsupported("an operand whose rows are not 16-byte aligned (TMA)")
    if h.k % 8:
        raise Unsupported("K not a multiple of 8 (TMA)")
    if evt_inputs(chain) is None and h.n % 4:
        raise Unsupported("N not a multiple of 4 (the float product's TMA store)")
    return "evt" if evt_inputs(chain) is not None else "gemm_then_rows"


# ----------------------------------------------------------------------------- the tail kernel (rows or elements)


def _tail_kernel(chain: Any, head_sig: TensorSig, head_bias: bool) -> tuple[str, str]:
    """(source of ``kf_tail_kernel``, its launch) reading the float product at ``head_sig`` (the head's output
    shape and the strides it was written with)."""
    h = chain.head

    def loads(flat: str) -> list[str]:
        out = []
        hoff = offset_expr(head_sig.shape, head_sig.stride, "hflat")
        for i, t in enumerate(chain.tail_inputs):
            off = offset_expr(t.sig.shape, t.sig.stride, flat)
            if t.source < 0:
                continue
            out.append(f"const float x{i} = {load_expr(t.sig.dtype, f'p.in[{t.source}]', off, 'cuda')};")
        # the product: its flat index in the head's output shape is the frame element's index in hshape order
        head_t = chain.tail_inputs[0].sig
        out.insert(0, f"const int64_t hflat = {offset_expr(head_t.shape, head_t.stride, flat)};")
        value = f"((const float*)p.head)[{hoff}]"
        if head_bias and h.bias is not None:
            if h.is_conv:
                boff = f"(hflat / {math.prod(h.out.shape[2:])}LL) % {h.n}LL * {h.bias.stride[0]}LL"
            else:
                pad = 3 - len(h.bias.shape)
                st = [0 if d < pad or h.bias.shape[d - pad] == 1 else h.bias.stride[d - pad] for d in range(3)]
                boff = f"(hflat / {h.m * h.n}LL) * {st[0]}LL + ((hflat / {h.n}LL) % {h.m}LL) * {st[1]}LL + (hflat % {h.n}LL) * {st[2]}LL"
            value = (f"{literal(h.alpha)} * {value} + {literal(h.beta)} * "
                     f"{load_expr(h.bias.dtype, 'p.in[2]', boff, 'cuda')}")
        elif h.alpha != 1.0:
            value = f"{literal(h.alpha)} * {value}"
        out.insert(1, f"const float x0 = {ROUND[h.dtype].format(value)};")
        return out

    sigs = [t.sig for t in chain.tail_inputs]
    ir = chain.ir
    if ir is None:
        s = chain.outputs[0]
        numel = s.numel
        body = "\n        ".join([*loads("e"), store_stmt(s.dtype, "p.out[0]", offset_expr(s.shape, s.stride, "e"), "x0", "cuda")])
        src = f"""
__global__ void __launch_bounds__(256) kf_tail_kernel(KfPtrs p) {{
    for (int64_t e = blockIdx.x * 256LL + threadIdx.x; e < {numel}LL; e += (int64_t)gridDim.x * 256LL) {{
        {body}
    }}
}}
"""
        return src, f"kf_tail_kernel<<<kf_grid({numel}LL), 256, 0, st>>>(p);"
    plan = chain.plan()
    if plan.red is None:
        code = tail_lines(ir, sigs)
        numel = math.prod(chain.frame)
        stores = [store_stmt(s.dtype, f"p.out[{j}]", offset_expr(s.shape, s.stride, "e"), f"t{o}", "cuda")
                  for j, (o, s) in enumerate(zip(ir.outputs, chain.out_frames))]
        body = "\n        ".join([*loads("e"), *code.lines, *stores])
        src = f"""
__global__ void __launch_bounds__(256) kf_tail_kernel(KfPtrs p) {{
    for (int64_t e = blockIdx.x * 256LL + threadIdx.x; e < {numel}LL; e += (int64_t)gridDim.x * 256LL) {{
        {body}
    }}
}}
"""
        return src, f"kf_tail_kernel<<<kf_grid({numel}LL), 256, 0, st>>>(p);"
    red = plan.red
    node = ir.nodes[red]
    src_ref = node.args[0]
    operand = f"x{src_ref.value}" if src_ref.kind == "i" else f"t{src_ref.value}"
    rows, cols = plan.rows, plan.cols
    phase1 = tail_lines(ir, sigs, plan.phase1).lines if src_ref.kind == "n" else ()
    op = node.op

    def sweep(step: str) -> str:
        inner = "\n            ".join([*loads("e"), *phase1, step])
        return f"""for (int64_t c = threadIdx.x; c < {cols}LL; c += 256) {{
            const int64_t e = r * {cols}LL + c;
            {inner}
        }}"""

    if op in ("sum", "mean"):
        stats = (f"float s = 0.0f;\n        {sweep(f's += {operand};')}\n        s = kf_block<0>(s, scratch);\n"
                 f"        const float rval = s{' / %d.0f' % cols if op == 'mean' else ''};")
    elif op in ("amax", "amin"):
        o = 1 if op == "amax" else 2
        init = literal(float("-inf") if op == "amax" else float("inf"))
        cmp = ">" if op == "amax" else "<"
        stats = (f"float s = {init};\n        {sweep(f'if ({operand} {cmp} s || {operand} != {operand}) s = {operand};')}\n"
                 f"        const float rval = kf_block<{o}>(s, scratch);")
    elif op in ("softmax", "log_softmax"):
        stats = (f"float mx = {literal(float('-inf'))};\n        {sweep(f'if ({operand} > mx || {operand} != {operand}) mx = {operand};')}\n"
                 f"        mx = kf_block<1>(mx, scratch);\n        float s = 0.0f;\n        {sweep(f's += expf({operand} - mx);')}\n"
                 f"        s = kf_block<0>(s, scratch);\n        const float rinv = 1.0f / s; const float rlog = logf(s);")
    elif op == "layer_norm":
        eps = float(node.attr["eps"])
        stats = (f"float s = 0.0f;\n        {sweep(f's += {operand};')}\n        const float rmean = kf_block<0>(s, scratch) / {cols}.0f;\n"
                 f"        float q = 0.0f;\n        {sweep(f'q += ({operand} - rmean) * ({operand} - rmean);')}\n"
                 f"        const float rrstd = rsqrtf(kf_block<0>(q, scratch) / {cols}.0f + {eps!r}f);")
    else:
        raise Unsupported(f"no row kernel for {op}")

    def reduced(i: int, arg: str) -> str:
        return {"softmax": f"(expf({arg} - mx) * rinv)", "log_softmax": f"({arg} - mx - rlog)",
                "layer_norm": f"(({arg} - rmean) * rrstd)"}.get(op, "rval")

    code = tail_lines(ir, sigs, reduced=reduced)
    full, row = [], []
    for j, (o, s, is_row) in enumerate(zip(ir.outputs, chain.out_frames, plan.out_is_row)):
        if is_row:
            row.append(f"if (c == 0) {{ {store_stmt(s.dtype, f'p.out[{j}]', offset_expr(s.shape, s.stride, 'r'), f't{o}', 'cuda')} }}")
        else:
            full.append(store_stmt(s.dtype, f"p.out[{j}]", offset_expr(s.shape, s.stride, "e"), f"t{o}", "cuda"))
    second = "\n            ".join([*loads("e"), *code.lines, *full, *row])
    src = f"""
__global__ void __launch_bounds__(256) kf_tail_kernel(KfPtrs p) {{
    __shared__ float scratch[32];
    for (int64_t r = blockIdx.x; r < {rows}LL; r += gridDim.x) {{
        {stats}
        for (int64_t c = threadIdx.x; c < {cols}LL; c += 256) {{
            const int64_t e = r * {cols}LL + c;
            {second}
        }}
        __syncthreads();
    }}
}}
"""
    return src, f"kf_tail_kernel<<<(unsigned)({rows}LL < 1048576LL ? {rows}LL : 1048576LL), 256, 0, st>>>(p);"


def _ptrs(chain: Any) -> str:
    return f"""
struct KfPtrs {{ const void* in[{max(len(chain.inputs), 1)}]; void* out[{max(len(chain.outputs), 1)}]; const void* head; }};
static unsigned kf_grid(long long n) {{
    long long blocks = (n + 255) / 256, cap = (long long)kf_sm_count() * 8;
    return (unsigned)(blocks < cap ? blocks : cap);
}}
"""


# ----------------------------------------------------------------------------- GEMM


def _gemm_types(chain: Any, config: CutlassConfig, fusion: str, out_dtype: str, out_align: int,
                src_dtype: str | None) -> str:
    h = chain.head
    ta, tb = _ctype(h.a.dtype), _ctype(h.b.dtype)
    la = "cutlass::layout::RowMajor" if h.a_major == "row" else "cutlass::layout::ColumnMajor"
    lb = "cutlass::layout::ColumnMajor" if h.b_major == "col" else "cutlass::layout::RowMajor"
    al = 128 // _BITS[h.a.dtype]
    mainloop, epi = _schedules(config)
    tm, tn, tk = config.tile
    cm, cn = config.cluster
    elc = _ctype(src_dtype) if src_dtype else "void"
    alc = 128 // _BITS[src_dtype] if src_dtype else out_align
    return f"""
using KfTile = Shape<_{tm}, _{tn}, _{tk}>;
using KfCluster = Shape<_{cm}, _{cn}, _1>;
{fusion}
using KfEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, KfTile, KfCluster,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    {elc}, cutlass::layout::RowMajor, {alc}, {_ctype(out_dtype)}, cutlass::layout::RowMajor, {out_align},
    {epi}{', KfFusion' if fusion else ''}>::CollectiveOp;
using KfMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, {ta}, {la}, {al}, {tb}, {lb}, {al}, float,
    KfTile, KfCluster, {_stage_count(config, 'KfEpilogue')}, {mainloop}>::CollectiveOp;
using KfKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, KfMainloop, KfEpilogue,
                                                      cutlass::gemm::PersistentScheduler>;
using KfGemm = cutlass::gemm::device::GemmUniversalAdapter<KfKernel>;
"""


def _operand_strides(chain: Any) -> tuple[str, str]:
    h = chain.head
    a, b = h.a, h.b
    la = a.stride[0] if len(a.shape) == 3 else 0
    lb = b.stride[0] if len(b.shape) == 3 else 0
    da = (f"Stride<int64_t, _1, int64_t>{{{a.stride[-2]}, _1{{}}, {la}}}" if h.a_major == "row"
          else f"Stride<_1, int64_t, int64_t>{{_1{{}}, {a.stride[-1]}, {la}}}")
    db = (f"Stride<int64_t, _1, int64_t>{{{b.stride[-1]}, _1{{}}, {lb}}}" if h.b_major == "col"
          else f"Stride<_1, int64_t, int64_t>{{_1{{}}, {b.stride[-2]}, {lb}}}")
    return da, db


def _scheduler_lines(config: CutlassConfig) -> str:
    raster = {"heuristic": "Heuristic", "m": "AlongM", "n": "AlongN"}[config.raster]
    return (f"args.scheduler.max_swizzle_size = {config.swizzle};\n"
            f"    args.scheduler.raster_order = decltype(args.scheduler.raster_order)::{raster};")


def _run_gemm(workspace: str) -> str:
    return f"""
    KfGemm gemm;
    if (KfGemm::get_workspace_size(args) > {CUTLASS_WORKSPACE}ULL) return 1000;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 1001;
    if (gemm.initialize(args, {workspace}, st) != cutlass::Status::kSuccess) return 1002;
    if (gemm.run(st) != cutlass::Status::kSuccess) return 1003;"""


def _evt(chain: Any, config: CutlassConfig) -> str:
    h = chain.head
    inputs = evt_inputs(chain)
    assert inputs is not None
    out = chain.out_frames[0]
    sm_d, _, sl_d = _mnl(chain, out)
    out_align = _align(h.n, _BITS[out.dtype])
    children, args_lines, scalar_params = ["kf_fus::Sm90AccFetch"], ["{}"], ["float acc"]
    src = next((e for e in inputs if e.kind == "src"), None)
    names = []
    for j, e in enumerate(inputs):
        ct = _ctype(e.dtype)
        ptr = f"(const {ct}*)in[{e.source}].data"
        a = _align(h.n, _BITS[e.dtype])
        if e.kind == "row":
            children.append(f"kf_fus::Sm90RowBroadcast<0, KfTile, {ct}, float, Stride<_0, _1, int64_t>, {a}>")
            args_lines.append(f"{{{ptr}, {ct}(0), {{_0{{}}, _1{{}}, {e.stride[2]}}}}}")
        elif e.kind == "col":
            children.append(f"kf_fus::Sm90ColBroadcast<0, KfTile, {ct}, float, Stride<_1, _0, int64_t>, 1>")
            args_lines.append(f"{{{ptr}, {ct}(0), {{_1{{}}, _0{{}}, {e.stride[2]}}}}}")
        elif e.kind == "scalar":
            children.append(f"kf_fus::Sm90ScalarBroadcast<{ct}, Stride<_0, _0, int64_t>>")
            args_lines.append(f"{{{{{ct}(0)}}, {{{ptr}}}, {{{{_0{{}}, _0{{}}, {e.stride[2]}}}}}}}")
        elif e.kind == "src":
            children.append(f"kf_fus::Sm90SrcFetch<{ct}>")
            args_lines.append("{}")
        else:
            children.append(f"kf_fus::Sm90AuxLoad<0, cutlass::epilogue::collective::EpilogueTileAuto, {ct}, "
                            f"Stride<int64_t, _1, int64_t>, void, void, {a}, false>")
            args_lines.append(f"{{{ptr}, {ct}(0), {{{e.stride[0]}, _1{{}}, {e.stride[2]}}}}}")
        names.append(f"v{j}")
        scalar_params.append(f"float v{j}")
    # the scalar function: the head's value, then the tail
    sigs = [t.sig for t in chain.tail_inputs]
    code = tail_lines(chain.ir, sigs)
    head_value = "acc"
    pos = 0
    if h.bias is not None:
        head_value = f"{literal(h.alpha)} * acc + {literal(h.beta)} * v0"
        pos = 1
    elif h.alpha != 1.0:
        head_value = f"{literal(h.alpha)} * acc"
    binds = [f"const float x0 = {ROUND[h.dtype].format(head_value)};"]
    j = pos
    for i, t in enumerate(chain.tail_inputs):
        if t.source >= 0:   # NB: evt_inputs lists them in this order, after the head's bias
            binds.append(f"const float x{i} = v{j};")
            j += 1
    fn_body = "\n    ".join([*binds, *code.lines, f"return t{chain.ir.outputs[0]};"])
    arity = len(scalar_params)
    arr = "cutlass::Array<float, N> const&"
    functor = f"""
static __device__ __forceinline__ float kf_tail_fn({', '.join(scalar_params)}) {{
    {fn_body}
}}
template <class T> struct KfTail {{}};
template <int N> struct KfTail<cutlass::Array<float, N>> {{
    CUTLASS_DEVICE cutlass::Array<float, N> operator()({', '.join(f'{arr} a{i}' for i in range(arity))}) const {{
        cutlass::Array<float, N> out;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < N; ++i) out[i] = kf_tail_fn({', '.join(f'a{i}[i]' for i in range(arity))});
        return out;
    }}
}};
"""
    fusion = ("using KfFusion = kf_fus::Sm90EVT<kf_fus::Sm90Compute<KfTail, " + _ctype(out.dtype)
              + ", float, cutlass::FloatRoundStyle::round_to_nearest>,\n    " + ",\n    ".join(children) + ">;")
    types = _gemm_types(chain, config, fusion, out.dtype, out_align, src.dtype if src else None)
    da, db = _operand_strides(chain)
    src_ptr = f"(const {_ctype(src.dtype)}*)in[{src.source}].data" if src else "nullptr"
    src_stride = f"{{{src.stride[0]}, _1{{}}, {src.stride[2]}}}" if src else f"{{{sm_d}, _1{{}}, {sl_d}}}"
    return f"""/* kforge vendor chain (CUDA, CUTLASS EVT, {config.label()}): {chain.describe()} */
{_prelude(GEMM_INCLUDES)}
{functor}
{types}
KF_ENTRY size_t kf_workspace_bytes(void) {{ return {CUTLASS_WORKSPACE}ULL; }}

KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, const double* params,
                       int n_params, void* workspace, void* stream) {{
    (void)params; (void)n_params;
    if (n_in != {len(chain.inputs)} || n_out != 1 || workspace == NULL) return 1;
    cudaStream_t st = (cudaStream_t)stream;
    typename KfGemm::Arguments args{{
        cutlass::gemm::GemmUniversalMode::kGemm, {{{h.m}, {h.n}, {h.k}, {h.batch}}},
        {{(const {_ctype(h.a.dtype)}*)in[0].data, {da}, (const {_ctype(h.b.dtype)}*)in[1].data, {db}}},
        {{{{}}, {src_ptr}, {src_stride}, ({_ctype(out.dtype)}*)out[0].data, {{{sm_d}, _1{{}}, {sl_d}}}}}}};
    args.epilogue.thread = {{{", ".join(args_lines)}, {{}}}};
    int dev = 0;
    cudaGetDevice(&dev);
    args.hw_info.device_id = dev;
    args.hw_info.sm_count = kf_sm_count();
    {_scheduler_lines(config)}
    {_run_gemm("workspace")}
    return (int)cudaGetLastError();
}}
"""


def _gemm_then_rows(chain: Any, config: CutlassConfig) -> str:
    h = chain.head
    numel = math.prod(h.out.shape)
    head_sig = TensorSig(h.out.shape, "float32", _contiguous(h.out.shape), "cpu")
    tail_src, tail_launch = _tail_kernel(chain, head_sig, head_bias=True)
    types = _gemm_types(chain, config, "", "float32", _align(h.n, 32), None)
    da, db = _operand_strides(chain)
    head_bytes = _round_up(numel * 4)
    return f"""/* kforge vendor chain (CUDA, CUTLASS GEMM then the tail, {config.label()}): {chain.describe()} */
{_prelude(GEMM_INCLUDES)}
{_ptrs(chain)}
{tail_src}
{types}
KF_ENTRY size_t kf_workspace_bytes(void) {{ return {CUTLASS_WORKSPACE + head_bytes}ULL; }}

KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, const double* params,
                       int n_params, void* workspace, void* stream) {{
    (void)params; (void)n_params;
    if (n_in != {len(chain.inputs)} || n_out != {len(chain.outputs)} || workspace == NULL) return 1;
    cudaStream_t st = (cudaStream_t)stream;
    float* H = (float*)((char*)workspace + {CUTLASS_WORKSPACE});
    typename KfGemm::Arguments args{{
        cutlass::gemm::GemmUniversalMode::kGemm, {{{h.m}, {h.n}, {h.k}, {h.batch}}},
        {{(const {_ctype(h.a.dtype)}*)in[0].data, {da}, (const {_ctype(h.b.dtype)}*)in[1].data, {db}}},
        {{{{}}, nullptr, {{{h.n}, _1{{}}, {h.m * h.n}}}, H, {{{h.n}, _1{{}}, {h.m * h.n}}}}}}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    int dev = 0;
    cudaGetDevice(&dev);
    args.hw_info.device_id = dev;
    args.hw_info.sm_count = kf_sm_count();
    {_scheduler_lines(config)}
    {_run_gemm("workspace")}
    KfPtrs p;
    for (int i = 0; i < n_in; ++i) p.in[i] = in[i].data;
    for (int i = 0; i < n_out; ++i) p.out[i] = out[i].data;
    p.head = H;
    {tail_launch}
    return (int)cudaGetLastError();
}}
"""


# ----------------------------------------------------------------------------- convolution


def _round_up(n: int, to: int = 256) -> int:
    return (n + to - 1) // to * to


def _contiguous(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


def _conv(chain: Any, config: CutlassConfig) -> str:
    h = chain.head
    c = h.conv
    x, w, o = h.a, h.b, h.out
    n, ci, hi, wi = x.shape
    k, _, r, s = w.shape
    p_, q_ = o.shape[2], o.shape[3]
    cp = (ci + 7) // 8 * 8
    act_bytes = _round_up(n * hi * wi * cp * 2)
    flt_bytes = _round_up(k * r * s * cp * 2)
    head_elems = n * p_ * q_ * k
    # the float product, NHWC: [n, p, q, k] in the head's [n, k, p, q] shape
    head_sig = TensorSig(o.shape, "float32", (p_ * q_ * k, 1, q_ * k, k), "cpu")
    tail_src, tail_launch = _tail_kernel(chain, head_sig, head_bias=True)
    ct = _ctype(h.dtype)
    # NB: CUTLASS 4.2 refuses its persistent (cooperative, ping-pong) schedules for convolutions: one CTA a tile
    mainloop, epi = "cutlass::conv::KernelImplicitTmaWarpSpecializedSm90", "cutlass::epilogue::TmaWarpSpecialized"
    tm, tn, tk = config.tile
    cm, cn = config.cluster
    stages = (f"cutlass::conv::collective::StageCount<{config.stages}>" if config.stages else
              "cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename KfEpilogue::SharedStorage))>")
    xo = lambda nn, cc, yy, xx: f"{nn} * {x.stride[0]}LL + {cc} * {x.stride[1]}LL + {yy} * {x.stride[2]}LL + {xx} * {x.stride[3]}LL"  # noqa: E731
    wo = lambda kk, cc, yy, xx: f"{kk} * {w.stride[0]}LL + {cc} * {w.stride[1]}LL + {yy} * {w.stride[2]}LL + {xx} * {w.stride[3]}LL"  # noqa: E731
    return f"""/* kforge vendor chain (CUDA, CUTLASS implicit-GEMM conv then the tail, {config.label()}): {chain.describe()} */
{_prelude(CONV_INCLUDES)}
{_ptrs(chain)}
{tail_src}
/* NCHW (any strides) -> NHWC with channels padded to {cp}, zeros in the padding */
__global__ void __launch_bounds__(256) kf_pack_act(const {ct}* x, {ct}* y) {{
    for (int64_t e = blockIdx.x * 256LL + threadIdx.x; e < {n * hi * wi * cp}LL; e += (int64_t)gridDim.x * 256LL) {{
        const int64_t cc = e % {cp}LL, xx = (e / {cp}LL) % {wi}LL, yy = (e / {cp * wi}LL) % {hi}LL, nn = e / {cp * wi * hi}LL;
        y[e] = cc < {ci}LL ? x[{xo("nn", "cc", "yy", "xx")}] : {ct}(0.0f);
    }}
}}
/* KCRS (any strides) -> KRSC with channels padded to {cp} */
__global__ void __launch_bounds__(256) kf_pack_flt(const {ct}* w, {ct}* y) {{
    for (int64_t e = blockIdx.x * 256LL + threadIdx.x; e < {k * r * s * cp}LL; e += (int64_t)gridDim.x * 256LL) {{
        const int64_t cc = e % {cp}LL, xx = (e / {cp}LL) % {s}LL, yy = (e / {cp * s}LL) % {r}LL, kk = e / {cp * s * r}LL;
        y[e] = cc < {ci}LL ? w[{wo("kk", "cc", "yy", "xx")}] : {ct}(0.0f);
    }}
}}
using KfTile = Shape<_{tm}, _{tn}, Shape<_{tk}>>;
using KfCluster = Shape<_{cm}, _{cn}, _1>;
using KfEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, KfTile, KfCluster,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    void, cutlass::layout::TensorNHWC, 4, float, cutlass::layout::TensorNHWC, 4, {epi}>::CollectiveOp;
using KfMainloop = typename cutlass::conv::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop,
    {ct}, cutlass::layout::TensorNHWC, 8, {ct}, cutlass::layout::TensorNHWC, 8, float,
    KfTile, KfCluster, {stages}, {mainloop}>::CollectiveOp;
using KfProblem = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop, 2>;
using KfKernel = cutlass::conv::kernel::ConvUniversal<KfProblem, KfMainloop, KfEpilogue>;
using KfConv = cutlass::conv::device::ConvUniversalAdapter<KfKernel>;

KF_ENTRY size_t kf_workspace_bytes(void) {{ return {CUTLASS_WORKSPACE + act_bytes + flt_bytes + _round_up(head_elems * 4)}ULL; }}

KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, const double* params,
                       int n_params, void* workspace, void* stream) {{
    (void)params; (void)n_params;
    if (n_in != {len(chain.inputs)} || n_out != {len(chain.outputs)} || workspace == NULL) return 1;
    cudaStream_t st = (cudaStream_t)stream;
    char* ws = (char*)workspace;
    {ct}* A = ({ct}*)(ws + {CUTLASS_WORKSPACE});
    {ct}* B = ({ct}*)(ws + {CUTLASS_WORKSPACE + act_bytes});
    float* H = (float*)(ws + {CUTLASS_WORKSPACE + act_bytes + flt_bytes});
    kf_pack_act<<<kf_grid({n * hi * wi * cp}LL), 256, 0, st>>>((const {ct}*)in[0].data, A);
    kf_pack_flt<<<kf_grid({k * r * s * cp}LL), 256, 0, st>>>((const {ct}*)in[1].data, B);
    KfProblem problem(cutlass::conv::Mode::kCrossCorrelation, {{{n}, {hi}, {wi}, {cp}}}, {{{k}, {r}, {s}, {cp}}},
                      {{{c.padding[0]}, {c.padding[1]}}}, {{{c.padding[0]}, {c.padding[1]}}},
                      {{{c.stride[0]}, {c.stride[1]}}}, {{{c.dilation[0]}, {c.dilation[1]}}}, 1);
    typename KfKernel::StrideD stride_d;
    cute::for_each(cute::make_seq<cute::rank<0>(typename KfKernel::StrideD{{}})>{{}}, [&](auto i) {{
        cute::get<0, i>(stride_d) = problem.stride_C[KfProblem::RankT - 2 - i];
    }});
    typename KfConv::Arguments args{{problem, {{A, B}}, {{{{}}, nullptr, stride_d, H, stride_d}}}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    int dev = 0;
    cudaGetDevice(&dev);
    args.hw_info.device_id = dev;
    args.hw_info.sm_count = kf_sm_count();
    KfConv conv;
    if (KfConv::get_workspace_size(args) > {CUTLASS_WORKSPACE}ULL) return 1000;
    if (conv.can_implement(args) != cutlass::Status::kSuccess) return 1001;
    if (conv.initialize(args, workspace, st) != cutlass::Status::kSuccess) return 1002;
    if (conv.run(st) != cutlass::Status::kSuccess) return 1003;
    KfPtrs p;
    for (int i = 0; i < n_in; ++i) p.in[i] = in[i].data;
    for (int i = 0; i < n_out; ++i) p.out[i] = out[i].data;
    p.head = H;
    {tail_launch}
    return (int)cudaGetLastError();
}}
"""


def render_cuda(chain: Any, config: CutlassConfig | None = None) -> str:
    """A complete CUDA source of the kernel contract computing ``chain`` on CUTLASS 3.x for sm_90a, in the
    design ``design(chain)`` picks; Unsupported where none fits."""
    config = config or default_config(chain)
    which = design(chain)
    if which == "evt":
        return _evt(chain, config)
    if which == "gemm_then_rows":
        return _gemm_then_rows(chain, config)
    return _conv(chain, config)


# ----------------------------------------------------------------------------- building


@dataclass(frozen=True)
class CutlassBuild:
    """A built CUTLASS kernel: the library (a cache object of ``compile_source``), its SHA-256, the seconds the build
    took (0 from the cache), the compiler's log, and what kforge's binary wall says of it: always empty, since a
    library the wall refuses is never cached nor returned (``build_cutlass`` raises ``BinaryRejected``)."""

    path: Path
    sha256: str
    seconds: float
    cached: bool
    log: str
    wall: tuple[str, ...] = ()


def nvcc_command(src: Path, out: Path, arch: str = "sm_90a") -> list[str]:
    """nvcc's command line for a CUTLASS kernel, as ``compile_source`` runs it (kernels/_cutlass.py names what a
    CUTLASS source adds: sm_90a's own instructions, CUTLASS's headers, the driver's TMA calls made directly and linked
    against libcuda where it is here, the runtime shared). Unsupported where nvcc or the CUTLASS headers are not here."""
    from ...kernels import find_nvcc
    from ...kernels._compile import _command

    if find_nvcc() is None or cutlass_root() is None:
        raise Unsupported("building CUTLASS kernels needs nvcc and the CUTLASS headers: pip install \"kforge[cutlass]\" "
                          "(or set CUTLASS_PATH to a CUTLASS tree)")
    return _command("cuda", arch, src, out)[0]


def build_cutlass(source: str, arch: str = "sm_90a", timeout_s: float | None = None) -> CutlassBuild:
    """Build ``source`` as the judge does, through ``compile_source`` (the screen, the compiler's jail with CUTLASS's
    folder readable and a CUTLASS build's limits, the binary wall, the cache by content): one path for the benchmark
    and the search. ``timeout_s``: ``compile_timeout``'s by default. Raises Unsupported where nvcc or the CUTLASS
    headers are not here, CompileError (SourceRejected, BinaryRejected) when the build fails or a wall refuses it."""
    from ...kernels import compile_source, find_nvcc

    if find_nvcc() is None or cutlass_root() is None:
        raise Unsupported("building CUTLASS kernels needs nvcc and the CUTLASS headers: pip install \"kforge[cutlass]\" "
                          "(or set CUTLASS_PATH to a CUTLASS tree)")
    built = compile_source(source, "cuda", arch, timeout_s=timeout_s)
    return CutlassBuild(built.path, built.sha256, built.seconds, built.cached, built.log)


__all__ = ["CutlassBuild", "CutlassConfig", "build_cutlass", "config_space", "cutlass_root", "default_config",
           "design", "driver_library", "evt_inputs", "nvcc_command", "render_cuda"]
