"""The region IR: a small DAG of pointwise operators and at most one row reduction.

A region is its inputs (exact tensor signatures), its nodes in topological order and the nodes it
returns. Each node is one operator with torch's exact semantics (broadcasting, type promotion):
the reference runs the nodes with the torch functions below, so eager's answer is the region's
own subgraph run op by op.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..ops import TensorSig, torch_dtype


@dataclass(frozen=True)
class OpInfo:
    """One IR operator: its kind, how many tensor/scalar operands it takes, and torch's version."""

    name: str
    kind: str            # "unary" | "binary" | "compare" | "where" | "clamp" | "cast" | "reduce" | "norm"
    arity: int
    torch_fn: Callable[..., torch.Tensor]
    source: str          # how the reference printer spells it; {0}, {1}, ... are operands, {a[k]} attributes


def _gelu(x, approximate="none"):
    return torch.nn.functional.gelu(x, approximate=approximate)


OPS: dict[str, OpInfo] = {o.name: o for o in [
    OpInfo("neg", "unary", 1, torch.neg, "torch.neg({0})"),
    OpInfo("abs", "unary", 1, torch.abs, "torch.abs({0})"),
    OpInfo("exp", "unary", 1, torch.exp, "torch.exp({0})"),
    OpInfo("log", "unary", 1, torch.log, "torch.log({0})"),
    OpInfo("sqrt", "unary", 1, torch.sqrt, "torch.sqrt({0})"),
    OpInfo("rsqrt", "unary", 1, torch.rsqrt, "torch.rsqrt({0})"),
    OpInfo("tanh", "unary", 1, torch.tanh, "torch.tanh({0})"),
    OpInfo("sigmoid", "unary", 1, torch.sigmoid, "torch.sigmoid({0})"),
    OpInfo("silu", "unary", 1, torch.nn.functional.silu, "F.silu({0})"),
    OpInfo("relu", "unary", 1, torch.relu, "torch.relu({0})"),
    OpInfo("gelu", "unary", 1, _gelu, "F.gelu({0}, approximate={a[approximate]!r})"),
    OpInfo("sin", "unary", 1, torch.sin, "torch.sin({0})"),
    OpInfo("cos", "unary", 1, torch.cos, "torch.cos({0})"),
    OpInfo("erf", "unary", 1, torch.erf, "torch.erf({0})"),
    OpInfo("reciprocal", "unary", 1, torch.reciprocal, "torch.reciprocal({0})"),
    OpInfo("add", "binary", 2, torch.add, "torch.add({0}, {1})"),
    OpInfo("sub", "binary", 2, torch.sub, "torch.sub({0}, {1})"),
    OpInfo("mul", "binary", 2, torch.mul, "torch.mul({0}, {1})"),
    OpInfo("div", "binary", 2, torch.div, "torch.div({0}, {1})"),
    OpInfo("pow", "binary", 2, torch.pow, "torch.pow({0}, {1})"),
    OpInfo("maximum", "binary", 2, torch.maximum, "torch.maximum({0}, {1})"),
    OpInfo("minimum", "binary", 2, torch.minimum, "torch.minimum({0}, {1})"),
    OpInfo("gt", "compare", 2, torch.gt, "torch.gt({0}, {1})"),
    OpInfo("lt", "compare", 2, torch.lt, "torch.lt({0}, {1})"),
    OpInfo("ge", "compare", 2, torch.ge, "torch.ge({0}, {1})"),
    OpInfo("le", "compare", 2, torch.le, "torch.le({0}, {1})"),
    OpInfo("where", "where", 3, torch.where, "torch.where({0}, {1}, {2})"),
    OpInfo("clamp", "clamp", 1, lambda x, min=None, max=None: torch.clamp(x, min, max),
           "torch.clamp({0}, {a[min]!r}, {a[max]!r})"),
    OpInfo("cast", "cast", 1, lambda x, dtype: x.to(torch_dtype(dtype)), "{0}.to(torch.{a[dtype]})"),
    OpInfo("sum", "reduce", 1, lambda x, k, keepdim: torch.sum(x, _dims(x, k), keepdim=keepdim),
           "torch.sum({0}, dim={d}, keepdim={a[keepdim]})"),
    OpInfo("mean", "reduce", 1, lambda x, k, keepdim: torch.mean(x, _dims(x, k), keepdim=keepdim),
           "torch.mean({0}, dim={d}, keepdim={a[keepdim]})"),
    OpInfo("amax", "reduce", 1, lambda x, k, keepdim: torch.amax(x, _dims(x, k), keepdim=keepdim),
           "torch.amax({0}, dim={d}, keepdim={a[keepdim]})"),
    OpInfo("amin", "reduce", 1, lambda x, k, keepdim: torch.amin(x, _dims(x, k), keepdim=keepdim),
           "torch.amin({0}, dim={d}, keepdim={a[keepdim]})"),
    OpInfo("softmax", "norm", 1, lambda x, k: torch.softmax(x, -1), "torch.softmax({0}, dim=-1)"),
    OpInfo("log_softmax", "norm", 1, lambda x, k: torch.log_softmax(x, -1), "torch.log_softmax({0}, dim=-1)"),
    OpInfo("layer_norm", "norm", 1,
           lambda x, k, eps: torch.nn.functional.layer_norm(x, tuple(x.shape[x.dim() - k:]), eps=eps),
           "F.layer_norm({0}, {0}.shape[-{a[k]}:], eps={a[eps]!r})"),
]}

