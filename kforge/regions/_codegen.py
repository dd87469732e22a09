"""One generator for every region: the plan's nodes become one fused kernel (C/OpenMP or CUDA).

Values are computed in float. Two choices trade eager's exact numbers for speed, each a knob of the
search (the judge decides whether the result still matches eager within the dtype's tolerance):

- ``round``: 1 rounds every float16/bfloat16 node to its dtype, as eager rounds each operator's
  result; 0 keeps float32 through the chain and rounds only at casts and outputs (Inductor's way).
- ``fast`` (CUDA): 1 computes the transcendental functions of float16/bfloat16 nodes with the
  hardware approximations (``tanh.approx``, ``ex2.approx``, ``lg2.approx``; sigmoid and silu keep an
  exactly rounded reciprocal, ``__frcp_rn``), whose error is far below
  a 16-bit result's rounding; float32 nodes use the accurate functions, except a softmax's own
  exponentials where every output of the region is 16-bit (``fast_reduction``).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from ..kernels._offsets import lin
from ._ir import Node
from ._plan import RegionPlan

Config = dict[str, Any]

_C_TYPES = {"float32": "float", "bfloat16": "uint16_t", "float16": "uint16_t", "bool": "uint8_t"}
_CU_TYPES = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half", "bool": "uint8_t"}
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "bool": 1}


def _lit(v: Any) -> str:
    v = float(v)
    if math.isnan(v):
        return "(0.f / 0.f)"
    if math.isinf(v):
        return "KF_POS_INF" if v > 0 else "KF_NEG_INF"
    return f"{v!r}f" if abs(v) < 3e38 else repr(v)


#: Operators whose CUDA expression has a hardware-approximate form (the ``fast`` knob).
FAST_OPS = frozenset({"tanh", "exp", "log", "sigmoid", "silu", "gelu"})
_HALF = ("bfloat16", "float16")


def _fast_expr(op: str, x: str, attr: dict) -> str | None:
    if op == "tanh":
        return f"kf_tanh_approx({x})"
    if op == "exp":
        return f"__expf({x})"
    if op == "log":
        return f"__logf({x})"
    if op == "sigmoid":
        return f"__frcp_rn(1.f + __expf(-{x}))"
    if op == "silu":
        return f"({x} * __frcp_rn(1.f + __expf(-{x})))"
    if op == "gelu" and attr.get("approximate", "none") == "tanh":
        return f"(0.5f * {x} * (1.f + kf_tanh_approx(0.7978845608028654f * ({x} + 0.044715f * {x} * {x} * {x}))))"
    return None


def _expr(node: Node, a: list[str], cuda: bool, fast: bool = False) -> str:
    """The operator on float operands ``a`` as a C expression (``fast``: CUDA approximations)."""
    op, attr = node.op, node.attr
    x = a[0] if a else ""
    if fast and cuda and op in FAST_OPS:
        approx = _fast_expr(op, x, attr)
        if approx is not None:
            return approx
    unary = {
        "neg": f"(-{x})", "abs": f"fabsf({x})", "exp": f"expf({x})", "log": f"logf({x})", "sqrt": f"sqrtf({x})",
        "rsqrt": f"rsqrtf({x})" if cuda else f"(1.f / sqrtf({x}))", "tanh": f"tanhf({x})",
        "sigmoid": f"(1.f / (1.f + expf(-{x})))", "silu": f"({x} / (1.f + expf(-{x})))",
        "relu": f"({x} < 0.f ? 0.f : {x})", "sin": f"sinf({x})", "cos": f"cosf({x})", "erf": f"erff({x})",
        "reciprocal": f"(1.f / {x})",
    }
    if op in unary:
        return unary[op]
    if op == "gelu":
        if attr.get("approximate", "none") == "tanh":
            return f"(0.5f * {x} * (1.f + tanhf(0.7978845608028654f * ({x} + 0.044715f * {x} * {x} * {x}))))"
        return f"(0.5f * {x} * (1.f + erff({x} * 0.70710678118654752f)))"
    if op in ("add", "sub", "mul", "div"):
        return f"({a[0]} {dict(add='+', sub='-', mul='*', div='/')[op]} {a[1]})"
    if op == "pow":
        e = node.args[1]
        if e.kind == "c" and not isinstance(e.value, bool):
            special = {2.0: f"({x} * {x})", 3.0: f"({x} * {x} * {x})", 0.5: f"sqrtf({x})", 1.0: f"({x})",
                       -1.0: f"(1.f / {x})", -2.0: f"(1.f / ({x} * {x}))", 0.0: "1.f",
                       -0.5: f"rsqrtf({x})" if cuda else f"(1.f / sqrtf({x}))"}
            if float(e.value) in special:
                return special[float(e.value)]
        return f"powf({a[0]}, {a[1]})"
    if op == "maximum":
        return f"kf_maxf({a[0]}, {a[1]})"
    if op == "minimum":
        return f"kf_minf({a[0]}, {a[1]})"
    if op in ("gt", "lt", "ge", "le"):
        sym = dict(gt=">", lt="<", ge=">=", le="<=")[op]
        return f"(({a[0]} {sym} {a[1]}) ? 1.f : 0.f)"
    if op == "where":
        return f"(({a[0]}) != 0.f ? {a[1]} : {a[2]})"
    if op == "clamp":
        r = x
        if attr.get("min") is not None:
            r = f"kf_maxf({r}, {_lit(attr['min'])})"
        if attr.get("max") is not None:
            r = f"kf_minf({r}, {_lit(attr['max'])})"
        return r
    if op == "cast":
        return f"(({x}) != 0.f ? 1.f : 0.f)" if attr["dtype"] == "bool" else f"({x})"
    raise ValueError(f"no pointwise expression for {op!r}")


def _round(dtype: str, name: str) -> str:
    if dtype == "bfloat16":
        return f" {name} = kf_rbf({name});"
    if dtype == "float16":
        return f" {name} = kf_rhf({name});"
    return ""


def node_lines(plan: RegionPlan, nodes: Sequence[int], cuda: bool, red_value: str | None = None, *,
               fast: bool = False, round_each: bool = True) -> list[str]:
    """``float tN = ...;`` for each node (inputs are ``aI``); the reduction's value is ``red_value``.

    ``round_each`` and ``fast`` are the knobs of the module docstring."""
    lines = []
    for n in nodes:
        node = plan.ir.nodes[n]
        half = plan.node_dtypes[n] in _HALF
        if n == plan.red:
            expr = red_value
        else:
            ops = []
            for r in node.args:
                ops.append(f"a{r.value}" if r.kind == "i" else f"t{r.value}" if r.kind == "n" else _lit(r.value))
            expr = _expr(node, ops, cuda, fast=fast and half)
        rounded = round_each or node.op == "cast"
        lines.append(f"float t{n} = {expr};" + (_round(plan.node_dtypes[n], f"t{n}") if rounded else ""))
    return lines


def math_choices(c: Config) -> dict[str, bool]:
    """The ``fast``/``round`` knobs of a config as node_lines keywords (defaults: eager's numbers)."""
    return {"fast": bool(int(c.get("fast", 0))), "round_each": bool(int(c.get("round", 1)))}


def math_knobs(plan: RegionPlan) -> tuple[bool, bool]:
    """(``fast`` offered, ``round`` offered) for this plan: where they change the kernel, and only
    when every output is 16-bit (a float32 output is held to 1e-4, which a 16-bit intermediate
    computed another way than eager's misses by its own rounding)."""
    if any(s.dtype not in _HALF for s in plan.outputs):
        return False, False
    emitted = set(plan.full) | set(plan.phase1) | set(plan.row)
    half = [n for n in sorted(emitted) if plan.node_dtypes[n] in _HALF and n != plan.red]
    fast = any(plan.ir.nodes[n].op in FAST_OPS and _fast_expr(plan.ir.nodes[n].op, "x", plan.ir.nodes[n].attr)
               for n in half) or fast_reduction(plan)
    rounds = any(plan.ir.nodes[n].op != "cast" for n in half) or (
        plan.red is not None and plan.red in emitted and plan.node_dtypes[plan.red] in _HALF)
    return fast, rounds


def fast_reduction(plan: RegionPlan) -> bool:
    """Whether the ``fast`` knob reaches the reduction itself: a softmax (its exponentials) whose
    every output is 16-bit, whatever the dtype it is computed in (``ex2.approx``'s error is far
    below a 16-bit result's rounding)."""
    return plan.red_op in ("softmax", "log_softmax") and all(s.dtype in _HALF for s in plan.outputs)


def inputs_of(plan: RegionPlan, nodes: Sequence[int]) -> list[int]:
    used = {r.value for n in nodes for r in plan.ir.nodes[n].args if r.kind == "i"}
    return sorted(used)




def split_offsets(plan: RegionPlan, shape: Sequence[int], strides: Sequence[int], col: str = "j") -> tuple[str, str]:
    """(row part in ``r``, column part in ``col``) of a tensor's offset in a reduction plan."""
    bst = plan.bstrides(shape, strides)
    n, k = len(plan.shape), plan.k
    return lin("r", plan.shape[:n - k], bst[:n - k]), lin(col, plan.shape[n - k:], bst[n - k:])


def flat_offset(plan: RegionPlan, shape: Sequence[int], strides: Sequence[int], var: str = "i") -> str:
    return lin(var, plan.shape, plan.bstrides(shape, strides))


def row_out_offset(plan: RegionPlan, o: int) -> str:
    sig = plan.outputs[o]
    lead = len(plan.shape) - plan.k
    return lin("r", sig.shape[:lead], sig.stride[:lead])


# ----------------------------------------------------------------------------- statistics

def stats_code(op: str, fn: str, exp: str = "expf") -> str:
    """``St`` plus init/add/merge for the reduction ``op``; ``fn`` qualifies the functions, ``exp``
    names the exponential (``__expf`` under the ``fast`` knob)."""
    add = {
        "sum": "s->a += p;", "mean": "s->a += p;", "amax": "s->a = kf_maxf(s->a, p);",
        "amin": "s->a = kf_minf(s->a, p);",
        "softmax": "if (p > s->a) { s->b = s->b * expf(s->a - p) + 1.f; s->a = p; } else { s->b += expf(p - s->a); }",
        "layer_norm": "s->c += 1.f; { float d = p - s->a; s->a += d / s->c; s->b += d * (p - s->a); }",
    }
    merge = {
        "sum": "s->a += o.a;", "mean": "s->a += o.a;", "amax": "s->a = kf_maxf(s->a, o.a);",
        "amin": "s->a = kf_minf(s->a, o.a);",
        "softmax": "{ float m = kf_maxf(s->a, o.a); float f1 = s->a == KF_NEG_INF ? 0.f : expf(s->a - m); "
                   "float f2 = o.a == KF_NEG_INF ? 0.f : expf(o.a - m); s->b = s->b * f1 + o.b * f2; s->a = m; }",
        "layer_norm": "if (o.c > 0.f) { float n = s->c + o.c; float d = o.a - s->a; float w = o.c / n; "
                      "s->a += d * w; s->b += o.b + d * d * s->c * w; s->c = n; }",
    }
    init = {"sum": "{0.f, 0.f, 0.f}", "mean": "{0.f, 0.f, 0.f}", "amax": "{KF_NEG_INF, 0.f, 0.f}",
            "amin": "{KF_POS_INF, 0.f, 0.f}", "softmax": "{KF_NEG_INF, 0.f, 0.f}", "layer_norm": "{0.f, 0.f, 0.f}"}
    kind = "softmax" if op == "log_softmax" else op
    return (f"typedef struct {{ float a, b, c; }} St;\n"
            f"{fn} St st_init(void) {{ St s = {init[kind]}; return s; }}\n"
            f"{fn} void st_add(St* s, float p) {{ {add[kind].replace('expf', exp)} }}\n"
            f"{fn} void st_merge(St* s, St o) {{ {merge[kind].replace('expf', exp)} }}\n")


#: The fields of ``St`` each reduction uses (the others stay at their initial values).
STAT_FIELDS = {"sum": "a", "mean": "a", "amax": "a", "amin": "a", "softmax": "ab", "log_softmax": "ab",
               "layer_norm": "abc"}


def red_value(plan: RegionPlan, p: str, exp: str = "expf") -> str:
    """The reduction node's value from the final stats ``st`` (and its operand ``p`` for norms)."""
    op, cols = plan.red_op, plan.cols
    if op in ("sum", "amax", "amin"):
        return "st.a"
    if op == "mean":
        return f"(st.a / {float(cols)!r}f)"
    if op == "softmax":
        return f"({exp}({p} - st.a) / st.b)"
    if op == "log_softmax":
        return f"({p} - st.a - logf(st.b))"
    return f"(({p} - st.a) * rstd)"


def finish_stats(plan: RegionPlan, cuda: bool) -> str:
    if plan.red_op != "layer_norm":
        return ""
    eps = float(plan.ir.nodes[plan.red].attr["eps"])
    rs = "rsqrtf" if cuda else "1.f / sqrtf"
    return f"const float rstd = {rs}(kf_maxf(st.b / {float(plan.cols)!r}f, 0.f) + {eps!r}f);"


def red_operand(plan: RegionPlan) -> str:
    r = plan.ir.nodes[plan.red].args[0]
    return f"a{r.value}" if r.kind == "i" else f"t{r.value}"
