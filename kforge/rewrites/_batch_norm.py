"""Batch norm folded into the convolution before it, for inference.

An eval-mode batch norm is a per-channel affine map: ``y = (x - mean) * gamma / sqrt(var + eps) + beta``. Where
it alone reads a convolution's output, the convolution can compute ``y`` itself with its weight scaled per output
channel by ``s = gamma / sqrt(var + eps)`` and its bias set to ``(b - mean) * s + beta``: one pass over the
activation less (a read and a write of it in eager; in a compiled graph, the batch norm's arithmetic in the kernel
Inductor fuses after the convolution). Inductor makes this fold only with ``freezing`` (off by default:
``torch._inductor.fx_passes.pre_grad.fuse_conv_bn`` runs under ``config.freezing``).

The folded weight and bias are constants of the rewritten graph, made from the model's parameters and buffers as
they are when the graph is compiled. They never go stale: before each run ``refresh`` compares every source
tensor the graph is handed (which object, its version counter, its storage address) with what the constants were
made from, and makes them again in place where any differs (``load_state_dict``, an optimiser step, ``p.data =``).
A model that changes its batch norm statistics therefore runs with its new values, as eager would.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx

from ._rewrite import Rewrite, Rewritten, register_rewrite

_CONV = torch.ops.aten.convolution.default
_NORM = torch.ops.aten._native_batch_norm_legit_no_training.default   # what AOTAutograd makes of an eval-mode batch norm


@dataclass(frozen=True)
class ConvBatchNorm:
    """A convolution whose output only an eval-mode batch norm reads, in an ATen graph. Each source is the position
    of the placeholder that feeds it (None: absent: a convolution without bias, a batch norm without affine)."""

    conv: torch.fx.Node
    norm: torch.fx.Node
    weight: int
    bias: int | None
    gamma: int | None
    beta: int | None
    mean: int
    var: int
    eps: float

    @property
    def sources(self) -> tuple[int | None, ...]:
        return (self.weight, self.bias, self.gamma, self.beta, self.mean, self.var)

    @property
    def transposed(self) -> bool:
        return bool(self.conv.args[6])

    @property
    def groups(self) -> int:
        return int(self.conv.args[8])

    def describe(self, values: Sequence[Any]) -> str:
        w = values[self.weight]
        kind = "conv_transpose" if self.transposed else "conv"
        return f"fold_batch_norm: {kind} weight {list(w.shape)} {str(w.dtype).replace('torch.', '')} + batch_norm"


def find_conv_batch_norms(gm: torch.fx.GraphModule) -> list[ConvBatchNorm]:
    """Every convolution in ``gm`` read only by an eval-mode batch norm whose only used output is its result, with
    the convolution's weight and bias and the batch norm's parameters and statistics graph inputs (placeholders:
    the model's parameters and buffers, which a fold can read and watch)."""
    # NB: walked by hand, not matched as a traced pattern: the replacement is made of the values the placeholders
    # hold (new constants), which a traced replacement function cannot take
    places = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}

    def place(arg: Any, optional: bool = False) -> int | None | bool:
        if arg is None and optional:
            return None
        return places.get(arg, False) if isinstance(arg, torch.fx.Node) else False

    found = []
    for norm in gm.graph.nodes:
        if norm.op != "call_function" or norm.target is not _NORM:
            continue
        conv, gamma, beta, mean, var, _momentum, eps = norm.args
        if not (isinstance(conv, torch.fx.Node) and conv.op == "call_function" and conv.target is _CONV
                and len(conv.users) == 1):
            continue
        # the batch norm's other outputs (its saved statistics) are read by nothing
        if any(not (u.op == "call_function" and u.target is operator.getitem)
               or (u.args[1] != 0 and u.users) for u in norm.users):
            continue
        ids = (place(conv.args[1]), place(conv.args[2], True), place(gamma, True), place(beta, True), place(mean),
               place(var))
        if any(i is False for i in ids):
            continue
        found.append(ConvBatchNorm(conv, norm, *ids, eps=float(eps)))   # type: ignore[arg-type]
    return found


