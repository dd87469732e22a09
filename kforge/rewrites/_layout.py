"""Convolution chains run channels-last, for inference: a layout chosen per chain.

A 2-d convolution library (cuDNN on a GPU, oneDNN on a CPU) computes in channels-last (NHWC) natively and, given
contiguous (NCHW) tensors, converts them around the call, its weight included, on every call. Eager PyTorch keeps
the layout it is given. This rewrite, in a model's ATen graph, runs each chain of convolutions and of the operators
that keep a layout (pointwise operators, batch norm, pooling) channels-last: the chain's input converted once where
it enters, each convolution's weight a channels-last constant, and each tensor that leaves the chain (to a view, a
reduction, a matrix product, the graph's output) converted back to the contiguous layout where it leaves, so every
other operator sees the strides it saw before. Values do not change, only the order they are stored in: the output
is eager's to the convolutions' own rounding, which the deployment's check holds it to.

Inductor makes its own layout decision (``layout_optimization``, on a GPU) in a compiled graph; this rewrite gives an
eager deployment one, and a compiled graph the explicit conversions, which Inductor then keeps or not.

The weight constants never go stale: before each run ``refresh`` compares every weight the graph is handed (which
object, its version counter, its storage address) with what the constants were made from (a constant another
rewrite made, the folded weight of ``fold_batch_norm``, by its version), and makes them again in place where any
differs.
"""
from __future__ import annotations

import operator
from typing import Any, Sequence

import torch
import torch.fx

from ._rewrite import Rewrite, Rewritten, register_rewrite

_aten = torch.ops.aten
_CONV = _aten.convolution.default
# NB: beyond the pointwise operators (torch.Tag.pointwise): operators that take a channels-last input and give a
# channels-last output, computing the same values
_KEEPS = {_CONV, _aten._native_batch_norm_legit_no_training.default, _aten.max_pool2d_with_indices.default,
          _aten.avg_pool2d.default, _aten._adaptive_avg_pool2d.default, _aten.clone.default, operator.getitem}


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _is_4d(node: Any) -> bool:
    v = _val(node)
    return isinstance(v, torch.Tensor) and v.dim() == 4


