"""C/OpenMP region kernels: one pass over the outputs, or one row per iteration with two phases."""
from __future__ import annotations

from ._codegen import (Config, _C_TYPES, finish_stats, flat_offset, inputs_of, math_choices, node_lines, red_operand,
                       red_value, row_out_offset, split_offsets, stats_code)
from ._plan import RegionPlan

_PRELUDE = r"""#include "kforge.h"
#include <math.h>
#include <stdint.h>

static inline float kf_maxf(float a, float b) { return (a > b || a != a) ? a : b; }
static inline float kf_minf(float a, float b) { return (a < b || a != a) ? a : b; }
static inline float kf_rbf(float v) { return kf_bf16_to_f32(kf_f32_to_bf16(v)); }
static inline float kf_rhf(float v) { return kf_f16_to_f32(kf_f32_to_f16(v)); }
static inline float ld_float32(const float* p, long i) { return p[i]; }
static inline float ld_bfloat16(const uint16_t* p, long i) { return kf_bf16_to_f32(p[i]); }
static inline float ld_float16(const uint16_t* p, long i) { return kf_f16_to_f32(p[i]); }
static inline float ld_bool(const uint8_t* p, long i) { return p[i] != 0 ? 1.f : 0.f; }
static inline void st_float32(float* p, long i, float v) { p[i] = v; }
static inline void st_bfloat16(uint16_t* p, long i, float v) { p[i] = kf_f32_to_bf16(v); }
static inline void st_float16(uint16_t* p, long i, float v) { p[i] = kf_f32_to_f16(v); }
static inline void st_bool(uint8_t* p, long i, float v) { p[i] = v != 0.f; }
"""


def _pointers(plan: RegionPlan) -> list[str]:
    lines = []
    for i, s in enumerate(plan.inputs):
        lines.append(f"const {_C_TYPES[s.dtype]}* restrict in{i} = (const {_C_TYPES[s.dtype]}*)inputs[{i}].data;")
    for o, s in enumerate(plan.outputs):
        lines.append(f"{_C_TYPES[s.dtype]}* restrict out{o} = ({_C_TYPES[s.dtype]}*)outputs[{o}].data;")
    return lines


def _indent(lines, n):
    return "\n".join(" " * n + ln for ln in lines)


def render_cpu(plan: RegionPlan, config: Config) -> str:
    body = _pointwise(plan, config) if plan.red is None else _reduction(plan, config)
    head = ["/* kforge region kernel (C/OpenMP): " + ",".join(plan.ir.ops) + " */", _PRELUDE]
    if plan.red is not None:
        head.append(stats_code(plan.red_op, "static inline"))
    return "\n".join(head) + "\n" + body


def _pointwise(plan: RegionPlan, c: Config) -> str:
    loads = [f"const float a{i} = ld_{plan.inputs[i].dtype}(in{i}, {flat_offset(plan, plan.inputs[i].shape, plan.inputs[i].stride)});"
             for i in inputs_of(plan, plan.full)]
    stores = [f"st_{s.dtype}(out{o}, {flat_offset(plan, s.shape, s.stride)}, t{plan.ir.outputs[o]});"
              for o, s in enumerate(plan.outputs)]
    chunk = int(c.get("chunk", 1024))
    simd = "#pragma omp simd\n        " if c.get("simd") else ""
    return f"""
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {{
{_indent(_pointers(plan), 4)}
    const long total = {plan.numel}L;
    #pragma omp parallel for schedule(static) if(total > {chunk * 4}L)
    for (long c0 = 0; c0 < total; c0 += {chunk}L) {{
        const long c1 = c0 + {chunk}L < total ? c0 + {chunk}L : total;
        {simd}for (long i = c0; i < c1; ++i) {{
{_indent(loads + node_lines(plan, plan.full, False, **math_choices(c)) + stores, 12)}
        }}
    }}
    return 0;
}}
"""


def _reduction(plan: RegionPlan, c: Config) -> str:
    p = red_operand(plan)
    norm = plan.red_op in ("softmax", "log_softmax", "layer_norm")
    cache = bool(c.get("cache")) and norm
    phase1 = list(plan.phase1)
    # Phase 2 needs the reduction's operand again for a norm: from the row cache, or recomputed.
    full = [n for n in plan.full if n != plan.red]
    need2 = sorted(set(full) | (set(phase1) if norm and not cache else set()))
    need2 = [n for n in need2 if n not in phase1 or not cache or n in full]

    def loads(inputs, var="j"):
        out = []
        for i in inputs:
            s = plan.inputs[i]
            rpart, cpart = split_offsets(plan, s.shape, s.stride)
            out.append(f"const float a{i} = ld_{s.dtype}(in{i}, {rpart} + {cpart if var == 'j' else '0L'});")
        return out

    p1 = loads(inputs_of(plan, phase1) + ([] if plan.ir.nodes[plan.red].args[0].kind == "n" else
                                            [plan.ir.nodes[plan.red].args[0].value]))
    p1 = sorted(set(p1), key=p1.index)
    p1 += node_lines(plan, phase1, False, **math_choices(c))
    if cache:
        p1.append(f"rowc[j] = {p};")
    p1.append(f"st_add(&st, {p});")
    value = red_value(plan, "rowc[j]" if cache else p)
    ph2_nodes = sorted(set(need2) | ({plan.red} if plan.red in plan.full else set()))
    in2 = inputs_of(plan, [n for n in ph2_nodes if n != plan.red])
    if norm and not cache and plan.ir.nodes[plan.red].args[0].kind == "i":
        in2 = sorted(set(in2) | {plan.ir.nodes[plan.red].args[0].value})
    p2 = loads(in2) + node_lines(plan, ph2_nodes, False, value, **math_choices(c))
    p2 += [f"st_{s.dtype}(out{o}, {split_offsets(plan, s.shape, s.stride)[0]} + {split_offsets(plan, s.shape, s.stride)[1]}, t{plan.ir.outputs[o]});"
           for o, s in enumerate(plan.outputs) if not plan.out_is_row[o]]
    rowl = []
    if plan.row:
        rowl = ["const long j = 0;"] + loads(inputs_of(plan, [n for n in plan.row if n != plan.red]))
        rowl += node_lines(plan, plan.row, False, red_value(plan, "0.f"), **math_choices(c))
        rowl += [f"st_{s.dtype}(out{o}, {row_out_offset(plan, o)}, t{plan.ir.outputs[o]});"
                 for o, s in enumerate(plan.outputs) if plan.out_is_row[o]]
    has_full = any(not r for r in plan.out_is_row)
    cache_decl = f"float rowc[{plan.cols}];" if cache else ""
    return f"""
KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {{
{_indent(_pointers(plan), 4)}
    #pragma omp parallel for schedule(static, {int(c.get('rows_per_task', 1))})
    for (long r = 0; r < {plan.rows}L; ++r) {{
        {cache_decl}
        St st = st_init();
        for (long j = 0; j < {plan.cols}L; ++j) {{
{_indent(p1, 12)}
        }}
        {finish_stats(plan, False)}
        {{
{_indent(rowl, 12)}
        }}
        {"" if not has_full else "for (long j = 0; j < " + str(plan.cols) + "L; ++j) {"}
{_indent(p2, 12) if has_full else ""}
        {"}" if has_full else ""}
    }}
    return 0;
}}
"""
