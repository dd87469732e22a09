"""CUDA region kernels.

Pointwise: a grid-stride loop over the index space in ``vec``-element groups (16-byte vectors for
operands that are contiguous along the last dim, one broadcast load for operands constant along
it). Reduction: ``tpr`` threads per row (several rows per block when a row is short), the row
kept in registers between the two phases when it fits (``cache``), or ``split`` blocks per row
with partial statistics merged through the workspace (a second kernel) when rows are long.
"""
from __future__ import annotations


from ._codegen import (STAT_FIELDS, Config, _CU_TYPES, fast_reduction, finish_stats, flat_offset, inputs_of,
                       math_choices, node_lines, red_operand, red_value, row_out_offset, split_offsets, stats_code)
from ._plan import RegionPlan

_PRELUDE = r"""#include "kforge.h"
#include <stdint.h>

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(uint8_t v) { return v != 0 ? 1.f : 0.f; }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ uint8_t from_f<uint8_t>(float v) { return v != 0.f; }
__device__ __forceinline__ float kf_maxf(float a, float b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ float kf_minf(float a, float b) { return (a < b || a != a) ? a : b; }
__device__ __forceinline__ float kf_rbf(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float kf_rhf(float v) { return __half2float(__float2half_rn(v)); }

template <typename T, int N> struct alignas(sizeof(T) * N) Vec { T v[N]; };
template <int N, typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[N]) {
    Vec<T, N> v = *reinterpret_cast<const Vec<T, N>*>(p);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_f(v.v[i]);
}
template <int N, typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[N]) {
    Vec<T, N> v;
#pragma unroll
    for (int i = 0; i < N; ++i) v.v[i] = from_f<T>(in[i]);
    *reinterpret_cast<Vec<T, N>*>(p) = v;
}
"""


def _types(plan: RegionPlan) -> str:
    out = [f"typedef {_CU_TYPES[s.dtype]} T{i};" for i, s in enumerate(plan.inputs)]
    out += [f"typedef {_CU_TYPES[s.dtype]} O{o};" for o, s in enumerate(plan.outputs)]
    n_in, n_out = max(len(plan.inputs), 1), max(len(plan.outputs), 1)
    out.append(f"struct Args {{ const void* in[{n_in}]; void* out[{n_out}]; }};")
    return "\n".join(out) + "\n"


def _ptrs(plan: RegionPlan) -> list[str]:
    lines = [f"const T{i}* __restrict__ in{i} = (const T{i}*)args.in[{i}];" for i in range(len(plan.inputs))]
    lines += [f"O{o}* __restrict__ out{o} = (O{o}*)args.out[{o}];" for o in range(len(plan.outputs))]
    return lines


def _args_fill(plan: RegionPlan) -> str:
    lines = ["Args args;"]
    lines += [f"args.in[{i}] = inputs[{i}].data;" for i in range(len(plan.inputs))]
    lines += [f"args.out[{o}] = outputs[{o}].data;" for o in range(len(plan.outputs))]
    return "\n    ".join(lines)


def _indent(lines, n):
    return "\n".join(" " * n + ln for ln in lines)


def _vec_mode(plan: RegionPlan, shape, stride, v: int) -> str:
    """How a ``v``-lane group reads a tensor: "vec" (one vector), "bcast" (one value) or "lane"."""
    if v == 1:
        return "lane"
    bst = plan.bstrides(shape, stride)
    last = plan.shape[-1]
    if last % v:
        return "lane"
    if bst[-1] == 0:
        return "bcast"
    if bst[-1] == 1 and all(st % v == 0 for st in bst[:-1]):
        return "vec"
    return "lane"