def _keeps_layout(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    t = node.target
    if t in _KEEPS:
        return t is not _aten.clone.default or node.kwargs.get("memory_format") is None
    return isinstance(t, torch._ops.OpOverload) and torch.Tag.pointwise in t.tags


def _fake_like(anchor: Any, fn) -> Any:
    """``fn`` applied to the fake tensor ``anchor`` in its own fake mode (the new node's meta), or None."""
    if anchor is None or not hasattr(anchor, "fake_mode"):
        return None
    with anchor.fake_mode:
        return fn(anchor)


def _clone_node(gm: torch.fx.GraphModule, src: torch.fx.Node, fmt: torch.memory_format) -> torch.fx.Node:
    node = gm.graph.call_function(_aten.clone.default, (src,), {"memory_format": fmt})
    fake = _fake_like(_val(src), lambda t: _aten.clone.default(t, memory_format=fmt))
    if fake is not None:
        node.meta["val"] = fake
    return node


class _Weights:
    """The channels-last weight constants of one graph and what each was made from (a placeholder's position, or a
    constant tensor another rewrite holds): ``refresh(args)`` makes a constant again, in place, where its source is
    another object, another version or at another address."""

    def __init__(self, made: list[tuple[torch.Tensor, int | None, torch.Tensor]], values: Sequence[Any]):
        self.made = made   # (constant, placeholder position or None, source tensor where not a placeholder)
        self.seen = [self._state(values, pos, src) for _, pos, src in made]
        self.remade = 0

    @staticmethod
    def _state(values: Sequence[Any], pos: int | None, src: torch.Tensor) -> tuple[int, int, int]:
        t = values[pos] if pos is not None else src
        return id(t), t._version, t.data_ptr()

    def __call__(self, args: Sequence[Any]) -> None:
        for k, (constant, pos, src) in enumerate(self.made):
            state = self._state(args, pos, src)
            if state == self.seen[k]:
                continue
            with torch.no_grad():
                constant.copy_(args[pos] if pos is not None else src)
            self.seen[k] = state
            self.remade += 1


def channels_last(gm: torch.fx.GraphModule, values: Sequence[Any]) -> Rewritten | None:
    """Run the graph's 2-d convolution chains channels-last, in place (see the module's doc)."""
    places = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    convs = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is _CONV and _is_4d(n.args[0])
             and _is_4d(n) and _weight(gm, n.args[1], places, values) is not None]
    if not convs:
        return None
    chain: set[torch.fx.Node] = set()
    entered: dict[torch.fx.Node, torch.fx.Node] = {}
    made: list[tuple[torch.Tensor, int | None, torch.Tensor]] = []
    lines: list[str] = []
    todo = set(convs)
    for node in list(gm.graph.nodes):
        if node in todo:
            x, w_node = node.args[0], node.args[1]
            if x not in chain:
                if x not in entered:
                    with gm.graph.inserting_before(node):
                        entered[x] = _clone_node(gm, x, torch.channels_last)
                x = entered[x]
            pos, source = _weight(gm, w_node, places, values)
            constant = source.detach().clone(memory_format=torch.channels_last)
            name = f"_kforge_channels_last_weight_{len(made)}"
            while hasattr(gm, name):
                name += "_"
            gm.register_buffer(name, constant)
            with gm.graph.inserting_before(node):
                w_cl = gm.graph.get_attr(name)
            fake = _val(w_node)
            if fake is not None and hasattr(fake, "fake_mode"):
                # NB: static, as fold_batch_norm's constants are (a size symbol with no source breaks dynamo's guards)
                w_cl.meta["val"] = fake.fake_mode.from_tensor(constant, static_shapes=True)
            node.args = (x, w_cl, *node.args[2:])
            made.append((constant, pos, source))
            chain.add(node)
            lines.append(f"channels_last: conv weight {list(constant.shape)} "
                         f"{str(constant.dtype).replace('torch.', '')}")
        elif _keeps_layout(node) and any(a in chain for a in node.all_input_nodes) and (
                _is_4d(node) or isinstance(_val(node), (tuple, list))):
            chain.add(node)
    # where a tensor leaves the chain, the contiguous layout again (once per tensor)
    for node in [n for n in gm.graph.nodes if n in chain and _is_4d(n)]:
        leaving = [u for u in node.users if u not in chain]
        if not leaving:
            continue
        with gm.graph.inserting_after(node):
            back = _clone_node(gm, node, torch.contiguous_format)
        for user in leaving:
            user.replace_input_with(node, back)
    gm.graph.lint()
    gm.recompile()
    return Rewritten("channels_last", tuple(lines), _Weights(made, values))


def _weight(gm: torch.fx.GraphModule, node: Any, places: dict, values: Sequence[Any]
            ) -> tuple[int | None, torch.Tensor] | None:
    """Where a convolution's weight comes from, as (placeholder position, its tensor) or (None, a constant of the
    graph), if it is a 4-d floating tensor not already channels-last; None otherwise (the convolution is left)."""
    if not isinstance(node, torch.fx.Node):
        return None
    if node.op == "placeholder":
        pos, t = places[node], values[places[node]]
    elif node.op == "get_attr":
        pos, t = None, getattr(gm, node.target, None)
    else:
        return None
    if not (isinstance(t, torch.Tensor) and t.dim() == 4 and t.is_floating_point()):
        return None
    return pos, t


CHANNELS_LAST = register_rewrite(Rewrite(
    "channels_last",
    "2-d convolution chains run channels-last: the chain's input converted once, each weight a channels-last "
    "constant, the contiguous layout again where a tensor leaves the chain",
    channels_last))