def folded(site: ConvBatchNorm, values: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The convolution's weight and bias with the batch norm folded in, computed in float64 (float32 where the
    device has no float64) and rounded once to the weight's dtype."""
    w, b, gamma, beta, mean, var = (None if i is None else values[i] for i in site.sources)
    wide = torch.float32 if w.device.type == "mps" else torch.float64
    with torch.no_grad():
        scale = (var.to(wide) + site.eps).rsqrt()
        if gamma is not None:
            scale = scale * gamma.to(wide)
        shift = (b.to(wide) if b is not None else 0.0) - mean.to(wide)
        bias = shift * scale + (beta.to(wide) if beta is not None else 0.0)
        k = (1,) * (w.dim() - 2)
        if site.transposed:   # weight [in, out / groups, *k]: output channel g * (out / groups) + j
            g = site.groups
            wf = w.to(wide).reshape(g, w.shape[0] // g, w.shape[1], *w.shape[2:]) * scale.reshape(g, 1, w.shape[1], *k)
            wf = wf.reshape(w.shape)
        else:                 # weight [out, in / groups, *k]
            wf = w.to(wide) * scale.reshape(-1, 1, *k)
        return wf.to(w.dtype).contiguous(memory_format=_format_of(w)), bias.to(w.dtype)


def _format_of(t: torch.Tensor) -> torch.memory_format:
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


class _Folds:
    """The constants of one graph's folds and what they were made from: ``refresh(args)`` makes them again, in place,
    where a source tensor the graph is handed is another object, another version or at another address."""

    def __init__(self, sites: list[ConvBatchNorm], constants: list[tuple[torch.Tensor, torch.Tensor]],
                 values: Sequence[Any]):
        self.sites, self.constants = sites, constants
        self.positions = sorted({i for s in sites for i in s.sources if i is not None})
        self.seen = self._state(values)
        self.refolds = 0

    def _state(self, values: Sequence[Any]) -> list[tuple[int, int, int]]:
        return [(id(values[i]), values[i]._version, values[i].data_ptr()) for i in self.positions]

    def __call__(self, args: Sequence[Any]) -> None:
        state = self._state(args)
        if state == self.seen:
            return
        for site, (w, b) in zip(self.sites, self.constants):
            nw, nb = folded(site, args)
            with torch.no_grad():
                w.copy_(nw)
                b.copy_(nb)
        self.seen = state
        self.refolds += 1


def fold_batch_norms(gm: torch.fx.GraphModule, values: Sequence[Any]) -> Rewritten | None:
    """Fold each eval-mode batch norm into the convolution it alone reads (``find_conv_batch_norms``), in place."""
    sites = [s for s in find_conv_batch_norms(gm)
             if all(isinstance(values[i], torch.Tensor) and values[i].is_floating_point()
                    and values[i].device == values[s.weight].device for i in s.sources if i is not None)]
    if not sites:
        return None
    constants = []
    lines = []
    for n, site in enumerate(sites):
        w, b = folded(site, values)
        names = (f"_kforge_folded_weight_{n}", f"_kforge_folded_bias_{n}")
        while any(hasattr(gm, name) for name in names):
            names = tuple(f"{name}_" for name in names)
        gm.register_buffer(names[0], w)
        gm.register_buffer(names[1], b)
        conv = site.conv
        with gm.graph.inserting_before(conv):
            nodes = [gm.graph.get_attr(name) for name in names]
        fake = conv.args[1].meta.get("val")
        if fake is not None and hasattr(fake, "fake_mode"):
            # NB: static: dynamo's fake mode has a shape env, and a fake made in it without static_shapes gets a
            # symbol per size with no source (duck-sized: a 3x3 kernel's 3s one symbol), which a compiler's
            # guard on the convolution's output size then holds; building dynamo's guards on it raised IndexError
            for node, t in zip(nodes, (w, b)):
                node.meta["val"] = fake.fake_mode.from_tensor(t, static_shapes=True)
        conv.args = (conv.args[0], nodes[0], nodes[1], *conv.args[3:])
        for user in list(site.norm.users):
            if user.args[1] == 0:
                user.replace_all_uses_with(conv)
            gm.graph.erase_node(user)
        gm.graph.erase_node(site.norm)
        constants.append((w, b))
        lines.append(site.describe(values))
    gm.graph.lint()
    gm.recompile()
    return Rewritten("fold_batch_norm", tuple(lines), _Folds(sites, constants, values))


FOLD_BATCH_NORM = register_rewrite(Rewrite(
    "fold_batch_norm",
    "an eval-mode batch norm folded into the convolution whose output it alone reads (weight and bias rescaled)",
    fold_batch_norms))
