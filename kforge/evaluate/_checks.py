"""Comparing a candidate's outputs with eager's: dtype-aware tolerances, NaN/Inf, exact integers."""
from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Sequence

import torch

from ..ops import OpSpec

@dataclass(frozen=True)
class Mismatch:
    ok: bool
    message: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    fraction: float = 0.0


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.numel() else t


def _within(out: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float, stats: bool) -> Mismatch | None:
    """The common case in a few passes: every element of a finite reference within tolerance.

    None when it is not (or eager has NaN/Inf): the full comparison then says what is wrong.
    NB: float32 arithmetic for float32 and narrower outputs (float64 only for float64): the
    difference of two float32 values within 2x of each other is exact, and the bound is off by
    1e-7 of itself at most, far inside every tolerance; a failure here is decided in float64.
    """
    work = torch.float64 if ref.dtype == torch.float64 else torch.float32
    r, o = ref.to(work), out.to(work)          # NB: may be ``ref`` itself: nothing below writes into r
    if not r.numel():
        return Mismatch(True, "")
    size = r.abs()
    scale = float(size.max())
    if not math.isfinite(scale):
        return None
    scale = scale or 1.0
    err = torch.sub(o, r).abs_()
    if not bool(torch.sub(err, size, alpha=rtol).le_(atol * scale).all()):   # NaN (never written) fails too
        return None
    if not stats:
        return Mismatch(True, "")
    return Mismatch(True, "", float(err.max()), float(err.div_(size.add_(atol * scale)).max()), 0.0)


def compare(spec: OpSpec, out: torch.Tensor, ref: torch.Tensor, name: str, *, stats: bool = True) -> Mismatch:
    """Compare one output with eager's, with dtype-aware tolerances relative to the reference's scale.

    ``stats=False``: a passing comparison skips its error statistics (the timed calls' checks).
    """
    if out.shape != ref.shape:
        return Mismatch(False, f"{name}: shape {tuple(out.shape)} but eager gives {tuple(ref.shape)}")
    if not out.dtype.is_floating_point:
        bad = (out != ref)
        n = int(bad.sum())
        return Mismatch(n == 0, f"{name}: {n} of {ref.numel()} elements differ (exact match required)" if n else "",
                        fraction=n / max(ref.numel(), 1))
    rtol, atol = spec.tolerance(str(ref.dtype).replace("torch.", ""))
    quick = _within(out, ref, rtol, atol, stats) 
    if quick is not None:
        return quick
    o, r = out.double(), ref.double()
    ref_finite = torch.isfinite(r)
    out_finite = torch.isfinite(o)
    nonfinite = ~out_finite & ref_finite
    if bool(nonfinite.any()):
        n = int(nonfinite.sum())
        return Mismatch(False, f"{name}: {n} of {ref.numel()} elements are NaN/Inf (or never written) where "
                        f"eager's are finite", float("inf"), float("inf"), n / ref.numel())
    special = ~ref_finite
    if bool(special.any()):
        same = (o[special] == r[special]) | (torch.isnan(o[special]) & torch.isnan(r[special]))
        if not bool(same.all()):
            return Mismatch(False, f"{name}: eager's NaN/Inf elements are not reproduced")
    if not bool(ref_finite.any()):
        return Mismatch(True, "")
    rf, of = r[ref_finite], o[ref_finite]
    scale = float(rf.abs().max()) or 1.0
    err = (of - rf).abs()
    bound = rtol * rf.abs() + atol * scale
    bad = err > bound
    max_abs = float(err.max())
    max_rel = float((err / (rf.abs() + atol * scale)).max())
    n = int(bad.sum())
    if n:
        worst = int(torch.argmax(err - bound))
        return Mismatch(False, f"{name}: {n} of {rf.numel()} elements outside tolerance (rtol {rtol:g}, atol "
                        f"{atol:g} x scale {scale:.3g}); max abs error {max_abs:.3g}, max rel error {max_rel:.3g}; "
                        f"worst: got {float(of[worst]):.6g}, eager {float(rf[worst]):.6g}",
                        max_abs, max_rel, n / rf.numel())
    return Mismatch(True, "", max_abs, max_rel, 0.0)


#: Above this many bytes of float32 work a batch is checked set by set (no stacked copy).
_STACKED_CHECK_BYTES = 256 << 20


def within_sets(spec: OpSpec, got: torch.Tensor, refs: Sequence[torch.Tensor]) -> bool:
    """Whether every set of a batch, ``got[j]``, is within tolerance of eager's ``refs[j]``, each with
    its own scale: ``compare``'s quick test for a whole batch, in a few passes and one device sync.

    True only where ``compare`` would pass every set; False says nothing (compare set by set: it
    decides, and says what is wrong). NB: on CUDA the set-by-set test cost two syncs and ten
    launches per set, more than the candidate's own calls in a timed batch.
    """
    k = len(refs)
    if (not k or got.shape[0] != k or not got.dtype.is_floating_point
            or any(r.shape != got.shape[1:] or r.dtype != got.dtype or r.device != got.device for r in refs)):
        return False
    if got[0].numel() == 0:
        return True
    work = torch.float64 if got.dtype == torch.float64 else torch.float32
    if got.numel() * torch.empty((), dtype=work).element_size() * 3 > _STACKED_CHECK_BYTES:
        return False
    rtol, atol = spec.tolerance(str(got.dtype).replace("torch.", ""))
    r = torch.stack([x.to(work) for x in refs]).reshape(k, -1)
    o = got.to(work).reshape(k, -1)
    size = r.abs()
    scale = size.amax(dim=1, keepdim=True)
    finite = torch.isfinite(scale).all()
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    err = torch.sub(o, r).abs_()
    bound = (scale.to(torch.float64) * atol).to(work)   # NB: rounded as compare's float bound is
    ok = err.sub_(size, alpha=rtol).le_(bound).all()    # NB: NaN (never written) fails too
    return bool(ok & finite)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.stride() == b.stride() and bool(torch.equal(_bits(a), _bits(b)))


def reference_outputs(spec: OpSpec, inputs: Sequence, params: dict) -> list[torch.Tensor]:
    with torch.no_grad():
        out = spec.reference(list(inputs), params)
    return list(out) if isinstance(out, (tuple, list)) else [out]
