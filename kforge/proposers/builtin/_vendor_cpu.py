"""The C/OpenMP kernel of a vendor-headed chain: the product by plain loops, then the tail, both in one source.

Correct before fast: the product is summed in double per output element (eager's BLAS sums in float in another
order; both are far inside the float32 tolerance), rounded to the head's dtype as eager's product is, and kept in
float in the workspace; the tail then reads it as its input 0 (``_vendor_tail``). It exists so that the whole loop
(capture, cards, judge, search) runs and is tested on a machine without a GPU.
"""
from __future__ import annotations

import math

from typing import Any

from ...ops import Unsupported
from ._vendor_tail import C_ROUNDING, ROUND, literal, load_expr, offset_expr, store_stmt, tail_lines

HEADER = r"""#include "kforge.h"
#include <stdint.h>
#include <stddef.h>
#include <math.h>
#include <omp.h>
""" + C_ROUNDING


def _bstrides(shape, stride, target) -> list[int]:
    """Strides of a tensor of ``shape`` broadcast (trailing-aligned) onto ``target``: 0 where broadcast."""
    pad = len(target) - len(shape)
    return [0 if d < pad or shape[d - pad] == 1 else stride[d - pad] for d in range(len(target))]


def _gemm(chain: Any) -> str:
    h = chain.head
    a, b = h.a, h.b
    batched = h.kind in ("bmm", "baddbmm")
    sab, sam, sak = (a.stride[0] if batched else 0), a.stride[-2], a.stride[-1]
    sbb, sbk, sbn = (b.stride[0] if batched else 0), b.stride[-2], b.stride[-1]
    la = load_expr(a.dtype, "in[0].data", "pa + k * %dLL" % sak, "c")
    lb = load_expr(b.dtype, "in[1].data", "pb + k * %dLL" % sbk, "c")
    value = "v"
    bias_line = ""
    if h.bias is not None:
        target = (h.batch, h.m, h.n)
        st = _bstrides(h.bias.shape, h.bias.stride, target)
        off = f"b * {st[0]}LL + m * {st[1]}LL + n * {st[2]}LL"
        bias_line = f"v = {literal(h.alpha)} * v + {literal(h.beta)} * {load_expr(h.bias.dtype, 'in[2].data', off, 'c')};"
    elif h.alpha != 1.0:
        bias_line = f"v = {literal(h.alpha)} * v;"
    return f"""
static void kf_head(const kf_tensor* in, float* H) {{
    #pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < {h.batch}LL; ++b)
    for (int64_t m = 0; m < {h.m}LL; ++m) {{
        for (int64_t n = 0; n < {h.n}LL; ++n) {{
            const int64_t pa = b * {sab}LL + m * {sam}LL, pb = b * {sbb}LL + n * {sbn}LL;
            double acc = 0.0;
            for (int64_t k = 0; k < {h.k}LL; ++k) acc += (double){la} * (double){lb};
            float v = (float)acc;
            {bias_line}
            H[(b * {h.m}LL + m) * {h.n}LL + n] = {ROUND[h.dtype].format(value)};
        }}
    }}
}}
"""


