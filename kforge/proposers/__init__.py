"""Proposers: given a card, the contract, a parent and its feedback, write a new candidate."""
from __future__ import annotations

from ._base import Attempt, Proposal, ProposalRequest, Proposer, ProposerError, ProposerExhausted, Usage
from ._registry import make_proposer

__all__ = ["Attempt", "Proposal", "ProposalRequest", "Proposer", "ProposerError", "ProposerExhausted", "Usage", "make_proposer"]
