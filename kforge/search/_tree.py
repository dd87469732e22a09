"""The search tree of one card, rebuilt from the store, and the search policies that grow it.

A ``TreeNode`` is a candidate, an edge one revision, the value the candidate's ``score`` (its speedup
over eager, 0 for failures). The root stands for eager itself; its children are first candidates.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Iterable, Protocol

from ..store import Candidate


@dataclass
class TreeNode:
    candidate: Candidate | None           # None for the root (eager)
    parent: "TreeNode | None" = None
    children: list["TreeNode"] = field(default_factory=list)
    visits: int = 0
    total: float = 0.0
    pending: int = 0                      # proposals in flight below this node (virtual loss)

    @property
    def id(self) -> int | None:
        return self.candidate.id if self.candidate else None

    @property
    def score(self) -> float:
        return self.candidate.score if self.candidate else 1.0

    @property
    def mean(self) -> float:
        return self.total / self.visits if self.visits else 0.0

    def path(self) -> list["TreeNode"]:
        node, out = self, []
        while node is not None:
            out.append(node)
            node = node.parent
        return out[::-1]


class Tree:
    def __init__(self, candidates: Iterable[Candidate] = ()):
        self.root = TreeNode(None, visits=1, total=1.0)
        self.nodes: dict[int, TreeNode] = {}
        for c in candidates:
            self.add(c)

    def add(self, candidate: Candidate) -> TreeNode:
        parent = self.nodes.get(candidate.parent_id) if candidate.parent_id is not None else self.root
        node = TreeNode(candidate, parent or self.root)
        node.parent.children.append(node)
        self.nodes[candidate.id] = node
        if candidate.is_evaluated:
            self.backup(node, candidate.score)
        return node

    def update(self, candidate: Candidate) -> TreeNode:
        """Put the candidate's evaluation in the tree (one that does not count leaves the node pending)."""
        node = self.nodes[candidate.id]
        node.candidate = candidate
        if candidate.is_evaluated:
            self.backup(node, candidate.score)
        return node

    @staticmethod
    def backup(node: TreeNode, value: float) -> None:
        for n in node.path():
            n.visits += 1
            n.total += value

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def evaluated(self) -> list[TreeNode]:
        return [n for n in self.nodes.values() if n.candidate and n.candidate.is_evaluated]

    def best(self) -> TreeNode | None:
        scored = [n for n in self.evaluated if n.candidate.status and n.candidate.status.is_correct]
        return max(scored, key=lambda n: (n.score, -n.id)) if scored else None

    def value_range(self) -> tuple[float, float]:
        means = [n.mean for n in self.nodes.values() if n.visits] + [self.root.mean]
        return min(means), max(means)


class SearchPolicy(Protocol):
    """Which node the proposer revises next. (Not a "strategy": those are the built-in kernel families.)"""

    name: str
    lookahead: bool  # may pick again before the pending candidates are evaluated

    def select(self, tree: Tree, rng: random.Random) -> TreeNode:
        """The node whose candidate the proposer revises next (the root: propose a first candidate)."""


class MCTS:
    """UCT on values normalised across the tree, with progressive widening.

    A node may take a new child while it has fewer than ``k * visits ** alpha`` children, so good
    nodes are revised again and again; the exploration term brings the search back to branches
    that looked poor early.
    """

    name = "mcts"
    lookahead = True  # virtual loss spreads picks made before feedback arrives

    def __init__(self, c: float = 0.7, k: float = 1.0, alpha: float = 0.5, root_children: int = 2):
        self.c, self.k, self.alpha, self.root_children = c, k, alpha, root_children

    def _can_widen(self, node: TreeNode) -> bool:
        n = node.visits + node.pending
        limit = max(1, math.ceil(self.k * n ** self.alpha))
        if node.candidate is None:
            limit = max(limit, self.root_children)
        return len(node.children) + node.pending < limit

    def _uct(self, child: TreeNode, parent: TreeNode, lo: float, hi: float) -> float:
        visits = child.visits + child.pending
        if visits == 0:
            return float("inf")
        q = (child.total / visits - lo) / (hi - lo) if hi > lo else 0.5
        return q + self.c * math.sqrt(math.log(max(parent.visits + parent.pending, 1)) / visits)

    def select(self, tree: Tree, rng: random.Random) -> TreeNode:
        lo, hi = tree.value_range()
        node = tree.root
        while True:
            evaluated_children = [ch for ch in node.children if ch.visits > 0 or ch.pending > 0]
            if self._can_widen(node) or not evaluated_children:
                return node
            best = max(evaluated_children, key=lambda ch: (self._uct(ch, node, lo, hi), rng.random()))
            node = best


class LinearRefinement:
    """Always revise the best correct candidate so far (the latest one when none is correct)."""

    name = "linear"
    lookahead = False  # revising "the best" means nothing until the last revision is scored

    def select(self, tree: Tree, rng: random.Random) -> TreeNode:
        best = tree.best()
        if best is not None:
            return best
        if tree.evaluated:
            return max(tree.evaluated, key=lambda n: n.id)
        return tree.root


class BestOfN:
    """Independent samples: every candidate is a fresh first proposal."""

    name = "best_of_n"
    lookahead = True

    def select(self, tree: Tree, rng: random.Random) -> TreeNode:
        return tree.root


POLICIES = {"mcts": MCTS, "linear": LinearRefinement, "best_of_n": BestOfN}


def make_policy(policy: str | SearchPolicy) -> SearchPolicy:
    """A search policy by name ("mcts", "linear", "best_of_n"), or the policy object itself."""
    if isinstance(policy, str):
        try:
            return POLICIES[policy]()
        except KeyError:
            raise ValueError(f"unknown search policy {policy!r}; choose one of {', '.join(POLICIES)}") from None
    return policy

