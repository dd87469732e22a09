"""Stable Diffusion 3.5 Medium: the MMDiT transformer and the VAE decoder, from diffusers."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ._deps import require

# stabilityai/stable-diffusion-3.5-medium, transformer/config.json
SD35_TRANSFORMER_CONFIG: dict[str, Any] = {
    "sample_size": 128, "patch_size": 2, "in_channels": 16, "out_channels": 16,
    "num_layers": 24, "attention_head_dim": 64, "num_attention_heads": 24,
    "joint_attention_dim": 4096, "caption_projection_dim": 1536, "pooled_projection_dim": 2048,
    "pos_embed_max_size": 384, "dual_attention_layers": list(range(13)), "qk_norm": "rms_norm",
}

# stabilityai/stable-diffusion-3.5-medium, vae/config.json
SD35_VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3, "out_channels": 3, "latent_channels": 16,
    "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2, "norm_num_groups": 32,
    "act_fn": "silu", "sample_size": 1024, "scaling_factor": 1.5305, "shift_factor": 0.0609,
    "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
    "mid_block_add_attention": True, "force_upcast": True,
    "use_quant_conv": False, "use_post_quant_conv": False,
}

# CLIP-L and CLIP-G give 77 tokens, T5-XXL 256 (the pipeline's max_sequence_length): 333 in all.
SD35_TEXT_TOKENS = 77 + 256


def _subfolder(weights: Path, name: str) -> str | None:
    """The component's subfolder when ``weights`` is a whole pipeline directory."""
    return name if (weights / name / "config.json").exists() else None


def sd35_transformer(*, device: str = "cpu", dtype: torch.dtype = torch.bfloat16, layers: int | None = None,
                     batch: int = 1, resolution: int = 1024, tokens: int = SD35_TEXT_TOKENS,
                     weights: str | Path | None = None) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """SD3Transformer2DModel with the SD3.5 Medium config and one denoising step's keyword inputs.

    ``layers`` keeps the first N joint blocks (the dual-attention ones come first, as published).
    """
    diffusers = require("diffusers", "sd35_transformer")
    cls = diffusers.SD3Transformer2DModel
    if weights is not None:
        if layers is not None:
            raise ValueError("layers= cannot be combined with weights=: the checkpoint fixes the depth")
        path = Path(weights)
        model = cls.from_pretrained(path, subfolder=_subfolder(path, "transformer"), torch_dtype=dtype,
                                    local_files_only=True)
    else:
        config = dict(SD35_TRANSFORMER_CONFIG)
        if layers is not None:
            config["num_layers"] = layers
            config["dual_attention_layers"] = [i for i in config["dual_attention_layers"] if i < layers]
        torch.manual_seed(0)
        with torch.device(device):
            model = cls.from_config(config)
    model = model.to(device=device, dtype=dtype).eval()
    cfg = model.config
    latent = resolution // 8
    g = torch.Generator().manual_seed(0)
    inputs = {
        "hidden_states": torch.randn(batch, cfg.in_channels, latent, latent, generator=g),
        "encoder_hidden_states": torch.randn(batch, tokens, cfg.joint_attention_dim, generator=g),
        "pooled_projections": torch.randn(batch, cfg.pooled_projection_dim, generator=g),
        "timestep": torch.full((batch,), 500.0),
    }
    return model, {k: v.to(device=device, dtype=dtype) for k, v in inputs.items()}


class VAEDecoder(nn.Module):
    """``vae.decode(latents).sample`` as a module: the VAE half an image pipeline runs."""

    def __init__(self, vae: nn.Module):
        super().__init__()
        self.vae = vae

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(latents).sample


def sd35_vae_decoder(*, device: str = "cpu", dtype: torch.dtype = torch.bfloat16, batch: int = 1,
                     resolution: int = 1024, weights: str | Path | None = None
                     ) -> tuple[nn.Module, torch.Tensor]:
    """The SD3.5 AutoencoderKL's decoder (wrapped in VAEDecoder) and latents ``[batch, 16, res/8, res/8]``."""
    diffusers = require("diffusers", "sd35_vae_decoder")
    cls = diffusers.AutoencoderKL
    if weights is not None:
        path = Path(weights)
        vae = cls.from_pretrained(path, subfolder=_subfolder(path, "vae"), torch_dtype=dtype,
                                  local_files_only=True)
    else:
        torch.manual_seed(0)
        with torch.device(device):
            vae = cls.from_config(SD35_VAE_CONFIG)
    model = VAEDecoder(vae).to(device=device, dtype=dtype).eval()
    latent = resolution // 8
    g = torch.Generator().manual_seed(0)
    latents = torch.randn(batch, vae.config.latent_channels, latent, latent, generator=g)
    return model, latents.to(device=device, dtype=dtype)
