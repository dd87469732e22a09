"""How a variant's static parameters reach kf_launch: a flat vector of doubles."""
from __future__ import annotations

from typing import Any

from ..ops import Variant


def _flatten(value: Any) -> list[float]:
    if value is None:
        return [float("nan")]
    if isinstance(value, bool):
        return [1.0 if value else 0.0]
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _flatten(v)]
    return []  # strings (dtype names, modes) are baked into the specialised source


def param_vector(variant: Variant) -> list[float]:
    """The spec's params in order, each flattened: tuples expand, None is NaN, strings vanish."""
    return [x for _, v in variant.params for x in _flatten(v)]
