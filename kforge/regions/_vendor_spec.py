"""The one OpSpec of every vendor-headed chain: its variant carries the chain (``VendorChain.dumps``), its reference
is the chain's, its eager baseline the chain as the model spells it."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..ops import OpSpec, Unsupported, Variant, get_spec, random_tensor, register
from ._vendor import VendorChain, _positive_sources

VENDOR_CHAIN = "vendor_chain"
MAX_INPUTS = 64


@functools.lru_cache(maxsize=512)
def _load(text: str) -> VendorChain:
    return VendorChain.loads(text)


def chain_variant(chain: VendorChain) -> Variant:
    """The variant of one chain: the chain itself (device-free) as its one param, every input's exact signature."""
    if len(chain.inputs) > MAX_INPUTS:
        raise Unsupported(f"a chain with {len(chain.inputs)} inputs (kforge handles at most {MAX_INPUTS})")
    return Variant(VENDOR_CHAIN, tuple(chain.inputs), (("chain", chain.dumps()),), tuple(chain.outputs))


def vendor_chain(variant: Variant) -> VendorChain:
    """The chain a vendor_chain variant carries."""
    if variant.op != VENDOR_CHAIN:
        raise ValueError(f"{variant.signature} is not a vendor chain")
    return _load(variant.param_dict["chain"])


_HEAD_CALLS = {
    "mm": "torch.mm(x0, x1)", "bmm": "torch.bmm(x0, x1)",
    "addmm": "torch.addmm(x2, x0, x1, beta={beta!r}, alpha={alpha!r})",
    "baddbmm": "torch.baddbmm(x2, x0, x1, beta={beta!r}, alpha={alpha!r})",
}


def chain_source(chain: VendorChain) -> str:
    """The chain as a standalone PyTorch function: the head's call, then the tail (``RegionIR.source``) reading it in
    the chain's frame (what a person or an LLM reads)."""
    h = chain.head
    n_in = len(chain.inputs)
    lines = ["import torch", "import torch.nn.functional as F", "", ""]
    if chain.ir is not None:
        lines += chain.ir.source([t.sig for t in chain.tail_inputs], name="tail").splitlines()[4:] + ["", ""]
    lines.append(f"def vendor_chain({', '.join(f'x{i}' for i in range(n_in))}):")
    for i, s in enumerate(chain.inputs):
        lines.append(f"    # x{i}: {s.dtype}, shape {tuple(s.shape)}, strides {tuple(s.stride)}")
    if h.conv is not None:
        c = h.conv
        bias = "x2" if h.bias is not None else "None"
        lines.append(f"    h = torch.convolution(x0, x1, {bias}, {list(c.stride)}, {list(c.padding)}, {list(c.dilation)}, "
                     f"{c.transposed}, {list(c.output_padding)}, {c.groups})")
    else:
        lines.append("    h = " + _HEAD_CALLS[h.kind].format(alpha=h.alpha, beta=h.beta))
    if chain.ir is None:
        lines.append(f"    return h.reshape({tuple(chain.outputs[0].shape)})")
        return "\n".join(lines) + "\n"
    frame = f".view({tuple(chain.frame)})" if chain.groups else ""
    args = []
    for t in chain.tail_inputs:
        if t.source < 0:
            args.append(f"h.reshape({tuple(chain.hshape)}){frame}")
            continue
        x = f"x{t.source}"
        if t.channel:
            x += f".reshape({(1, -1) + (1,) * (len(chain.hshape) - 2)})"
        args.append(f"{x}.expand({tuple(chain.hshape)}){frame}")
    outs = ", ".join(f"o{j}.reshape({tuple(s.shape)})" for j, s in enumerate(chain.outputs))
    lines.append(f"    {', '.join(f'o{j}' for j in range(len(chain.outputs)))}, = tail({', '.join(args)})"
                 if len(chain.outputs) > 1 else f"    o0 = tail({', '.join(args)})")
    lines.append(f"    return {outs}")
    return "\n".join(lines) + "\n"


