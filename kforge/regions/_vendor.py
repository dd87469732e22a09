"""Vendor-headed chains: a matrix product or a convolution and the elementwise chain after it.

A region (``_finder``) stops at a matmul or a convolution: eager runs those in cuBLAS/cuDNN, and kforge's own
region kernels are pointwise. Where such a product is followed by a chain (bias, scaling, activations, residual
adds, clamps, batch norm in eval mode, and one reduction over the output's rows or channel groups: softmax,
layer norm, group norm), one kernel can compute the product and apply the chain in its epilogue, so the product
is never written and read back. This module finds those chains in the ATen graph that graph capture records
(``capture_regions``), as records a generator can work from:

- ``VendorHead``: which product (mm, addmm, bmm, baddbmm, convolution, transposed convolution), its operands'
  exact signatures, the problem's dims, each operand's majorness, its scalars and its convolution parameters;
- the tail: kforge's region IR (``RegionIR``) over an index space (``frame``), whose input 0 is the product and
  whose other inputs are the chain's own inputs seen in that space (``TailInput``). The frame is the product's
  shape as the chain reads it (after the reshape ``F.linear`` puts around a 3-d input), or, where a group norm
  is in the chain, that shape split into ``[N, groups, C / groups, spatial]`` so that the group norm is a layer
  norm over the last two dims.

A chain's reference is the head's torch call followed by the IR run op by op (``VendorChain.reference``).
"""
from __future__ import annotations

import hashlib
import json
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from ..ops import TensorSig, Unsupported, torch_dtype
from ..ops._aten import bind_node, is_scalar, val
from ._finder import translate
from ._ir import OPS, Node, Ref, RegionIR
from ._plan import KERNEL_DTYPES, plan_region

aten = torch.ops.aten

HEADS: dict[Any, str] = {aten.mm.default: "mm", aten.addmm.default: "addmm", aten.bmm.default: "bmm",
                         aten.baddbmm.default: "baddbmm", aten.convolution.default: "conv"}
_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_BN = aten._native_batch_norm_legit_no_training.default
_GN = aten.native_group_norm.default
_LN = aten.native_layer_norm.default
MAX_TAIL_NODES = 48
HEAD_DTYPES = ("float32", "float16", "bfloat16")


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class ConvParams:
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    output_padding: tuple[int, ...]
    groups: int
    transposed: bool

    @property
    def spatial(self) -> int:
        return len(self.stride)


@dataclass(frozen=True)
class VendorHead:
    """The product at a chain's head.

    GEMM kinds compute ``out[b] = beta * bias + alpha * a[b] @ b[b]`` (``batch`` 1 and no batch dim for mm/addmm),
    ``m x k`` times ``k x n``. A convolution is its implicit GEMM: ``m`` = N * output pixels, ``n`` = output
    channels, ``k`` = input channels per group * kernel size (``conv`` holds its parameters). ``a_major`` /
    ``b_major`` say which of the operand's last two dims is dense ("row": the last; "col": the one before;
    "none": neither, a generator copies it first); for convolutions they describe the activation's layout
    ("row": NCHW, "col": channels-last)."""

    kind: str                       # "mm" | "addmm" | "bmm" | "baddbmm" | "conv" | "conv_transpose"
    a: TensorSig
    b: TensorSig
    bias: TensorSig | None
    out: TensorSig
    m: int
    n: int
    k: int
    batch: int
    a_major: str
    b_major: str
    alpha: float = 1.0
    beta: float = 1.0
    conv: ConvParams | None = None

    @property
    def dtype(self) -> str:
        return self.out.dtype

    @property
    def is_conv(self) -> bool:
        return self.conv is not None

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    def run(self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The head's own torch call (eager's)."""
        if self.kind == "mm":
            return torch.mm(a, b)
        if self.kind == "bmm":
            return torch.bmm(a, b)
        if self.kind == "addmm":
            return torch.addmm(bias, a, b, beta=self.beta, alpha=self.alpha)
        if self.kind == "baddbmm":
            return torch.baddbmm(bias, a, b, beta=self.beta, alpha=self.alpha)
        c = self.conv
        assert c is not None
        return torch.convolution(a, b, bias, list(c.stride), list(c.padding), list(c.dilation), c.transposed,
                                 list(c.output_padding), c.groups)

    def short(self) -> str:
        if self.conv is not None:
            c = self.conv
            what = "conv_transpose" if c.transposed else "conv"
            return (f"{what}{c.spatial}d(x{list(self.a.shape)}, w{list(self.b.shape)}, stride={list(c.stride)}, "
                    f"pad={list(c.padding)}, groups={c.groups}{', bias' if self.bias is not None else ''}) {self.dtype}")
        shape = f"[{self.batch}x]" if self.kind in ("bmm", "baddbmm") else ""
        t = ("T" if self.a_major == "col" else "N") + ("T" if self.b_major == "row" else "N")
        return f"{self.kind} {shape}{self.m}x{self.n}x{self.k} {t} {self.dtype}"


@dataclass(frozen=True)
class TailInput:
    """One input of the tail's IR: the product (``source`` -1) or the chain's input ``source``, seen in the frame
    as ``sig`` (the same memory; strides 0 where it is broadcast). ``channel``: a 1-d per-channel tensor (batch
    norm's and group norm's statistics and affine) placed along dim 1 of the head's output."""

    source: int
    sig: TensorSig
    channel: bool = False


