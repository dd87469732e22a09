"""Language models measured as they are used: prefill latency and greedy decode with a static KV cache."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn


@dataclass(frozen=True)
class Decode:
    """Greedy decoding of ``new_tokens`` tokens at batch 1 after a prompt."""

    tokens: tuple[int, ...]          # the generated token ids
    logits: torch.Tensor             # [new_tokens, vocab] float32 on the CPU, one row per step
    tokens_per_s: float              # decode steps only: (N - 1) / (time for N tokens - time for 1)
    cache: str                       # "static", or "dynamic (why the static cache was not usable)"

    def agrees_with(self, reference: "Decode", rtol: float = 2e-2) -> tuple[bool, float]:
        """(same tokens as ``reference``, largest logit difference relative to the reference's scale)."""
        same = self.tokens == reference.tokens
        n = min(len(self.logits), len(reference.logits))
        diff = (self.logits[:n] - reference.logits[:n]).abs().max().item()
        scale = reference.logits[:n].abs().max().clamp_min(1e-12).item()
        return same, diff / scale


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _generate(model: nn.Module, input_ids: torch.Tensor, n: int, cache: str | None) -> Any:
    kwargs: dict[str, Any] = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, return_dict_in_generate=True,
                                  output_logits=True, pad_token_id=0)
    if cache is not None:
        kwargs["cache_implementation"] = cache
    # NB: transformers compiles the forward by itself under a static cache; the caller decides here.
    kwargs["disable_compile"] = True
    with torch.no_grad():
        return model.generate(input_ids, **kwargs)


def greedy_decode(model: nn.Module, input_ids: torch.Tensor, new_tokens: int = 32, *,
                  forward: Callable | None = None, repeats: int = 3) -> Decode:
    """Greedy decode with a static KV cache (a dynamic one where the model has no static cache),
    timed as the median of ``repeats`` runs after one warm-up (which also compiles ``forward``).

    ``forward`` replaces ``model.forward`` for the run (a compiled forward); the model is restored after.
    """
    if new_tokens < 2:
        raise ValueError("new_tokens must be at least 2: decode speed is measured over the steps after the first")
    device = input_ids.device
    if forward is not None:
        model.forward = forward
    try:
        cache, why = "static", ""
        try:
            out = _generate(model, input_ids, new_tokens, "static")
        except Exception as exc:  # e.g. a linear-attention (recurrent state) layer the static cache lacks
            cache, why = None, f"{type(exc).__name__}: {str(exc)[:120]}"
            out = _generate(model, input_ids, new_tokens, None)

        def timed(n: int) -> float:
            _sync(device)
            start = time.perf_counter()
            _generate(model, input_ids, n, cache)
            _sync(device)
            return time.perf_counter() - start

        _generate(model, input_ids, 1, cache)  # warm: a compiled forward compiles for both shapes here
        runs = sorted((timed(new_tokens) - timed(1)) for _ in range(repeats))
        steps_s = max(runs[len(runs) // 2], 1e-9)
    finally:
        if forward is not None:
            del model.forward
    tokens = tuple(out.sequences[0, input_ids.shape[1]:].tolist())
    logits = torch.stack([step[0].float().cpu() for step in out.logits])
    return Decode(tokens, logits, (new_tokens - 1) / steps_s, "static" if cache else f"dynamic ({why})")