REDUCTIONS = frozenset(n for n, o in OPS.items() if o.kind in ("reduce", "norm"))


def _dims(x: torch.Tensor, k: int) -> list[int]:
    return list(range(x.dim() - k, x.dim()))


@dataclass(frozen=True)
class Ref:
    """An operand: region input ``i``, node ``n``, or a Python constant ``c``."""

    kind: str       # "i" | "n" | "c"
    value: Any

    def to_json(self) -> list:
        return [self.kind, self.value]


@dataclass(frozen=True)
class Node:
    op: str
    args: tuple[Ref, ...]
    attrs: tuple[tuple[str, Any], ...] = ()

    @property
    def attr(self) -> dict[str, Any]:
        return dict(self.attrs)

    def to_json(self) -> dict:
        return {"op": self.op, "args": [a.to_json() for a in self.args], "attrs": {k: v for k, v in self.attrs}}


@dataclass(frozen=True)
class RegionIR:
    """Nodes in topological order over ``n_inputs`` inputs; ``outputs`` are node indices."""

    n_inputs: int
    nodes: tuple[Node, ...]
    outputs: tuple[int, ...]

    # ------------------------------------------------------------------ identity and text

    def to_json(self) -> dict:
        return {"v": 1, "inputs": self.n_inputs, "nodes": [n.to_json() for n in self.nodes],
                "outputs": list(self.outputs)}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def loads(cls, text: str) -> "RegionIR":
        d = json.loads(text)
        nodes = tuple(Node(n["op"], tuple(Ref(a[0], a[1]) for a in n["args"]),
                           tuple(sorted((k, v) for k, v in n["attrs"].items()))) for n in d["nodes"])
        return cls(d["inputs"], nodes, tuple(d["outputs"]))

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(n.op for n in self.nodes)

    @property
    def reduction(self) -> int | None:
        found = [i for i, n in enumerate(self.nodes) if n.op in REDUCTIONS]
        return found[0] if found else None

    def check(self) -> None:
        """Raise ValueError for an ill-formed IR (unknown op, forward reference, two reductions)."""
        for i, n in enumerate(self.nodes):
            if n.op not in OPS:
                raise ValueError(f"node {i}: unknown region operator {n.op!r}; known: {', '.join(sorted(OPS))}")
            for a in n.args:
                if a.kind == "n" and not 0 <= a.value < i:
                    raise ValueError(f"node {i} reads node {a.value}, which does not come before it")
                if a.kind == "i" and not 0 <= a.value < self.n_inputs:
                    raise ValueError(f"node {i} reads input {a.value}; the region has {self.n_inputs}")
        if sum(n.op in REDUCTIONS for n in self.nodes) > 1:
            raise ValueError("a region holds at most one reduction")
        if not self.outputs or any(not 0 <= o < len(self.nodes) for o in self.outputs):
            raise ValueError("a region returns at least one of its nodes")

    # ------------------------------------------------------------------ evaluation

    def run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Every node's value, computed op by op with torch (eager's own kernels)."""
        values: list[torch.Tensor] = []

        def get(r: Ref):
            return inputs[r.value] if r.kind == "i" else values[r.value] if r.kind == "n" else r.value

        for n in self.nodes:
            info = OPS[n.op]
            args = [get(a) for a in n.args]
            values.append(info.torch_fn(*args, **n.attr))
        return values

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        values = self.run(inputs)
        return [values[o] for o in self.outputs]

    def meta(self, sigs: Sequence[TensorSig]) -> list[torch.Tensor]:
        """Every node's value on the meta device: exact shapes and dtypes, no data."""
        ins = [torch.empty_strided(s.shape, s.stride, dtype=torch_dtype(s.dtype), device="meta") for s in sigs]
        return self.run(ins)

    def users(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.nodes]
        for i, n in enumerate(self.nodes):
            for a in n.args:
                if a.kind == "n":
                    out[a.value].append(i)
        return out

    def source(self, sigs: Sequence[TensorSig], name: str = "region") -> str:
        """The region as a standalone PyTorch function (what a person or an LLM reads)."""
        lines = ["import torch", "import torch.nn.functional as F", "", ""]
        params = ", ".join(f"x{i}" for i in range(self.n_inputs))
        lines.append(f"def {name}({params}):")
        for i, s in enumerate(sigs):
            lines.append(f"    # x{i}: {s.dtype}, shape {tuple(s.shape)}, strides {tuple(s.stride)}")
        for i, n in enumerate(self.nodes):
            info = OPS[n.op]
            operands = [f"x{a.value}" if a.kind == "i" else f"t{a.value}" if a.kind == "n" else _const(a.value)
                        for a in n.args]
            attrs = n.attr
            k = attrs.get("k", 1)
            dims = repr(tuple(range(-k, 0))) if k > 1 else "-1"
            lines.append(f"    t{i} = " + info.source.format(*operands, a=attrs, d=dims))
        lines.append("    return " + ", ".join(f"t{o}" for o in self.outputs))
        return "\n".join(lines) + "\n"


def _const(v: Any) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return f"float({str(v)!r})"
    return repr(v)
