"""The one OpSpec for every region: its variant carries the region's IR, its reference runs it."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..ops import OpSpec, TensorSig, Unsupported, Variant, get_spec, random_tensor, register
from ._ir import OPS, RegionIR

MAX_INPUTS = 64
# Operators whose first operand must be positive for realistic values (a variance, a norm).
_POSITIVE = {"log", "sqrt", "rsqrt", "reciprocal"}


@functools.lru_cache(maxsize=512)
def load_ir(text: str) -> RegionIR:
    ir = RegionIR.loads(text)
    ir.check()
    return ir


def region_variant(ir: RegionIR, inputs: Sequence[TensorSig], outputs: Sequence[TensorSig] | None = None) -> Variant:
    """The variant of one region: structure + constants (the IR) and every input's exact signature."""
    ir.check()
    if len(inputs) != ir.n_inputs:
        raise ValueError(f"the region reads {ir.n_inputs} inputs, {len(inputs)} signatures given")
    if len(inputs) > MAX_INPUTS:
        raise Unsupported(f"a region with {len(inputs)} inputs (kforge handles at most {MAX_INPUTS})")
    if outputs is None:
        values = ir.meta(inputs)
        device = inputs[0].device if inputs else "cpu"
        outputs = [TensorSig(tuple(values[o].shape), TensorSig.of(values[o]).dtype, tuple(values[o].stride()), device)
                   for o in ir.outputs]
    return Variant("region", tuple(inputs), (("ir", ir.dumps()),), tuple(outputs))


def region_ir(variant: Variant) -> RegionIR:
    if variant.op != "region":
        raise ValueError(f"{variant.signature} is not a region")
    return load_ir(variant.param_dict["ir"])


def _positive_inputs(ir: RegionIR) -> set[int]:
    """Inputs that reach a log/sqrt/rsqrt/reciprocal/fractional pow/denominator through the first
    operands of pointwise operators only (so their sign survives to it)."""
    out: set[int] = set()
    for n in ir.nodes:
        wants = []
        if n.op in _POSITIVE:
            wants.append(n.args[0])
        if n.op == "div":
            wants.append(n.args[1])
        if n.op == "pow" and n.args[1].kind == "c" and float(n.args[1].value) != int(n.args[1].value):
            wants.append(n.args[0])
        for ref in wants:
            stack = [ref]
            while stack:
                r = stack.pop()
                if r.kind == "i":
                    out.add(r.value)
                elif r.kind == "n" and ir.nodes[r.value].op in ("add", "mul", "cast", "mean", "sum", "amax"):
                    stack.extend(a for a in ir.nodes[r.value].args if a.kind != "c")
    return out


@dataclass(frozen=True)
class RegionSpec(OpSpec):
    """The spec of op "region": one per process, every region variant goes through it."""

    def tolerance(self, dtype: str) -> tuple[float, float]:
        # NB: a fused reduction adds in another order than eager's chain; where its terms cancel (a mean
        # of mixed signs), float32 results differ by ~1e-5 of their own scale. 1e-4 still refuses a
        # float32 region computed in bf16 or tf32 (~1e-3).
        if dtype == "float32":
            return (1e-4, 1e-4)
        return super().tolerance(dtype)

    def ir(self, variant: Variant) -> RegionIR:
        return region_ir(variant)

    def ops_of(self, variant: Variant) -> tuple[str, ...]:
        return region_ir(variant).ops

    def source(self, variant: Variant) -> str:
        """The region's reference as a standalone PyTorch function."""
        return region_ir(variant).source([s for s in variant.inputs if s is not None])

    def describe(self, variant: Variant) -> str:
        ins = ", ".join(s.short() for s in variant.inputs if s is not None)
        outs = ", ".join(s.short() for s in variant.outputs)
        return f"region[{','.join(self.ops_of(variant))}]({ins})" + (f" -> {outs}" if outs else "")


def _reference(inputs: Sequence[torch.Tensor | None], params: dict[str, Any]):
    return load_ir(params["ir"])(list(inputs))


def _sample(variant: Variant, seed: int, gen: torch.Generator) -> list:
    positive = _positive_inputs(region_ir(variant))
    return [random_tensor(s, gen, positive=i in positive) for i, s in enumerate(variant.inputs)]


def _bind(*args, **kwargs):
    raise Unsupported("regions are found in the model's graph, not bound from a call")


REGION_SPEC = RegionSpec(
    name="region", targets=(), inputs=tuple(f"x{i}" for i in range(MAX_INPUTS)), params=("ir",), bind=_bind,
    reference=_reference, vendor=None, kind="region", sample=_sample,
    doc="a chain of pointwise operators with at most one row reduction, found in the model's graph "
        f"(operators: {', '.join(sorted(OPS))})")


def _register() -> RegionSpec:
    try:
        spec = get_spec("region")
    except KeyError:
        return register(REGION_SPEC)  # type: ignore[return-value]
    return spec  # type: ignore[return-value]


_register()
