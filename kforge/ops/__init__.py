"""Operator specs: what kforge intercepts, how a call becomes a variant, and its reference.

Also the records most of kforge reads: ``Card``/``Cards`` (one per captured variant) and the
search's ``CardVerdict``/``CardStatus``, defined here, at the lowest layer that can hold them.
"""
from __future__ import annotations

from ._registry import Call, OpSpec, Unsupported, all_specs, get_spec, random_tensor, register, spec_for
from ._signature import DTYPE_CODES, TensorSig, Variant, dtype_name, torch_dtype
from . import _definitions  # noqa: F401 - registers the operators
from ._definitions import (FUSED_EPILOGUES, GRAPH_FUSED_OPS, LAYOUT_TWIN_OPS, PROLOGUE_OPS, channels_last_strides, inplace_binder,
                           is_channels_last_twin, placed_in_aten_graph, without_prologue)
from ._card import Card, Cards
from ._verdict import CardStatus, CardVerdict

__all__ = [
    "Call", "Card", "CardStatus", "CardVerdict", "Cards", "OpSpec", "Unsupported", "TensorSig",
    "Variant", "DTYPE_CODES", "all_specs", "get_spec", "spec_for", "register", "random_tensor", "dtype_name",
    "torch_dtype", "inplace_binder", "FUSED_EPILOGUES", "GRAPH_FUSED_OPS", "LAYOUT_TWIN_OPS", "PROLOGUE_OPS", "channels_last_strides",
    "is_channels_last_twin", "placed_in_aten_graph", "without_prologue",
]
