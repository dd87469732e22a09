"""The search of one card: a tree grown by a proposer until a budget ends it.

Two ways to propose share one evaluation step. ``PooledSearch`` (LLMs) keeps ``parallel``
proposals in flight on a thread pool; ``InlineSearch`` (a proposer that answers at once, such as
the built-in library) proposes in the search thread, so each proposal sees the pending ones, and
only the compiles run in the pool.
"""
from __future__ import annotations

import concurrent.futures as cf
import random
import threading
import time
from dataclasses import replace

from ..evaluate import Evaluation, Evaluator
from ..kernels import compile_source
from ..ops import Card
from ..proposers._base import Attempt, Proposal, ProposalRequest, Proposer, ProposerError, ProposerExhausted
from ..store import Candidate, Store, is_infra_failure
from ._decide import decide
from .._events import EventKind
from ._ledger import RunLedger
from ._settings import RunSettings
from ._tree import Tree, TreeNode

# NB: failures outside the candidates' control (the evaluator's infrastructure) in a row that end a card.
MAX_INFRA_FAILURES = 3


def proposes_inline(proposer: Proposer) -> bool:
    """Whether the proposer answers at once (no network), so proposals are made in the search thread.

    NB: ``fast`` is the attribute's former name ("fast" also names the C dispatch path).
    """
    return bool(getattr(proposer, "instant", getattr(proposer, "fast", False)))


def budget_units_left(store: Store, card_key: str, iterations: int) -> int:
    """The budget units a card's search in a new run may use: what ``iterations`` leaves after the store's
    candidates and proposer failures, plus the candidates stored but not yet evaluated for good (the same
    count ``CardSearch.run`` announces in ``CARD_STARTED``)."""
    candidates = store.candidates(card_key)
    waiting = sum(1 for c in candidates if not c.is_evaluated)
    redo = sum(1 for c in candidates if is_infra_failure(c.evaluation) and not c.is_evaluated)
    return max(iterations - (len(candidates) - redo + _spent_on_nothing(store, card_key)), 0) + waiting


def _spent_on_nothing(store: Store, card_key: str) -> int:
    """Budget units a card's searches used without storing a candidate: proposer failures and repeated sources.

    NB: stored, so that a resumed run spends what the first left, no more: a repeat that used a unit in one run but
    was forgotten gave the card one more candidate on resume than ``--iterations`` allowed."""
    return sum(int(store.get_meta(f"{what}:{card_key}") or 0) for what in ("proposer_failures", "proposal_repeats"))


def _attempt(node: TreeNode) -> Attempt:
    c = node.candidate
    return Attempt(c.id, c.source, c.intent, c.measured, c.strategy, c.config)


