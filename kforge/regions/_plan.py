"""How a region maps onto one kernel: its index space, the reduction's rows, what runs in which phase.

``plan_region`` is the single judge of whether kforge can generate a kernel for a region: the
finder keeps a node in a region only if the grown region still plans (``regions.plan_variant``: the same for a
region variant, cached). A ``RegionPlan`` is this kernel's plan, not the deployment's (``deploy``) nor the judge's
arena layout (``evaluate``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from ..ops import TensorSig, Unsupported
from ._ir import OPS, RegionIR

KERNEL_DTYPES = ("float32", "float16", "bfloat16", "bool")


@dataclass(frozen=True)
class RegionPlan:
    """``shape`` is the index space: the outputs' shape (pointwise) or the reduction's input shape,
    whose last ``k`` dims form one row of ``cols`` elements (``rows`` rows)."""

    ir: RegionIR
    inputs: tuple[TensorSig, ...]
    outputs: tuple[TensorSig, ...]
    shape: tuple[int, ...]
    k: int
    red: int | None
    node_shapes: tuple[tuple[int, ...], ...]
    node_dtypes: tuple[str, ...]
    phase1: tuple[int, ...]        # nodes computing the reduction's operand (reduction regions)
    full: tuple[int, ...]          # nodes computed per element for the full-shape outputs
    row: tuple[int, ...]           # nodes computed once per row for the row-shaped outputs
    out_is_row: tuple[bool, ...]

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:len(self.shape) - self.k])

    @property
    def cols(self) -> int:
        return math.prod(self.shape[len(self.shape) - self.k:])

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def red_op(self) -> str | None:
        return None if self.red is None else self.ir.nodes[self.red].op

    def bstrides(self, sig_shape: Sequence[int], sig_stride: Sequence[int]) -> tuple[int, ...]:
        """Strides of a tensor broadcast onto ``shape`` (0 where it is broadcast)."""
        pad = len(self.shape) - len(sig_shape)
        return tuple(0 if d < pad or sig_shape[d - pad] == 1 else sig_stride[d - pad] for d in range(len(self.shape)))

    def col_varying(self, i: int) -> bool:
        """Whether input ``i`` changes along a row (else it is read once per row)."""
        st = self.bstrides(self.inputs[i].shape, self.inputs[i].stride)
        return any(st[len(st) - self.k:]) if self.k else True


def _broadcasts_to(shape: Sequence[int], target: Sequence[int]) -> bool:
    if len(shape) > len(target):
        return False
    pad = len(target) - len(shape)
    return all(s == 1 or s == target[d + pad] for d, s in enumerate(shape))


def _ancestors(ir: RegionIR, roots: Sequence[int], stop: int | None = None) -> set[int]:
    """``roots`` and the nodes they read, not looking past node ``stop``."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n != stop:
            stack.extend(a.value for a in ir.nodes[n].args if a.kind == "n")
    return seen


def memory_order(sig: TensorSig) -> tuple[int, ...] | None:
    """The order of ``sig``'s dims, outermost first, in which it is dense row-major (channels-last
    N,C,H,W: (0, 2, 3, 1)); None where that is the order it has, or where no order is dense (a view
    with gaps or overlaps). Dims of size 1 go first, their strides mean nothing."""
    rank = len(sig.shape)
    order = tuple(sorted(range(rank), key=lambda d: (sig.shape[d] != 1, -sig.stride[d] if sig.shape[d] != 1 else 0)))
    if order == tuple(range(rank)):
        return None
    acc = 1
    for d in reversed(order):
        if sig.shape[d] != 1 and sig.stride[d] != acc:
            return None
        acc *= sig.shape[d]
    # NB: sizes of 1 moved: only a real change of order is worth a permuted plan
    big = [d for d in order if sig.shape[d] != 1]
    return None if big == sorted(big) else order


def _permuted_shape(shape: Sequence[int], perm: Sequence[int]) -> tuple[int, ...]:
    full = (1,) * (len(perm) - len(shape)) + tuple(shape)
    return tuple(full[d] for d in perm)


def _permuted(sig: TensorSig | None, perm: Sequence[int]) -> TensorSig | None:
    """``sig`` broadcast to the index space's rank (leading dims of size 1) with its dims in ``perm``'s
    order: the same elements at the same offsets, walked in another order."""
    if sig is None:
        return None
    pad = len(perm) - len(sig.shape)
    shape = (1,) * pad + tuple(sig.shape)
    stride = (0,) * pad + tuple(sig.stride)
    return replace(sig, shape=tuple(shape[d] for d in perm), stride=tuple(stride[d] for d in perm))


