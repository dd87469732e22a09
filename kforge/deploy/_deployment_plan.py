"""The deployment plan: which winners a deployment installs, what each is expected to save per forward, and which
were left on eager and why.

It is computed once, by ``choose``: from a session's verdicts (``plan_deployment``) or from an exported artifact's
manifest (``_artifact.plan_of_artifact``, which reads back what ``PlannedKernel.to_json`` wrote), and every consumer
reads it: ``Session.apply``, ``compile``, ``end_to_end``, ``export`` and ``kforge.load``. The steps after it (building,
replaying, the re-check in this process, the model-level checks) only narrow it (``DeploymentPlan.leaving_out``), each
kernel they drop with a ``LeftOut`` that says why.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..ops import Card, Variant
from ._select import DispatchCost, _patched_eagerly, dispatch_cost

if TYPE_CHECKING:
    from ..store import Store


@dataclass(frozen=True)
class PlannedKernel:
    """One winner of a deployment plan: its card's variant, the winning candidate's source, and one call's eager and
    kernel time, both from the card's verdict (the same evaluation's timings, pooled).

    ``eager_us`` is the judge's eager time (the capture's time of the card where the verdict has none);
    ``kernel_us`` the verdict's kernel time, or ``eager_us / winner_speedup`` where it has none: the kernel's time is
    always read against the same eager time, so the saving never mixes two baselines. Both are None only for a
    kernel read from an artifact written before they were recorded (it is never filtered).
    """

    variant: Variant
    source: str
    candidate_id: int | None
    winner_speedup: float | None   # the card's speedup (its verdict's), the figure the tables show
    calls: int                     # this variant's calls per forward
    op_calls: int                  # its operator's calls per forward, every variant (those without a kernel pay a miss)
    eager_us: float | None
    kernel_us: float | None

    @property
    def key(self) -> str:
        return self.variant.key

    @property
    def op(self) -> str:
        return self.variant.op

    @property
    def signature(self) -> str:
        return self.variant.signature

    @property
    def timed(self) -> bool:
        """Whether the plan can weigh it (its calls and both times are known)."""
        return bool(self.calls) and self.eager_us is not None and self.kernel_us is not None

    @property
    def saving_per_forward_us(self) -> float:
        """What it is expected to save in one forward: calls x (eager - kernel); 0 where it is not ``timed``. The
        model-level check ranks kernels by it."""
        if not self.timed:
            return 0.0
        return self.calls * (self.eager_us - self.kernel_us)   # type: ignore[operator]

    @classmethod
    def of_verdict(cls, card: Card, verdict: Any, candidate: Any, op_calls: int) -> "PlannedKernel":
        """A card's winner (``verdict``, a ``CardVerdict`` with a winner; ``candidate``, its winning ``Candidate``)."""
        eager = verdict.eager_us or card.eager_us
        kernel = verdict.kernel_us or eager / max(verdict.winner_speedup or 1.0, 1e-9)
        return cls(card.variant, candidate.source, candidate.id, verdict.winner_speedup, card.calls, op_calls,
                   eager, kernel)

    def to_json(self) -> dict[str, Any]:
        """Its fields in an artifact's manifest entry (the source goes to a file of its own); ``from_json`` reads
        them back."""
        return {"variant": self.variant.to_json(), "signature": self.signature, "candidate_id": self.candidate_id,
                "speedup": self.winner_speedup, "calls": self.calls, "eager_us": self.eager_us,
                "kernel_us": self.kernel_us, "op_calls": self.op_calls}

    @classmethod
    def from_json(cls, entry: dict[str, Any], source: str) -> "PlannedKernel":
        """The inverse of ``to_json`` (a manifest entry and the source its file holds). An entry without times (an
        artifact older than them) gives an untimed kernel; a zero time is no time (those artifacts wrote 0)."""
        return cls(Variant.from_json(entry["variant"]), source, entry.get("candidate_id"), entry.get("speedup"),
                   entry.get("calls") or 0, entry.get("op_calls") or 0, entry.get("eager_us") or None,
                   entry.get("kernel_us") or None)


class LeftBy(enum.Enum):
    """The step that left a winner on eager."""

    DISPATCH_COST = "dispatch cost"       # saves less per forward than patching its operator costs the host
    BUILD = "build"                       # does not build for this machine (an artifact from another target)
    REVALIDATION = "revalidation"         # an artifact's kernel re-judged on this machine, and failed
    REPLAY = "replay"                     # a CUDA kernel with no launch plan to replay
    RECHECK = "re-check"                  # called in this process before install, and wrong or failing
    GRAPH_FORWARD = "graph forward"       # its captured forward did not make the model measurably faster


@dataclass(frozen=True)
class LeftOut:
    """A winner left on eager: its signature, the step that left it out, and why in the user's words (the reason
    ``Deployment.skipped`` shows)."""

    signature: str
    by: LeftBy
    reason: str


