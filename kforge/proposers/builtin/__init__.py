from ._strategy import Strategy, all_strategies, strategies_for
from . import _softmax