class CardSearch:
    """State and steps shared by both ways of proposing: the tree, budgets, store, events.

    What it tells the run goes through the run's ``RunLedger`` alone (``gate``, ``stopping``, ``publish``).
    """

    def __init__(self, settings: RunSettings, ledger: RunLedger, card: Card, evaluator: Evaluator):
        self.settings, self.ledger, self.card, self.evaluator = settings, ledger, card, evaluator
        self.store, self.budget, self.proposer = settings.store, settings.budget, settings.proposer
        self.policy = settings.policy
        self.tree = Tree(self.store.candidates(card.key))
        self.seen = {n.candidate.source for n in self.tree.nodes.values()}
        self._lock = threading.Lock()   # NB: the proposal pool's threads share seen, repeats, failure counts
        self.rng = random.Random(f"{settings.seed}:{card.key}")
        self.best = max((n.score for n in self.tree.evaluated if n.candidate.status and n.candidate.status.is_win),
                        default=0.0)
        self.failures = 0           # proposer failures in a row
        self.exhausted = False      # the proposer said it has nothing new for this card
        self.infra_failures = 0     # evaluations failed outside the candidate's control, in a row
        self.evaluated = 0          # evaluations made in this run that count
        self.reason = "iteration budget used"
        self.examples = self.store.example_paths(card.key)

    # ------------------------------------------------------------------ budget units

    @property
    def attempts(self) -> int:
        """Budget units used: candidates evaluated for good or waiting, plus proposer failures and repeats."""
        redo = sum(1 for n in self.tree.nodes.values() if is_infra_failure(n.candidate.evaluation)
                   and not n.candidate.is_evaluated)
        return len(self.tree) - redo + _spent_on_nothing(self.store, self.card.key)

    def _out_of_budget(self) -> bool:
        """True (with the reason set) when the run stops or a dollar, time or failure budget is reached."""
        if not self.ledger.gate():
            self.reason = "stopped"
        elif self.settings.over_dollars():
            self.reason = "dollar budget reached"
        elif (self.budget.seconds_per_card is not None
              and time.monotonic() - self.started > self.budget.seconds_per_card):
            self.reason = "time budget reached"
        elif self.infra_failures >= MAX_INFRA_FAILURES:
            self.reason = (f"{self.infra_failures} evaluations in a row failed outside the candidates' control; "
                           "they count for nothing and are evaluated again when the run resumes")
        else:
            return False
        return True

    # ------------------------------------------------------------------ the shared steps

    def judge(self, source: str, seed: int) -> Evaluation:
        """The evaluator's verdict on ``source`` for the card's variant and its stored examples."""
        return self.evaluator.evaluate_variant(self.card.variant, source, self.examples, seed=seed)

    def evaluate(self, candidate: Candidate) -> Evaluation:
        """Evaluate a stored candidate, store the evaluation, grow the tree, publish the events."""
        ev = self.judge(candidate.source, seed=candidate.id)
        self.store.set_evaluation(candidate.id, ev)
        counts = not is_infra_failure(ev)
        self.tree.update(replace(candidate, evaluation=ev))
        self.infra_failures = 0 if counts else self.infra_failures + 1
        self.evaluated += counts
        self.ledger.publish(EventKind.EVALUATED, self.card.key, candidate.id, ev.summary(), status=ev.status.value,
                            score=ev.score if counts else 0.0, parent_id=candidate.parent_id, counts=counts)
        if counts and ev.status.is_win and ev.speedup > self.best:
            self.best = ev.speedup
            self.ledger.publish(EventKind.NEW_BEST, self.card.key, candidate.id, f"{ev.speedup:.2f}x over eager",
                                speedup=ev.speedup)
        return ev

    def request(self, parent: TreeNode, seed: int) -> ProposalRequest:
        tree, backend, device = self.tree, self.evaluator.backend, self.settings.device
        tried = tuple(_attempt(n) for n in tree.nodes.values())  # pending ones too (no evaluation yet)
        siblings = tuple(_attempt(ch) for ch in parent.children if ch.candidate.is_evaluated)
        if parent.candidate is None:
            return ProposalRequest(self.card, backend, device, None, (), siblings, seed, tried)
        lineage = tuple(_attempt(n) for n in parent.path()[1:-1])
        return ProposalRequest(self.card, backend, device, _attempt(parent), lineage, siblings, seed, tried)

    def propose(self, parent: TreeNode, request: ProposalRequest) -> Candidate | ProposerError | str:
        """Ask the proposer, and store at once what was paid for (thread-safe).

        Returns the stored candidate, the proposer's error, or a message for a repeated source.
        """
        try:
            proposal = self.proposer.propose(request)
        except ProposerExhausted as exc:
            return exc                 # NB: no call paid for, no budget used
        except ProposerError as exc:
            self._record_call(exc)
            with self._lock:
                meta = f"proposer_failures:{self.card.key}"
                self.store.set_meta(meta, int(self.store.get_meta(meta) or 0) + 1)
            return exc
        call_id = self._record_call(proposal)
        with self._lock:
            if proposal.source in self.seen:
                meta = f"proposal_repeats:{self.card.key}"
                self.store.set_meta(meta, int(self.store.get_meta(meta) or 0) + 1)
                return "the proposer repeated a candidate already evaluated; not evaluated again"
            self.seen.add(proposal.source)
        cid = self.store.add_candidate(self.card.key, parent.id, self.proposer.name, proposal.source,
                                       strategy=proposal.strategy, config=proposal.config, intent=proposal.intent,
                                       dollars=proposal.usage.dollars)
        if call_id is not None:
            self.store.link_llm_call(call_id, cid)
        return self.store.candidate(cid)

    def _record_call(self, proposal_or_error: Proposal | ProposerError) -> int | None:
        usage = proposal_or_error.usage
        if not (usage.input_tokens or usage.output_tokens or proposal_or_error.prompt):
            return None
        error = str(proposal_or_error) if isinstance(proposal_or_error, ProposerError) else None
        return self.store.add_llm_call(self.proposer.name, usage, proposal_or_error.prompt,
                                       proposal_or_error.response, card_key=self.card.key, error=error)

    def build(self, source: str) -> None:
        """Compile into the evaluator's cache, so compiles overlap with evaluations."""
        try:
            remote = getattr(self.evaluator, "build", None)  # NB: a cluster's evaluator compiles on its node
            if remote is not None:
                remote(source)
            else:
                compile_source(source, self.evaluator.backend, self.evaluator.arch)
        except Exception:  # the evaluator reports compile errors with their log
            pass

    def adopt(self, parent: TreeNode, outcome: Candidate | ProposerError | str) -> Candidate | None:
        """In the search thread: put a stored candidate into the tree, or report the failure."""
        if isinstance(outcome, ProposerExhausted):
            if not self.exhausted:     # NB: once: proposals in flight at once may each say so
                self.exhausted = True
                self.reason = f"nothing left to propose: {outcome}"
                self.ledger.publish(EventKind.EXHAUSTED, self.card.key, parent.id, str(outcome))
            return None
        if not isinstance(outcome, Candidate):
            self.failures += 1
            self.ledger.publish(EventKind.PROPOSER_FAILED, self.card.key, parent.id, str(outcome))
            return None
        self.failures = 0
        self.tree.add(outcome)
        self.ledger.publish(EventKind.PROPOSED, self.card.key, outcome.id, outcome.intent, parent_id=parent.id,
                            strategy=outcome.strategy)
        return outcome

    def _can_propose(self, inflight: int, unstored: int) -> bool:
        """Room for another proposal: ``inflight`` in the pool, ``unstored`` of them not yet in the tree."""
        return (inflight < self.budget.parallel and self.attempts + unstored < self.budget.iterations
                and self.failures < self.budget.max_proposer_failures and not self.exhausted)

    # ------------------------------------------------------------------ the card from start to verdict

    def run(self) -> None:
        card = self.card
        waiting = sum(1 for n in self.tree.nodes.values() if not n.candidate.is_evaluated)
        self.ledger.publish(EventKind.CARD_STARTED, card.key, message=card.signature, resumed=len(self.tree),
                            budget=max(self.budget.iterations - self.attempts, 0) + waiting)
        # Proposals stored but never evaluated for good (a killed process, an infrastructure failure): first.
        for node in list(self.tree.nodes.values()):
            if not node.candidate.is_evaluated and self.ledger.gate():
                self.evaluate(node.candidate)
        self.started = time.monotonic()
        pool = cf.ThreadPoolExecutor(max_workers=max(1, self.budget.parallel), thread_name_prefix="kforge-propose")
        try:
            self.grow(pool)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if self.failures >= self.budget.max_proposer_failures:
            self.reason = f"{self.failures} proposer failures in a row"
        verdict = decide(self)
        self.ledger.publish(EventKind.CARD_FINISHED, card.key, verdict.winner_id, verdict.reason,
                            **verdict.to_json(), evaluated=self.evaluated, ended=self.reason)

    def grow(self, pool: cf.ThreadPoolExecutor) -> None:
        raise NotImplementedError


