"""A deployment plan's kernels made ready in this process: built for the evaluator's architecture, each served by
its sandboxed worker (CPU) or replayed from its recorded launch plan (CUDA), then re-checked here against eager.
Each step only narrows the plan (``_deployment_plan``): what it drops is left out with why."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from ._artifact import build_kernels
from ._deployment import Deployment
from ._deployment_plan import DeploymentPlan, LeftBy, LeftOut, left_out
from ._launch import DeployedKernel, deploy_winners
from ._recheck import example_paths_of, refuse_failing

if TYPE_CHECKING:
    from ..store import Store


@dataclass(frozen=True)
class ReadyKernels:
    """A plan's kernels made ready in this process: ``kernels`` (DeployedKernels, in the plan's order) and ``plan``,
    the plan less those that could not be made ready (each in its ``left_out`` with why)."""

    kernels: tuple[DeployedKernel, ...]
    plan: DeploymentPlan

    @property
    def expected_savings_us(self) -> list[float]:
        """Per kernel, in order: its plan's saving per forward (``PlannedKernel.saving_per_forward_us``)."""
        return [self.plan.kernel(dk.variant.key).saving_per_forward_us for dk in self.kernels]

    @property
    def skipped(self) -> list[tuple[str, str]]:
        return self.plan.skipped

    def leaving_out(self, left: Iterable[LeftOut]) -> "ReadyKernels":
        """These less the kernels of ``left`` (by signature)."""
        left = tuple(left)
        gone = {lo.signature for lo in left}
        return ReadyKernels(tuple(dk for dk in self.kernels if dk.variant.signature not in gone),
                            self.plan.leaving_out(left))

    def deployment(self, model: Any) -> Deployment:
        """These kernels as a (not yet installed) ``Deployment`` for ``model`` (None: process-wide), its ``skipped``
        the plan's ``left_out``."""
        return Deployment(list(self.kernels), model, self.plan.skipped)


def make_ready(plan: DeploymentPlan, evaluator: Any = None, store: "Store | None" = None) -> ReadyKernels:
    """The plan's kernels built for ``evaluator``'s architecture and made ready in this process: a CPU kernel served by
    a sandboxed worker, a CUDA kernel replayed from the launch plan ``evaluator`` records (``_replay``); then each
    re-checked here against eager on its card's captured examples (from ``store``) and fresh inputs (``_recheck``).
    Those that cannot be replayed or fail the re-check are left out, each with why. ``evaluator`` is needed only
    where the plan has kernels."""
    if not plan.kernels:
        return ReadyKernels((), plan)
    exported = build_kernels(plan, evaluator)
    cuda = any(k.variant.device.startswith("cuda") for k in plan.kernels)
    kernels, unreplayable = deploy_winners(exported, evaluator if cuda else None,
                                           lambda v: _example_names(store, v.key))
    ready = ReadyKernels(tuple(kernels), plan).leaving_out(left_out(unreplayable, LeftBy.REPLAY))
    kept, refused = refuse_failing(list(ready.kernels), lambda v: example_paths_of(store, v.key))
    return ReadyKernels(tuple(kept), ready.plan).leaving_out(left_out(refused, LeftBy.RECHECK))


def _example_names(store: "Store | None", key: str) -> list[tuple[list[str | None], list[str]]]:
    """A card's captured examples as the evaluator's jobs carry them (``Evaluator.examples_for``): file names."""
    return [([None if p is None else str(p) for p in ins], [str(p) for p in outs])
            for ins, outs in example_paths_of(store, key)]