@dataclass(frozen=True)
class VendorChain:
    """A product and the chain after it, as one kernel computes them.

    ``inputs``: the kernel's inputs in order (the head's operands a, b, then its bias if it has one, then the
    tail's own inputs); ``outputs``: the chain's outputs as the model has them. The tail is ``ir`` over
    ``frame`` (None: the head alone); ``tail_inputs[i]`` is what its input ``i`` reads; ``out_frames[j]`` is
    output ``j`` seen in the frame. ``hshape`` is the head's output shape as the tail reads it; ``groups``
    (> 0) says the frame splits its dim 1 into that many groups."""

    head: VendorHead
    inputs: tuple[TensorSig, ...]
    outputs: tuple[TensorSig, ...]
    ir: RegionIR | None
    hshape: tuple[int, ...]
    frame: tuple[int, ...]
    tail_inputs: tuple[TailInput, ...]
    out_frames: tuple[TensorSig, ...]
    groups: int = 0

    @property
    def ops(self) -> tuple[str, ...]:
        return (self.head.kind,) + (self.ir.ops if self.ir is not None else ())

    @property
    def reduction(self) -> str | None:
        if self.ir is None or self.ir.reduction is None:
            return None
        return self.ir.nodes[self.ir.reduction].op

    @property
    def key(self) -> str:
        text = json.dumps({"head": _head_json(self.head), "inputs": [_sig_json(s) for s in self.inputs],
                           "ir": self.ir.dumps() if self.ir is not None else None, "frame": self.frame,
                           "tail": [[t.source, _sig_json(t.sig), t.channel] for t in self.tail_inputs],
                           "outs": [_sig_json(s) for s in self.outputs], "groups": self.groups}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def plan(self):
        """The tail's kernel plan (``plan_region``: its index space, the reduction's rows, what runs in which
        phase), or None for a head alone: what a generator reads, so that it needs nothing else from here."""
        if self.ir is None:
            return None
        return plan_region(self.ir, [t.sig for t in self.tail_inputs], list(self.out_frames))

    def describe(self) -> str:
        tail = ",".join(self.ir.ops) if self.ir is not None else "-"
        return f"{self.head.short()} -> [{tail}]"

    def dumps(self) -> str:
        """The whole record as canonical JSON (``loads`` gives it back). Signatures are kept without their device:
        a chain is the same computation on every device (the card's variant carries the device), so a kernel
        searched on cuda:0 is placed on cuda:1; ``loads`` gives them the device "cpu"."""
        h = self.head
        head = {**_head_json(h), "m": h.m, "n": h.n, "k": h.k, "batch": h.batch, "a_major": h.a_major,
                "b_major": h.b_major}
        d = {"v": 1, "head": head, "inputs": [_sig_json(s) for s in self.inputs],
             "outputs": [_sig_json(s) for s in self.outputs], "ir": self.ir.to_json() if self.ir is not None else None,
             "hshape": list(self.hshape), "frame": list(self.frame),
             "tail": [[t.source, _sig_json(t.sig), t.channel] for t in self.tail_inputs],
             "out_frames": [_sig_json(s) for s in self.out_frames], "groups": self.groups}
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @classmethod
    def loads(cls, text: str) -> "VendorChain":
        d = json.loads(text)
        if d.get("v") != 1:
            raise ValueError(f"a vendor chain record of version {d.get('v')!r}; this kforge reads version 1")
        ir = RegionIR.loads(json.dumps(d["ir"])) if d["ir"] is not None else None
        if ir is not None:
            ir.check()
        return cls(_head_of_json(d["head"]), tuple(_sig_of_json(s) for s in d["inputs"]),
                   tuple(_sig_of_json(s) for s in d["outputs"]), ir, tuple(d["hshape"]), tuple(d["frame"]),
                   tuple(TailInput(int(src), _sig_of_json(sig), bool(ch)) for src, sig, ch in d["tail"]),
                   tuple(_sig_of_json(s) for s in d["out_frames"]), int(d["groups"]))

    def portable(self) -> "VendorChain":
        """The same chain with every signature's device "cpu": what ``loads(dumps())`` gives."""
        return VendorChain.loads(self.dumps())

    def head_frame(self, stride: Sequence[int] | None = None) -> TensorSig:
        """The head's product seen in the frame, stored with ``stride`` in the head's own output shape
        (contiguous by default: how the CPU kernel holds it)."""
        out = self.head.out
        st = tuple(stride) if stride is not None else _contiguous(out.shape)
        meta = torch.empty_strided(out.shape, st, dtype=torch_dtype(out.dtype), device="meta")
        return _in_frame(meta.reshape(self.hshape) if tuple(out.shape) != self.hshape else meta, self)

    def bind_tail(self, head_out: torch.Tensor, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The tail IR's inputs: the head's product (in its own output shape) and the chain's inputs, each seen in
        the frame."""
        out = []
        for t in self.tail_inputs:
            x = head_out.reshape(self.hshape) if t.source < 0 else inputs[t.source]
            if t.channel:
                x = _channel_view(x, len(self.hshape))
            out.append(_in_frame(x, self))
        return out

    def reference(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Eager's answer: the head's torch call, then the tail's operators one by one."""
        h = self.head.run(inputs[0], inputs[1], inputs[2] if self.head.bias is not None else None)
        if self.ir is None:
            return [h.reshape(self.outputs[0].shape)]
        outs = self.ir(self.bind_tail(h, inputs))
        return [o.reshape(s.shape) for o, s in zip(outs, self.outputs)]

    def eager(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The chain as a model spells it (``F.linear``, ``F.conv2d``, ``F.batch_norm``, ``F.group_norm``, then the
        tail's other operators one by one): what eager runs, timed as the card's baseline and replayed to tell which
        operator cards the chain stands for. Same values as ``reference`` up to float rounding."""
        h = _model_head(self.head, self.hshape, inputs)
        if self.ir is None:
            return [h.reshape(self.outputs[0].shape)]
        tins = self.bind_tail(h, inputs)
        values: list[Any] = []
        spans = _norm_spans(self)

        def get(r: Ref):
            return tins[r.value] if r.kind == "i" else values[r.value] if r.kind == "n" else r.value

        i = 0
        while i < len(self.ir.nodes):
            span = spans.get(i)
            if span is not None:
                last, fn = span
                values.extend([None] * (last - i))
                values.append(fn(get, inputs))
                i = last + 1
                continue
            n = self.ir.nodes[i]
            values.append(OPS[n.op].torch_fn(*[get(a) for a in n.args], **n.attr))
            i += 1
        return [values[o].reshape(s.shape) for o, s in zip(self.ir.outputs, self.outputs)]

    def random_inputs(self, seed: int, device: str | torch.device = "cpu") -> list[torch.Tensor]:
        """Fresh inputs with the exact signatures: normal values; batch norm's variances positive."""
        from ..ops import random_tensor

        g = torch.Generator().manual_seed(seed)
        positive = _positive_sources(self)
        out = []
        for i, s in enumerate(self.inputs):
            t = random_tensor(TensorSig(s.shape, s.dtype, s.stride, "cpu"), g, positive=i in positive)
            out.append(t.to(device))
        return out


@dataclass(frozen=True)
class FoundChain:
    """A chain in a graph: its record, its graph nodes (head first), the nodes its inputs come from, and the
    nodes whose values it returns."""

    chain: VendorChain
    nodes: tuple[fx.Node, ...]
    inputs: tuple[fx.Node, ...]
    outputs: tuple[fx.Node, ...]


# ----------------------------------------------------------------------------- frames


def _contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


def _sig_json(s: TensorSig) -> list:
    return [list(s.shape), s.dtype, list(s.stride)]


def _sig_of_json(d: list) -> TensorSig:
    return TensorSig(tuple(int(x) for x in d[0]), str(d[1]), tuple(int(x) for x in d[2]), "cpu")


def _head_of_json(d: dict) -> VendorHead:
    conv = None
    if d.get("conv") is not None:
        st, pad, dil, opad, groups, transposed = d["conv"]
        conv = ConvParams(tuple(st), tuple(pad), tuple(dil), tuple(opad), int(groups), bool(transposed))
    return VendorHead(d["kind"], _sig_of_json(d["a"]), _sig_of_json(d["b"]),
                      _sig_of_json(d["bias"]) if d["bias"] is not None else None, _sig_of_json(d["out"]),
                      int(d["m"]), int(d["n"]), int(d["k"]), int(d["batch"]), d["a_major"], d["b_major"],
                      float(d["alpha"]), float(d["beta"]), conv)


def _head_json(h: VendorHead) -> dict:
    d = {"kind": h.kind, "a": _sig_json(h.a), "b": _sig_json(h.b), "bias": _sig_json(h.bias) if h.bias else None,
         "out": _sig_json(h.out), "alpha": h.alpha, "beta": h.beta}
    if h.conv is not None:
        c = h.conv
        d["conv"] = [list(c.stride), list(c.padding), list(c.dilation), list(c.output_padding), c.groups, c.transposed]
    return d


def _grouped_frame(hshape: Sequence[int], groups: int) -> tuple[int, ...]:
    n, c = hshape[0], hshape[1]
    return (n, groups, c // groups, math.prod(hshape[2:]))


def _channel_view(x: torch.Tensor, rank: int) -> torch.Tensor:
    return x.reshape((1, x.shape[0]) + (1,) * (rank - 2))


def _in_frame(x: torch.Tensor, where: Any) -> Any:
    """``x`` (broadcastable to the head's output as the tail reads it) seen in the frame: a view, never a copy.
    Returns a TensorSig for a meta tensor, else the view."""
    hshape, groups = where.hshape, where.groups
    y = x.expand(hshape)
    if groups:
        y = y.view(_grouped_frame(hshape, groups))
    if x.device.type == "meta":
        return TensorSig(tuple(y.shape), str(y.dtype).replace("torch.", ""), tuple(y.stride()), "cpu")
    return y


@dataclass(frozen=True)
class _Where:
    hshape: tuple[int, ...]
    groups: int


def _meta(sig: TensorSig) -> torch.Tensor:
    return torch.empty_strided(sig.shape, sig.stride, dtype=torch_dtype(sig.dtype), device="meta")


def _positive_sources(chain: VendorChain) -> set[int]:
    """Chain inputs that must be positive for realistic values: what reaches a sqrt/rsqrt/log/reciprocal through
    adds (batch norm's running variance)."""
    from ._spec import _positive_inputs

    if chain.ir is None:
        return set()
    return {chain.tail_inputs[i].source for i in _positive_inputs(chain.ir) if chain.tail_inputs[i].source >= 0}


# ----------------------------------------------------------------------------- the chain as a model spells it


def _model_head(h: VendorHead, hshape: tuple[int, ...], inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The head as nn.Linear / nn.Conv1d / nn.Conv2d call it (``F.linear``, ``F.conv2d``), else its ATen call."""
    import torch.nn.functional as F

    a, b = inputs[0], inputs[1]
    bias = inputs[2] if h.bias is not None else None
    c = h.conv
    if c is not None and not c.transposed and c.spatial in (1, 2):
        conv = F.conv1d if c.spatial == 1 else F.conv2d
        return conv(a, b, bias, c.stride, c.padding, c.dilation, c.groups)
    linear_weight = h.kind in ("mm", "addmm") and h.b_major == "col" and (h.kind == "mm" or (
        h.alpha == 1.0 and h.beta == 1.0 and bias is not None and tuple(bias.shape) == (h.n,)))
    if linear_weight:
        x = a.reshape(tuple(hshape[:-1]) + (h.k,)) if len(hshape) > 2 and hshape[-1] == h.n else a
        return F.linear(x, b.t(), bias)
    if h.kind in ("mm", "bmm"):
        return torch.matmul(a, b)
    return h.run(a, b, bias)


def _norm_spans(chain: VendorChain) -> dict[int, tuple[int, Callable]]:
    """The IR nodes a batch norm or a group norm became (``_translate_tail``), by first node: (last node, the one
    torch call that computes them)."""
    import torch.nn.functional as F

    ir, tails = chain.ir, chain.tail_inputs
    nodes = ir.nodes if ir is not None else ()
    chan = (lambda r: r.kind == "i" and tails[r.value].channel)   # noqa: E731
    out: dict[int, tuple[int, Callable]] = {}

    def affine(j: int) -> tuple[int, Ref | None, Ref | None]:
        """The optional weight and bias nodes after node ``j``: (last node, weight, bias)."""
        w = b = None
        if j + 1 < len(nodes) and nodes[j + 1].op == "mul" and nodes[j + 1].args[0] == Ref("n", j) \
                and chan(nodes[j + 1].args[1]):
            j, w = j + 1, nodes[j + 1].args[1]
        if j + 1 < len(nodes) and nodes[j + 1].op == "add" and nodes[j + 1].args[0] == Ref("n", j) \
                and chan(nodes[j + 1].args[1]):
            j, b = j + 1, nodes[j + 1].args[1]
        return j, w, b

    def original(r: Ref | None, inputs):
        return None if r is None else inputs[tails[r.value].source]

    for i, n in enumerate(nodes):
        if n.op == "sub" and i + 3 < len(nodes) and chan(n.args[1]):
            add, rs, mul = nodes[i + 1], nodes[i + 2], nodes[i + 3]
            if add.op == "add" and chan(add.args[0]) and add.args[1].kind == "c" and rs.op == "rsqrt" \
                    and rs.args == (Ref("n", i + 1),) and mul.op == "mul" and mul.args == (Ref("n", i), Ref("n", i + 2)):
                last, w, b = affine(i + 3)
                x, mean, var, eps = n.args[0], n.args[1], add.args[0], float(add.args[1].value)

                def bn(get, inputs, x=x, mean=mean, var=var, w=w, b=b, eps=eps):
                    y = F.batch_norm(get(x).reshape(chain.hshape), original(mean, inputs), original(var, inputs),
                                     original(w, inputs), original(b, inputs), False, 0.1, eps)
                    return _in_frame(y, chain)
                out[i] = (last, bn)
        elif n.op == "layer_norm" and chain.groups and n.attr.get("k") == 2:
            last, w, b = affine(i)
            x, eps = n.args[0], float(n.attr["eps"])

            def gn(get, inputs, x=x, w=w, b=b, eps=eps):
                y = F.group_norm(get(x).reshape(chain.hshape), chain.groups, original(w, inputs), original(b, inputs), eps)
                return _in_frame(y, chain)
            out[i] = (last, gn)
    return out


# ----------------------------------------------------------------------------- the head


def _major(sig: TensorSig) -> str:
    r, c = sig.shape[-2], sig.shape[-1]
    sr, sc = sig.stride[-2], sig.stride[-1]
    if sc == 1 or c == 1:
        return "row" if (sr == c or r == 1 or sr >= c) else "none"
    if sr == 1 or r == 1:
        return "col" if sc >= r else "none"
    return "none"


def parse_head(node: fx.Node) -> VendorHead | None:
    """The head record of a product node, or None where it is not one kforge fuses."""
    kind = HEADS.get(node.target)
    if kind is None or not isinstance(val(node), torch.Tensor):
        return None
    try:
        a = bind_node(node)
    except Exception:
        return None
    out = TensorSig.of(val(node))
    if out.dtype not in HEAD_DTYPES or out.numel == 0:
        return None
    if kind == "conv":
        x, w, bias = a["input"], a["weight"], a.get("bias")
        if not all(isinstance(val(t), torch.Tensor) for t in (x, w)) or (bias is not None and not isinstance(val(bias), torch.Tensor)):
            return None
        xs, ws = TensorSig.of(val(x)), TensorSig.of(val(w))
        if len(xs.shape) < 3 or len(xs.shape) != len(ws.shape) or xs.dtype != out.dtype or ws.dtype != out.dtype:
            return None
        spatial = len(xs.shape) - 2
        expand = (lambda v: tuple(int(e) for e in (list(v) * spatial if len(v) == 1 else v)))
        conv = ConvParams(expand(a["stride"]), expand(a["padding"]), expand(a["dilation"]), expand(a["output_padding"]),
                          int(a["groups"]), bool(a["transposed"]))
        n_img, c_out = out.shape[0], out.shape[1]
        ksize = math.prod(ws.shape[2:])
        c_in = xs.shape[1]
        layout = "col" if xs.stride[1] == 1 and c_in > 1 else "row"
        return VendorHead("conv_transpose" if conv.transposed else "conv", xs, ws,
                          TensorSig.of(val(bias)) if bias is not None else None, out, n_img * math.prod(out.shape[2:]),
                          c_out, c_in // conv.groups * ksize, 1, layout, "row", conv=conv)
    if kind in ("mm", "bmm"):
        x, y, bias, alpha, beta = a["self"], a["mat2"], None, 1.0, 1.0
    else:
        x, y, bias, alpha, beta = a["mat1" if kind == "addmm" else "batch1"], a["mat2" if kind == "addmm" else "batch2"], \
            a["self"], a.get("alpha", 1), a.get("beta", 1)
        if not (is_scalar(alpha) and is_scalar(beta)) or not isinstance(val(bias), torch.Tensor):
            return None
    if not all(isinstance(val(t), torch.Tensor) for t in (x, y)):
        return None
    xs, ys = TensorSig.of(val(x)), TensorSig.of(val(y))
    if xs.dtype != out.dtype or ys.dtype != out.dtype:
        return None
    bs = TensorSig.of(val(bias)) if bias is not None else None
    if bs is not None and bs.dtype != out.dtype:
        return None
    batch = xs.shape[0] if kind in ("bmm", "baddbmm") else 1
    return VendorHead(kind, xs, ys, bs, out, xs.shape[-2], ys.shape[-1], xs.shape[-1], batch, _major(xs), _major(ys),
                      float(alpha), float(beta))


def _head_operands(node: fx.Node, head: VendorHead) -> list[fx.Node]:
    a = bind_node(node)
    if head.is_conv:
        return [a["input"], a["weight"]] + ([a["bias"]] if a.get("bias") is not None else [])
    if head.kind == "mm" or head.kind == "bmm":
        return [a["self"], a["mat2"]]
    if head.kind == "addmm":
        return [a["mat1"], a["mat2"], a["self"]]
    return [a["batch1"], a["batch2"], a["self"]]


# ----------------------------------------------------------------------------- the tail


# A translated operand, as _finder's pieces have them, plus ("chan", node): a 1-d per-channel tensor.
Piece = tuple[str, tuple[Any, ...], dict[str, Any]]


def _single_getitem(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    if len(users) == 1 and users[0].target is operator.getitem and users[0].args[1] == 0:
        return users[0]
    return None


def _translate_tail(node: fx.Node) -> tuple[list[Piece], int] | None:
    """The IR pieces of one tail node and the groups it splits the frame into (0: none), or None."""
    if node.op == "call_function" and node.target is operator.getitem and node.args[1] == 0 \
            and isinstance(node.args[0], fx.Node):
        src = node.args[0]
        if src.target is _BN and _single_getitem(src) is node:
            a = bind_node(src)
            x, eps = a["input"], float(a["eps"])
            pieces: list[Piece] = [("sub", (x, ("chan", a["running_mean"])), {}),
                                   ("add", (("chan", a["running_var"]), eps), {}),
                                   ("rsqrt", (("local", 1),), {}), ("mul", (("local", 0), ("local", 2)), {})]
            if a.get("weight") is not None:
                pieces.append(("mul", (("local", len(pieces) - 1), ("chan", a["weight"])), {}))
            if a.get("bias") is not None:
                pieces.append(("add", (("local", len(pieces) - 1), ("chan", a["bias"])), {}))
            return pieces, 0
        if src.target is _GN and _single_getitem(src) is node:
            a = bind_node(src)
            x = a["input"]
            pieces = [("layer_norm", (x,), {"k": 2, "eps": float(a["eps"])})]
            if a.get("weight") is not None:
                pieces.append(("mul", (("local", 0), ("chan", a["weight"])), {}))
            if a.get("bias") is not None:
                pieces.append(("add", (("local", len(pieces) - 1), ("chan", a["bias"])), {}))
            return pieces, int(a["group"])
    pieces = translate(node)
    return (pieces, 0) if pieces is not None else None


def _operand_nodes(pieces: list[Piece]) -> list[fx.Node]:
    out = []
    for _, args, _ in pieces:
        for x in args:
            if isinstance(x, fx.Node):
                out.append(x)
            elif isinstance(x, tuple) and len(x) == 2 and x[0] == "chan":
                out.append(x[1])
    return out


def _user_candidates(x: fx.Node) -> list[fx.Node]:
    """The nodes that read ``x`` as a tail would: its users, and for a normalisation node (batch, group, layer
    norm) the ``getitem(..., 0)`` that stands for it."""
    out = []
    for u in x.users:
        if u.target in (_BN, _GN, _LN):
            g = _single_getitem(u)
            if g is not None:
                out.append(g)
        else:
            out.append(u)
    return out


def _inside(u: fx.Node, members: set[fx.Node]) -> bool:
    if u in members:
        return True
    return u.target in (_BN, _GN, _LN) and bool(u.users) and all(g in members for g in u.users)


def _build(head: VendorHead, hv: fx.Node, operands: list[fx.Node], members: list[fx.Node],
           trans: dict[fx.Node, tuple[list[Piece], int]]) -> tuple[VendorChain, list[fx.Node]]:
    """The chain record of ``members`` after the head (graph order), and its input nodes; Unsupported if none."""
    hshape = tuple(val(hv).shape)
    groups = 0
    for m in members:
        g = trans[m][1]
        if g:
            if groups or len(hshape) < 2 or hshape[1] % g:
                raise Unsupported("a second group norm, or groups that do not divide the channels")
            groups = g
    where = _Where(hshape, groups)
    member_set = set(members)
    in_nodes: list[fx.Node] = list(operands)
    tail_inputs: list[TailInput] = []
    seen: dict[tuple[fx.Node | None, bool], int] = {}
    index_of: dict[fx.Node, int] = {}
    ir_nodes: list[Node] = []

    def tail_input(x: fx.Node | None, channel: bool) -> Ref:
        keyed = (x, channel)
        if keyed not in seen:
            if x is None:
                sig = _in_frame(torch.empty(hshape, dtype=torch_dtype(head.dtype), device="meta"), where)
                tail_inputs.append(TailInput(-1, sig))
            else:
                v = val(x)
                if not isinstance(v, torch.Tensor):
                    raise Unsupported(f"operand {x.name} is not a tensor")
                if channel and (v.dim() != 1 or len(hshape) < 2 or v.shape[0] != hshape[1]):
                    raise Unsupported("a per-channel tensor that does not match the channels")
                if x not in in_nodes:
                    in_nodes.append(x)
                m = _meta(TensorSig.of(v))
                try:
                    sig = _in_frame(_channel_view(m, len(hshape)) if channel else m, where)
                except RuntimeError as exc:
                    raise Unsupported(f"operand {x.name} cannot be seen in the chain's frame ({exc})") from None
                tail_inputs.append(TailInput(in_nodes.index(x), sig, channel))
            seen[keyed] = len(tail_inputs) - 1
        return Ref("i", seen[keyed])

    tail_input(None, False)   # NB: the product is always input 0

    def ref(x: Any, base: int) -> Ref:
        if isinstance(x, tuple) and len(x) == 2 and x[0] == "local":
            return Ref("n", base + x[1])
        if isinstance(x, tuple) and len(x) == 2 and x[0] == "chan":
            return tail_input(x[1], True)
        if isinstance(x, fx.Node):
            if x is hv:
                return Ref("i", 0)
            if x in member_set:
                return Ref("n", index_of[x])
            return tail_input(x, False)
        if is_scalar(x):
            return Ref("c", x)
        raise Unsupported(f"operand {x!r}")

    for m in members:
        base = len(ir_nodes)
        for op, args, attrs in trans[m][0]:
            ir_nodes.append(Node(op, tuple(ref(x, base) for x in args), tuple(sorted(attrs.items()))))
        index_of[m] = len(ir_nodes) - 1
    outs = [m for m in members if any(not _inside(u, member_set) for u in m.users)]
    if len(outs) != 1:
        raise Unsupported("a chain returns one value")
    ir = RegionIR(len(tail_inputs), tuple(ir_nodes), tuple(index_of[o] for o in outs))
    ir.check()
    sigs = [t.sig for t in tail_inputs]
    values = ir.meta(sigs)
    out_sigs = tuple(TensorSig.of(val(o)) for o in outs)
    out_frames = []
    for o, s in zip(ir.outputs, out_sigs):
        got = tuple(values[o].shape)
        if math.prod(got) != s.numel:
            raise Unsupported(f"an output of {got} for the model's {s.shape}")
        if tuple(s.shape) == hshape:
            out_frames.append(_in_frame(_meta(s), where))
        elif not groups and got == tuple(s.shape):
            out_frames.append(s)
        else:
            raise Unsupported("a per-row output of a grouped frame")
    for s in out_frames:
        if s.dtype not in KERNEL_DTYPES or s.dtype == "bool":
            raise Unsupported(f"a {s.dtype} output")
    plan_region(ir, sigs, out_frames)
    in_sigs = tuple(TensorSig.of(val(x)) for x in in_nodes)
    chain = VendorChain(head, in_sigs, out_sigs, ir, hshape, tuple(sigs[0].shape), tuple(tail_inputs),
                        tuple(out_frames), groups)
    return chain, in_nodes


def _descendants(start: fx.Node, limit: int = 100_000) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = [start]
    while stack and len(seen) < limit:
        n = stack.pop()
        for u in n.users:
            if u not in seen:
                seen.add(u)
                stack.append(u)
    return seen


def _head_value(node: fx.Node) -> tuple[fx.Node, list[fx.Node]]:
    """The value the tail reads: the product, or the reshape (``F.linear``'s view back to 3-d) that is its only
    reader; and the reshape nodes between."""
    hv, views = node, []
    while len(hv.users) == 1:
        u = next(iter(hv.users))
        if u.target not in _RESHAPES or not isinstance(val(u), torch.Tensor) or not val(hv).is_contiguous():
            break
        hv = u
        views.append(u)
    return hv, views


def chain_at(node: fx.Node, order: dict[fx.Node, int], taken: set[fx.Node] = frozenset(),  # type: ignore[assignment]
             min_tail: int = 1) -> FoundChain | None:
    """The longest chain headed by ``node`` whose tail returns one value, or None."""
    head = parse_head(node)
    if head is None:
        return None
    hv, views = _head_value(node)
    operands = _head_operands(node, head)
    after = None   # the head's descendants, computed once an operand comes after it
    members: list[fx.Node] = []
    trans: dict[fx.Node, tuple[list[Piece], int]] = {}
    best: tuple[VendorChain, list[fx.Node], list[fx.Node]] | None = None
    while len(members) < MAX_TAIL_NODES:
        member_set = set(members)
        cands = sorted({u for x in [hv, *members] for u in _user_candidates(x)
                        if u not in member_set and u not in taken}, key=lambda n: order.get(n, 1 << 60))
        grown = False
        for u in cands:
            if u not in trans:
                t = _translate_tail(u)
                if t is None:
                    continue
                trans[u] = t
            ok = True
            for x in _operand_nodes(trans[u][0]):
                if x is hv or x in member_set:
                    continue
                if order.get(x, -1) > order[node]:
                    after = after if after is not None else _descendants(node)
                    if x in after:
                        ok = False
                        break
            if not ok:
                continue
            trial = members + [u]
            try:
                chain, ins = _build(head, hv, operands, trial, trans)
            except (Unsupported, RuntimeError, TypeError, ValueError, IndexError):
                # NB: a node that makes two outputs now may close into one later (x * sigmoid(x)): keep growing,
                # the last state that built is what is found
                members, grown = trial, True
                break
            members, grown = trial, True
            if all(_inside(u2, set(trial)) for u2 in hv.users):
                best = (chain, ins, list(trial))
            break
        if not grown:
            break
    if best is None or len(best[0].ir.nodes if best[0].ir else ()) < min_tail:
        return None
    chain, ins, trial = best
    norm_nodes = [m.args[0] for m in trial if m.target is operator.getitem]
    nodes = tuple([node, *views, *sorted(set(norm_nodes) | set(trial), key=order.__getitem__)])
    outs = tuple(m for m in trial if any(not _inside(u, set(trial)) for u in m.users))
    return FoundChain(chain, nodes, tuple(ins), outs)


def find_vendor_chains(graph: fx.Graph, skip: frozenset = frozenset(), min_tail: int = 1) -> list[FoundChain]:
    """Every product in ``graph`` (an ATen graph with "val" metadata) followed by a chain of at least ``min_tail``
    IR operators, each as long as it can be while it returns one value; nodes in ``skip`` join none."""
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    taken: set[fx.Node] = set(skip)
    found: list[FoundChain] = []
    for n in nodes:
        if n.target not in HEADS or n in taken:
            continue
        got = chain_at(n, order, frozenset(taken), min_tail)
        if got is not None:
            found.append(got)
            taken |= set(got.nodes)
    return found


# ----------------------------------------------------------------------------- capture for tests and benchmarks


def graph_values(gm: fx.GraphModule, args: Sequence[Any]) -> dict[fx.Node, Any]:
    """Every node's value when ``gm`` runs on ``args`` (no grad): what a found chain's inputs and output were."""
    values: dict[fx.Node, Any] = {}

    class Keep(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            out = super().run_node(n)
            values[n] = out
            return out

    with torch.no_grad():
        Keep(gm).run(*args)
    return values


def aten_graph_calls(model: Callable, *args, **kwargs) -> list[tuple[fx.GraphModule, list]]:
    """The ATen forward graphs ``model(*args, **kwargs)`` runs as graph capture records them (torch.compile,
    AOTAutograd, no decompositions, exact shapes), each with the arguments it was called with (parameters
    and buffers lifted as inputs)."""
    from torch._dynamo.backends.common import aot_autograd

    from ..deploy._graph import no_recompile_limit

    calls: list[tuple[fx.GraphModule, list]] = []

    def keep(gm: fx.GraphModule, example_inputs):
        def run(*call_args):
            calls.append((gm, list(call_args)))
            return gm(*call_args)
        return run

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=keep), dynamic=False, fullgraph=False)
    with torch.no_grad(), no_recompile_limit():
        compiled(*args, **kwargs)
    torch._dynamo.reset()
    return calls


def aten_graphs(model: Callable, *args, **kwargs) -> list[fx.GraphModule]:
    """The ATen forward graphs of ``model(*args, **kwargs)`` (``aten_graph_calls`` without the arguments)."""
    return [gm for gm, _ in aten_graph_calls(model, *args, **kwargs)]


def chains_of(model: Callable, *args, **kwargs) -> list[FoundChain]:
    """Every vendor-headed chain in the graphs of ``model(*args, **kwargs)``."""
    return [c for gm in aten_graphs(model, *args, **kwargs) for c in find_vendor_chains(gm.graph)]


__all__ = ["ConvParams", "FoundChain", "HEADS", "TailInput", "VendorChain", "VendorHead", "aten_graph_calls", "aten_graphs",
           "chain_at", "chains_of", "find_vendor_chains", "parse_head"]
