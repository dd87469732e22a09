"""Exact runtime signatures: what makes two operator calls the same variant."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

_DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.bool: "bool",
    torch.uint8: "uint8",
    torch.int8: "int8",
}
_DTYPES = {v: k for k, v in _DTYPE_NAMES.items()}
_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "i64",
          "int32": "i32", "bool": "bool", "uint8": "u8", "int8": "i8"}
# NB: the codes must match enum kf_dtype in kernels/include/kforge.h.
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "int64": 4, "int32": 5,
               "bool": 6, "uint8": 7, "int8": 8}


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise TypeError(f"kforge does not handle tensors of dtype {dtype}") from None


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


@dataclass(frozen=True)
class TensorSig:
    """Shape, dtype, strides (in elements) and device of one tensor argument."""

    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...]
    device: str

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorSig":
        return cls(tuple(t.shape), dtype_name(t.dtype), tuple(t.stride()), _device_name(t.device))

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=torch_dtype(self.dtype)).element_size()

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def is_contiguous(self) -> bool:
        expected, acc = [], 1
        for s in reversed(self.shape):
            expected.append(acc)
            acc *= s
        expected.reverse()
        return all(st == ex for st, ex, sz in zip(self.stride, expected, self.shape) if sz != 1)

    @property
    def is_floating(self) -> bool:
        return self.dtype in ("float32", "float16", "bfloat16", "float64")

    def short(self) -> str:
        dims = ",".join(str(s) for s in self.shape)
        text = f"{_SHORT[self.dtype]}[{dims}]"
        if not self.is_contiguous:
            text += "{" + ",".join(str(s) for s in self.stride) + "}"
        return text

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype, "stride": list(self.stride),
                "device": self.device}

    @classmethod
    def from_json(cls, d: dict) -> "TensorSig":
        return cls(tuple(d["shape"]), d["dtype"], tuple(d["stride"]), d["device"])


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    return device.type


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, torch.Size):
        return tuple(value)
    return value


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
        from . import get_spec

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
        from . import get_spec

        custom = get_spec(self.op).io_bytes
        if custom is not None:
            return custom(self)
        return sum(s.nbytes for s in self.inputs if s is not None) + sum(s.nbytes for s in self.outputs)

    def on(self, device: str) -> "Variant":
        """The same variant on another device (an artifact made on cuda:0 runs on cuda:1)."""
        if self.device == device:
            return self
        from dataclasses import replace

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
                   tuple((k, _freeze(v)) for k, v in d["params"]),
                   tuple(TensorSig.from_json(s) for s in d["outputs"]))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, tuple):
        return "(" + ",".join(_fmt(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    return str(v)


def freeze_params(names: Sequence[str], values: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple((n, _freeze(values[n])) for n in names)
