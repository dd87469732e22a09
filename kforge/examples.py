"""Small built-in models that run on a CPU in seconds: the README command, tests and tutorials."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyCNN(nn.Module):
    """conv, batch_norm, relu, max/avg/adaptive pooling, a residual add and a linear head."""

    def __init__(self, channels: int = 16, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.stem(x)), inplace=True)
        x = F.max_pool2d(x, 3, 2, 1)
        y = self.bn2(self.conv2(x))
        x = torch.relu(y + x)
        x = F.avg_pool2d(x, 2)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class TinyTransformer(nn.Module):
    """embedding, layer_norm and rms_norm, attention with an explicit softmax and with SDPA,
    a gelu MLP and a silu-gated MLP."""

    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4, hidden: int = 128):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = RMSNorm(dim)
        self.qkv2 = nn.Linear(dim, 3 * dim)
        self.norm3 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.gate = nn.Linear(dim, hidden)
        self.up2 = nn.Linear(dim, hidden)
        self.down2 = nn.Linear(hidden, dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def _split(self, qkv: torch.Tensor):
        b, t, _ = qkv.shape
        q, k, v = qkv.view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        q, k, v = self._split(self.qkv(self.norm1(x)))
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        attn = scores.softmax(dim=-1) @ v
        x = x + self.proj(attn.transpose(1, 2).flatten(2))
        q, k, v = self._split(self.qkv2(self.norm2(x)))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).flatten(2))
        h = self.norm3(x)
        x = x + self.down(F.gelu(self.up(h), approximate="tanh"))
        x = x + self.down2(F.silu(self.gate(h)) * self.up2(h))
        return F.log_softmax(self.lm_head(x), dim=-1)


class HandRMSNorm(nn.Module):
    """RMSNorm written out the way Gemma and Qwen write it: pow, mean, add, rsqrt, mul, mul."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def gelu_tanh_formula(x: torch.Tensor) -> torch.Tensor:
    """The tanh-approximation GELU as a formula (eight pointwise operators)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class ChainBlock(nn.Module):
    """A pre-norm MLP block as language models write it: a hand-written RMSNorm, up projection,
    a tanh-formula GELU, down projection and a residual add."""

    def __init__(self, dim: int = 64, hidden: int = 128):
        super().__init__()
        self.norm = HandRMSNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(gelu_tanh_formula(self.up(self.norm(x))))


class TinyChains(nn.Module):
    """Two ChainBlocks and a final hand-written RMSNorm: the operator chains that regions fuse
    (the residual add of each block joins the next norm as a second output)."""

    def __init__(self, dim: int = 64, hidden: int = 128, blocks: int = 2):
        super().__init__()
        self.blocks = nn.ModuleList(ChainBlock(dim, hidden) for _ in range(blocks))
        self.norm = HandRMSNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


EXAMPLES = ("tiny_cnn", "tiny_transformer", "tiny_chains")


def example(name: str, device: str = "cpu", dtype: torch.dtype = torch.float32, batch: int = 2,
            seed: int = 0) -> tuple[nn.Module, Any]:
    """A built-in model in eval mode and example inputs for it, on ``device``."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if name == "tiny_cnn":
        model: nn.Module = TinyCNN()
        inputs: Any = torch.randn(batch, 3, 32, 32, generator=g).to(dtype)
    elif name == "tiny_transformer":
        model = TinyTransformer()
        inputs = torch.randint(0, 256, (batch, 32), generator=g)
    elif name == "tiny_chains":
        model = TinyChains()
        inputs = torch.randn(batch, 32, 64, generator=g).to(dtype)
    else:
        raise ValueError(f"unknown example {name!r}; choose one of {', '.join(EXAMPLES)}")
    model = model.to(device=device, dtype=dtype).eval()
    return model, inputs.to(device)
