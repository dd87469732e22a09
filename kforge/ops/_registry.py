"""The operator registry: one OpSpec per supported operator, and the Variant (one exact signature of a call of it)
that each spec makes from a call and that reads its spec back by name."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

import torch

from ._functions import FunctionTarget, note_spec, spec_of_twin
from ._signature import TensorSig, Unsupported, freeze_params, freeze_value, torch_dtype


@dataclass
class Call:
    """A torch call normalised into tensor inputs (spec order) and static parameters."""

    inputs: tuple[torch.Tensor | None, ...]
    params: dict[str, Any]


@dataclass(frozen=True)
class Variant:
    """One operator with one exact runtime signature: the unit kforge optimizes.

    ``inputs`` follows the spec's input order (None for an absent optional tensor); ``params``
    holds every static parameter in the spec's order. ``outputs`` are eager's output tensors
    (derived from the rest, so not part of the identity).
    """

    op: str
    inputs: tuple[TensorSig | None, ...]
    params: tuple[tuple[str, Any], ...]
    outputs: tuple[TensorSig, ...] = field(default=(), compare=False)

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def key(self) -> str:
        """A stable 16-hex-digit identity (same across processes and machines)."""
        payload = json.dumps(
            [self.op, [s.to_json() if s else None for s in self.inputs], [list(p) for p in self.params]],
            sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @property
    def device(self) -> str:
        for s in self.inputs:
            if s is not None:
                return s.device
        return "cpu"

    @property
    def signature(self) -> str:
        spec = get_spec(self.op)
        if hasattr(spec, "describe"):  # a region: its operators, not its serialized IR
            return spec.describe(self)
        names = spec.inputs
        parts = [f"{n}: {s.short()}" for n, s in zip(names, self.inputs) if s is not None]
        parts += [f"{k}={_fmt(v)}" for k, v in self.params]
        return f"{self.op}(" + ", ".join(parts) + ")"

    @property
    def io_bytes(self) -> int:
        """Fewest bytes a kernel must move: each input read once, each output written once
        (or what the spec says, e.g. an embedding reads only the rows it gathers)."""
        custom = get_spec(self.op).io_bytes
        if custom is not None:
            return custom(self)
        return sum(s.nbytes for s in self.inputs if s is not None) + sum(s.nbytes for s in self.outputs)

    def on(self, device: str) -> "Variant":
        """The same variant on another device (an artifact made on cuda:0 runs on cuda:1)."""
        if self.device == device:
            return self
        move = lambda s: None if s is None else replace(s, device=device)  # noqa: E731
        return replace(self, inputs=tuple(move(s) for s in self.inputs),
                       outputs=tuple(move(s) for s in self.outputs))

    def to_json(self) -> dict:
        return {"op": self.op, "inputs": [s.to_json() if s else None for s in self.inputs],
                "params": [[k, v] for k, v in self.params],
                "outputs": [s.to_json() for s in self.outputs]}

    @classmethod
    def from_json(cls, d: dict) -> "Variant":
        return cls(d["op"], tuple(TensorSig.from_json(s) if s else None for s in d["inputs"]),
                   tuple((k, freeze_value(v)) for k, v in d["params"]),
                   tuple(TensorSig.from_json(s) for s in d["outputs"]))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, tuple):
        return "(" + ",".join(_fmt(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    return str(v)



@dataclass(frozen=True)
class OpSpec:
    """Everything kforge knows about one operator.

    ``bind`` takes the arguments of any intercepted spelling (``targets``) and returns a
    :class:`Call`; ``reference`` recomputes the original torch call from a Call's inputs and
    params. ``vendor`` names the library eager dispatches to (``"cudnn"``, ``"cublas"``,
    ``"flash"``) or is None when eager runs PyTorch's own kernels.
    """

    name: str
    targets: tuple[Callable, ...]
    inputs: tuple[str, ...]
    params: tuple[str, ...]
    bind: Callable[..., Call]
    reference: Callable[[Sequence[torch.Tensor | None], dict[str, Any]], Any]
    vendor: str | None = None
    kind: str = "other"  # elementwise | normalization | reduction | pooling | vendor | data | recurrent
    doc: str = ""
    sample: Callable[[Variant, int, torch.Generator], list] | None = None
    inplace_targets: tuple[Callable, ...] = field(default=())
    io_bytes: Callable[[Variant], int] | None = None  # fewest bytes moved, when not every input is read whole
    # Python functions of libraries that compute this operator (kforge.ops._functions): reached through hooks
    functions: tuple[FunctionTarget, ...] = field(default=())
    # What a model runs eagerly, where that is not ``reference`` (the semantics): the baseline a kernel is timed
    # against (a function spec: the library's function, not the float32 loop that defines it)
    eager: Callable[[Sequence[torch.Tensor | None], dict[str, Any]], Any] | None = None

    def run_eager(self, inputs: Sequence[torch.Tensor | None], params: dict[str, Any]) -> Any:
        """One call as the model runs it eagerly (timings of eager use this; correctness uses ``reference``)."""
        return (self.eager or self.reference)(inputs, params)

    def variant(self, call: Call, outputs: Iterable[torch.Tensor]) -> Variant:
        sigs = tuple(TensorSig.of(t) if t is not None else None for t in call.inputs)
        return Variant(self.name, sigs, freeze_params(self.params, call.params),
                       tuple(TensorSig.of(o) for o in outputs))

    def tolerance(self, dtype: str) -> tuple[float, float]:
        """(rtol, atol-relative-to-reference-scale) for an output dtype."""
        if dtype in ("float32", "float64"):
            # NB: cuBLAS's float32 products are float32 throughout (TF32 is off for matmul by default): a candidate's
            # own summation order needs at most ~2e-6 of this check, TF32 (10-bit inputs) 2.5e-4 to 4e-4 (simulated
            # on the CPU, K 64 to 6144), so 5e-5 refuses a product of lower precision than eager's. cuDNN's
            # convolutions use TF32 by default, and attention kernels their own orders: 1e-3 there. A recurrence
            # carries each step's rounding into the next (hundreds of steps).
            if self.kind == "vendor" and self.vendor == "cublas":
                return (5e-5, 5e-5)
            return (1e-5, 1e-5) if self.kind not in ("vendor", "recurrent") else (1e-3, 1e-3)
        if dtype == "float16":
            return (5e-3, 5e-3)
        if dtype == "bfloat16":
            return (1.6e-2, 1.6e-2)
        return (0.0, 0.0)

    def random_inputs(self, variant: Variant, seed: int) -> list[torch.Tensor | None]:
        """Fresh inputs of the variant's exact signature, with values valid for the operator."""
        gen = torch.Generator().manual_seed(seed)
        if self.sample is not None:
            return self.sample(variant, seed, gen)
        return [random_tensor(s, gen) if s is not None else None for s in variant.inputs]