@dataclass(frozen=True)
class DeploymentPlan:
    """What a deployment installs (``kernels``, in install order) and what it leaves on eager (``left_out``, each with
    why). ``dispatch_cost``: the cost the dispatch filter weighed the winners against (None: not filtered,
    ``all_winners=True``, or nothing to weigh)."""

    kernels: tuple[PlannedKernel, ...]
    left_out: tuple[LeftOut, ...] = ()
    dispatch_cost: DispatchCost | None = None

    def kernel(self, key: str) -> PlannedKernel:
        """The planned kernel of the variant ``key``."""
        for k in self.kernels:
            if k.key == key:
                return k
        raise KeyError(f"the plan has no kernel for the variant {key}; its kernels: {[k.key for k in self.kernels]}")

    def leaving_out(self, left: Iterable[LeftOut]) -> "DeploymentPlan":
        """This plan less the kernels of ``left`` (by signature), which join ``left_out`` in their order."""
        left = tuple(left)
        if not left:
            return self
        gone = {lo.signature for lo in left}
        return replace(self, kernels=tuple(k for k in self.kernels if k.signature not in gone),
                       left_out=self.left_out + left)

    @property
    def skipped(self) -> list[tuple[str, str]]:
        """``left_out`` as ``Deployment.skipped`` and ``EndToEnd.skipped`` list it: (signature, reason)."""
        return [(lo.signature, lo.reason) for lo in self.left_out]


def choose(winners: Sequence[PlannedKernel], *, device: str, all_winners: bool = False,
           dispatch_cost_given: DispatchCost | None = None) -> DeploymentPlan:
    """The deployment plan of ``winners``: every one with ``all_winners``, else an operator's winners only if, per
    forward, they save more than patching it costs the host.

    Patching an operator puts every call of it behind the guard, so the cost counts all its calls: the dispatched
    ones pay the hit cost, the others (``op_calls`` less those) the miss cost. Region kernels patch nothing and are
    kept, as are kernels the plan cannot weigh (``PlannedKernel.timed``). The cost is ``dispatch_cost_given``, else
    ``KFORGE_DISPATCH_COST``, else measured in this process (``_select.dispatch_cost``), and only where something is
    weighed. The kept kernels come in the winners' order, those that were weighed after those that were not, grouped
    by operator (each operator where its first winner stood).
    """
    winners = list(winners)
    timed = [w for w in winners if w.timed]
    if all_winners or not timed:
        return DeploymentPlan(tuple(winners))
    cost = dispatch_cost(device, dispatch_cost_given)
    by_op: dict[str, list[PlannedKernel]] = {}
    for w in timed:
        by_op.setdefault(w.op, []).append(w)
    kept, left = [w for w in winners if not w.timed], []
    for op, ws in by_op.items():
        if not _patched_eagerly(op):
            kept.extend(ws)
            continue
        hits = sum(w.calls for w in ws)
        op_calls = max(max(w.op_calls for w in ws), hits)
        saving = sum(w.saving_per_forward_us for w in ws)
        overhead = hits * cost.hit_us + (op_calls - hits) * cost.miss_us
        if saving > overhead:
            kept.extend(ws)
            continue
        why = (f"saves {saving:.1f} us per forward but dispatching {op} costs about {overhead:.1f} us "
               f"({op_calls} calls); apply(all_winners=True) installs it anyway")
        left.extend(LeftOut(w.signature, LeftBy.DISPATCH_COST, why) for w in ws)
    return DeploymentPlan(tuple(kept), tuple(left), cost)


def plan_deployment(cards: Iterable[Card], store: "Store", *, device: str, all_winners: bool = False,
                    dispatch_cost: DispatchCost | None = None) -> DeploymentPlan:
    """The deployment plan of a session: each card's winner (in the cards' order) with one call's times from its
    verdict, through ``choose``."""
    cards = list(cards)
    verdicts = store.results()
    op_calls: dict[str, int] = {}
    for card in cards:
        op_calls[card.op] = op_calls.get(card.op, 0) + card.calls
    winners = []
    for card in cards:
        v = verdicts.get(card.key)
        if v is not None and v.status.has_winner:
            winners.append(PlannedKernel.of_verdict(card, v, store.candidate(v.winner_id), op_calls[card.op]))
    return choose(winners, device=device, all_winners=all_winners, dispatch_cost_given=dispatch_cost)


def left_out(pairs: Iterable[tuple[str, str]], by: LeftBy) -> list[LeftOut]:
    """The (signature, reason) pairs a step of deploy reports (``_replay``, ``_recheck``) as ``LeftOut`` records."""
    return [LeftOut(signature, by, reason) for signature, reason in pairs]
