"""Operator specs: what kforge intercepts, how a call becomes a variant, and its reference."""
from __future__ import annotations

from ._registry import Call, OpSpec, Unsupported, all_specs, get_spec, random_tensor, register, spec_for
from ._signature import DTYPE_CODES, TensorSig, Variant, dtype_name, torch_dtype
from . import _definitions
from ._definitions import inplace_binder

__all__ = [
    "Call", "OpSpec", "Unsupported", "TensorSig", "Variant", "DTYPE_CODES", "all_specs", "get_spec",
    "spec_for", "register", "random_tensor", "dtype_name", "torch_dtype", "inplace_binder",
]
