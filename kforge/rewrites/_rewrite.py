"""What a rewrite is: a change to a model's ATen graph that keeps its outputs (to rounding), registered by name."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch.fx


@dataclass(frozen=True)
class Rewritten:
    """What one rewrite did to one graph: a line per site it changed, and ``refresh(args)``, called with the graph's
    arguments before each run, which keeps the constants it made equal to what they were made from."""

    rewrite: str
    sites: tuple[str, ...]
    refresh: Callable[[Sequence[Any]], None]


@dataclass(frozen=True)
class Rewrite:
    """An inference rewrite: ``apply(gm, values)`` changes the ATen graph ``gm`` in place, given the values its
    placeholders hold at this compile (real tensors, in placeholder order), and says what it did (None: nothing
    to do). It runs only on graphs that record no gradients (a kforge deployment checks it before keeping it)."""

    name: str
    description: str
    apply: Callable[[torch.fx.GraphModule, Sequence[Any]], "Rewritten | None"]


_REWRITES: dict[str, Rewrite] = {}


def register_rewrite(rewrite: Rewrite) -> Rewrite:
    """Make ``rewrite`` available by its name (``Session.apply(rewrites=(name,))``)."""
    _REWRITES[rewrite.name] = rewrite
    return rewrite


def rewrite_names() -> tuple[str, ...]:
    return tuple(_REWRITES)


def get_rewrite(name: str) -> Rewrite:
    try:
        return _REWRITES[name]
    except KeyError:
        raise ValueError(f"no rewrite named {name!r}; the rewrites are: {', '.join(_REWRITES) or 'none'}") from None


def as_rewrites(names: Sequence[str] | str | None) -> tuple[str, ...]:
    """``names`` checked against the registry, each once, in the registry's order whatever order they are named in
    (a single name may be passed as a string): a rewrite reads the graph the earlier ones left, and the registry's
    order is the one that works (``fold_batch_norm`` before ``channels_last``, which takes the folded weights)."""
    if names is None:
        return ()
    if isinstance(names, str):
        names = (names,)
    for name in names:
        get_rewrite(name)
    order = list(_REWRITES)
    return tuple(sorted(set(names), key=order.index))