def _conv(chain: Any) -> str:
    h = chain.head
    c = h.conv
    assert c is not None
    x, w, out = h.a, h.b, h.out
    sp = c.spatial
    n_img, c_out = out.shape[0], out.shape[1]
    c_in = x.shape[1]
    groups = c.groups
    cin_g = c_in // groups
    cout_g = c_out // groups
    osz, isz, ksz = out.shape[2:], x.shape[2:], w.shape[2:]
    loops, idx, checks = [], [], []
    for d in range(sp):
        loops.append(f"for (int64_t o{d} = 0; o{d} < {osz[d]}LL; ++o{d})")
    kloops = [f"for (int64_t k{d} = 0; k{d} < {ksz[d]}LL; ++k{d}) {{" for d in range(sp)]
    for d in range(sp):
        if not c.transposed:
            idx.append(f"const int64_t i{d} = o{d} * {c.stride[d]}LL - {c.padding[d]}LL + k{d} * {c.dilation[d]}LL;")
            checks.append(f"if (i{d} < 0 || i{d} >= {isz[d]}LL) continue;")
        else:
            idx.append(f"const int64_t u{d} = o{d} + {c.padding[d]}LL - k{d} * {c.dilation[d]}LL;")
            checks.append(f"if (u{d} < 0 || u{d} % {c.stride[d]}LL) continue;")
            idx.append(f"const int64_t i{d} = u{d} / {c.stride[d]}LL;")
            checks.append(f"if (i{d} >= {isz[d]}LL) continue;")
    xoff = " + ".join([f"n * {x.stride[0]}LL", f"ic * {x.stride[1]}LL"] + [f"i{d} * {x.stride[2 + d]}LL" for d in range(sp)])
    if c.transposed:   # weight [C_in, C_out / groups, k...]
        woff = " + ".join([f"ic * {w.stride[0]}LL", f"(oc % {cout_g}LL) * {w.stride[1]}LL"]
                          + [f"k{d} * {w.stride[2 + d]}LL" for d in range(sp)])
    else:              # weight [C_out, C_in / groups, k...]
        woff = " + ".join([f"oc * {w.stride[0]}LL", f"icg * {w.stride[1]}LL"] + [f"k{d} * {w.stride[2 + d]}LL" for d in range(sp)])
    hoff = "(n * %dLL + oc)" % c_out
    for d in range(sp):
        hoff = f"({hoff} * {osz[d]}LL + o{d})"
    inner = []
    # NB: index and bound checks interleaved per dim, so that a dim's index is checked before the next is formed
    per_dim = []
    for d in range(sp):
        if not c.transposed:
            per_dim.append(f"{idx[d]} {checks[d]}")
        else:
            per_dim.append(f"{idx[2 * d]} {checks[2 * d]} {idx[2 * d + 1]} {checks[2 * d + 1]}")
    for d in range(sp):
        inner.append(kloops[d] + " " + per_dim[d])
    closing = "}" * sp
    bias = ""
    if h.bias is not None:
        bias = f"v += {load_expr(h.bias.dtype, 'in[2].data', f'oc * {h.bias.stride[0]}LL', 'c')};"
    return f"""
static void kf_head(const kf_tensor* in, float* H) {{
    #pragma omp parallel for collapse(2) schedule(static)
    for (int64_t n = 0; n < {n_img}LL; ++n)
    for (int64_t oc = 0; oc < {c_out}LL; ++oc) {{
        const int64_t g = oc / {cout_g}LL;
        {" ".join(loops)} {{
            double acc = 0.0;
            for (int64_t icg = 0; icg < {cin_g}LL; ++icg) {{
                const int64_t ic = g * {cin_g}LL + icg;
                {" ".join(inner)}
                    acc += (double){load_expr(x.dtype, 'in[0].data', xoff, 'c')} * (double){load_expr(w.dtype, 'in[1].data', woff, 'c')};
                {closing}
            }}
            float v = (float)acc;
            {bias}
            H[{hoff}] = {ROUND[h.dtype].format("v")};
        }}
    }}
}}
"""


def _loads(chain: Any, flat: str) -> list[str]:
    out = []
    for i, t in enumerate(chain.tail_inputs):
        off = offset_expr(t.sig.shape, t.sig.stride, flat)
        if t.source < 0:
            out.append(f"const float x{i} = H[{off}];")
        else:
            out.append(f"const float x{i} = {load_expr(t.sig.dtype, f'in[{t.source}].data', off, 'c')};")
    return out


