"""The built-in strategy library: kernels specialised to each variant, no network and no LLM."""
from __future__ import annotations

from . import _data, _elementwise, _gemm, _moe, _norms, _pooling, _recurrent, _rope, _softmax  # noqa: F401  (register the families)
from ._proposer import BuiltinProposer
from ._strategy import Strategy, all_strategies, get_strategy, strategies_for

__all__ = ["BuiltinProposer", "Strategy", "all_strategies", "get_strategy", "strategies_for"]
