"""group_norm and its fused forms: binders and references."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..._registry import Call

T = torch.Tensor


def bind_group_norm(input, num_groups, weight=None, bias=None, eps=1e-5, *_a, **_k):
    return Call((input, weight, bias), {"num_groups": int(num_groups), "eps": float(eps)})


def group_norm(x: list, p: dict) -> T:
    return F.group_norm(x[0], p["num_groups"], x[1], x[2], p["eps"])


def group_norm_silu(x: list, p: dict) -> T:
    return F.silu(F.group_norm(x[0], p["num_groups"], x[1], x[2], p["eps"]))


def bind_biased_group_norm(input, input_bias, num_groups, weight=None, bias=None, eps=1e-5, *_a, **_k):
    return Call((input, input_bias, weight, bias), {"num_groups": int(num_groups), "eps": float(eps)})


def _channel_view(t: T, ndim: int) -> T:
    """A per-channel [C] vector shaped to broadcast over an N,C,* tensor of ``ndim`` dims."""
    return t.reshape((1, -1) + (1,) * (ndim - 2))


def biased_group_norm_silu(x: list, p: dict) -> T:
    """The reference: the bias added in float32, as the convolution's own epilogue and Inductor's peeled add do
    it (in the input's type, x + bias rounds before the statistics: a kernel exact in float32 failed the check
    on 785 of 65536 bf16 elements where the bias dominates, found by review)."""
    dt = x[0].dtype
    f32 = lambda t: None if t is None else t.float()
    y = f32(x[0]) + _channel_view(x[1].float(), x[0].dim())
    return F.silu(F.group_norm(y, p["num_groups"], f32(x[2]), f32(x[3]), p["eps"])).to(dt)
