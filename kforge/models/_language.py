"""Gemma 4 E2B and Qwen 3.5 35B-A3B text models from transformers, with their published configs."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ._deps import require

# google/gemma-4-E2B, config.json "text_config"
GEMMA4_E2B_CONFIG: dict[str, Any] = {
    "vocab_size": 262144, "hidden_size": 1536, "intermediate_size": 6144, "num_hidden_layers": 35,
    "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512,
    "num_global_key_value_heads": None, "attention_k_eq_v": False,
    "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
    "sliding_window": 512, "final_logit_softcapping": 30.0, "tie_word_embeddings": True,
    "vocab_size_per_layer_input": 262144, "hidden_size_per_layer_input": 256,
    "num_kv_shared_layers": 20, "use_double_wide_mlp": True, "enable_moe_block": False,
    "attention_bias": False, "attention_dropout": 0.0,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
    },
    "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
}
GEMMA4_PATTERN = ("sliding_attention", 5)  # four sliding layers, then one full

# Qwen/Qwen3.5-35B-A3B, config.json "text_config"
QWEN35_MOE_CONFIG: dict[str, Any] = {
    "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "attention_bias": False,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "hidden_act": "silu", "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144, "tie_word_embeddings": False, "attention_dropout": 0.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10], "mrope_interleaved": True},
}
QWEN35_PATTERN = ("linear_attention", 4)  # three Gated-DeltaNet layers, then one full attention


def layer_types(n: int, pattern: tuple[str, int]) -> list[str]:
    """The published repeating pattern over ``n`` layers; the last layer is full attention, as in both models."""
    local, period = pattern
    types = [local if (i + 1) % period else "full_attention" for i in range(n)]
    types[-1] = "full_attention"
    return types


def gemma4_e2b_config(layers: int | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The E2B text config, optionally ``layers`` deep.

    A shallower model keeps the published share of KV-shared (double-wide MLP) layers at the end, 20 of 35,
    as long as the layers before them still hold one layer of each attention type to share from.
    ``overrides`` replaces published fields (the tests shrink the vocabularies with it).
    """
    config = dict(GEMMA4_E2B_CONFIG)
    n = layers if layers is not None else config["num_hidden_layers"]
    types = layer_types(n, GEMMA4_PATTERN)
    shared = round(n * config["num_kv_shared_layers"] / config["num_hidden_layers"])
    while shared and len(set(types[:n - shared])) < 2:
        shared -= 1
    config.update(num_hidden_layers=n, layer_types=types, num_kv_shared_layers=shared)
    return {**config, **(overrides or {})}


def qwen35_moe_config(layers: int | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The 35B-A3B text config, optionally ``layers`` deep, with ``overrides`` replacing published fields."""
    config = dict(QWEN35_MOE_CONFIG)
    n = layers if layers is not None else config["num_hidden_layers"]
    config.update(num_hidden_layers=n, layer_types=layer_types(n, QWEN35_PATTERN))
    return {**config, **(overrides or {})}


def _causal_lm(model_name: str, cls_name: str, config_name: str, config: dict[str, Any], *, device: str,
               dtype: torch.dtype, batch: int, tokens: int, attn_implementation: str,
               weights: str | Path | None, layers: int | None) -> tuple[nn.Module, torch.Tensor]:
    transformers = require("transformers", model_name)
    cls = getattr(transformers, cls_name)
    if weights is not None:
        if layers is not None:
            raise ValueError("layers= cannot be combined with weights=: the checkpoint fixes the depth")
        model = cls.from_pretrained(Path(weights), dtype=dtype, attn_implementation=attn_implementation,
                                    local_files_only=True)
    else:
        torch.manual_seed(0)
        cfg = getattr(transformers, config_name)(**config)
        with torch.device(device):
            model = cls._from_config(cfg, dtype=dtype, attn_implementation=attn_implementation)
    model = model.to(device).eval()
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, model.config.vocab_size, (batch, tokens), generator=g)
    return model, input_ids.to(device)


def gemma4_e2b(*, device: str = "cpu", dtype: torch.dtype = torch.bfloat16, layers: int | None = None,
               batch: int = 1, tokens: int = 512, attn_implementation: str = "sdpa",
               weights: str | Path | None = None, overrides: dict[str, Any] | None = None) -> tuple[nn.Module, torch.Tensor]:
    """Gemma4ForCausalLM with the E2B text config and a prefill of ``input_ids [batch, tokens]``."""
    return _causal_lm("gemma4_e2b", "Gemma4ForCausalLM", "Gemma4TextConfig", gemma4_e2b_config(layers, overrides),
                      device=device, dtype=dtype, batch=batch, tokens=tokens,
                      attn_implementation=attn_implementation, weights=weights, layers=layers)


def qwen35_moe(*, device: str = "cpu", dtype: torch.dtype = torch.bfloat16, layers: int | None = None,
               batch: int = 1, tokens: int = 512, attn_implementation: str = "sdpa",
               weights: str | Path | None = None, overrides: dict[str, Any] | None = None) -> tuple[nn.Module, torch.Tensor]:
    """Qwen3_5MoeForCausalLM with the 35B-A3B text config and a prefill of ``input_ids [batch, tokens]``."""
    return _causal_lm("qwen35_moe", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig", qwen35_moe_config(layers, overrides),
                      device=device, dtype=dtype, batch=batch, tokens=tokens,
                      attn_implementation=attn_implementation, weights=weights, layers=layers)
