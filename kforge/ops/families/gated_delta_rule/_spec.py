"""gated_delta_rule: its binders (transformers' chunked and token-by-token functions), reference, sampler, and what
a model runs eagerly."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ..._functions import FunctionTarget
from ..._registry import Call, Unsupported, Variant, random_tensor


def bind(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, *, cu_seqlens=None, scale=None, **_k):
    # NB: chunk_size only orders the arithmetic; packed sequences (cu_seqlens) and another scale change the result
    if cu_seqlens is not None or scale is not None:
        raise Unsupported("gated delta rule: packed sequences (cu_seqlens) or a scale other than Dk^-0.5")
    if not all(isinstance(t, torch.Tensor) for t in (query, key, value, g, beta)) or not (
            initial_state is None or isinstance(initial_state, torch.Tensor)):
        raise Unsupported("gated delta rule: tensor inputs")
    if query.dim() != 4 or key.shape != query.shape or value.dim() != 4 or value.shape[:2] != query.shape[:2]:
        raise Unsupported("gated delta rule: query and key [B, T, Hk, Dk], value [B, T, Hv, Dv]")
    if value.shape[2] % key.shape[2] or tuple(g.shape) != tuple(value.shape[:3]) or tuple(beta.shape) != tuple(g.shape):
        raise Unsupported("gated delta rule: Hv a multiple of Hk, g and beta [B, T, Hv]")
    return Call((query, key, value, g, beta, initial_state),
                {"use_qk_l2norm": bool(use_qk_l2norm_in_kernel), "output_final_state": bool(output_final_state)})


def _bind_recurrent_gated_delta_rule(query, key, value, g, beta, initial_state=None, output_final_state=False,
                                     use_qk_l2norm_in_kernel=False, **kwargs):
    # transformers' token-by-token form (what its layers call for a one-token step on a cache): the chunked
    # function's arguments but chunk_size
    return bind(query, key, value, g, beta, initial_state=initial_state,
                                  output_final_state=output_final_state,
                                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)


def reference(x: list, p: dict):
    """The gated delta rule token by token, in float32: per value head a state S [Dk, Dv] decays by exp(g_t),
    corrects its prediction of v_t from k_t by beta_t (the delta rule) and is read by q_t scaled by Dk^-0.5
    (query and key L2-normalised first when ``use_qk_l2norm``; key heads shared by Hv / Hk value heads)."""
    q, k, v, g, beta, s0 = x
    b, t, hk, dk = k.shape
    hv, dv = v.shape[-2:]
    q, k = (y.float().repeat_interleave(hv // hk, dim=2) for y in (q, k))
    if p["use_qk_l2norm"]:
        q, k = (y * torch.rsqrt((y * y).sum(-1, keepdim=True) + 1e-6) for y in (q, k))
    q = q * dk ** -0.5
    v, g, beta = v.float(), g.float(), beta.float()
    state = torch.zeros(b, hv, dk, dv, device=v.device) if s0 is None else s0.float().clone()
    out = torch.empty(b, t, hv, dv, device=v.device)
    for i in range(t):
        state = state * g[:, i].exp()[..., None, None]
        delta = (v[:, i] - (state * k[:, i, :, :, None]).sum(-2)) * beta[:, i, :, None]
        state = state + k[:, i, :, :, None] * delta[:, :, None, :]
        out[:, i] = (state * q[:, i, :, :, None]).sum(-2)
    out = out.to(x[0].dtype)
    return (out, state) if p["output_final_state"] else out


def sample(v: Variant, seed: int, gen: torch.Generator) -> list:
    """Valid values as the models make them: g (a log decay) at most 0, each head's about its own rate, from 1e-3 (a
    step keeps 99.9% of the state: the long memory of a model's slow heads) to 1; beta in (0, 1); k of unit norm
    where the call does not normalise it (a model normalises it itself: an unnormalised k makes the recurrence
    overflow, and a check of inf against inf says little); a small initial state.

    NB: a decay of 0.5 a step for every head (as this sampler drew before) forgot a token within 32 steps, and a kernel
    that restarted its state every 32 tokens passed (review 7)."""
    q, k, val, g, beta, s0 = (None if s is None else random_tensor(s, gen) for s in v.inputs)
    rate = 10.0 ** (torch.rand(g.shape[0], 1, *g.shape[2:], generator=gen) * 3.0 - 3.0)
    g.copy_(-(rate * (0.25 + 0.5 * torch.rand(g.shape, generator=gen))))
    beta.copy_(torch.sigmoid(beta.float()))
    if not v.param_dict.get("use_qk_l2norm", True):
        k.copy_(k.float() / k.float().norm(dim=-1, keepdim=True).clamp_min(1e-6))
    if s0 is not None:
        s0.copy_(s0.float() * 0.1)
    return [q, k, val, g, beta, s0]


def _gdn_outputs(result: Any) -> list:
    out, state = result
    return [out] if state is None else [out, state]


def _gdn_result(outs: Sequence[torch.Tensor], params: dict) -> Any:
    return (outs[0], outs[1] if params.get("output_final_state") else None)


# transformers' models whose linear attention layers call it (the same signatures and return values in each):
# the chunked function for a prompt, the token-by-token one for a one-token step on a cache (decode)
_GDN_MODELS = ("qwen3_5_moe", "qwen3_5", "qwen3_next")
_GDN_CHUNK, _GDN_RECURRENT = "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"
FUNCTIONS = tuple(
    FunctionTarget(f"transformers.models.{m}.modeling_{m}", name, _gdn_outputs, _gdn_result,
                   bind=_bind_recurrent_gated_delta_rule if name == _GDN_RECURRENT else None)
    for name in (_GDN_CHUNK, _GDN_RECURRENT) for m in _GDN_MODELS)

_GDN_IMPORTED: list = []


def _gdn_function(name: str):
    """transformers' function ``name`` (the original, where kforge hooks it), imported here if no model did (a
    judge's process), or None without transformers."""
    targets = [t for t in FUNCTIONS if t.name == name]
    for target in targets:
        fn = target.resolve()
        if fn is not None:
            return getattr(fn, "kforge_original", fn)
    if not _GDN_IMPORTED:
        _GDN_IMPORTED.append(True)
        import importlib

        for target in targets:
            try:
                importlib.import_module(target.module)
                return _gdn_function(name)
            except Exception:   # NB: no transformers, or one without these models: the reference is eager
                continue
    return None


def eager(x: list, p: dict):
    """What a Qwen 3.5 model runs eagerly, chosen as its layers choose: transformers' token-by-token function for
    one token on a state (a decode step), else its chunked one (a 64-token chunk loop of float32 matrix
    products); the reference where transformers is missing."""
    q, k, v, g, beta, s0 = x
    fn = _gdn_function(_GDN_RECURRENT if s0 is not None and q.shape[1] == 1 else _GDN_CHUNK)
    if fn is None:
        return reference(x, p)
    out, state = fn(q, k, v, g=g, beta=beta, initial_state=s0, output_final_state=p["output_final_state"],
                    use_qk_l2norm_in_kernel=p["use_qk_l2norm"])
    return (out, state) if p["output_final_state"] else out