def _layout(h) -> str:
    if h.conv is not None:
        return "channels-last activations" if h.a_major == "col" else "NCHW activations"
    a = "row-major (K contiguous)" if h.a_major == "row" else "column-major (M contiguous)" if h.a_major == "col" else "strided"
    b = "row-major (N contiguous)" if h.b_major == "row" else "column-major (K contiguous, a transposed weight)" \
        if h.b_major == "col" else "strided"
    return f"A {a}, B {b}"


def building_blocks(chain: VendorChain, backend: str) -> str:
    """What a kernel for ``chain`` can be built from on ``backend``, and the problem as those libraries name it: the
    LLM proposers' prompt section for a vendor-headed chain."""
    h = chain.head
    lines = ["# A vendor-headed chain",
             "The head is a matrix product or a convolution that eager runs in a vendor library (cuBLAS / cuDNN on "
             "a GPU, oneDNN / MKL on a CPU); the tail is the elementwise chain (and at most one row reduction) the "
             "model applies to its result. The point of one kernel is the epilogue: the product is never written "
             "to memory and read back. The head alone is hard to beat; fuse the tail into it.",
             f"Head: {h.short()}; {_layout(h)}; M={h.m}, N={h.n}, K={h.k}, batch={h.batch}, "
             f"{h.flops / 1e6:.3g} MFLOP."]
    if h.conv is not None:
        c = h.conv
        lines.append(f"Convolution: input {list(h.a.shape)}, weight {list(h.b.shape)}, output {list(h.out.shape)}, "
                     f"stride {list(c.stride)}, padding {list(c.padding)}, dilation {list(c.dilation)}, groups "
                     f"{c.groups}{', transposed, output_padding ' + str(list(c.output_padding)) if c.transposed else ''}"
                     f"; as an implicit GEMM M = N*output pixels, N = output channels, K = C_in/groups * kernel size.")
    if h.kind in ("addmm", "baddbmm"):
        lines.append(f"out = {h.beta!r} * bias + {h.alpha!r} * (A @ B), bias {list(h.bias.shape) if h.bias else []}.")
    if chain.ir is not None:
        lines.append(f"Tail IR ({len(chain.ir.nodes)} operators: {', '.join(chain.ir.ops)}) over the frame "
                     f"{list(chain.frame)} (the product seen as {list(chain.hshape)}"
                     + (f", channels split into {chain.groups} groups" if chain.groups else "") + "); its input 0 is the "
                     "product, the others are the chain's inputs, as the reference above shows.")
    if h.dtype == "float32":
        lines.append("Numerics: float32 operands, float32 products and sums, as eager computes them: no TF32, bf16 or "
                     "fp16 tensor-core math (the tolerance refuses it).")
    else:
        lines.append(f"Numerics: {h.dtype} operands, float32 accumulation, the product rounded to {h.dtype} before "
                     "the tail as eager rounds it.")
    if backend == "cuda":
        lines += ["Building blocks on this device (Hopper, sm_90a), beyond the general rules above:",
                  "- CUTLASS 3.x (`cutlass/...`, `cute/...` headers): a TMA warp-specialised GEMM "
                  "(KernelTmaWarpSpecializedCooperative / Pingpong, CollectiveBuilder) whose epilogue visitor tree "
                  "(Sm90EVT with Sm90RowBroadcast / Sm90ColBroadcast / Sm90AuxLoad / an N-ary Sm90Compute node) "
                  "computes the tail; an implicit-GEMM convolution (ConvUniversalAdapter, fprop) for convolution heads; "
                  "tile shape, cluster shape, stages, swizzle and raster order are the knobs. Build flags: "
                  "-gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr.",
                  "- cuBLASLt (`cublasLt.h`): a matmul with the BIAS, RELU_BIAS, GELU_BIAS epilogues where the tail is "
                  "exactly one of them; the workspace from kf_workspace_bytes.",
                  "- cuDNN's fused graphs (the frontend's matmul / convolution + pointwise graph) where the tail is "
                  "pointwise.",
                  "- A tail with a row reduction (softmax, layer or group norm) that an epilogue cannot hold: the GEMM "
                  "writes a float product to the workspace, then one row kernel computes the tail."]
    else:
        lines += ["On the CPU no library beyond OpenMP is allowed: a blocked GEMM (cache tiles, a register-blocked "
                  "micro-kernel vectorised along N) with the tail applied to each finished tile while it is in cache."]
    return "\n".join(lines)