def plan_region(ir: RegionIR, inputs: Sequence[TensorSig], outputs: Sequence[TensorSig]) -> RegionPlan:
    """The kernel plan of a region, or Unsupported saying why kforge cannot fuse it."""
    try:
        ir.check()
    except ValueError as exc:
        raise Unsupported(str(exc)) from None
    values = ir.meta(inputs)
    shapes = tuple(tuple(v.shape) for v in values)
    dtypes = tuple(str(v.dtype).replace("torch.", "") for v in values)
    for s in list(inputs) + list(outputs):
        if s.dtype not in KERNEL_DTYPES:
            raise Unsupported(f"a {s.dtype} tensor (the generator handles {', '.join(KERNEL_DTYPES)})")
        if s.numel == 0:
            raise Unsupported("an empty tensor")
    for i, d in enumerate(dtypes):
        if d not in KERNEL_DTYPES:
            raise Unsupported(f"node {i} ({ir.nodes[i].op}) gives {d}")
    for i, n in enumerate(ir.nodes):
        if OPS[n.op].kind == "cast" and n.attr["dtype"] not in KERNEL_DTYPES:
            raise Unsupported(f"a cast to {n.attr['dtype']}")
        if n.op in ("clamp",) and any(n.attr.get(k) is not None and not isinstance(n.attr[k], (int, float))
                                      for k in ("min", "max")):
            raise Unsupported("clamp with tensor bounds")
    red = ir.reduction
    users = ir.users()
    if red is None:
        shape = shapes[ir.outputs[0]]
        for o in ir.outputs:
            if shapes[o] != shape:
                raise Unsupported("pointwise outputs of different shapes")
        for s in [x.shape for x in inputs] + list(shapes):
            if not _broadcasts_to(s, shape):
                raise Unsupported(f"shape {tuple(s)} does not broadcast to the region's {shape}")
        full = tuple(sorted(_ancestors(ir, ir.outputs)))
        # NB: a pointwise kernel walks its index space in the first output's memory order: elementwise
        # values do not care which dim comes first, and a channels-last output (a twin between
        # convolutions) walked N,C,H,W would be read and written C elements apart (0.23-0.72x of eager on
        # the H200 for ResNet-50's add,relu twins, 2026-12-03), where N,H,W,C is a dense sweep
        perm = memory_order(outputs[0]) if outputs and len(shape) > 1 else None
        if perm is not None:
            shape = tuple(shape[d] for d in perm)
            inputs = [_permuted(x, perm) for x in inputs]
            outputs = [_permuted(x, perm) for x in outputs]
            shapes = tuple(_permuted_shape(s, perm) for s in shapes)
        return RegionPlan(ir, tuple(inputs), tuple(outputs), shape or (1,), 0, None, shapes, dtypes, (), full, (),
                    tuple(False for _ in ir.outputs))
    node = ir.nodes[red]
    src = node.args[0]
    if src.kind == "c":
        raise Unsupported("a reduction of a constant")
    shape = tuple(inputs[src.value].shape) if src.kind == "i" else shapes[src.value]
    k = int(node.attr.get("k", 1))
    if not 1 <= k <= len(shape):
        raise Unsupported(f"a reduction over {k} trailing dims of a {len(shape)}-d tensor")
    keepdim = node.attr.get("keepdim", True) if OPS[node.op].kind == "reduce" else True
    if not keepdim and users[red]:
        raise Unsupported("a reduction without keepdim feeding other operators")
    row_shape = shape[:len(shape) - k] + (1,) * k
    lead = shape[:len(shape) - k]
    for s in [x.shape for x in inputs]:
        if not _broadcasts_to(s, shape):
            raise Unsupported(f"input shape {tuple(s)} does not broadcast to the reduction's {shape}")
    for i, s in enumerate(shapes):
        if i == red and not keepdim:
            continue
        if not _broadcasts_to(s, shape):
            raise Unsupported(f"node {i} ({ir.nodes[i].op}) has shape {s}, not within the reduction's {shape}")
    out_is_row = []
    for o in ir.outputs:
        if shapes[o] == shape:
            out_is_row.append(False)
        elif shapes[o] == row_shape or (o == red and not keepdim and shapes[o] == lead):
            out_is_row.append(True)
        else:
            raise Unsupported(f"an output of shape {shapes[o]} is neither a full row {shape} nor one value per row")
    phase1 = tuple(sorted(_ancestors(ir, [src.value]))) if src.kind == "n" else ()
    full_outs = [o for o, r in zip(ir.outputs, out_is_row) if not r]
    row_outs = [o for o, r in zip(ir.outputs, out_is_row) if r]
    full = tuple(sorted(_ancestors(ir, full_outs, stop=red)))
    row = tuple(sorted(_ancestors(ir, row_outs, stop=red)))
    if OPS[node.op].kind == "norm" and red in row:
        raise Unsupported("a per-row output of a full-row normalisation")
    return RegionPlan(ir, tuple(inputs), tuple(outputs), shape, k, red, shapes, dtypes, phase1, full, row,
                tuple(out_is_row))
