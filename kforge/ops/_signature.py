"""Exact runtime signatures of tensors and params: what makes two operator calls the same variant (``Variant``, in
``_registry``, holds them); and ``Unsupported``, what a binder raises for a call that has none."""
from __future__ import annotations

from dataclasses import dataclass
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


def freeze_value(value: Any) -> Any:
    """A param's value as a variant holds it: hashable (tuples for lists and sizes) and dtypes by name."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze_value(v) for v in value)
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, torch.Size):
        return tuple(value)
    return value


def freeze_params(names: Sequence[str], values: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple((n, freeze_value(values[n])) for n in names)


class Unsupported(Exception):
    """Raised by a binder for a call form kforge does not optimize (the call stays eager)."""