class PooledSearch(CardSearch):
    """Proposals (LLM calls) in a pool, ``parallel`` at once; each stored and compiled as it returns.

    A policy without ``lookahead`` (linear refinement) has one proposal in flight, each revising the
    last verdict: ``parallel`` copies of "revise the best" would all revise the same candidate.
    """

    def _propose_and_build(self, parent: TreeNode, request: ProposalRequest) -> Candidate | ProposerError | str:
        outcome = self.propose(parent, request)
        if isinstance(outcome, Candidate):
            self.build(outcome.source)
        return outcome

    def grow(self, pool: cf.ThreadPoolExecutor) -> None:
        inflight: dict[cf.Future, TreeNode] = {}
        lookahead = getattr(self.policy, "lookahead", True)
        try:
            while not self._out_of_budget():
                while self._can_propose(len(inflight), len(inflight)) and (lookahead or not inflight):
                    parent = self.policy.select(self.tree, self.rng)
                    request = self.request(parent, seed=self.attempts + len(inflight))
                    for n in parent.path():
                        n.pending += 1
                    inflight[pool.submit(self._propose_and_build, parent, request)] = parent
                if not inflight:
                    return
                done, _ = cf.wait(list(inflight), return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    parent = inflight.pop(fut)
                    for n in parent.path():
                        n.pending -= 1
                    candidate = self.adopt(parent, fut.result())
                    if candidate is not None and not self.ledger.stopping:  # else kept; evaluated on resume
                        self.evaluate(candidate)
        finally:
            for fut in inflight:
                fut.cancel()


class InlineSearch(CardSearch):
    """Proposals in the search thread, one at a time, each seeing the pending ones; compiles in the pool.

    A policy without ``lookahead`` (linear refinement) waits for each verdict before picking again.
    """

    def grow(self, pool: cf.ThreadPoolExecutor) -> None:
        inflight: dict[cf.Future, Candidate] = {}
        lookahead = getattr(self.policy, "lookahead", True)
        try:
            while not self._out_of_budget():
                while self._can_propose(len(inflight), 0) and (lookahead or not inflight):
                    parent = self.policy.select(self.tree, self.rng)
                    outcome = self.propose(parent, self.request(parent, seed=self.attempts))
                    candidate = self.adopt(parent, outcome)
                    if candidate is not None:
                        inflight[pool.submit(self.build, candidate.source)] = candidate
                if not inflight:
                    return
                done, _ = cf.wait(list(inflight), return_when=cf.FIRST_COMPLETED)
                for fut in sorted(done, key=lambda f: inflight[f].id):
                    candidate = inflight.pop(fut)
                    if not self.ledger.stopping:  # else kept in the store; evaluated when the run resumes
                        self.evaluate(candidate)
        finally:
            for fut in inflight:
                fut.cancel()