@dataclass(frozen=True)
class VendorChainSpec(OpSpec):
    """The spec of op "vendor_chain": one per process, every chain variant goes through it."""

    def tolerance(self, dtype: str) -> tuple[float, float]:
        # NB: a float32 product of K terms summed in another order than eager's BLAS (blocked, or in double as the C
        # kernel does) differs by ~sqrt(K) * 6e-8 of the output's scale (2e-6 at K = 1024; cuBLAS's own spec needs
        # ~2e-6 of its 5e-5), and a row reduction in the tail (a mean of mixed signs) adds ~1e-5, as a region's does.
        # TF32 operands (10-bit mantissas) are off by 2.5e-4 to 4e-4 (kforge.ops' measurement, K 64 to 6144) and bf16
        # by ~4e-3: 1e-4 refuses both, as the region spec's 1e-4 does for its tails.
        if dtype == "float32":
            return (1e-4, 1e-4)
        return super().tolerance(dtype)

    def chain(self, variant: Variant) -> VendorChain:
        return vendor_chain(variant)

    def ops_of(self, variant: Variant) -> tuple[str, ...]:
        return vendor_chain(variant).ops

    def source(self, variant: Variant) -> str:
        return chain_source(vendor_chain(variant))

    def describe(self, variant: Variant) -> str:
        return vendor_chain(variant).describe()

    def building_blocks(self, variant: Variant, backend: str) -> str:
        return building_blocks(vendor_chain(variant), backend)

    def replay(self, inputs: Sequence[torch.Tensor | None], params: dict[str, Any]):
        """The chain as the model's operators run it (what capture's shares count it for)."""
        return _eager(inputs, params)


def _reference(inputs: Sequence[torch.Tensor | None], params: dict[str, Any]):
    return _load(params["chain"]).reference(list(inputs))


def _eager(inputs: Sequence[torch.Tensor | None], params: dict[str, Any]):
    return _load(params["chain"]).eager(list(inputs))


def _sample(variant: Variant, seed: int, gen: torch.Generator) -> list:
    positive = _positive_sources(vendor_chain(variant))
    return [random_tensor(s, gen, positive=i in positive) for i, s in enumerate(variant.inputs)]


def _bind(*args, **kwargs):
    raise Unsupported("vendor chains are found in the model's graph, not bound from a call")


VENDOR_CHAIN_SPEC = VendorChainSpec(
    name=VENDOR_CHAIN, targets=(), inputs=tuple(f"x{i}" for i in range(MAX_INPUTS)), params=("chain",), bind=_bind,
    reference=_reference, eager=_eager, vendor=None, kind="region", sample=_sample,
    doc="a matrix product or convolution (eager: a vendor library) and the chain of pointwise operators, with at "
        "most one row reduction, the model applies to its result; found in the model's graph")


def _register() -> VendorChainSpec:
    try:
        return get_spec(VENDOR_CHAIN)  # type: ignore[return-value]
    except KeyError:
        return register(VENDOR_CHAIN_SPEC)  # type: ignore[return-value]


_register()


__all__ = ["MAX_INPUTS", "VENDOR_CHAIN", "VENDOR_CHAIN_SPEC", "VendorChainSpec", "building_blocks", "chain_source",
           "chain_variant", "vendor_chain"]
