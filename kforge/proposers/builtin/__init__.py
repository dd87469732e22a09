"""The built-in strategy library: kernels specialised to each variant, no network and no LLM."""
from __future__ import annotations

import importlib

from ...ops import all_families
from . import _data, _elementwise, _norms, _pooling, _softmax  # noqa: F401  (the plain operators' strategies)
from ._proposer import BuiltinProposer
from ._strategy import Strategy, all_strategies, get_strategy, strategies_for

for _family in all_families():   # each family's strategies, in the modules its folder names (Family.strategies)
    for _module in _family.strategies:
        importlib.import_module(_module)

__all__ = ["BuiltinProposer", "Strategy", "all_strategies", "get_strategy", "strategies_for"]
