"""The operators kforge captures, one spec each. Adding an operator means adding one spec here."""
from __future__ import annotations

import numbers
from dataclasses import replace
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ._functions import FunctionTarget, entry_of_twin
from ._registry import Call, OpSpec, Unsupported, random_tensor, register
from ._signature import Variant, torch_dtype

T = torch.Tensor


def _dim(dim: int, ndim: int) -> int:
    if dim is None:
        raise Unsupported("implicit dim")
    return dim + ndim if dim < 0 else dim


def _tuple(v: Any, n: int) -> tuple:
    if isinstance(v, (list, tuple)):
        return tuple(int(x) for x in v) if len(v) == n else tuple(int(x) for x in v) * (n // len(v))
    return (int(v),) * n


def _dtype_param(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).replace("torch.", "")


def _as_dtype(name: str | None) -> torch.dtype | None:
    return None if name is None else getattr(torch, name)


def _positive(names: set[str]):
    """Sampler drawing strictly positive values for the named inputs (variances, scales)."""

    def sample(variant: Variant, seed: int, gen: torch.Generator) -> list:
        from . import get_spec

        spec = get_spec(variant.op)
        return [None if s is None else random_tensor(s, gen, positive=n in names)
                for n, s in zip(spec.inputs, variant.inputs)]

    return sample


# ----------------------------------------------------------------------------- reductions


def _bind_softmax(input, dim=None, _stacklevel=3, dtype=None, **_):
    if not isinstance(input, torch.Tensor):
        raise Unsupported("input is not a tensor")
    return Call((input,), {"dim": _dim(dim, input.dim()), "dtype": _dtype_param(dtype)})


register(OpSpec(
    name="softmax", kind="reduction",
    targets=(F.softmax, torch.softmax, T.softmax, torch.special.softmax),
    inputs=("input",), params=("dim", "dtype"), bind=_bind_softmax,
    reference=lambda x, p: torch.softmax(x[0], p["dim"], dtype=_as_dtype(p["dtype"])),
    doc="softmax along one dimension"))

register(OpSpec(
    name="log_softmax", kind="reduction",
    targets=(F.log_softmax, torch.log_softmax, T.log_softmax, torch.special.log_softmax),
    inputs=("input",), params=("dim", "dtype"), bind=_bind_softmax,
    reference=lambda x, p: torch.log_softmax(x[0], p["dim"], dtype=_as_dtype(p["dtype"])),
    doc="log of softmax along one dimension"))


def _bind_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, *_a, **_k):
    return Call((input, weight, bias), {"normalized_shape": tuple(normalized_shape), "eps": float(eps)})


register(OpSpec(
    name="layer_norm", kind="normalization",
    targets=(F.layer_norm, torch.layer_norm),
    inputs=("input", "weight", "bias"), params=("normalized_shape", "eps"), bind=_bind_layer_norm,
    reference=lambda x, p: F.layer_norm(x[0], p["normalized_shape"], x[1], x[2], p["eps"]),
    doc="layer normalization over the trailing dimensions"))


def _bind_group_norm(input, num_groups, weight=None, bias=None, eps=1e-5, *_a, **_k):
    return Call((input, weight, bias), {"num_groups": int(num_groups), "eps": float(eps)})


register(OpSpec(
    name="group_norm", kind="normalization",
    targets=(F.group_norm, torch.group_norm),
    inputs=("input", "weight", "bias"), params=("num_groups", "eps"), bind=_bind_group_norm,
    reference=lambda x, p: F.group_norm(x[0], p["num_groups"], x[1], x[2], p["eps"]),
    doc="group normalization of an N,C,* tensor"))

# NB: an epilogue fused onto an operator, as one operator of its own: no eager spelling to patch
# (``targets`` is empty), so its cards come from the model's graph (``kforge.regions`` finds a
# group_norm whose only reader is a SiLU) and its kernels run in the model's graph (compiled, or the forward
# apply() captures), in place of both calls.
# Under torch.compile Inductor fuses the SiLU into its group_norm; a kforge group_norm alone then
# costs the model an extra pass over the tensor for the SiLU.
register(OpSpec(
    name="group_norm_silu", kind="normalization", targets=(),
    inputs=("input", "weight", "bias"), params=("num_groups", "eps"), bind=_bind_group_norm,
    reference=lambda x, p: F.silu(F.group_norm(x[0], p["num_groups"], x[1], x[2], p["eps"])),
    doc="silu(group_norm(x)): a group normalization whose only reader is a SiLU (found in the model's graph: no eager spelling)"))


def _bind_biased_group_norm(input, input_bias, num_groups, weight=None, bias=None, eps=1e-5, *_a, **_k):
    return Call((input, input_bias, weight, bias), {"num_groups": int(num_groups), "eps": float(eps)})


def _channel_view(t: T, ndim: int) -> T:
    """A per-channel [C] vector shaped to broadcast over an N,C,* tensor of ``ndim`` dims."""
    return t.reshape((1, -1) + (1,) * (ndim - 2))


def _biased_group_norm_silu(x: list, p: dict) -> T:
    """The reference: the bias added in float32, as the convolution's own epilogue and Inductor's peeled add do
    it (in the input's type, x + bias rounds before the statistics: a kernel exact in float32 failed the check
    on 785 of 65536 bf16 elements where the bias dominates, found by review)."""
    dt = x[0].dtype
    f32 = lambda t: None if t is None else t.float()
    y = f32(x[0]) + _channel_view(x[1].float(), x[0].dim())
    return F.silu(F.group_norm(y, p["num_groups"], f32(x[2]), f32(x[3]), p["eps"])).to(dt)


