"""A vendor chain's tail as scalar C: one statement per IR node, shared by the C/OpenMP and CUDA generators.

It reads a chain as ``kforge.regions.VendorChain`` describes it (its IR, its tail's inputs, its plan) without
importing the regions package, which sits above the proposers in kforge's layers.

Every value is a float; each node's result is rounded to the dtype eager gives it (a bf16 chain rounds after every
operator as eager does), so a fused tail computes what the chain computes op by op, up to float rounding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ...ops import TensorSig, Unsupported

_UNARY = {
    "neg": "(-{0})", "abs": "fabsf({0})", "exp": "expf({0})", "log": "logf({0})", "sqrt": "sqrtf({0})",
    "rsqrt": "(1.0f / sqrtf({0}))", "tanh": "tanhf({0})", "sigmoid": "(1.0f / (1.0f + expf(-{0})))",
    "silu": "({0} / (1.0f + expf(-{0})))", "relu": "({0} < 0.0f ? 0.0f : {0})", "sin": "sinf({0})",
    "cos": "cosf({0})", "erf": "erff({0})", "reciprocal": "(1.0f / {0})",
}
_BINARY = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})", "pow": "powf({0}, {1})",
    "maximum": "(({0}) > ({1}) || ({0}) != ({0}) ? ({0}) : ({1}))",
    "minimum": "(({0}) < ({1}) || ({0}) != ({0}) ? ({0}) : ({1}))",
    "gt": "(({0}) > ({1}) ? 1.0f : 0.0f)", "lt": "(({0}) < ({1}) ? 1.0f : 0.0f)",
    "ge": "(({0}) >= ({1}) ? 1.0f : 0.0f)", "le": "(({0}) <= ({1}) ? 1.0f : 0.0f)",
}
ROUND = {"float32": "{0}", "float16": "KF_R_F16({0})", "bfloat16": "KF_R_BF16({0})", "bool": "{0}"}


def literal(v) -> str:
    """A Python constant as a C float expression."""
    if isinstance(v, bool):
        return "1.0f" if v else "0.0f"
    f = float(v)
    if math.isnan(f):
        return "(0.0f / 0.0f)"
    if math.isinf(f):
        return "(1.0f / 0.0f)" if f > 0 else "(-1.0f / 0.0f)"
    return f"{f!r}f" if "e" in repr(f) or "." in repr(f) else f"{f!r}.0f"


@dataclass(frozen=True)
class TailCode:
    """Scalar statements computing every node (``t<i>``), given the inputs' values (``x<i>``)."""

    lines: tuple[str, ...]
    dtypes: tuple[str, ...]


def node_dtypes(ir: Any, sigs: Sequence[TensorSig]) -> tuple[str, ...]:
    return tuple(str(v.dtype).replace("torch.", "") for v in ir.meta(sigs))


