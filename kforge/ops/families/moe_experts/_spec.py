"""moe_experts: its binder (transformers' experts implementations), reference, sampler, bytes moved, and what a
model runs eagerly."""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ..._functions import FunctionTarget
from ..._registry import Call, Unsupported, Variant, random_tensor
from ..._signature import torch_dtype


def bind(module, hidden_states=None, top_k_index=None, top_k_weights=None, *rest, **kwargs):
    """transformers' experts implementation ``grouped_mm_experts_forward(self, hidden_states, top_k_index,
    top_k_weights)``: the weights come from ``self`` (the experts module), the rest from the call."""
    if rest or kwargs:
        raise Unsupported("moe_experts: only (self, hidden_states, top_k_index, top_k_weights)")
    w_gu, w_down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    flags = {name: getattr(module, name, default) for name, default in (
        ("has_gate", True), ("has_bias", False), ("is_transposed", False), ("is_concatenated", True),
        ("_is_expert_parallel", False), ("has_post_expert_norm", False))}
    if flags != {"has_gate": True, "has_bias": False, "is_transposed": False, "is_concatenated": True,
                 "_is_expert_parallel": False, "has_post_expert_norm": False}:
        raise Unsupported(f"moe_experts: experts other than gated, concatenated, unbiased and local ({flags})")
    # NB: earlier transformers 5 releases mark these otherwise: a transposed layout and biases by attribute
    if getattr(module, "experts_are_transposed", False) or any(
            getattr(module, name, None) is not None for name in ("gate_up_proj_bias", "down_proj_bias")):
        raise Unsupported("moe_experts: experts other than gated, concatenated, unbiased and local (transposed or biased)")
    if type(getattr(module, "act_fn", None)).__name__ not in ("SiLU", "SiLUActivation"):
        raise Unsupported("moe_experts: an activation other than SiLU")
    gate = getattr(type(module), "_apply_gate", None)
    if gate is not None and getattr(gate, "__name__", "") != "_default_apply_gate":
        raise Unsupported("moe_experts: a gate of the model's own (not act(gate) * up)")
    tensors = (hidden_states, top_k_index, top_k_weights, w_gu, w_down)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        raise Unsupported("moe_experts: tensor inputs")
    if hidden_states.dim() != 2 or top_k_index.dim() != 2 or top_k_weights.shape != top_k_index.shape \
            or top_k_index.shape[0] != hidden_states.shape[0] or top_k_index.dtype not in (torch.int64, torch.int32):
        raise Unsupported("moe_experts: hidden_states [T, H], top_k_index and top_k_weights [T, K]")
    if w_gu.dtype != hidden_states.dtype or w_down.dtype != hidden_states.dtype:
        raise Unsupported("moe_experts: hidden states and expert weights of one dtype")
    e, two_i, h = w_gu.shape if w_gu.dim() == 3 else (0, 0, 0)
    if h != hidden_states.shape[1] or two_i % 2 or tuple(w_down.shape) != (e, h, two_i // 2):
        raise Unsupported("moe_experts: gate_up_proj [E, 2I, H] and down_proj [E, H, I]")
    return Call(tensors, {"impl": "grouped_mm"})



def reference(x: list, p: dict) -> torch.Tensor:
    """Each token through its K experts, in float32, rounded where transformers' grouped_mm path rounds: each
    expert's gate/up product, act(gate) and its product with up, and the down product to the hidden states'
    dtype; the routing weight's product to the promoted dtype; the sum over the K experts in float32, then the
    hidden states' dtype. An expert index out of [0, E) contributes nothing."""
    h, idx, w, w_gu, w_down = x
    dt = h.dtype
    rd = lambda y: y.to(dt).float()  # noqa: E731
    t, k = idx.shape
    flat, hs = idx.reshape(-1).long(), h.float()
    out = torch.zeros(t * k, h.shape[1], device=h.device)
    inter = w_gu.shape[1] // 2
    for e in torch.unique(flat).tolist():
        if not 0 <= e < w_gu.shape[0]:
            continue
        rows = (flat == e).nonzero()[:, 0]
        gu = rd(hs[rows // k] @ w_gu[e].float().T)
        act = rd(rd(F.silu(gu[:, :inter])) * gu[:, inter:])
        out[rows] = rd(act @ w_down[e].float().T)
    prod = (out * w.reshape(-1, 1).float()).to(torch.promote_types(h.dtype, w.dtype)).float()
    return prod.view(t, k, -1).sum(1).to(dt)


def sample(v: Variant, seed: int, gen: torch.Generator) -> list:
    """Valid values: K distinct experts a token, routing weights that sum to 1, weights scaled by their fan-in."""
    hs, idx_sig, w_sig, gu_sig, dn_sig = v.inputs
    e = gu_sig.shape[0]
    t, k = idx_sig.shape
    h = random_tensor(hs, gen)
    # NB: K distinct experts a token where there are K (topk's), else with repeats
    idx = torch.stack([torch.randperm(e, generator=gen)[:k] if k <= e else torch.randint(0, e, (k,), generator=gen)
                       for _ in range(t)]) if t else torch.zeros(0, k)
    w = torch.rand(t, k, generator=gen) + 0.05
    w = w / w.sum(-1, keepdim=True)
    out = [h]
    for sig, value in ((idx_sig, idx), (w_sig, w)):
        ten = random_tensor(sig, gen)
        ten.copy_(value.to(ten.device))
        out.append(ten)
    for sig in (gu_sig, dn_sig):
        out.append(_expert_weights(sig, gen))
    return out


def _expert_weights(sig, gen: torch.Generator) -> torch.Tensor:
    """One expert weight tensor, every expert random (normal, clamped to 3, scaled by its fan-in). On a GPU the values
    are drawn there, from a generator seeded from ``gen``: the CPU took 12 s a sample for Qwen 3.5's 256 experts.

    NB: every expert, not only those the sample's tokens use: the judge's timed sets take each input from its own
    offset in a pool of samples, so a set's tokens mostly route to experts another sample did not use. Filled with a
    constant, those let a kernel tell them apart and skip their products (review 7: 6.6x and 11.2x "faster" on the
    CPU, no faster on real weights), and honest float32 kernels failed on the cancellation in their sums."""
    scale = sig.shape[-1] ** -0.5
    if not sig.is_contiguous:
        return random_tensor(sig, gen).mul_(scale)
    device = torch.device(sig.device)
    draw = gen if device.type == "cpu" else \
        torch.Generator(device=device).manual_seed(int(torch.randint(0, 2 ** 62, (1,), generator=gen)))
    ten = torch.empty(sig.shape, dtype=torch_dtype(sig.dtype), device=device)
    for e in range(sig.shape[0]):   # NB: an expert at a time: no float32 copy of all of them at once
        ten[e] = torch.randn(sig.shape[1:], generator=draw, device=device).clamp_(-3.0, 3.0).mul_(scale)
    return ten


def _moe_gathered(x: list) -> torch.Tensor:
    """The reference's values without its data-dependent loop (for tracing): each (token, expert) pair's
    weights gathered, T * K matrix-vector products. Memory: T * K copies of an expert's weights."""
    h, idx, w, w_gu, w_down = x
    dt, e, inter = h.dtype, w_gu.shape[0], w_gu.shape[1] // 2
    rd = lambda y: y.to(dt).float()  # noqa: E731
    t, k = idx.shape
    flat = idx.reshape(-1).long()
    valid = ((flat >= 0) & (flat < e)).unsqueeze(-1)
    flat = flat.clamp(0, e - 1)
    hs = h.float().repeat_interleave(k, 0)
    gu = rd(torch.bmm(w_gu[flat].float(), hs.unsqueeze(-1)).squeeze(-1))
    act = rd(rd(F.silu(gu[:, :inter])) * gu[:, inter:])
    down = rd(torch.bmm(w_down[flat].float(), act.unsqueeze(-1)).squeeze(-1)) * valid
    prod = (down * w.reshape(-1, 1).float()).to(torch.promote_types(h.dtype, w.dtype)).float()
    return prod.view(t, k, -1).sum(1).to(dt)


def _traced() -> bool:
    """Whether torch is tracing this call rather than running it: dynamo inlining it, or running it on fake tensors
    (dynamo working out a graph node's output, AOTAutograd tracing the graph), where ``is_compiling()`` is False on
    torch 2.11 (found on the H200: the grouped product's float32 meta check failed there, and the node broke the
    graph)."""
    return torch.compiler.is_compiling() or torch._guards.detect_fake_mode() is not None


def _moe_batched(x: list) -> torch.Tensor:
    """What transformers' batched_mm experts run, from the tensors alone: each (token, expert) pair's weights
    gathered (an index out of range clamped, as there), two batched matrix-vector products, the gate, the routing
    weights and the sum over the K experts."""
    h, idx, w, w_gu, w_down = x
    t, k = idx.shape
    ids = idx.reshape(-1).clamp(0, w_gu.shape[0] - 1)
    gu = torch.bmm(w_gu[ids], h.repeat_interleave(k, dim=0).unsqueeze(-1)).squeeze(-1)
    gate, up = gu.chunk(2, dim=-1)
    down = torch.bmm(w_down[ids], (F.silu(gate) * up).unsqueeze(-1)).squeeze(-1)
    return (down * w.reshape(-1).unsqueeze(-1)).view(t, k, -1).sum(1).to(h.dtype)


def eager(x: list, p: dict) -> torch.Tensor:
    """What transformers' experts implementation that made the call runs, from the tensors alone: batched_mm's
    gathered products (``_moe_batched``), or grouped_mm's sort, gather, grouped products and unsort where this
    torch has the grouped product for them (on the CPU from torch 2.9, bf16 there only with 16-byte strides); the
    reference where it has not."""
    h, idx, w, w_gu, w_down = x
    if p.get("impl") == "batched_mm":
        return _moe_batched(x)
    mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
    if _traced() and not (h.device.type == "cuda" and w_gu.dtype == torch.bfloat16):
        # NB: traced (the graph twin where no kernel replaces it): torch compiles the grouped product for bf16 on
        # CUDA only (as transformers decides), and the reference's loop over the experts used is data-dependent
        return _moe_gathered(x)
    if mm is None or h.device.type not in ("cuda", "cpu"):
        return reference(x, p)
    try:
        t, k = idx.shape
        ids, perm = torch.sort(idx.reshape(-1))
        xs = h[perm // k].to(w_gu.dtype)
        counts = torch.histc(ids.float() if h.device.type == "cpu" else ids.int(), bins=w_gu.shape[0], min=0,
                             max=w_gu.shape[0] - 1)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        gu = mm(xs, w_gu.transpose(-2, -1), offs=offs)
        gate, up = gu.chunk(2, dim=-1)
        down = mm((F.silu(gate) * up).to(w_down.dtype), w_down.transpose(-2, -1), offs=offs)
        weighted = down * w.reshape(-1)[perm].unsqueeze(-1)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel(), device=h.device)
        return weighted[inv].view(t, k, -1).sum(1).to(h.dtype)
    except (RuntimeError, NotImplementedError):   # NB: a dtype, layout or device this torch's grouped product lacks
        return reference(x, p)


def _moe_outputs(result: Any) -> list:
    return [result]


def _moe_result(outs: Sequence[torch.Tensor], params: dict) -> Any:
    return outs[0]


# transformers' experts implementation that a model with grouped_mm experts calls: looked up in its experts
# interface at each call (``ALL_EXPERTS_FUNCTIONS``), so kforge hooks it there too. It takes the experts module
# (self) as its first argument, which no graph node can hold: in a graph kforge compiles its twin takes the bound
# tensors (the weights among them), graph="tensors".
FUNCTIONS = (
    FunctionTarget("transformers.integrations.moe", "grouped_mm_experts_forward", _moe_outputs, _moe_result,
                   mappings=("ALL_EXPERTS_FUNCTIONS._global_mapping",), graph="tensors", fixed=(("impl", "grouped_mm"),)),
    # NB: transformers' generate() decodes with batched_mm on a GPU (grouped_mm for the prompt): found on the H200,
    # where a Qwen 3.5 decode captured no experts card for its one-token steps. The same arguments as grouped_mm's.
    FunctionTarget("transformers.integrations.moe", "batched_mm_experts_forward", _moe_outputs, _moe_result,
                   mappings=("ALL_EXPERTS_FUNCTIONS._global_mapping",), graph="tensors",
                   fixed=(("impl", "batched_mm"),)),
)


def io_bytes(v: Variant) -> int:
    """The bytes a call must move: its tokens, routing and output, and the weights of the experts it uses only
    (at most T * K of the E experts)."""
    hs, idx, w, gu, dn = v.inputs
    t, k = idx.shape
    used = min(t * k, gu.shape[0])
    weights = used * (gu.nbytes + dn.nbytes) // max(gu.shape[0], 1)
    return weights + sum(s.nbytes for s in (hs, idx, w)) + v.outputs[0].nbytes
