"""The plain operators kforge captures, one spec each: a torch call to patch and nothing more. An operator with
a role in the model's graph (a fused operator, a layout twin) or one computed by a library's function is a family
of its own folder (kforge.ops.families)."""
from __future__ import annotations

import numbers
from typing import Any

import torch
import torch.nn.functional as F

from ._functions import entry_of_twin
from ._registry import Call, OpSpec, Unsupported, Variant, get_spec, random_tensor, register

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


def _bind_rms_norm(input, normalized_shape, weight=None, eps=None):
    return Call((input, weight), {"normalized_shape": tuple(normalized_shape),
                                  "eps": None if eps is None else float(eps)})


register(OpSpec(
    name="rms_norm", kind="normalization",
    targets=(getattr(F, "rms_norm", None), getattr(torch, "rms_norm", None)),
    inputs=("input", "weight"), params=("normalized_shape", "eps"), bind=_bind_rms_norm,
    reference=lambda x, p: F.rms_norm(x[0], p["normalized_shape"], x[1], p["eps"]),
    doc="root-mean-square normalization over the trailing dimensions"))


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