def max_vec(plan: RegionPlan) -> int:
    """Widest lane group every full-shape output can be stored in as whole 16-byte vectors."""
    sigs = [s for o, s in enumerate(plan.outputs) if not plan.out_is_row[o]] + list(plan.inputs)
    w = min(16 // (4 if s.dtype == "float32" else 2 if s.dtype != "bool" else 1) for s in sigs)
    w = min(w, 8)
    while w > 1:
        outs_ok = all(_vec_mode(plan, s.shape, s.stride, w) == "vec" for o, s in enumerate(plan.outputs)
                      if not plan.out_is_row[o])
        if outs_ok and plan.shape[-1] % w == 0 and (plan.red is None or plan.cols % w == 0):
            return w
        w //= 2
    return 1


def render_cuda(plan: RegionPlan, config: Config, sm_count: int = 132) -> str:
    head = "/* kforge region kernel (CUDA): " + ",".join(plan.ir.ops) + " */\n" + _PRELUDE + _types(plan)
    if plan.red is None:
        return head + _pointwise(plan, config, sm_count)
    return head + stats_code(plan.red_op, "__device__ __forceinline__", _exp(plan, config)) + _reduction(plan, config)


def _exp(plan: RegionPlan, c: Config) -> str:
    """The reduction's exponential: the hardware one under ``fast`` where every output is 16-bit."""
    return "__expf" if math_choices(c)["fast"] and fast_reduction(plan) else "expf"


def _lane_reduce(var: str, combine: str, tpr: int, tag: str) -> str:
    """``var`` combined over the ``tpr`` lanes of its row: shuffles within a warp, then shared memory
    across warps (``tpr`` > 32: one row per block). ``combine`` is a format of ``{a}`` and ``{b}``."""
    code = f"""
#pragma unroll
    for (int o = {min(tpr, 32)} / 2; o > 0; o >>= 1)
        {var} = {combine.format(a=var, b=f"__shfl_xor_sync(0xffffffffu, {var}, o)")};"""
    if tpr > 32:
        code += f"""
    {{
        __shared__ float part_{tag}[{tpr // 32}];
        __syncthreads();
        if ((threadIdx.x & 31) == 0) part_{tag}[threadIdx.x >> 5] = {var};
        __syncthreads();
        {var} = part_{tag}[0];
        for (int w = 1; w < {tpr // 32}; ++w) {var} = {combine.format(a=var, b=f"part_{tag}[w]")};
    }}"""
    return code


def _group_loads(plan: RegionPlan, inputs, v: int, off_of) -> tuple[list[str], str]:
    """Loads of ``v`` lanes per input into ``va{i}[l]``; returns (lines, alignment condition)."""
    lines, aligned = [], ""
    for i in inputs:
        s = plan.inputs[i]
        mode = _vec_mode(plan, s.shape, s.stride, v)
        off = off_of(s.shape, s.stride, "base")
        lines.append(f"float va{i}[V];")
        if mode == "vec":
            lines.append(f"load_vec<V>(in{i} + {off}, va{i});")
            aligned += f" && (uintptr_t)inputs[{i}].data % 16 == 0"
        elif mode == "bcast":
            lines.append(f"{{ const float s_ = to_f(in{i}[{off}]);")
            lines.append(f"#pragma unroll\nfor (int l = 0; l < V; ++l) va{i}[l] = s_; }}")
        else:
            lines.append("#pragma unroll")
            lines.append(f"for (int l = 0; l < V; ++l) va{i}[l] = to_f(in{i}[{off_of(s.shape, s.stride, '(base + l)')}]);")
    return lines, aligned


def _pointwise(plan: RegionPlan, c: Config, sm_count: int) -> str:
    threads, vec = int(c.get("threads", 256)), int(c.get("vec", 1))
    waves = int(c.get("waves", 0))
    total = plan.numel
    ins = inputs_of(plan, plan.full)
    loads, aligned = _group_loads(plan, ins, vec, lambda sh, st, var: flat_offset(plan, sh, st, var))
    comp = [f"const float a{i} = va{i}[l];" for i in ins] + node_lines(plan, plan.full, True, **math_choices(c))
    comp += [f"vo{o}[l] = t{plan.ir.outputs[o]};" for o in range(len(plan.outputs))]
    stores = []
    for o, s in enumerate(plan.outputs):
        if vec > 1:
            # NB: at the output's own offset of the group's first lane: only the first output is dense in the
            # walk order (plan_region), another may be laid out otherwise (max_vec: unit stride on the last dim)
            stores.append(f"store_vec<V>(out{o} + {flat_offset(plan, s.shape, s.stride, 'base')}, vo{o});")
            aligned += f" && (uintptr_t)outputs[{o}].data % 16 == 0"
        else:
            stores.append(f"out{o}[{flat_offset(plan, s.shape, s.stride, 'base')}] = from_f<O{o}>(vo{o}[0]);")
    generic_stores = [f"out{o}[{flat_offset(plan, s.shape, s.stride, 'base')}] = from_f<O{o}>(vo{o}[0]);"
                      for o, s in enumerate(plan.outputs)]
    cap = waves * sm_count * max(2048 // threads, 1) if waves else 1 << 30
    outs_decl = " ".join(f"float vo{o}[V];" for o in range(len(plan.outputs)))

    def kernel(name: str, stores_: list[str]) -> str:
        return f"""
template <int V>
__global__ void __launch_bounds__({threads}) {name}(Args args) {{
{_indent(_ptrs(plan), 4)}
    const long step = (long)gridDim.x * {threads} * V;
    for (long base = ((long)blockIdx.x * {threads} + threadIdx.x) * V; base < {total}L; base += step) {{
{_indent(loads, 8)}
        {outs_decl}
#pragma unroll
        for (int l = 0; l < V; ++l) {{
{_indent(comp, 12)}
        }}
{_indent(stores_, 8)}
    }}
}}
"""
    return kernel("region_vec", stores) + (kernel("region_one", generic_stores) if vec > 1 else "") + f"""
static long blocks_for(long groups) {{
    long b = (groups + {threads} - 1) / {threads};
    if (b > {cap}L) b = {cap}L;
    return b < 1 ? 1 : b;
}}

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {{
    {_args_fill(plan)}
    cudaStream_t s = (cudaStream_t)stream;
    if ({vec} == 1 || (1{aligned}))
        region_vec<{vec}><<<(int)blocks_for({total}L / {vec}), {threads}, 0, s>>>(args);
    else
        {"region_one<1>" if vec > 1 else "region_vec<1>"}<<<(int)blocks_for({total}L), {threads}, 0, s>>>(args);
    return (int)cudaGetLastError();
}}
"""


def _reduction(plan: RegionPlan, c: Config) -> str:
    threads, tpr = int(c.get("threads", 256)), int(c.get("tpr", 256))
    vec, split, cache = int(c.get("vec", 1)), int(c.get("split", 1)), bool(c.get("cache", False))
    rpb = threads // tpr
    cols, rows = plan.cols, plan.rows
    chunk = -(-cols // split)
    chunk = -(-chunk // vec) * vec
    items = max(1, -(-chunk // (tpr * vec)))
    norm = plan.red_op in ("softmax", "log_softmax", "layer_norm")
    cache = cache and split == 1
    red_src = plan.ir.nodes[plan.red].args[0]
    in1 = sorted(set(inputs_of(plan, plan.phase1)) | ({red_src.value} if red_src.kind == "i" else set()))
    full = [n for n in plan.full if n != plan.red]
    ph2 = sorted(set(full) | ({plan.red} if plan.red in plan.full else set())
                 | (set(plan.phase1) if norm and not cache else set()))
    in2 = sorted(set(inputs_of(plan, [n for n in ph2 if n != plan.red]))
                 | ({red_src.value} if (norm and not cache and red_src.kind == "i") else set()))
    p = red_operand(plan)

    def off_of(shape, stride, var):
        rp, cp = split_offsets(plan, shape, stride, "j" if var in ("base", "j") else "(j + l)")
        return f"({rp} + {cp})"

    def group_loads(inputs, tag):
        lines, aligned = _group_loads(plan, inputs, vec, lambda sh, st, var: off_of(sh, st, var))
        return [ln.replace("va", f"v{tag}") for ln in lines], aligned

    # NB: a norm whose row is held in registers takes its statistics from them in two passes (max,
    # then the exponentials' sum; mean, then the squared deviations): one exponential per element,
    # no division per element and no branch, where the one-pass online statistics have all three.
    two_pass = cache and norm
    exp = _exp(plan, c)
    cached_inputs = sorted(set(in1) | set(in2)) if cache else in1
    l1, al1 = group_loads(cached_inputs, "a")
    comp1 = [f"const float a{i} = va{i}[l];" for i in cached_inputs]
    comp1 += node_lines(plan, plan.phase1, True, **math_choices(c))
    if not two_pass:
        comp1.append(f"st_add(&st, {p});")
    if cache:
        l1 += [f"for (int l = 0; l < V; ++l) ca{i}[it][l] = va{i}[l];" for i in cached_inputs]
        if norm:
            comp1.append(f"cp[it][l] = {p};")
    if two_pass and plan.red_op == "softmax":
        value = "(cp[it][l] * inv_)"       # cp holds the exponentials, inv_ is 1 / their sum
    else:
        value = red_value(plan, "cp[it][l]" if (cache and norm) else p, exp)
    if cache:
        l2, al2 = [f"float va{i}[V]; for (int l = 0; l < V; ++l) va{i}[l] = ca{i}[it][l];" for i in in2], ""
    else:
        l2, al2 = group_loads(in2, "a")
    ph2_nodes = [n for n in ph2 if not (cache and n in plan.phase1 and n not in full)]
    comp2 = [f"const float a{i} = va{i}[l];" for i in in2] + node_lines(plan, ph2_nodes, True, value, **math_choices(c))
    full_outs = [o for o in range(len(plan.outputs)) if not plan.out_is_row[o]]
    comp2 += [f"vo{o}[l] = t{plan.ir.outputs[o]};" for o in full_outs]
    st2, al3 = [], ""
    for o in full_outs:
        s = plan.outputs[o]
        if vec > 1:
            st2.append(f"store_vec<V>(out{o} + {off_of(s.shape, s.stride, 'j')}, vo{o});")
            al3 += f" && (uintptr_t)outputs[{o}].data % 16 == 0"
        else:
            st2.append(f"out{o}[{off_of(s.shape, s.stride, 'j')}] = from_f<O{o}>(vo{o}[0]);")
    rowl = []
    if plan.row:
        rowl = ["const long j = 0;"]
        for i in inputs_of(plan, [n for n in plan.row if n != plan.red]):
            s = plan.inputs[i]
            rowl.append(f"const float a{i} = to_f(in{i}[{off_of(s.shape, s.stride, 'j')}]);")
        rowl += node_lines(plan, plan.row, True, red_value(plan, "0.f"), **math_choices(c))
        rowl += [f"out{o}[{row_out_offset(plan, o)}] = from_f<O{o}>(t{plan.ir.outputs[o]});"
                 for o in range(len(plan.outputs)) if plan.out_is_row[o]]
    aligned = al1 + al2 + al3
    cache_decl = " ".join(f"float ca{i}[{items}][V];" for i in cached_inputs) if cache else ""
    if cache and norm:
        cache_decl += f" float cp[{items}][V];"
    outs_decl = " ".join(f"float vo{o}[V];" for o in full_outs)
    fields = STAT_FIELDS[plan.red_op]
    shuffled = ", ".join(f"__shfl_xor_sync(0xffffffffu, st.{f}, o)" if f in fields else f"st.{f}" for f in "abc")
    reduce_lanes = f"""
    // merge the row's threads: lanes of a warp by shuffles (the fields this reduction uses), warps
    // through shared memory
#pragma unroll
    for (int o = {min(tpr, 32)} / 2; o > 0; o >>= 1) {{
        St other = {{{shuffled}}};
        st_merge(&st, other);
    }}"""
    if tpr > 32:
        reduce_lanes += f"""
    {{
        __shared__ St part[{tpr // 32}];
        __syncthreads();
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = st;
        __syncthreads();
        st = part[0];
        for (int w = 1; w < {tpr // 32}; ++w) st_merge(&st, part[w]);
    }}"""

    if two_pass:
        def row_loop(body: str) -> str:
            return f"""
#pragma unroll
    for (int it = 0; it < {items}; ++it) {{
        const long j = j0 + ((long)it * {tpr} + t) * V;
        if (valid && j < j1) {{
#pragma unroll
            for (int l = 0; l < V; ++l) {{ {body} }}
        }}
    }}"""
        if plan.red_op == "layer_norm":
            first = "float m_ = 0.f;" + row_loop("m_ += cp[it][l];") + _lane_reduce("m_", "({a} + {b})", tpr, "m")
            first += f"\n    m_ = m_ / {float(cols)!r}f;"
            second = "\n    float s_ = 0.f;" + row_loop("const float d_ = cp[it][l] - m_; s_ += d_ * d_;")
        else:
            first = "float m_ = KF_NEG_INF;" + row_loop("m_ = kf_maxf(m_, cp[it][l]);")
            first += _lane_reduce("m_", "kf_maxf({a}, {b})", tpr, "m")
            keep = "cp[it][l] = e_; " if plan.red_op == "softmax" else ""
            second = "\n    float s_ = 0.f;" + row_loop(f"const float e_ = {exp}(cp[it][l] - m_); {keep}s_ += e_;")
        second += _lane_reduce("s_", "({a} + {b})", tpr, "s")
        reduce_lanes = f"""
    // the row's statistics from its registers, in two passes, each merged over the row's threads
    {first}{second}
    st.a = m_; st.b = s_; st.c = {float(cols)!r}f;"""
        if plan.red_op == "softmax":
            reduce_lanes += "\n    const float inv_ = 1.f / st.b;"

    phase1 = f"""
#pragma unroll
    for (int it = 0; it < {items}; ++it) {{
        const long j = j0 + ((long)it * {tpr} + t) * V;
        if (valid && j < j1) {{
{_indent(l1, 12)}
#pragma unroll
            for (int l = 0; l < V; ++l) {{
{_indent(comp1, 16)}
            }}
        }}
    }}"""
    phase2 = f"""
    if (valid && chunk == 0 && t == 0) {{
{_indent(rowl, 8)}
    }}
#pragma unroll
    for (int it = 0; it < {items}; ++it) {{
        const long j = j0 + ((long)it * {tpr} + t) * V;
        if (valid && j < j1) {{
{_indent(l2, 12)}
            {outs_decl}
#pragma unroll
            for (int l = 0; l < V; ++l) {{
{_indent(comp2, 16)}
            }}
{_indent(st2, 12)}
        }}
    }}""" if (full_outs or plan.row) else ""
    prologue = f"""
{_indent(_ptrs(plan), 4)}
    const int t = threadIdx.x % {tpr};
    const long r = (long)(blockIdx.x / {split}) * {rpb} + threadIdx.x / {tpr};
    const int chunk = blockIdx.x % {split};
    const bool valid = r < {rows}L;
    const long j0 = (long)chunk * {chunk}L;
    const long j1 = j0 + {chunk}L < {cols}L ? j0 + {chunk}L : {cols}L;
    (void)j1;"""
    if split == 1:
        kernels = f"""
template <int V>
__global__ void __launch_bounds__({threads}) region_red(Args args, float* ws) {{{prologue}
    {cache_decl}
    St st = st_init();{phase1}{reduce_lanes}
    {finish_stats(plan, True)}{phase2}
}}
"""
        launch = f"""
    const int blocks = (int)(({rows}L + {rpb} - 1) / {rpb});
    if ({vec} == 1 || (1{aligned}))
        region_red<{vec}><<<blocks, {threads}, 0, s>>>(args, (float*)workspace);
    else
        region_red<1><<<blocks, {threads}, 0, s>>>(args, (float*)workspace);"""
        ws = 0
    else:
        kernels = f"""
template <int V>
__global__ void __launch_bounds__({threads}) region_stats(Args args, float* ws) {{{prologue}
    St st = st_init();{phase1}{reduce_lanes}
    if (valid && t == 0) {{ float* w = ws + (r * {split} + chunk) * 3; w[0] = st.a; w[1] = st.b; w[2] = st.c; }}
}}

template <int V>
__global__ void __launch_bounds__({threads}) region_red(Args args, float* ws) {{{prologue}
    St st = st_init();
    if (valid) {{
        for (int k = 0; k < {split}; ++k) {{
            const float* w = ws + (r * {split} + k) * 3;
            St o = {{w[0], w[1], w[2]}};
            st_merge(&st, o);
        }}
    }}
    {finish_stats(plan, True)}{phase2}
}}
"""
        launch = f"""
    const int blocks = (int)({rows}L * {split});
    if ({vec} == 1 || (1{aligned})) {{
        region_stats<{vec}><<<blocks, {threads}, 0, s>>>(args, (float*)workspace);
        region_red<{vec}><<<blocks, {threads}, 0, s>>>(args, (float*)workspace);
    }} else {{
        region_stats<1><<<blocks, {threads}, 0, s>>>(args, (float*)workspace);
        region_red<1><<<blocks, {threads}, 0, s>>>(args, (float*)workspace);
    }}"""
        ws = rows * split * 3 * 4
    return kernels + f"""
KF_ENTRY size_t kf_workspace_bytes(void) {{ return {ws}; }}

KF_ENTRY int kf_launch(const kf_tensor* inputs, int n_inputs, const kf_tensor* outputs, int n_outputs,
                       const double* params, int n_params, void* workspace, void* stream) {{
    {_args_fill(plan)}
    cudaStream_t s = (cudaStream_t)stream;{launch}
    return (int)cudaGetLastError();
}}
"""
