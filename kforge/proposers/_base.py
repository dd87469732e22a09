"""The proposer interface: (card, contract, parent, feedback) -> a new candidate."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..ops import Card
    from ..evaluate import Evaluation
    from ..kernels import DeviceInfo


@dataclass(frozen=True)
class Usage:
    """Tokens and dollars of one LLM call (all zero for the built-in proposer)."""

    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    dollars: float = 0.0
    latency_s: float = 0.0


@dataclass(frozen=True)
class Attempt:
    """A candidate already evaluated, as a proposer sees it (the parent, ancestors, siblings)."""

    candidate_id: int
    source: str
    intent: str
    evaluation: "Evaluation | None"    # None only in ProposalRequest.tried, for a pending candidate
    strategy: str | None = None
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProposalRequest:
    card: "Card"
    backend: str                       # "cuda" or "cpu"
    device: "DeviceInfo"
    parent: Attempt | None = None      # None: propose a first candidate
    lineage: tuple[Attempt, ...] = ()  # ancestors of the parent, oldest first
    siblings: tuple[Attempt, ...] = () # other children of the parent (failed ones teach most)
    seed: int = 0
    tried: tuple[Attempt, ...] = ()    # every candidate of the card evaluated so far, anywhere in the tree


@dataclass(frozen=True)
class Proposal:
    source: str
    intent: str                        # one line: what this revision tries and why
    strategy: str | None = None        # built-in strategy name, when there is one
    config: dict[str, Any] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    prompt: str = ""                   # what was sent (LLM proposers), kept in the store
    response: str = ""                 # what came back (LLM proposers), kept in the store


class ProposerError(RuntimeError):
    """A proposer could not produce a candidate (no key, refusal, API down after retries)."""

    def __init__(self, message: str, usage: Usage | None = None, prompt: str = "", response: str = ""):
        super().__init__(message)
        self.usage = usage or Usage()
        self.prompt = prompt
        self.response = response


class ProposerExhausted(ProposerError):
    """The proposer has nothing new for this card (the built-in library: every strategy and config that fits was
    tried). Not a failure: the card's search ends there, and it uses no budget."""


@runtime_checkable
class Proposer(Protocol):
    """``name`` is recorded with every candidate. A proposer may set ``instant = True`` when it
    answers at once (no network): the search then proposes one at a time, each proposal seeing
    the pending ones, and overlaps only the compiles. (``fast = True``, its former name, still
    works.)"""

    name: str

    def propose(self, request: ProposalRequest) -> Proposal: ...