# NB: a prologue too: the convolution bias Inductor peels off on CUDA ("cudnn is slower with it") and adds in
# a pointwise kernel of its own, which it fuses into its group_norm's reads. A kforge kernel taking the
# convolution's output would make Inductor write that sum first (one more read and write of the tensor: 652 us
# a forward for one SD3.5 VAE call on the H200, profile of 2026-12-03m); this one takes the bias-free output
# and the bias (kforge.regions finds a convolution whose only reader is the group_norm).
register(OpSpec(
    name="biased_group_norm_silu", kind="normalization", targets=(),
    inputs=("input", "input_bias", "weight", "bias"), params=("num_groups", "eps"), bind=_bind_biased_group_norm,
    reference=_biased_group_norm_silu,
    doc="silu(group_norm(x + input_bias per channel)): a convolution's bias, a group normalization and the SiLU "
        "that alone reads it (found in the model's graph: no eager spelling)"))

# The fused operators (the group_norm ones above, linear_gelu beside linear below): (the operator whose call the
# graph holds, the pointwise op applied to its result by its only reader).
FUSED_EPILOGUES = {"group_norm_silu": ("group_norm", "silu"), "biased_group_norm_silu": ("group_norm", "silu"),
                   "linear_gelu": ("linear", "gelu")}

# Every fused operator: found in the ATen graph (regions.find_fused) and placed there, never in dynamo's graph. The
# epilogue pairs above, and chains of several operators that are no such pair (rms_norm_rope).
GRAPH_FUSED_OPS = frozenset(FUSED_EPILOGUES) | {"rms_norm_rope"}

# Fused operators whose second input is a per-channel bias added to the first before the operator (the bias of
# the convolution that made it): the fused operator they are without it.
PROLOGUE_OPS = {"biased_group_norm_silu": "group_norm_silu"}


def without_prologue(variant: Variant) -> Variant:
    """``variant`` as the operator its graph call is without a prologue (the bias input dropped): its shapes are
    those of the group_norm call the graph holds."""
    if variant.op not in PROLOGUE_OPS:
        return variant
    return replace(variant, op=PROLOGUE_OPS[variant.op], inputs=(variant.inputs[0], *variant.inputs[2:]))


# Operators (besides pointwise regions) whose cards get a channels-last twin where Inductor lays a graph out
# channels-last (kforge.regions._layout): the fused group_norms, and a group_norm no SiLU alone reads.
LAYOUT_TWIN_OPS = frozenset({"group_norm_silu", "biased_group_norm_silu", "group_norm"})


def channels_last_strides(shape) -> tuple[int, ...]:
    """The strides torch gives an N,C,H,W tensor of ``shape`` laid out channels-last."""
    return tuple(torch.empty(tuple(shape), device="meta").to(memory_format=torch.channels_last).stride())


def is_channels_last_twin(variant) -> bool:
    """Whether ``variant``'s first input and output are one 4-d N,C,H,W tensor laid out channels-last (and
    not also contiguous): what a channels-last twin makes of an operator's call."""
    if not variant.inputs or variant.inputs[0] is None or not variant.outputs:
        return False
    x, y = variant.inputs[0], variant.outputs[0]
    if len(x.shape) != 4 or x.is_contiguous or tuple(y.shape) != tuple(x.shape) or tuple(y.stride) != tuple(x.stride):
        return False
    return tuple(x.stride) == channels_last_strides(x.shape)


def placed_in_aten_graph(variant) -> bool:
    """Whether graph mode places ``variant``'s kernel in AOTAutograd's ATen graph (kforge.regions' pass)
    rather than in dynamo's graph: a region, a fused operator, an operator's channels-last twin."""
    if variant.op == "region" or variant.op in GRAPH_FUSED_OPS:
        return True
    return variant.op in LAYOUT_TWIN_OPS and is_channels_last_twin(variant)


def _bind_rms_norm(input, normalized_shape, weight=None, eps=None):
    return Call((input, weight), {"normalized_shape": tuple(normalized_shape),
                                  "eps": None if eps is None else float(eps)})


register(OpSpec(
    name="rms_norm", kind="normalization",
    targets=(getattr(F, "rms_norm", None), getattr(torch, "rms_norm", None)),
    inputs=("input", "weight"), params=("normalized_shape", "eps"), bind=_bind_rms_norm,
    reference=lambda x, p: F.rms_norm(x[0], p["normalized_shape"], x[1], p["eps"]),
    doc="root-mean-square normalization over the trailing dimensions"))


def _bind_rms_norm_rope(input, weight, cos, sin, eps=1e-6):
    tensors = (input, weight, cos, sin)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        raise Unsupported("rms_norm_rope takes four tensors")
    d = input.shape[-1] if input.dim() else 0
    if input.dim() < 2 or d % 2 or weight.shape != (d,):
        raise Unsupported("rms_norm_rope needs an even last dimension and a weight of its size")
    for t in (cos, sin):
        if t.dim() != input.dim() or t.shape[-1] != d or any(a not in (1, b) for a, b in zip(t.shape, input.shape)):
            raise Unsupported("cos and sin must broadcast to the input over its leading dimensions")
    return Call(tensors, {"eps": float(eps)})


def _rms_norm_rope(x, p):
    """Gemma's q/k RMSNorm (float32 statistics, the weight applied in float32, then the input's dtype), then the
    rotary embedding in rotate-half form, as transformers writes them: the reference runs those operators."""
    inp, weight, cos, sin = x
    xf = inp.float()
    y = (xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + p["eps"], -0.5) * weight.float()).type_as(inp)
    half = y.shape[-1] // 2
    return y * cos + torch.cat((-y[..., half:], y[..., :half]), dim=-1) * sin


# NB: the q/k RMSNorm and rotary embedding of Gemma 4's attention (q_norm / k_norm, then apply_rotary_pos_emb).
# Under torch.compile Inductor fuses them with the rotary angles' cos and sin into one persistent reduction a layer,
# 17.2 us a call (one warp a block) on the H200 for Gemma 4 E2B at 512 tokens, with a few microseconds of bytes to
# move (compiled profile of 2026-12-04l); kforge finds the chain in the ATen graph (regions._finder) and takes
# cos and sin as inputs.
register(OpSpec(
    name="rms_norm_rope", kind="normalization", targets=(),
    inputs=("input", "weight", "cos", "sin"), params=("eps",), bind=_bind_rms_norm_rope,
    reference=_rms_norm_rope,
    doc="rope(rms_norm(x) * weight): an RMSNorm over the last dimension (float32 statistics and weight, then the "
        "input's dtype) and the rotary embedding in rotate-half form, cos and sin broadcast over the leading "
        "dimensions (found in the model's graph: no eager spelling)"))


