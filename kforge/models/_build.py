"""``kforge.models.build``: one entry point over the seed-workload builders."""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from ._diffusion import sd35_transformer, sd35_vae_decoder
from ._language import gemma4_e2b, qwen35_moe
from ._vision import resnet50

BUILDERS: dict[str, Callable[..., tuple[nn.Module, Any]]] = {
    "resnet50": resnet50,
    "sd35_transformer": sd35_transformer,
    "sd35_vae_decoder": sd35_vae_decoder,
    "gemma4_e2b": gemma4_e2b,
    "qwen35_moe": qwen35_moe,
}
MODELS = tuple(BUILDERS)


def build(name: str, *, device: str = "cpu", dtype: torch.dtype = torch.bfloat16, layers: int | None = None,
          batch: int | None = None, resolution: int | None = None, tokens: int | None = None,
          attn_implementation: str = "sdpa", weights: str | Path | None = None) -> tuple[nn.Module, Any]:
    """A seed workload in eval mode on ``device`` and realistic example inputs for it.

    Random weights unless ``weights`` names a local checkpoint; nothing is downloaded. Options left
    as None take the model's defaults (see docs/models.md); an option the model has no use for is an error.

    >>> model, inputs = kforge.models.build("resnet50", dtype=torch.float32, batch=2)
    """
    if name not in BUILDERS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    builder = BUILDERS[name]
    options: dict[str, Any] = {k: v for k, v in dict(layers=layers, batch=batch, resolution=resolution,
                                                     tokens=tokens, weights=weights).items() if v is not None}
    if attn_implementation != "sdpa":
        options["attn_implementation"] = attn_implementation
    accepted = inspect.signature(builder).parameters
    unused = [k for k in options if k not in accepted]
    if unused:
        takes = ", ".join(f"{k}=" for k in accepted if k not in ("device", "dtype", "overrides"))
        raise ValueError(f"{name} has no use for {', '.join(k + '=' for k in unused)}; it takes {takes}")
    return builder(device=device, dtype=dtype, **options)
