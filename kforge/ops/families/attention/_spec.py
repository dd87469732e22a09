"""Attention's binders, references and samples: ``scaled_dot_product_attention`` as torch defines it, and the softmax
attention a model writes out by hand (``softmax_attention``); the shape rules both binders check and both
strategies read (``Geometry``)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..._registry import Call, OpSpec, Unsupported, Variant, get_spec, random_tensor

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Geometry:
    """One attention call's index space: ``lead`` the query's leading dimensions (batch, heads...), ``L`` queries,
    ``S`` keys, ``E`` the query and key width, ``EV`` the value width; ``group`` query heads share one key and value
    head (grouped-query attention: dim -3 of key and value is ``lead[-1] / group``)."""

    lead: tuple[int, ...]
    L: int
    S: int
    E: int
    EV: int
    group: int

    @property
    def rows(self) -> int:
        return math.prod(self.lead) * self.L

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (*self.lead, self.L, self.EV)


def geometry(q, k, v, mask, *, gqa: bool) -> Geometry:
    """The call's ``Geometry`` from the shapes of its tensors (tensors or ``TensorSig``s), or ``Unsupported`` naming
    what kforge's attention kernels do not take."""
    qs, ks, vs = (tuple(t.shape) for t in (q, k, v))
    if not len(qs) == len(ks) == len(vs) >= 3:
        raise Unsupported(f"attention needs query, key and value of one rank, 3 or more (batch..., sequence, width); "
                          f"got {qs}, {ks}, {vs}")
    lead, (L, E), (S, EK), (SV, EV) = qs[:-2], qs[-2:], ks[-2:], vs[-2:]
    if EK != E or SV != S or ks[:-2] != vs[:-2]:
        raise Unsupported(f"key {ks} and value {vs} do not fit query {qs}")
    group = 1
    if ks[:-2] != lead:
        heads, kv_heads = lead[-1], ks[-3] if len(ks) >= 4 else None
        if not (gqa and len(qs) >= 4 and ks[:-3] == lead[:-1] and kv_heads and heads % kv_heads == 0):
            raise Unsupported(f"key's leading dimensions {ks[:-2]} differ from the query's {lead} "
                              "(grouped heads need enable_gqa=True and a head count that divides the query's)")
        group = heads // kv_heads
    if mask is not None:
        ms = tuple(mask.shape)
        full = (*lead, L, S)
        if len(ms) > len(full) or any(m not in (1, f) for m, f in zip(ms[::-1], full[::-1])):
            raise Unsupported(f"attention mask {ms} does not broadcast to {full}")
    return Geometry(tuple(lead), L, S, E, EV, group)


def _dtype_of(t) -> torch.dtype:
    return t.dtype if isinstance(t, torch.dtype) else getattr(torch, t) if isinstance(t, str) else t


def _check_dtypes(q, k, v, mask) -> None:
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise Unsupported("query, key and value must be tensors")
    if q.dtype not in _FLOATS or k.dtype != q.dtype or v.dtype != q.dtype:
        raise Unsupported(f"attention kernels take float32, float16 or bfloat16 query, key and value of one dtype; "
                          f"got {q.dtype}, {k.dtype}, {v.dtype}")
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype not in (torch.bool, *_FLOATS)):
        raise Unsupported("the attention mask must be a boolean or floating tensor")


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


# ----------------------------------------------------------------------------- scaled_dot_product_attention


def bind_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        raise Unsupported("dropout: attention with dropout_p > 0 runs eagerly (kforge's kernels compute inference)")
    _check_dtypes(query, key, value, attn_mask)
    if _needs_grad(query, key, value, attn_mask):
        raise Unsupported("gradients: an attention call that autograd records runs eagerly (no backward kernel)")
    if is_causal and attn_mask is not None:
        raise Unsupported("is_causal with an explicit attn_mask (torch refuses it too)")
    geometry(query, key, value, attn_mask, gqa=bool(enable_gqa))
    return Call((query, key, value, attn_mask),
                {"is_causal": bool(is_causal), "scale": None if scale is None else float(scale),
                 "enable_gqa": bool(enable_gqa)})


def sdpa_reference(x, p):
    kwargs = {"attn_mask": x[3], "is_causal": p["is_causal"], "scale": p["scale"]}
    if p["enable_gqa"]:
        kwargs["enable_gqa"] = True
    return F.scaled_dot_product_attention(x[0], x[1], x[2], **kwargs)