def _bind_batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
                     momentum=0.1, eps=1e-5, *_a, **_k):
    if training or running_mean is None:
        raise Unsupported("training-mode batch_norm updates running statistics")
    return Call((input, running_mean, running_var, weight, bias), {"eps": float(eps)})


register(OpSpec(
    name="batch_norm", kind="normalization",
    targets=(F.batch_norm,),
    inputs=("input", "running_mean", "running_var", "weight", "bias"), params=("eps",),
    bind=_bind_batch_norm,
    reference=lambda x, p: F.batch_norm(x[0], x[1], x[2], x[3], x[4], False, 0.0, p["eps"]),
    sample=_positive({"running_var"}), vendor="cudnn",
    doc="batch normalization with running statistics (inference)"))

# ----------------------------------------------------------------------------- pooling


def _bind_adaptive_avg_pool2d(input, output_size):
    size = _tuple(output_size, 2)
    if any(s is None for s in size):
        raise Unsupported("None in output_size")
    return Call((input,), {"output_size": size})


register(OpSpec(
    name="adaptive_avg_pool2d", kind="pooling",
    targets=(F.adaptive_avg_pool2d, torch._C._nn.adaptive_avg_pool2d),
    inputs=("input",), params=("output_size",), bind=_bind_adaptive_avg_pool2d,
    reference=lambda x, p: F.adaptive_avg_pool2d(x[0], p["output_size"]),
    doc="adaptive average pooling over H, W"))


def _bind_max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                     return_indices=False):
    if return_indices:
        raise Unsupported("return_indices")
    k = _tuple(kernel_size, 2)
    s = k if stride is None or (isinstance(stride, (list, tuple)) and not stride) else _tuple(stride, 2)
    return Call((input,), {"kernel_size": k, "stride": s, "padding": _tuple(padding, 2),
                           "dilation": _tuple(dilation, 2), "ceil_mode": bool(ceil_mode)})


register(OpSpec(
    name="max_pool2d", kind="pooling",
    targets=(F.max_pool2d, F._max_pool2d, torch.max_pool2d),
    inputs=("input",), params=("kernel_size", "stride", "padding", "dilation", "ceil_mode"),
    bind=_bind_max_pool2d,
    reference=lambda x, p: F.max_pool2d(x[0], p["kernel_size"], p["stride"], p["padding"],
                                        p["dilation"], p["ceil_mode"]),
    doc="max pooling over H, W"))


def _bind_avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
                     count_include_pad=True, divisor_override=None):
    k = _tuple(kernel_size, 2)
    s = k if stride is None or (isinstance(stride, (list, tuple)) and not stride) else _tuple(stride, 2)
    return Call((input,), {"kernel_size": k, "stride": s, "padding": _tuple(padding, 2),
                           "ceil_mode": bool(ceil_mode), "count_include_pad": bool(count_include_pad),
                           "divisor_override": divisor_override})


register(OpSpec(
    name="avg_pool2d", kind="pooling",
    targets=(F.avg_pool2d, torch._C._nn.avg_pool2d),
    inputs=("input",),
    params=("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"),
    bind=_bind_avg_pool2d,
    reference=lambda x, p: F.avg_pool2d(x[0], p["kernel_size"], p["stride"], p["padding"],
                                        p["ceil_mode"], p["count_include_pad"], p["divisor_override"]),
    doc="average pooling over H, W"))

# ----------------------------------------------------------------------------- elementwise


def _binary(op, with_alpha: bool) -> tuple:
    """(bind, reference) of a broadcasting binary operator whose ``other`` may be a number."""

    def bind(input, other, *, alpha=1, out=None):
        if out is not None:
            raise Unsupported("out=")
        if not isinstance(input, torch.Tensor):
            input, other = other, input  # 1 + x arrives as (1, x); add and mul commute
        scalar = None
        if isinstance(other, numbers.Number):
            scalar, other = other, None
        elif not isinstance(other, torch.Tensor):
            raise Unsupported("other is neither a tensor nor a number")
        params = {"scalar": scalar, "inplace": False}
        if with_alpha:
            params["alpha"] = alpha
        return Call((input, other), params)

    def reference(x, p):
        other = x[1] if x[1] is not None else p["scalar"]
        return op(x[0], other, alpha=p["alpha"]) if with_alpha else op(x[0], other)

    return bind, reference


for _name, _op, _targets, _inplace, _alpha, _doc in (
        ("add", torch.add, (torch.add, T.add, T.__add__, T.__radd__), (T.add_, T.__iadd__), True,
         "elementwise sum with broadcasting"),
        ("mul", torch.mul, (torch.mul, T.mul, T.__mul__, T.__rmul__, torch.multiply, T.multiply),
         (T.mul_, T.__imul__), False, "elementwise product with broadcasting")):
    _bind, _reference = _binary(_op, _alpha)
    register(OpSpec(name=_name, kind="elementwise", targets=_targets + _inplace, inputs=("input", "other"),
                    params=("scalar", "alpha", "inplace") if _alpha else ("scalar", "inplace"), bind=_bind,
                    reference=_reference, inplace_targets=_inplace, doc=_doc))


def _unary(name: str, fn, targets: tuple, inplace: tuple, doc: str, extra: tuple[str, ...] = (),
           bind=None, reference=None):
    def default_bind(input, inplace=False, *_, **__):
        if not isinstance(input, torch.Tensor):
            raise Unsupported("input is not a tensor")
        return Call((input,), {"inplace": bool(inplace)})

    register(OpSpec(name=name, kind="elementwise", targets=targets + inplace, inputs=("input",),
                    params=extra + ("inplace",), bind=bind or default_bind,
                    reference=reference or (lambda x, p: fn(x[0])), inplace_targets=inplace,
                    doc=doc))