def tail_lines(ir: Any, sigs: Sequence[TensorSig], nodes: Sequence[int] | None = None,
               reduced: Callable[[int, str], str] | None = None) -> TailCode:
    """C statements for ``nodes`` (all by default) of ``ir``: node ``i`` into ``float t<i>``, input ``j`` read from
    ``x<j>``. A reduction node's value is ``reduced(i, operand)`` (the caller's row statistics)."""
    dtypes = node_dtypes(ir, sigs)
    wanted = range(len(ir.nodes)) if nodes is None else sorted(nodes)
    lines = []

    def operand(r) -> str:
        return f"x{r.value}" if r.kind == "i" else f"t{r.value}" if r.kind == "n" else literal(r.value)

    for i in wanted:
        n = ir.nodes[i]
        args = [operand(a) for a in n.args]
        attr = n.attr
        if n.op in _UNARY:
            expr = _UNARY[n.op].format(*args)
        elif n.op == "gelu":
            a = args[0]
            expr = (f"(0.5f * {a} * (1.0f + tanhf(0.7978845608028654f * ({a} + 0.044715f * {a} * {a} * {a}))))"
                    if attr.get("approximate") == "tanh" else f"(0.5f * {a} * (1.0f + erff({a} * 0.7071067811865476f)))")
        elif n.op in _BINARY:
            expr = _BINARY[n.op].format(*args)
            if n.op == "pow" and n.args[1].kind == "c" and float(n.args[1].value) == 2.0:
                expr = f"({args[0]} * {args[0]})"
        elif n.op == "where":
            expr = f"(({args[0]}) != 0.0f ? ({args[1]}) : ({args[2]}))"
        elif n.op == "clamp":
            expr = args[0]
            if attr.get("min") is not None:
                lo = literal(attr["min"])
                expr = f"(({expr}) < {lo} ? {lo} : ({expr}))"
            if attr.get("max") is not None:
                hi = literal(attr["max"])
                lines.append(f"float c{i} = {expr};")
                expr = f"(c{i} > {hi} ? {hi} : c{i})"
        elif n.op == "cast":
            expr = f"(({args[0]}) != 0.0f ? 1.0f : 0.0f)" if attr["dtype"] == "bool" else args[0]
        elif i == ir.reduction:
            if reduced is None:
                raise Unsupported(f"a {n.op} outside a row kernel")
            expr = reduced(i, args[0])
        else:
            raise Unsupported(f"no scalar form for {n.op}")
        lines.append(f"float t{i} = {ROUND[dtypes[i]].format(expr)};")
    return TailCode(tuple(lines), dtypes)


def offset_expr(shape: Sequence[int], stride: Sequence[int], flat: str) -> str:
    """The element offset of flat (row-major) index ``flat`` of ``shape`` in a tensor of ``stride`` (0 where it is
    broadcast), as a C expression of int64 arithmetic."""
    terms, inner = [], 1
    for d in reversed(range(len(shape))):
        size, st = shape[d], stride[d]
        if size != 1 and st != 0:
            idx = flat if inner == 1 else f"({flat} / {inner}LL)"
            idx = idx if inner * size >= math.prod(shape) else f"({idx} % {size}LL)"
            terms.append(f"{idx} * {st}LL" if st != 1 else idx)
        inner *= size
    return " + ".join(reversed(terms)) or "0"


def load_expr(dtype: str, ptr: str, off: str, lang: str) -> str:
    if dtype == "float32":
        return f"((const float*){ptr})[{off}]"
    if dtype == "bool":
        return f"(((const unsigned char*){ptr})[{off}] ? 1.0f : 0.0f)"
    if lang == "cuda":
        t = "__nv_bfloat16" if dtype == "bfloat16" else "__half"
        fn = "__bfloat162float" if dtype == "bfloat16" else "__half2float"
        return f"{fn}(((const {t}*){ptr})[{off}])"
    fn = "kf_bf16_to_f32" if dtype == "bfloat16" else "kf_f16_to_f32"
    return f"{fn}(((const uint16_t*){ptr})[{off}])"


def store_stmt(dtype: str, ptr: str, off: str, value: str, lang: str) -> str:
    if dtype == "float32":
        return f"((float*){ptr})[{off}] = {value};"
    if lang == "cuda":
        t = "__nv_bfloat16" if dtype == "bfloat16" else "__half"
        fn = "__float2bfloat16_rn" if dtype == "bfloat16" else "__float2half_rn"
        return f"(({t}*){ptr})[{off}] = {fn}({value});"
    fn = "kf_f32_to_bf16" if dtype == "bfloat16" else "kf_f32_to_f16"
    return f"((uint16_t*){ptr})[{off}] = {fn}({value});"


C_ROUNDING = r"""
#define KF_R_BF16(x) kf_bf16_to_f32(kf_f32_to_bf16(x))
#define KF_R_F16(x) kf_f16_to_f32(kf_f32_to_f16(x))
"""

CUDA_ROUNDING = r"""
#define KF_R_BF16(x) __bfloat162float(__float2bfloat16_rn(x))
#define KF_R_F16(x) __half2float(__float2half_rn(x))
"""