def random_tensor(sig: TensorSig, gen: torch.Generator, *, low: float = -3.0, high: float = 3.0,
                  positive: bool = False) -> torch.Tensor:
    """A tensor with ``sig``'s exact shape, dtype and strides, filled on the CPU then moved."""
    dtype = torch_dtype(sig.dtype)
    extent = 1 + sum((s - 1) * st for s, st in zip(sig.shape, sig.stride) if s > 0) if all(sig.shape) else 0
    if sig.is_floating:
        flat = torch.randn(max(extent, 1), generator=gen, dtype=torch.float32)
        flat = flat.abs() + 0.1 if positive else flat.clamp(low, high)
        flat = flat.to(dtype)
    elif sig.dtype == "bool":
        flat = torch.rand(max(extent, 1), generator=gen) > 0.5
    else:
        flat = torch.randint(0, 16, (max(extent, 1),), generator=gen, dtype=torch.int64).to(dtype)
    t = torch.as_strided(flat, sig.shape, sig.stride)
    return t.to(sig.device) if sig.device != "cpu" else t


_SPECS: dict[str, OpSpec] = {}
_BY_TARGET: dict[Any, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    if spec.name in _SPECS:
        raise ValueError(f"operator {spec.name!r} is registered twice")
    _SPECS[spec.name] = spec
    note_spec(spec)
    for target in spec.targets:
        if target is None:
            continue
        if target in _BY_TARGET and _BY_TARGET[target] is not spec:
            raise ValueError(f"{target} is claimed by both {_BY_TARGET[target].name} and {spec.name}")
        _BY_TARGET[target] = spec
    return spec


def get_spec(name: str) -> OpSpec:
    try:
        return _SPECS[name]
    except KeyError:
        known = ", ".join(sorted(_SPECS))
        raise KeyError(f"unknown operator {name!r}; kforge knows: {known}") from None


def spec_for(func: Any) -> OpSpec | None:
    """The operator a callable computes: a torch callable a spec targets, or the graph twin of a function a spec
    names (a node of a graph kforge compiled)."""
    try:
        found = _BY_TARGET.get(func)
    except TypeError:  # unhashable callable
        return None
    return found if found is not None else spec_of_twin(func)


def all_specs() -> list[OpSpec]:
    return list(_SPECS.values())