_unary("relu", torch.relu, (F.relu, torch.relu, T.relu), (torch.relu_, T.relu_, F.relu_),
       "max(x, 0)")
_unary("silu", F.silu, (F.silu,), (), "x * sigmoid(x)")
_unary("sigmoid", torch.sigmoid, (F.sigmoid, torch.sigmoid, T.sigmoid), (torch.sigmoid_, T.sigmoid_),
       "1 / (1 + exp(-x))")
_unary("tanh", torch.tanh, (F.tanh, torch.tanh, T.tanh), (torch.tanh_, T.tanh_), "hyperbolic tangent")


def _bind_gelu(input, approximate="none"):
    return Call((input,), {"approximate": str(approximate), "inplace": False})


_unary("gelu", None, (F.gelu,), (), "Gaussian error linear unit, exact erf or tanh approximation",
       extra=("approximate",), bind=_bind_gelu,
       reference=lambda x, p: F.gelu(x[0], approximate=p["approximate"]))


def _bind_softplus(input, beta=1.0, threshold=20.0):
    return Call((input,), {"beta": float(beta), "threshold": float(threshold), "inplace": False})


_unary("softplus", None, (F.softplus,), (), "log(1 + exp(beta x)) / beta, linear above threshold",
       extra=("beta", "threshold"), bind=_bind_softplus,
       reference=lambda x, p: F.softplus(x[0], p["beta"], p["threshold"]))


def _bind_pad(input, pad, mode="constant", value=None):
    return Call((input,), {"pad": tuple(int(v) for v in pad), "mode": str(mode),
                           "value": None if value is None else float(value)})


register(OpSpec(
    name="pad", kind="data", targets=(F.pad, torch._C._nn.pad),
    inputs=("input",), params=("pad", "mode", "value"), bind=_bind_pad,
    reference=lambda x, p: F.pad(x[0], p["pad"], p["mode"], p["value"]),
    doc="pad the trailing dimensions (constant, reflect, replicate, circular)"))


def _bind_embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
                    scale_grad_by_freq=False, sparse=False):
    if max_norm is not None:
        raise Unsupported("max_norm renormalises the weight in place")
    return Call((input, weight), {"padding_idx": padding_idx})


def _sample_embedding(variant: Variant, seed: int, gen: torch.Generator) -> list:
    idx_sig, w_sig = variant.inputs
    weight = random_tensor(w_sig, gen)
    idx = torch.randint(0, w_sig.shape[0], idx_sig.shape, generator=gen,
                        dtype=getattr(torch, idx_sig.dtype))
    idx = torch.empty_strided(idx_sig.shape, idx_sig.stride, dtype=idx.dtype).copy_(idx)
    return [idx.to(idx_sig.device), weight]


register(OpSpec(
    name="embedding", kind="data", targets=(F.embedding, torch.embedding),
    inputs=("indices", "weight"), params=("padding_idx",), bind=_bind_embedding,
    reference=lambda x, p: F.embedding(x[0], x[1], p["padding_idx"]),
    sample=_sample_embedding, doc="gather rows of a weight table by index",
    io_bytes=lambda v: v.inputs[0].nbytes + 2 * sum(o.nbytes for o in v.outputs)))

# ----------------------------------------------------------------------------- vendor-backed


def _bind_conv(nd: int):
    def bind(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        if isinstance(padding, str):
            pad: Any = padding
        else:
            pad = _tuple(padding, nd)
        return Call((input, weight, bias), {"stride": _tuple(stride, nd), "padding": pad,
                                            "dilation": _tuple(dilation, nd), "groups": int(groups)})
    return bind


register(OpSpec(
    name="conv1d", kind="vendor", vendor="cudnn", targets=(F.conv1d, torch.conv1d),
    inputs=("input", "weight", "bias"), params=("stride", "padding", "dilation", "groups"),
    bind=_bind_conv(1),
    reference=lambda x, p: F.conv1d(x[0], x[1], x[2], p["stride"], p["padding"], p["dilation"], p["groups"]),
    doc="1-D convolution"))

register(OpSpec(
    name="conv2d", kind="vendor", vendor="cudnn", targets=(F.conv2d, torch.conv2d),
    inputs=("input", "weight", "bias"), params=("stride", "padding", "dilation", "groups"),
    bind=_bind_conv(2),
    reference=lambda x, p: F.conv2d(x[0], x[1], x[2], p["stride"], p["padding"], p["dilation"], p["groups"]),
    doc="2-D convolution"))


def _bind_linear(input, weight, bias=None):
    return Call((input, weight, bias), {})


register(OpSpec(
    name="linear", kind="vendor", vendor="cublas", targets=(F.linear,),
    inputs=("input", "weight", "bias"), params=(), bind=_bind_linear,
    reference=lambda x, p: F.linear(x[0], x[1], x[2]), doc="x @ weight.T + bias"))

# NB: a linear layer whose only reader is the tanh GELU (the SD3.5 transformer's feed-forward: GELU(approximate=
# "tanh") after its projection). Under torch.compile without max-autotune the GEMM is cuBLAS's, with the bias in
# its epilogue, and Inductor runs the GELU as a pointwise kernel of its own: one more write and read of the GEMM's
# output (871 us of the SD3.5 transformer's 26.6 ms under reduce-overhead on the H200, profile of 2026-12-04i).
# A kernel doing both writes the output once (cuBLASLt's GELU_BIAS epilogue, which PyTorch's own cuBLASLt path takes
# for this tanh form; tests/test_linear_gelu.py checks it on a GPU in float32).
register(OpSpec(
    name="linear_gelu", kind="vendor", vendor="cublas", targets=(),
    inputs=("input", "weight", "bias"), params=(), bind=_bind_linear,
    reference=lambda x, p: F.gelu(F.linear(x[0], x[1], x[2]), approximate="tanh"),
    doc="gelu(x @ weight.T + bias, approximate='tanh'): a linear layer whose only reader is the tanh GELU "
        "(found in the model's graph: no eager spelling)"))


def _bind_matmul(input, other, *, out=None):
    if out is not None:
        raise Unsupported("out=")
    if not isinstance(other, torch.Tensor):
        raise Unsupported("other is not a tensor")
    return Call((input, other), {})


register(OpSpec(
    name="matmul", kind="vendor", vendor="cublas",
    targets=(torch.matmul, T.matmul, T.__matmul__, torch.bmm, T.bmm, torch.mm, T.mm),
    inputs=("input", "other"), params=(), bind=_bind_matmul,
    reference=lambda x, p: torch.matmul(x[0], x[1]), doc="matrix product (matmul, mm, bmm, @)"))


def _bind_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    if dropout_p:
        raise Unsupported("dropout")
    return Call((query, key, value, attn_mask),
                {"is_causal": bool(is_causal), "scale": None if scale is None else float(scale),
                 "enable_gqa": bool(enable_gqa)})


def _sdpa_reference(x, p):
    kwargs = {"attn_mask": x[3], "is_causal": p["is_causal"], "scale": p["scale"]}
    if p["enable_gqa"]:
        kwargs["enable_gqa"] = True
    return F.scaled_dot_product_attention(x[0], x[1], x[2], **kwargs)


register(OpSpec(
    name="scaled_dot_product_attention", kind="vendor", vendor="flash",
    targets=(F.scaled_dot_product_attention,),
    inputs=("query", "key", "value", "attn_mask"), params=("is_causal", "scale", "enable_gqa"),
    bind=_bind_sdpa, reference=_sdpa_reference,
    doc="softmax(q k^T * scale + mask) v"))



# ----------------------------------------------------------------------------- the gated delta rule

def _bind_gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, *, cu_seqlens=None, scale=None, **_k):
    # NB: chunk_size only orders the arithmetic; packed sequences (cu_seqlens) and another scale change the result
    if cu_seqlens is not None or scale is not None:
        raise Unsupported("gated delta rule: packed sequences (cu_seqlens) or a scale other than Dk^-0.5")
    if not all(isinstance(t, torch.Tensor) for t in (query, key, value, g, beta)) or not (
            initial_state is None or isinstance(initial_state, torch.Tensor)):
        raise Unsupported("gated delta rule: tensor inputs")
    if query.dim() != 4 or key.shape != query.shape or value.dim() != 4 or value.shape[:2] != query.shape[:2]:
        raise Unsupported("gated delta rule: query and key [B, T, Hk, Dk], value [B, T, Hv, Dv]")
    if value.shape[2] % key.shape[2] or tuple(g.shape) != tuple(value.shape[:3]) or tuple(beta.shape) != tuple(g.shape):
        raise Unsupported("gated delta rule: Hv a multiple of Hk, g and beta [B, T, Hv]")
    return Call((query, key, value, g, beta, initial_state),
                {"use_qk_l2norm": bool(use_qk_l2norm_in_kernel), "output_final_state": bool(output_final_state)})