def sample_attention(variant: Variant, seed: int, gen: torch.Generator) -> list:
    """Query, key and value as ``random_tensor`` draws them; a boolean mask keeps about three keys in four (a row of
    a few keys is sometimes fully masked, which the kernels must handle as eager does); an additive mask mixes zeros,
    moderate biases and blocked places (``finfo.min``, as transformers writes them)."""
    spec = get_spec(variant.op)
    out = []
    for name, sig in zip(spec.inputs, variant.inputs):
        if sig is None or name not in ("mask", "attn_mask"):
            out.append(None if sig is None else random_tensor(sig, gen))
            continue
        extent = 1 + sum((n - 1) * st for n, st in zip(sig.shape, sig.stride)) if all(sig.shape) else 1
        draw = torch.rand(extent, generator=gen)
        if sig.dtype == "bool":
            flat = draw < 0.75
        else:
            dtype = getattr(torch, sig.dtype)
            bias = torch.randn(extent, generator=gen)
            flat = torch.where(draw < 0.2, torch.finfo(dtype).min, torch.where(draw < 0.6, 0.0, bias)).to(dtype)
        t = torch.as_strided(flat, sig.shape, sig.stride)
        out.append(t.to(sig.device) if sig.device != "cpu" else t)
    return out


# ----------------------------------------------------------------------------- softmax_attention (written out)


def bind_chain(query, key, value, mask=None, scale=1.0, softcap=None, fill=None):
    """The chain's tensors and scalars: ``scale`` multiplies the scores; ``softcap`` (None: none) caps them as
    ``softcap * tanh(s / softcap)``; a ``mask`` is added (``fill`` None) or, boolean, fills its True places with
    ``fill`` (``masked_fill``)."""
    _check_dtypes(query, key, value, mask)
    if query.dim() != 4:
        raise Unsupported("a written-out attention chain is matched on 4-d query, key and value")
    if mask is not None and (fill is None) == (mask.dtype == torch.bool):
        raise Unsupported("a boolean mask is a masked_fill's, a floating one is added")
    geometry(query, key, value, mask, gqa=False)
    return Call((query, key, value, mask), {"scale": float(scale), "softcap": None if softcap is None else float(softcap),
                                            "fill": None if fill is None else float(fill)})


def _chain_scores(x, p):
    q, k, _, mask = x
    s = torch.matmul(q, k.transpose(2, 3)) * p["scale"]
    if p["softcap"] is not None:
        s = torch.tanh(s / p["softcap"]) * p["softcap"]
    if mask is not None:
        s = s.masked_fill(mask, p["fill"]) if p["fill"] is not None else s + mask
    return s


def chain_reference(x, p):
    """The chain as transformers' eager attention writes it: scores, scaled, soft-capped, masked, a float32 softmax
    rounded to the query's dtype, times the values. Each step rounds to its dtype as eager's operators do."""
    return torch.matmul(F.softmax(_chain_scores(x, p), dim=-1, dtype=torch.float32).to(x[0].dtype), x[2])


