"""The seed workloads as random-weight model builders: ResNet-50, SD3.5 Medium, Gemma 4 E2B, Qwen 3.5 MoE.

The packages they need (torchvision, diffusers, transformers) are imported only when a builder is called.
"""
from __future__ import annotations

from ._build import MODELS, build
from ._deps import MissingDependency
from ._generate import Decode, DecodeArm, Generate, compare_decode, decode_steps, forward_as, greedy_decode
from ._diffusion import SD35_TRANSFORMER_CONFIG, SD35_VAE_CONFIG, VAEDecoder, sd35_transformer, sd35_vae_decoder
from ._language import (GEMMA4_E2B_CONFIG, QWEN35_MOE_CONFIG, gemma4_e2b, gemma4_e2b_config, qwen35_moe,
                        qwen35_moe_config)
from ._vision import resnet50

__all__ = ["Decode", "GEMMA4_E2B_CONFIG", "MODELS", "MissingDependency", "QWEN35_MOE_CONFIG", "SD35_TRANSFORMER_CONFIG",
           "SD35_VAE_CONFIG", "VAEDecoder", "build", "compare_decode", "decode_steps", "DecodeArm", "Generate", "forward_as", "gemma4_e2b", "greedy_decode", "gemma4_e2b_config", "qwen35_moe",
           "qwen35_moe_config", "resnet50", "sd35_transformer", "sd35_vae_decoder"]
