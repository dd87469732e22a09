"""Where a decode step's torch calls go: a language model's greedy decode, each torch call of a decode step
counted under the library function or module it ran in (transformers' fallbacks and blocks). At batch 1 eager
decoding is host-bound, so these counts say which kernel kforge can put in place of how much host work.

    python benchmarks/decode_calls.py qwen35_moe              # narrow widths, the published layer pattern
    python benchmarks/decode_calls.py qwen35_moe --layers 8 --tokens 16

Counts do not depend on the widths (an operator is one call whatever its shapes), so narrow widths are used
and this runs on the CPU. Calls per token: (calls decoding N + 1 tokens - calls decoding 1) / N.
"""
from __future__ import annotations

import argparse
import collections
import importlib
import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kforge import models  # noqa: E402

# Narrow widths with the published structure (heads grouped as published, experts routed two a token)
NARROW = {
    "qwen35_moe": {"vocab_size": 512, "hidden_size": 128, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                   "linear_key_head_dim": 32, "linear_value_head_dim": 32, "num_attention_heads": 2,
                   "num_key_value_heads": 1, "head_dim": 32, "moe_intermediate_size": 64,
                   "shared_expert_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2},
}
# (module, attribute, label): functions and module forwards whose calls are counted apart
PLACES = {
    "qwen35_moe": [
        ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "torch_recurrent_gated_delta_rule",
         "gated delta rule, token by token (kforge: gated_delta_rule)"),
        ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "causal_conv1d_update", "causal conv1d update"),
        ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5MoeRMSNormGated.forward", "gated RMSNorm"),
        ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5MoeSparseMoeBlock.forward", "MoE block"),
        ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5MoeAttention.forward", "full attention"),
    ],
}
_IGNORED = frozenset({"dim", "size", "stride", "is_contiguous", "numel", "item", "tolist", "data_ptr"})


class _Count(TorchFunctionMode):
    def __init__(self, where: list[str]):
        super().__init__()
        self.where, self.calls = where, collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name not in _IGNORED and not name.startswith("__"):
            self.calls[self.where[-1] if self.where else "everything else"] += 1
        return func(*args, **(kwargs or {}))


def _wrap(where: list[str], label: str, fn):
    def run(*args, **kwargs):
        where.append(label)
        try:
            return fn(*args, **kwargs)
        finally:
            where.pop()
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=sorted(NARROW))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=8, help="decode steps counted")
    ap.add_argument("--experts", default="grouped_mm", help="MoE models: the experts implementation")
    args = ap.parse_args()
    model, ids = getattr(models, args.model)(dtype=torch.float32, layers=args.layers, tokens=12,
                                             overrides=NARROW[args.model])
    if args.experts and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(args.experts)
    where: list[str] = []
    undo = []
    for module_name, attr, label in PLACES[args.model]:
        module = importlib.import_module(module_name)
        owner, name = module, attr
        if "." in attr:
            cls, name = attr.split(".")
            owner = getattr(module, cls)
        undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, _wrap(where, label, getattr(owner, name)))
    try:
        generate = models.Generate(model, args.tokens + 1)
        with torch.no_grad():
            generate(ids)   # decides the cache
            counts = []
            for n in (1, args.tokens + 1):
                generate.new_tokens = n
                mode = _Count(where)
                with mode:
                    generate(ids)
                counts.append(mode.calls)
    finally:
        for owner, name, fn in undo:
            setattr(owner, name, fn)
    per_token = {k: (counts[1][k] - counts[0][k]) / args.tokens for k in set(counts[0]) | set(counts[1])}
    total = sum(per_token.values())
    print(f"# {args.model}, {args.layers} layers ({', '.join(model.config.layer_types)}), {generate.cache} cache: "
          f"{total:.0f} torch calls a decoded token")
    for label, n in sorted(per_token.items(), key=lambda kv: -kv[1]):
        print(f"  {n:7.1f}  {100 * n / total:5.1f}%  {label}")


if __name__ == "__main__":
    main()
