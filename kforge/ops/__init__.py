"""Operator specs: what kforge intercepts, how a call becomes a variant, and its reference; operator families
(one folder each under ``families/``): a spec with its role in the model's graph, its matching and its strategies.

Also the records most of kforge reads: ``Card``/``Cards`` (one per captured variant) and the
search's ``CardVerdict``/``CardStatus``, defined here, at the lowest layer that can hold them.
"""
from __future__ import annotations

from ._registry import Call, OpSpec, Unsupported, Variant, all_specs, get_spec, random_tensor, register, spec_for
from ._signature import DTYPE_CODES, TensorSig, dtype_name, torch_dtype
from . import _definitions  # noqa: F401 - registers the plain operators
from ._definitions import inplace_binder
from ._family import (Epilogue, Family, FusedMatch, all_families, channels_last_strides, family_of, found_in_graph,
                      has_layout_twin, has_prologue, is_channels_last_twin, is_fused, is_layout_twin, placed_in_aten_graph,
                      register_family, without_prologue)
from . import families  # noqa: F401 - registers the operator families
from ._card import Card, Cards
from ._verdict import CardStatus, CardVerdict

__all__ = [
    "Call", "Card", "CardStatus", "CardVerdict", "Cards", "OpSpec", "Unsupported", "TensorSig",
    "Variant", "DTYPE_CODES", "all_specs", "get_spec", "spec_for", "register", "random_tensor", "dtype_name",
    "torch_dtype", "inplace_binder", "Epilogue", "Family", "FusedMatch", "all_families", "channels_last_strides",
    "family_of", "found_in_graph", "has_layout_twin", "has_prologue", "is_channels_last_twin", "is_fused", "is_layout_twin",
    "placed_in_aten_graph", "register_family", "without_prologue",
]