def building_blocks(variant: Variant, backend: str) -> str:
    """The LLM proposers' prompt section for an attention card: the problem as attention kernels name it (rows,
    keys, widths, grouped heads, the mask and the numerics eager keeps) and what a kernel can be built from on
    ``backend`` (``proposers._prompt.card_prompt`` adds it where a spec has this method)."""
    q, k, v, mask = variant.inputs
    p = variant.param_dict
    chain = variant.op == "softmax_attention"
    g = geometry(q, k, v, mask, gqa=not chain and bool(p.get("enable_gqa")))
    scale = p.get("scale")
    lines = ["# An attention card",
             f"Index space: {g.rows} query rows (leading dimensions {list(g.lead)} x {g.L} queries), {g.S} keys; "
             f"query and key width {g.E}, value width {g.EV}; per row out = sum_j softmax(s)_j v_j over "
             f"s_j = (q . k_j) * {'1/sqrt(' + str(g.E) + ')' if scale is None else repr(scale)}"
             + (f", soft-capped as {p['softcap']!r} * tanh(s / {p['softcap']!r})" if chain and p.get("softcap") else "")
             + "."]
    if g.group > 1:
        lines.append(f"Grouped-query attention: {g.group} query heads share each key and value head (query head h "
                     f"reads key head h // {g.group}); load each key and value tile once for its group.")
    if len(k.stride) >= 3 and k.stride[-3] == 0 and len(k.shape) >= 3 and k.shape[-3] > 1:
        lines.append("The key and value heads are one head expanded over the query heads (stride 0): every query "
                     "head reads the same keys; load them once.")
    if mask is None:
        lines.append("Mask: " + ("causal (key j is visible to query i where j <= i, top-left aligned as torch's "
                                 "is_causal): skip the key tiles above the diagonal." if p.get("is_causal")
                                 else "none."))
    else:
        kind = ("boolean, True keeps a key" if mask.dtype == "bool" and not chain else
                f"boolean, True places filled with {p.get('fill')!r} (masked_fill)" if mask.dtype == "bool" else
                f"{mask.dtype}, added to the scores")
        lines.append(f"Mask: an input ({kind}; shape {list(mask.shape)}, strides {list(mask.stride)}, broadcast over "
                     "the rest): its values are the model's (a causal or sliding-window mask arrives as one); read it "
                     "as given, never assume its pattern.")
    lines.append("Numerics: scores, the softmax's running maximum and sum, and the output accumulated in float; "
                 + ("a query row with no key left gives zeros, as torch's kernels do; 16-bit inputs: the "
                    "unnormalised probabilities rounded to the input dtype before they weigh the values."
                    if not chain else
                    "each step rounded to its dtype as eager's operators round it (the product, the scaling, the "
                    "soft-capping, the mask), the probabilities normalised in float and rounded to the query's dtype "
                    "before they weigh the values; a row that is -inf everywhere is NaN, as eager's softmax gives."))
    lines.append("Eager: " + ("the SDPA backend torch chose for these inputs (flash, memory-efficient, cuDNN or its "
                              "C++ math)." if not chain else
                              "two batched products around a softmax that writes and reads the whole score matrix "
                              f"({g.L} x {g.S} per head)."))
    if backend == "cuda":
        lines += ["Building blocks on this device (Hopper, sm_90a), beyond the general rules above:",
                  "- The flash algorithm: a block takes a tile of query rows, streams key and value tiles through "
                  "shared memory, keeps the scores in registers with an online softmax (running maximum and sum, the "
                  "accumulator rescaled when the maximum grows); the score matrix is never written.",
                  "- Tensor cores through CuTe (`cute/...` headers, CUTLASS 3.x): mma.sync or wgmma with 16-bit "
                  "operands and float accumulation for the two products; TMA or cp.async to bring key and value "
                  "tiles in, double-buffered. float32 inputs: float FMAs only (no TF32: the tolerance refuses it). "
                  "Build flags: -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr.",
                  "- Tile sizes (query rows, keys a tile), warps, stages and whether a block serves a group of query "
                  "heads are the knobs; a row tile whose keys are all masked can be skipped only where the mask's "
                  "values say so."]
    else:
        lines.append("On the CPU no library beyond OpenMP is allowed: rows in parallel, the dot products vectorised "
                     "along the width, key blocks that stay in cache, the online softmax per row.")
    return "\n".join(lines)


class AttentionSpec(OpSpec):
    """``scaled_dot_product_attention``'s spec: an OpSpec whose prompt names attention's building blocks."""

    def building_blocks(self, variant: Variant, backend: str) -> str:
        return building_blocks(variant, backend)


class ChainSpec(AttentionSpec):
    """``softmax_attention``'s spec: its tolerance, argued here, and the operator calls a chain stands for."""

    def tolerance(self, dtype: str) -> tuple[float, float]:
        # NB: float32: another summation order of E products moves a score by ~sqrt(E) x 6e-8 of its size, and the
        # softmax and the value sum keep that scale; scores from TF32 operands (10-bit) move 100x more, refused
        if dtype == "float32":
            return (1e-4, 1e-4)
        return super().tolerance(dtype)

    def replay(self, x, p):
        """The operator calls one chain stands for (``regions.covered_op_calls``), its softmax as both spellings
        write it: in float32 (transformers' ``dtype=torch.float32``) and in the scores' dtype (plain code), which a
        float32 graph cannot tell apart. Only the spelling the model used has an operator card to cover."""
        s = _chain_scores(x, p)
        F.softmax(s, dim=-1)
        return torch.matmul(F.softmax(s, dim=-1, dtype=torch.float32).to(x[0].dtype), x[2])


def score_dtype(variant: Variant) -> str:
    """The dtype of the chain's scores after the mask (an added float32 mask promotes 16-bit scores)."""
    q, mask, fill = variant.inputs[0], variant.inputs[3], variant.param_dict.get("fill")
    if mask is None or fill is not None or mask.dtype == q.dtype:
        return q.dtype
    return str(torch.promote_types(_dtype_of(mask.dtype), _dtype_of(q.dtype))).replace("torch.", "")