def _tail(chain: Any) -> str:
    ir = chain.ir
    sigs = [t.sig for t in chain.tail_inputs]
    if ir is None:
        return ""
    plan = chain.plan()
    if plan.red is None:
        code = tail_lines(ir, sigs)
        numel = math.prod(chain.frame)
        stores = [store_stmt(s.dtype, f"out[{j}].data", offset_expr(s.shape, s.stride, "e"), f"t{o}", "c")
                  for j, (o, s) in enumerate(zip(ir.outputs, chain.out_frames))]
        body = "\n        ".join([*_loads(chain, "e"), *code.lines, *stores])
        return f"""
static void kf_tail(const kf_tensor* in, const kf_tensor* out, const float* H) {{
    #pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < {numel}LL; ++e) {{
        {body}
    }}
}}
"""
    red = plan.red
    node = ir.nodes[red]
    src = node.args[0]
    operand = f"x{src.value}" if src.kind == "i" else f"t{src.value}"
    rows, cols = plan.rows, plan.cols
    phase1 = tail_lines(ir, sigs, plan.phase1).lines if src.kind == "n" else ()
    op = node.op
    if op in ("sum", "mean"):
        acc_init, acc_step = "double s = 0.0;", f"s += (double){operand};"
        stats = f"const float rval = (float)(s{' / %d.0' % cols if op == 'mean' else ''});"
    elif op in ("amax", "amin"):
        cmp = ">" if op == "amax" else "<"
        acc_init = f"float s = {literal(float('-inf') if op == 'amax' else float('inf'))};"
        acc_step = f"if ({operand} {cmp} s || {operand} != {operand}) s = {operand};"
        stats = "const float rval = s;"
    elif op in ("softmax", "log_softmax"):
        acc_init = f"float mx = {literal(float('-inf'))}; double s = 0.0;"
        acc_step = (f"if ({operand} > mx) {{ s = s * exp((double)mx - (double){operand}) + 1.0; mx = {operand}; }} "
                    f"else s += exp((double){operand} - (double)mx);")
        stats = "const float rinv = (float)(1.0 / s); const float rlog = (float)log(s);"
    elif op == "layer_norm":
        acc_init, acc_step = "double s = 0.0, q = 0.0;", f"s += (double){operand}; q += (double){operand} * (double){operand};"
        eps = float(node.attr["eps"])
        stats = (f"const double mu = s / {cols}.0; double var = q / {cols}.0 - mu * mu; if (var < 0.0) var = 0.0;\n"
                 f"        const float rmean = (float)mu; const float rrstd = (float)(1.0 / sqrt(var + {eps!r}));")
    else:
        raise Unsupported(f"no row kernel for {op}")

    def reduced(i: int, arg: str) -> str:
        if op == "softmax":
            return f"(expf({arg} - mx) * rinv)"
        if op == "log_softmax":
            return f"({arg} - mx - rlog)"
        if op == "layer_norm":
            return f"(({arg} - rmean) * rrstd)"
        return "rval"

    code = tail_lines(ir, sigs, reduced=reduced)
    full, row = [], []
    for j, (o, s, is_row) in enumerate(zip(ir.outputs, chain.out_frames, plan.out_is_row)):
        if is_row:
            row.append(f"if (c == 0) {{ {store_stmt(s.dtype, f'out[{j}].data', offset_expr(s.shape, s.stride, 'r'), f't{o}', 'c')} }}")
        else:
            full.append(store_stmt(s.dtype, f"out[{j}].data", offset_expr(s.shape, s.stride, "e"), f"t{o}", "c"))
    first = "\n            ".join([*_loads(chain, "e"), *phase1, acc_step])
    second = "\n            ".join([*_loads(chain, "e"), *code.lines, *full, *row])
    return f"""
static void kf_tail(const kf_tensor* in, const kf_tensor* out, const float* H) {{
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < {rows}LL; ++r) {{
        {acc_init}
        for (int64_t c = 0; c < {cols}LL; ++c) {{
            const int64_t e = r * {cols}LL + c;
            {first}
        }}
        {stats}
        for (int64_t c = 0; c < {cols}LL; ++c) {{
            const int64_t e = r * {cols}LL + c;
            {second}
        }}
    }}
}}
"""


def render_cpu(chain: Any) -> str:
    """A complete C/OpenMP source of the kernel contract computing ``chain`` (a ``kforge.regions.VendorChain``):
    inputs and outputs as ``chain.inputs`` / ``chain.outputs``, the product in a float workspace (``kf_workspace_bytes``)."""
    h = chain.head
    if h.dtype not in ROUND:
        raise Unsupported(f"a {h.dtype} product")
    head = _conv(chain) if h.is_conv else _gemm(chain)
    numel = math.prod(h.out.shape)
    if chain.ir is None:
        s = chain.outputs[0]
        tail = f"""
static void kf_tail(const kf_tensor* in, const kf_tensor* out, const float* H) {{
    (void)in;
    #pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < {numel}LL; ++e) {{ {store_stmt(s.dtype, "out[0].data", offset_expr(s.shape, s.stride, "e"), "H[e]", "c")} }}
}}
"""
    else:
        tail = _tail(chain)
    return f"""/* kforge vendor chain (C/OpenMP): {chain.describe()} */
{HEADER}
KF_ENTRY size_t kf_workspace_bytes(void) {{ return (size_t){numel}ULL * sizeof(float); }}
{head}
{tail}
KF_ENTRY int kf_launch(const kf_tensor* in, int n_in, const kf_tensor* out, int n_out, const double* params,
                       int n_params, void* workspace, void* stream) {{
    (void)params; (void)n_params; (void)stream;
    if (n_in != {len(chain.inputs)} || n_out != {len(chain.outputs)} || workspace == NULL) return 1;
    float* H = (float*)workspace;
    kf_head(in, H);
    kf_tail(in, out, H);
    return 0;
}}
"""


__all__ = ["render_cpu"]
