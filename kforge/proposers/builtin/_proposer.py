"""The built-in proposer: picks and revises strategies from evaluation feedback, no network."""
from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from .._base import Attempt, Proposal, ProposalRequest, ProposerError, ProposerExhausted
from ...evaluate import Status
from ...kernels import DeviceInfo
from ...ops import Variant
from ._strategy import Config, Strategy, get_strategy, strategies_for

# Failures that condemn the strategy for this variant (as opposed to one unlucky configuration).
_BROKEN = (Status.COMPILE_ERROR, Status.WRONG_RESULT, Status.CRASHED)


def _key(strategy: str | None, config: dict[str, Any]) -> tuple[str | None, str]:
    return strategy, json.dumps(config, sort_keys=True, default=str)


class BuiltinProposer:
    """Proposes kernels from the built-in strategy library.

    First proposal: the most promising applicable strategy with its default configuration.
    Revisions: after a failure, another strategy (or, for launch errors and time-outs, another
    configuration of the same one); after a success, one tunable parameter moved to an untried
    neighbouring value, or a step up to a higher-level strategy. Never repeats a tried
    (strategy, config) while an untried one exists; deterministic for a given request seed.
    """

    name = "builtin"
    instant = True  # answers at once: the search proposes sequentially and overlaps only compiles

    def ranked(self, variant: Variant, device: DeviceInfo) -> list[Strategy]:
        """Applicable strategies, most promising first."""
        found = [s for s in strategies_for(variant.op, device.backend) if s.applies(variant, device)]
        return sorted(found, key=lambda s: (-s.fit(variant, device), -s.level, s.name))

    def space_size(self, card, device: DeviceInfo) -> int:
        """How many distinct (strategy, config) candidates exist for ``card`` on ``device``."""
        return sum(len(list(s.configs(card.variant, device))) for s in self.ranked(card.variant, device))

    def propose(self, request: ProposalRequest) -> Proposal:
        variant, device = request.card.variant, request.device
        ranked = self.ranked(variant, device)
        if not ranked:
            raise ProposerError(
                f"no built-in strategy handles {variant.signature} on {device.backend} "
                f"(layout or dtype not covered); the card stays on eager — try an LLM proposer")
        history = [a for a in (*request.lineage, *request.siblings,
                               *((request.parent,) if request.parent else ())) if a.strategy]
        tried = {_key(a.strategy, a.config) for a in (*history, *request.tried) if a.strategy}
        broken = {a.strategy for a in history if a.evaluation.status in _BROKEN}
        rng = random.Random(self._seed(request))
        parent = request.parent

        choice: tuple[Strategy, Config, str] | None = None
        if parent is None or parent.strategy is None:
            choice = self._fresh(ranked, variant, device, tried, broken, "first candidate")
        else:
            status = parent.evaluation.status
            if status.is_failure and status not in _BROKEN:
                choice = (self._neighbour(parent, variant, device, tried, rng, safer=True)
                          or self._fresh(ranked, variant, device, tried, broken | {parent.strategy},
                                         f"parent {parent.strategy} failed ({status.value})"))
            elif status.is_failure:
                choice = self._fresh(ranked, variant, device, tried, broken,
                                     f"parent {parent.strategy} failed ({status.value})")
            else:
                mutate_first = rng.random() < (0.7 if status is Status.FASTER else 0.4)
                moves = [lambda: self._neighbour(parent, variant, device, tried, rng),
                         lambda: self._higher(ranked, parent, variant, device, tried, broken)]
                for move in moves if mutate_first else moves[::-1]:
                    choice = move()
                    if choice:
                        break
        choice = choice or self._any_untried(ranked, variant, device, tried, broken)
        if choice is None:
            raise ProposerExhausted(f"the built-in library has nothing left to try ({len(tried)} tried)")
        strategy, config, why = choice
        return Proposal(source=strategy.render(variant, config, device),
                        intent=self._intent(strategy, variant, config, why, parent), strategy=strategy.name,
                        config=config)

    # ------------------------------------------------------------------------- moves

    def _fresh(self, ranked, variant, device, tried, broken, why):
        for s in ranked:
            if s.name in broken:
                continue
            config = s.default(variant, device)
            if _key(s.name, config) not in tried:
                return s, config, why
        return None

    def _higher(self, ranked, parent: Attempt, variant, device, tried, broken):
        current = get_strategy(parent.strategy)
        for s in ranked:
            if s.level > current.level and s.name not in broken:
                config = s.default(variant, device)
                if _key(s.name, config) not in tried:
                    return s, config, f"step up from {current.name} (level {current.level})"
        return None

    def _neighbour(self, parent: Attempt, variant, device, tried, rng: random.Random, safer: bool = False):
        """``parent``'s config with one parameter moved to an adjacent untried value."""
        strategy = get_strategy(parent.strategy)
        moves = []
        for param, choices in strategy.space.items():
            if param not in parent.config or parent.config[param] not in choices:
                continue
            i = choices.index(parent.config[param])
            steps = (-1,) if safer else (-1, 1)
            for step in steps:
                if 0 <= i + step < len(choices):
                    config = {**parent.config, param: choices[i + step]}
                    if _key(strategy.name, config) not in tried and strategy.valid(variant, config, device):
                        moves.append((param, choices[i + step], config))
        if not moves:
            return None
        param, value, config = moves[rng.randrange(len(moves))]
        verb = "shrink" if safer else "try"
        return strategy, config, f"{verb} {param}={value} (was {parent.config[param]})"

    def _any_untried(self, ranked, variant, device, tried, broken):
        for s in sorted(ranked, key=lambda s: s.name in broken):
            for config in s.configs(variant, device):
                if _key(s.name, config) not in tried:
                    return s, config, "next untried configuration"
        return None

    # ------------------------------------------------------------------------- text

    @staticmethod
    def _seed(request: ProposalRequest) -> int:
        parent = request.parent.candidate_id if request.parent else -1
        text = f"{request.seed}|{request.card.variant.key}|{parent}|{len(request.siblings)}"
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")

    @staticmethod
    def _intent(strategy: Strategy, variant: Variant, config: Config, why: str, parent: Attempt | None) -> str:
        line = f"{strategy.name}: {strategy.explain(variant, config)}; {why}"
        if parent is not None and parent.evaluation.status.is_correct:
            ev = parent.evaluation
            line += f"; parent ran {ev.speedup:.2f}x eager"
            if ev.roofline_fraction is not None:
                line += f" at {ev.roofline_fraction:.0%} of roofline"
        return line
