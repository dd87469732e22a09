"""Reading the nodes of an ATen FX graph (AOTAutograd's forward, with "val" metadata): what the region finder and
the pattern matcher (``_pattern``) share."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx


def bind_node(node: fx.Node) -> dict[str, Any]:
    """An ATen node's arguments by their schema names (defaults filled in)."""
    schema = node.target._schema  # type: ignore[union-attr]
    out, pos = {}, 0
    for a in schema.arguments:
        if not a.kwarg_only and pos < len(node.args):
            out[a.name] = node.args[pos]
            pos += 1
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def val(x: Any):
    """The value a node had while traced (a fake tensor), None for anything else."""
    return x.meta.get("val") if isinstance(x, fx.Node) else None


def rank(x: Any) -> int:
    v = val(x)
    return v.dim() if isinstance(v, torch.Tensor) else 0


def is_scalar(x: Any) -> bool:
    return isinstance(x, (int, float, bool)) and not isinstance(x, torch.Tensor)