def _bind_recurrent_gated_delta_rule(query, key, value, g, beta, initial_state=None, output_final_state=False,
                                     use_qk_l2norm_in_kernel=False, **kwargs):
    # transformers' token-by-token form (what its layers call for a one-token step on a cache): the chunked
    # function's arguments but chunk_size
    return _bind_gated_delta_rule(query, key, value, g, beta, initial_state=initial_state,
                                  output_final_state=output_final_state,
                                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)


def _gated_delta_rule(x: list, p: dict):
    """The gated delta rule token by token, in float32: per value head a state S [Dk, Dv] decays by exp(g_t),
    corrects its prediction of v_t from k_t by beta_t (the delta rule) and is read by q_t scaled by Dk^-0.5
    (query and key L2-normalised first when ``use_qk_l2norm``; key heads shared by Hv / Hk value heads)."""
    q, k, v, g, beta, s0 = x
    b, t, hk, dk = k.shape
    hv, dv = v.shape[-2:]
    q, k = (y.float().repeat_interleave(hv // hk, dim=2) for y in (q, k))
    if p["use_qk_l2norm"]:
        q, k = (y * torch.rsqrt((y * y).sum(-1, keepdim=True) + 1e-6) for y in (q, k))
    q = q * dk ** -0.5
    v, g, beta = v.float(), g.float(), beta.float()
    state = torch.zeros(b, hv, dk, dv, device=v.device) if s0 is None else s0.float().clone()
    out = torch.empty(b, t, hv, dv, device=v.device)
    for i in range(t):
        state = state * g[:, i].exp()[..., None, None]
        delta = (v[:, i] - (state * k[:, i, :, :, None]).sum(-2)) * beta[:, i, :, None]
        state = state + k[:, i, :, :, None] * delta[:, :, None, :]
        out[:, i] = (state * q[:, i, :, :, None]).sum(-2)
    out = out.to(x[0].dtype)
    return (out, state) if p["output_final_state"] else out


def _sample_gated_delta_rule(v: Variant, seed: int, gen: torch.Generator) -> list:
    """Valid values as the models make them: g (a log decay) at most 0, each head's about its own rate, from 1e-3 (a
    step keeps 99.9% of the state: the long memory of a model's slow heads) to 1; beta in (0, 1); k of unit norm
    where the call does not normalise it (a model normalises it itself: an unnormalised k makes the recurrence
    overflow, and a check of inf against inf says little); a small initial state.

    NB: a decay of 0.5 a step for every head (as this sampler drew before) forgot a token within 32 steps, and a kernel
    that restarted its state every 32 tokens passed (review 7)."""
    q, k, val, g, beta, s0 = (None if s is None else random_tensor(s, gen) for s in v.inputs)
    rate = 10.0 ** (torch.rand(g.shape[0], 1, *g.shape[2:], generator=gen) * 3.0 - 3.0)
    g.copy_(-(rate * (0.25 + 0.5 * torch.rand(g.shape, generator=gen))))
    beta.copy_(torch.sigmoid(beta.float()))
    if not v.param_dict.get("use_qk_l2norm", True):
        k.copy_(k.float() / k.float().norm(dim=-1, keepdim=True).clamp_min(1e-6))
    if s0 is not None:
        s0.copy_(s0.float() * 0.1)
    return [q, k, val, g, beta, s0]


def _gdn_outputs(result: Any) -> list:
    out, state = result
    return [out] if state is None else [out, state]


def _gdn_result(outs: Sequence[torch.Tensor], params: dict) -> Any:
    return (outs[0], outs[1] if params.get("output_final_state") else None)


# transformers' models whose linear attention layers call it (the same signatures and return values in each):
# the chunked function for a prompt, the token-by-token one for a one-token step on a cache (decode)
_GDN_MODELS = ("qwen3_5_moe", "qwen3_5", "qwen3_next")
_GDN_CHUNK, _GDN_RECURRENT = "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"
_GDN_FUNCTIONS = tuple(
    FunctionTarget(f"transformers.models.{m}.modeling_{m}", name, _gdn_outputs, _gdn_result,
                   bind=_bind_recurrent_gated_delta_rule if name == _GDN_RECURRENT else None)
    for name in (_GDN_CHUNK, _GDN_RECURRENT) for m in _GDN_MODELS)

_GDN_IMPORTED: list = []


def _gdn_function(name: str):
    """transformers' function ``name`` (the original, where kforge hooks it), imported here if no model did (a
    judge's process), or None without transformers."""
    targets = [t for t in _GDN_FUNCTIONS if t.name == name]
    for target in targets:
        fn = target.resolve()
        if fn is not None:
            return getattr(fn, "kforge_original", fn)
    if not _GDN_IMPORTED:
        _GDN_IMPORTED.append(True)
        import importlib

        for target in targets:
            try:
                importlib.import_module(target.module)
                return _gdn_function(name)
            except Exception:   # NB: no transformers, or one without these models: the reference is eager
                continue
    return None


def _gdn_eager(x: list, p: dict):
    """What a Qwen 3.5 model runs eagerly, chosen as its layers choose: transformers' token-by-token function for
    one token on a state (a decode step), else its chunked one (a 64-token chunk loop of float32 matrix
    products); the reference where transformers is missing."""
    q, k, v, g, beta, s0 = x
    fn = _gdn_function(_GDN_RECURRENT if s0 is not None and q.shape[1] == 1 else _GDN_CHUNK)
    if fn is None:
        return _gated_delta_rule(x, p)
    out, state = fn(q, k, v, g=g, beta=beta, initial_state=s0, output_final_state=p["output_final_state"],
                    use_qk_l2norm_in_kernel=p["use_qk_l2norm"])
    return (out, state) if p["output_final_state"] else out


# NB: not a torch function: the model calls a Python function of its own (transformers' Qwen 3.5 linear attention
# layers call ``torch_chunk_gated_delta_rule`` when flash-linear-attention is not installed). In eager mode it is
# dozens of small operators (and a loop over 64-token chunks); under torch.compile Inductor fuses some of them, and
# the loop and float32 matrix products stay (1.5-1.8 ms of compiled Qwen 3.5's 5.8 ms of GPU time at 4 layers and
# 512 tokens on the H200, compiled_profile_qwen35_moe_h200_2026-12-03t).
register(OpSpec(
    name="gated_delta_rule", kind="recurrent", targets=(), functions=_GDN_FUNCTIONS, eager=_gdn_eager,
    inputs=("query", "key", "value", "g", "beta", "initial_state"), params=("use_qk_l2norm", "output_final_state"),
    bind=_bind_gated_delta_rule, reference=_gated_delta_rule, sample=_sample_gated_delta_rule,
    doc="the gated delta rule (linear attention with a decaying, delta-corrected state): output [B, T, Hv, Dv], "
        "and the final state [B, Hv, Dk, Dv] when asked"))

def inplace_binder(spec: OpSpec, func) -> Any:
    """The binder for one spelling of ``spec``: in-place spellings mark the call in-place; a function's graph
    twin binds as its function does."""
    entry = entry_of_twin(func)
    if entry is not None and func is entry.tensor_twin:
        return lambda *inputs: Call(tuple(inputs), dict(entry.target.fixed))
    if entry is not None:
        return entry.target.binder(spec)
    if func not in spec.inplace_targets:
        return spec.bind

    def bind(*args, **kwargs):
        call = spec.bind(*args, **kwargs)
        call.params["inplace"] = True
        return call

    return bind


# ----------------------------------------------------------------------------- a mixture of experts' experts

def _bind_moe_experts(module, hidden_states=None, top_k_index=None, top_k_weights=None, *rest, **kwargs):
    """transformers' experts implementation ``grouped_mm_experts_forward(self, hidden_states, top_k_index,
    top_k_weights)``: the weights come from ``self`` (the experts module), the rest from the call."""
    if rest or kwargs:
        raise Unsupported("moe_experts: only (self, hidden_states, top_k_index, top_k_weights)")
    w_gu, w_down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    flags = {name: getattr(module, name, default) for name, default in (
        ("has_gate", True), ("has_bias", False), ("is_transposed", False), ("is_concatenated", True),
        ("_is_expert_parallel", False), ("has_post_expert_norm", False))}
    if flags != {"has_gate": True, "has_bias": False, "is_transposed": False, "is_concatenated": True,
                 "_is_expert_parallel": False, "has_post_expert_norm": False}:
        raise Unsupported(f"moe_experts: experts other than gated, concatenated, unbiased and local ({flags})")
    # NB: earlier transformers 5 releases mark these otherwise: a transposed layout and biases by attribute
    if getattr(module, "experts_are_transposed", False) or any(
            getattr(module, name, None) is not None for name in ("gate_up_proj_bias", "down_proj_bias")):
        raise Unsupported("moe_experts: experts other than gated, concatenated, unbiased and local (transposed or biased)")
    if type(getattr(module, "act_fn", None)).__name__ not in ("SiLU", "SiLUActivation"):
        raise Unsupported("moe_experts: an activation other than SiLU")
    gate = getattr(type(module), "_apply_gate", None)
    if gate is not None and getattr(gate, "__name__", "") != "_default_apply_gate":
        raise Unsupported("moe_experts: a gate of the model's own (not act(gate) * up)")
    tensors = (hidden_states, top_k_index, top_k_weights, w_gu, w_down)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        raise Unsupported("moe_experts: tensor inputs")
    if hidden_states.dim() != 2 or top_k_index.dim() != 2 or top_k_weights.shape != top_k_index.shape \
            or top_k_index.shape[0] != hidden_states.shape[0] or top_k_index.dtype not in (torch.int64, torch.int32):
        raise Unsupported("moe_experts: hidden_states [T, H], top_k_index and top_k_weights [T, K]")
    if w_gu.dtype != hidden_states.dtype or w_down.dtype != hidden_states.dtype:
        raise Unsupported("moe_experts: hidden states and expert weights of one dtype")
    e, two_i, h = w_gu.shape if w_gu.dim() == 3 else (0, 0, 0)
    if h != hidden_states.shape[1] or two_i % 2 or tuple(w_down.shape) != (e, h, two_i // 2):
        raise Unsupported("moe_experts: gate_up_proj [E, 2I, H] and down_proj [E, H, I]")
    return Call(tensors, {"impl": "grouped_mm"})



def _moe_experts(x: list, p: dict) -> torch.Tensor:
    """Each token through its K experts, in float32, rounded where transformers' grouped_mm path rounds: each
    expert's gate/up product, act(gate) and its product with up, and the down product to the hidden states'
    dtype; the routing weight's product to the promoted dtype; the sum over the K experts in float32, then the
    hidden states' dtype. An expert index out of [0, E) contributes nothing."""
    h, idx, w, w_gu, w_down = x
    dt = h.dtype
    rd = lambda y: y.to(dt).float()  # noqa: E731
    t, k = idx.shape
    flat, hs = idx.reshape(-1).long(), h.float()
    out = torch.zeros(t * k, h.shape[1], device=h.device)
    inter = w_gu.shape[1] // 2
    for e in torch.unique(flat).tolist():
        if not 0 <= e < w_gu.shape[0]:
            continue
        rows = (flat == e).nonzero()[:, 0]
        gu = rd(hs[rows // k] @ w_gu[e].float().T)
        act = rd(rd(F.silu(gu[:, :inter])) * gu[:, inter:])
        out[rows] = rd(act @ w_down[e].float().T)
    prod = (out * w.reshape(-1, 1).float()).to(torch.promote_types(h.dtype, w.dtype)).float()
    return prod.view(t, k, -1).sum(1).to(dt)


def _sample_moe_experts(v: Variant, seed: int, gen: torch.Generator) -> list:
    """Valid values: K distinct experts a token, routing weights that sum to 1, weights scaled by their fan-in."""
    hs, idx_sig, w_sig, gu_sig, dn_sig = v.inputs
    e = gu_sig.shape[0]
    t, k = idx_sig.shape
    h = random_tensor(hs, gen)
    # NB: K distinct experts a token where there are K (topk's), else with repeats
    idx = torch.stack([torch.randperm(e, generator=gen)[:k] if k <= e else torch.randint(0, e, (k,), generator=gen)
                       for _ in range(t)]) if t else torch.zeros(0, k)
    w = torch.rand(t, k, generator=gen) + 0.05
    w = w / w.sum(-1, keepdim=True)
    out = [h]
    for sig, value in ((idx_sig, idx), (w_sig, w)):
        ten = random_tensor(sig, gen)
        ten.copy_(value.to(ten.device))
        out.append(ten)
    for sig in (gu_sig, dn_sig):
        out.append(_expert_weights(sig, gen))
    return out


def _expert_weights(sig, gen: torch.Generator) -> torch.Tensor:
    """One expert weight tensor, every expert random (normal, clamped to 3, scaled by its fan-in). On a GPU the values
    are drawn there, from a generator seeded from ``gen``: the CPU took 12 s a sample for Qwen 3.5's 256 experts.

    NB: every expert, not only those the sample's tokens use: the judge's timed sets take each input from its own
    offset in a pool of samples, so a set's tokens mostly route to experts another sample did not use. Filled with a
    constant, those let a kernel tell them apart and skip their products (review 7: 6.6x and 11.2x "faster" on the
    CPU, no faster on real weights), and honest float32 kernels failed on the cancellation in their sums."""
    scale = sig.shape[-1] ** -0.5
    if not sig.is_contiguous:
        return random_tensor(sig, gen).mul_(scale)
    device = torch.device(sig.device)
    draw = gen if device.type == "cpu" else \
        torch.Generator(device=device).manual_seed(int(torch.randint(0, 2 ** 62, (1,), generator=gen)))
    ten = torch.empty(sig.shape, dtype=torch_dtype(sig.dtype), device=device)
    for e in range(sig.shape[0]):   # NB: an expert at a time: no float32 copy of all of them at once
        ten[e] = torch.randn(sig.shape[1:], generator=draw, device=device).clamp_(-3.0, 3.0).mul_(scale)
    return ten


def _moe_gathered(x: list) -> torch.Tensor:
    """The reference's values without its data-dependent loop (for tracing): each (token, expert) pair's
    weights gathered, T * K matrix-vector products. Memory: T * K copies of an expert's weights."""
    h, idx, w, w_gu, w_down = x
    dt, e, inter = h.dtype, w_gu.shape[0], w_gu.shape[1] // 2
    rd = lambda y: y.to(dt).float()  # noqa: E731
    t, k = idx.shape
    flat = idx.reshape(-1).long()
    valid = ((flat >= 0) & (flat < e)).unsqueeze(-1)
    flat = flat.clamp(0, e - 1)
    hs = h.float().repeat_interleave(k, 0)
    gu = rd(torch.bmm(w_gu[flat].float(), hs.unsqueeze(-1)).squeeze(-1))
    act = rd(rd(F.silu(gu[:, :inter])) * gu[:, inter:])
    down = rd(torch.bmm(w_down[flat].float(), act.unsqueeze(-1)).squeeze(-1)) * valid
    prod = (down * w.reshape(-1, 1).float()).to(torch.promote_types(h.dtype, w.dtype)).float()
    return prod.view(t, k, -1).sum(1).to(dt)


def _traced() -> bool:
    """Whether torch is tracing this call rather than running it: dynamo inlining it, or running it on fake tensors
    (dynamo working out a graph node's output, AOTAutograd tracing the graph), where ``is_compiling()`` is False on
    torch 2.11 (found on the H200: the grouped product's float32 meta check failed there, and the node broke the
    graph)."""
    return torch.compiler.is_compiling() or torch._guards.detect_fake_mode() is not None


def _moe_batched(x: list) -> torch.Tensor:
    """What transformers' batched_mm experts run, from the tensors alone: each (token, expert) pair's weights
    gathered (an index out of range clamped, as there), two batched matrix-vector products, the gate, the routing
    weights and the sum over the K experts."""
    h, idx, w, w_gu, w_down = x
    t, k = idx.shape
    ids = idx.reshape(-1).clamp(0, w_gu.shape[0] - 1)
    gu = torch.bmm(w_gu[ids], h.repeat_interleave(k, dim=0).unsqueeze(-1)).squeeze(-1)
    gate, up = gu.chunk(2, dim=-1)
    down = torch.bmm(w_down[ids], (F.silu(gate) * up).unsqueeze(-1)).squeeze(-1)
    return (down * w.reshape(-1).unsqueeze(-1)).view(t, k, -1).sum(1).to(h.dtype)


def _moe_eager(x: list, p: dict) -> torch.Tensor:
    """What transformers' experts implementation that made the call runs, from the tensors alone: batched_mm's
    gathered products (``_moe_batched``), or grouped_mm's sort, gather, grouped products and unsort where this
    torch has the grouped product for them (on the CPU from torch 2.9, bf16 there only with 16-byte strides); the
    reference where it has not."""
    h, idx, w, w_gu, w_down = x
    if p.get("impl") == "batched_mm":
        return _moe_batched(x)
    mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
    if _traced() and not (h.device.type == "cuda" and w_gu.dtype == torch.bfloat16):
        # NB: traced (the graph twin where no kernel replaces it): torch compiles the grouped product for bf16 on
        # CUDA only (as transformers decides), and the reference's loop over the experts used is data-dependent
        return _moe_gathered(x)
    if mm is None or h.device.type not in ("cuda", "cpu"):
        return _moe_experts(x, p)
    try:
        t, k = idx.shape
        ids, perm = torch.sort(idx.reshape(-1))
        xs = h[perm // k].to(w_gu.dtype)
        counts = torch.histc(ids.float() if h.device.type == "cpu" else ids.int(), bins=w_gu.shape[0], min=0,
                             max=w_gu.shape[0] - 1)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        gu = mm(xs, w_gu.transpose(-2, -1), offs=offs)
        gate, up = gu.chunk(2, dim=-1)
        down = mm((F.silu(gate) * up).to(w_down.dtype), w_down.transpose(-2, -1), offs=offs)
        weighted = down * w.reshape(-1)[perm].unsqueeze(-1)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel(), device=h.device)
        return weighted[inv].view(t, k, -1).sum(1).to(h.dtype)
    except (RuntimeError, NotImplementedError):   # NB: a dtype, layout or device this torch's grouped product lacks
        return _moe_experts(x, p)


def _moe_outputs(result: Any) -> list:
    return [result]


def _moe_result(outs: Sequence[torch.Tensor], params: dict) -> Any:
    return outs[0]


# transformers' experts implementation that a model with grouped_mm experts calls: looked up in its experts
# interface at each call (``ALL_EXPERTS_FUNCTIONS``), so kforge hooks it there too. It takes the experts module
# (self) as its first argument, which no graph node can hold: in a graph kforge compiles its twin takes the bound
# tensors (the weights among them), graph="tensors".
_MOE_FUNCTIONS = (
    FunctionTarget("transformers.integrations.moe", "grouped_mm_experts_forward", _moe_outputs, _moe_result,
                   mappings=("ALL_EXPERTS_FUNCTIONS._global_mapping",), graph="tensors", fixed=(("impl", "grouped_mm"),)),
    # NB: transformers' generate() decodes with batched_mm on a GPU (grouped_mm for the prompt): found on the H200,
    # where a Qwen 3.5 decode captured no experts card for its one-token steps. The same arguments as grouped_mm's.
    FunctionTarget("transformers.integrations.moe", "batched_mm_experts_forward", _moe_outputs, _moe_result,
                   mappings=("ALL_EXPERTS_FUNCTIONS._global_mapping",), graph="tensors",
                   fixed=(("impl", "batched_mm"),)),
)


def _moe_io_bytes(v: Variant) -> int:
    """The bytes a call must move: its tokens, routing and output, and the weights of the experts it uses only
    (at most T * K of the E experts)."""
    hs, idx, w, gu, dn = v.inputs
    t, k = idx.shape
    used = min(t * k, gu.shape[0])
    weights = used * (gu.nbytes + dn.nbytes) // max(gu.shape[0], 1)
    return weights + sum(s.nbytes for s in (hs, idx, w)) + v.outputs[0].nbytes


# NB: in eager decoding Qwen 3.5's experts are a score of small operators a layer and a token (sort, gather,
# histc, cumsum, two grouped products, the gate, the unsort, the sum), paid on the host: its eager decode on
# the H200 is host-bound (65 tokens/s at 4 layers, 1.7 ms of GPU kernels in 15 ms a token, 2026-12-04q).
register(OpSpec(
    name="moe_experts", kind="vendor", vendor="cublas", targets=(), functions=_MOE_FUNCTIONS, eager=_moe_eager,
    inputs=("hidden_states", "top_k_index", "top_k_weights", "gate_up_proj", "down_proj"), params=("impl",),
    bind=_bind_moe_experts, reference=_moe_experts, sample=_sample_moe_experts, io_bytes=_moe_io_bytes,
    doc="a mixture of experts' experts: each token's K experts (SiLU-gated, weights [E, 2I, H] and [E, H, I]), "
        "summed with their routing weights: output [T, H]"))
