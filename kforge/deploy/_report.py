"""The end-to-end report: the model's forward with and without kforge, with and without torch.compile."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..evaluate import bench


@dataclass(frozen=True)
class EndToEnd:
    """Forward latencies (median, us) of one batch, all measured in one run, and the output check."""

    eager_us: float
    kforge_us: float
    compile_us: float | None
    compile_kforge_us: float | None
    output_rel_diff: float | None          # ||kforge - eager|| / ||eager|| on the first output tensor
    kernels_installed: int
    skipped: list[tuple[str, str]] = field(default_factory=list)
    dispatch: str | None = None            # "C" or "Python": the path applied kernels were called through

    @property
    def speedup(self) -> float:
        return self.eager_us / self.kforge_us

    def table(self) -> str:
        ms = lambda us: "-" if us is None else f"{us / 1e3:8.3f} ms"  # noqa: E731
        lines = [f"eager              {ms(self.eager_us)}",
                 f"eager + kforge     {ms(self.kforge_us)}  ({self.speedup:.3f}x, {self.kernels_installed} kernels"
                 + (f", {self.dispatch} dispatch)" if self.dispatch else ")"),
                 f"torch.compile      {ms(self.compile_us)}",
                 f"compile + kforge   {ms(self.compile_kforge_us)}"]
        if self.output_rel_diff is not None:
            lines.append(f"output relative difference with kforge: {self.output_rel_diff:.2e}")
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.table())


def forward_us(fn: Callable[[], Any], device: str) -> float:
    """Median latency of a whole forward pass (warm caches: the model's own steady state)."""
    with torch.no_grad():
        return bench(fn, device=device, flush_l2=False, warmup=3, budget_ms=1000, min_reps=10, max_reps=200).median_us


def first_tensor(obj: Any) -> torch.Tensor | None:
    from ..store import iter_tensors

    return next(iter(iter_tensors(obj)), None)


def relative_difference(a: Any, b: Any) -> float | None:
    ta, tb = first_tensor(a), first_tensor(b)
    if ta is None or tb is None or ta.shape != tb.shape:
        return None
    ta, tb = ta.double(), tb.double()
    return float((ta - tb).norm() / ta.norm().clamp_min(1e-30))
