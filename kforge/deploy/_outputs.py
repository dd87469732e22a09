"""Whether a model's output is eager's: the relative difference on its first output tensor, and the rule every
model-level check holds it to (the end-to-end table, ``Session.compile``'s check, the rewrites' checks at apply and
at ``kforge.load``)."""
from __future__ import annotations

from typing import Any

import torch


def first_tensor(obj: Any) -> torch.Tensor | None:
    from ..store import iter_tensors

    return next(iter(iter_tensors(obj)), None)


def relative_difference(a: Any, b: Any, model: Any = None) -> float | None:
    """||b - a|| / ||a|| on the first output tensor. Where ``model`` has ``same_context(a, b)`` (a
    decoding, ``kforge.models.Generate``), only the part of the outputs computed from the same context
    is compared: two greedy decodings that part at a near-tie continue different texts."""
    ta, tb = first_tensor(a), first_tensor(b)
    # NB: a method of the model's class (a submodule a user model happens to name so is not one)
    if callable(getattr(type(model), "same_context", None)) and ta is not None and tb is not None:
        ta, tb = model.same_context(ta, tb)
    if ta is None or tb is None or ta.shape != tb.shape:
        return None
    ta, tb = ta.double(), tb.double()
    return float((ta - tb).norm() / ta.norm().clamp_min(1e-30))


def output_tolerance(reference: Any, model: Any = None) -> float:
    """How far (relative L2, first output tensor) a model with kernels may move from eager's output
    beyond what its plain baseline moves: each kernel was checked against eager per call, so this
    catches what a per-call check cannot (a kernel placed where its call's check did not reach).

    The precision is the model's where ``model`` is a module computing in bfloat16 or float16 that
    casts its output to float32 (a language model's logits): its kernels were checked to half
    precision's tolerance, so its output is held to that, not to float32's."""
    t = first_tensor(reference)
    if t is None:
        return float("inf")
    half = t.dtype not in (torch.float32, torch.float64)
    if not half and isinstance(model, torch.nn.Module):
        half = any(p.dtype in (torch.bfloat16, torch.float16) for p in model.parameters())
    return 5e-2 if half else 1e-3


def wrong_output(diff: float | None, plain_diff: float | None, reference: Any, baseline: str,
                 err64: float | None = None, plain_err64: float | None = None, model: Any = None) -> str | None:
    """Why a kernel set's output is not the model's (None: it is): its difference from eager's output
    beyond twice the baseline's own difference and the dtype's tolerance, or not a number.

    With ``err64`` and ``plain_err64`` (the set's and the baseline's difference from the output
    computed in float64) those are compared instead: a deep model in bfloat16 with random weights
    amplifies rounding until eager's own output is far from the true one (Gemma 4 E2B, 35 layers: 0.78
    from float64 on a CPU), so a difference from eager says little; the distance from the truth does."""
    if err64 is not None and plain_err64 is not None:
        allowed = max(2.0 * plain_err64, output_tolerance(reference, model))
        if err64 <= allowed:   # NB: a NaN fails this
            return None
        return (f"with them the output differs from the float64 model's by {err64:.1e} (relative), {baseline} "
                f"by {plain_err64:.1e}; at most {allowed:.1e} is allowed")
    if diff is None:
        return None
    allowed = max(2.0 * (plain_diff or 0.0), output_tolerance(reference, model))
    if diff <= allowed:   # NB: a NaN fails this
        return None
    return (f"with them the output differs from eager's by {diff:.1e} (relative), {baseline} by "
            f"{plain_diff or 0.0:.1e}; at most {allowed:.1e} is allowed")
