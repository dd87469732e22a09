"""ResNet-50 from torchvision, random weights unless a state dict is given."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from ._deps import require


def resnet50(*, device: str = "cpu", dtype: torch.dtype = torch.bfloat16, batch: int = 8, resolution: int = 224,
             weights: str | Path | None = None) -> tuple[nn.Module, torch.Tensor]:
    """torchvision ResNet-50 in eval mode and an image batch ``[batch, 3, resolution, resolution]``.

    ``weights`` is a torchvision state-dict file (``resnet50-*.pth``) to load instead of random init.
    """
    models = require("torchvision", "resnet50").models
    torch.manual_seed(0)
    with torch.device(device):
        model = models.resnet50(weights=None)
    if weights is not None:
        model.load_state_dict(torch.load(Path(weights), map_location="cpu", weights_only=True))
    model = model.to(device=device, dtype=dtype).eval()
    g = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, resolution, resolution, generator=g).to(device=device, dtype=dtype)
    return model, images
