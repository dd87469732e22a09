"""rms_norm_rope: its binder and reference."""
from __future__ import annotations

import torch

from ..._registry import Call, Unsupported


def bind(input, weight, cos, sin, eps=1e-6):
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


def reference(x, p):
    """Gemma's q/k RMSNorm (float32 statistics, the weight applied in float32, then the input's dtype), then the
    rotary embedding in rotate-half form, as transformers writes them: the reference runs those operators."""
    inp, weight, cos, sin = x
    xf = inp.float()
    y = (xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + p["eps"], -0.5) * weight.float()).type_as(inp)
    half = y.shape[-1] // 2
    return y * cos + torch.cat((-y[..., half:], y[..., :half]), dim=-1) * sin
