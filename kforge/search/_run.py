"""An optimization run: searches card after card, blocking or in a background thread.

Every proposal is written to the store before it is evaluated and every evaluation as soon as it
completes, so a killed process resumes where it stopped without evaluating or paying twice.
"""
from __future__ import annotations

import concurrent.futures as cf
import enum
import random
import threading
import time
import traceback
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from ..capture import Card
from ..evaluate import Evaluation, Evaluator, Status
from ..kernels import DeviceInfo, compile_source
from ..proposers._base import Attempt, Proposal, ProposalRequest, Proposer, ProposerError
from ..store import Candidate, Store
from ._events import Event, EventKind
from ._planner import PlannedCard
from ._tree import Node, Strategy, Tree


class RunState(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FINISHED = "finished"
    FAILED = "failed"

    @property
    def is_done(self) -> bool:
        return self in (RunState.STOPPED, RunState.FINISHED, RunState.FAILED)


@dataclass(frozen=True)
class Budget:
    iterations: int = 50               # candidates per card (proposer failures count too)
    dollars: float | None = None       # LLM spending for the whole run
    seconds_per_card: float | None = None
    parallel: int = 1                  # proposals in flight at once
    max_proposer_failures: int = 3     # consecutive failures before a card gives up
    confirm: bool = True               # re-time the best candidate before declaring it the winner


def _attempt(node: Node) -> Attempt:
    c = node.candidate
    return Attempt(c.id, c.source, c.intent, c.evaluation, c.strategy, c.config)


class OptimizationRun:
    """Handle of a running (or finished) optimization: pause, resume, stop, wait, subscribe."""

    def __init__(self, *, store: Store, evaluator: Evaluator | Sequence[Evaluator], proposer: Proposer,
                 strategy: Strategy, planned: Sequence[PlannedCard], device: DeviceInfo, budget: Budget,
                 seed: int = 0, on_event: Callable[[Event], None] | None = None):
        self.store = store
        # NB: one evaluator per device; with several, cards are searched concurrently, one per device.
        self.evaluators = list(evaluator) if isinstance(evaluator, (list, tuple)) else [evaluator]
        self.evaluator = self.evaluators[0]
        self.proposer = proposer
        self.strategy = strategy
        self.planned = list(planned)
        self.device = device
        self.budget = budget
        self.seed = seed
        self.events: list[Event] = []
        self.error: BaseException | None = None
        self.state = RunState.PENDING
        self._subscribers: list[Callable[[Event], None]] = [on_event] if on_event else []
        self._resume = threading.Event()
        self._resume.set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._dollars_at_start = store.dollars()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ control

    def subscribe(self, callback: Callable[[Event], None]) -> None:
        """Call ``callback(event)`` for every future event (from the run's thread)."""
        with self._lock:
            self._subscribers.append(callback)

    def pause(self) -> None:
        """Finish the evaluation in progress, then wait until resume() or stop()."""
        if not self.state.is_done:
            self._resume.clear()

    def resume(self) -> None:
        self._resume.set()

    def stop(self) -> None:
        """Stop after the evaluation in progress; proposals in flight are kept in the store."""
        self._stop.set()
        self._resume.set()
        if not self.state.is_done:
            self.state = RunState.STOPPING

    def wait(self, timeout: float | None = None) -> "OptimizationRun":
        """Block until the run ends; re-raise the exception that ended it, if any."""
        if self._thread is not None:
            self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self

    @property
    def done(self) -> bool:
        return self.state.is_done

    @property
    def dollars(self) -> float:
        return self.store.dollars() - self._dollars_at_start

    def start(self, background: bool) -> "OptimizationRun":
        if background:
            self._thread = threading.Thread(target=self._main, name="kforge-optimize", daemon=True)
            self._thread.start()
        else:
            self._main()
            if self.error is not None:
                raise self.error
        return self

    def _ipython_display_(self) -> None:
        from ..views import display_run

        display_run(self)

    def __repr__(self) -> str:
        evaluated = sum(1 for e in self.events if e.kind is EventKind.EVALUATED)
        return f"<kforge run {self.state.value}: {len(self.planned)} cards, {evaluated} evaluations, ${self.dollars:.2f}>"

    # ------------------------------------------------------------------ the loop

    def _emit(self, kind: EventKind, card_key: str | None = None, candidate_id: int | None = None,
              message: str = "", **data) -> None:
        event = Event(kind, card_key, candidate_id, message, data)
        self.events.append(event)
        with self._lock:
            subscribers = list(self._subscribers)
        for cb in subscribers:
            try:
                cb(event)
            except Exception:  # a broken view must not kill the search
                traceback.print_exc()

    def _main(self) -> None:
        self.state = RunState.RUNNING
        self._emit(EventKind.RUN_STARTED, message=f"{len(self.planned)} cards, strategy {self.strategy.name}, "
                   f"proposer {self.proposer.name}")
        try:
            queue = list(self.planned)
            lock = threading.Lock()
            errors: list[BaseException] = []

            def work(evaluator: Evaluator) -> None:
                while not errors:
                    with lock:
                        if not queue or self._stop.is_set() or self._over_dollars():
                            return
                        pc = queue.pop(0)
                    try:
                        self._search_card(pc.card, evaluator)
                    except BaseException as exc:
                        errors.append(exc)

            if len(self.evaluators) == 1:
                work(self.evaluator)
            else:
                threads = [threading.Thread(target=work, args=(ev,), name=f"kforge-search-{ev.device}", daemon=True)
                           for ev in self.evaluators]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            if errors:
                raise errors[0]
            if self._over_dollars():
                self._emit(EventKind.BUDGET_REACHED, message=f"dollar budget ${self.budget.dollars:.2f} reached")
            self.state = RunState.STOPPED if self._stop.is_set() else RunState.FINISHED
        except BaseException as exc:  # surfaces through wait() and the ERROR event
            self.error = exc
            self.state = RunState.FAILED
            self._emit(EventKind.ERROR, message=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        finally:
            self._emit(EventKind.RUN_FINISHED, message=self.state.value)

    def _over_dollars(self) -> bool:
        return self.budget.dollars is not None and self.dollars >= self.budget.dollars

    def _gate(self) -> bool:
        """Wait while paused; False once the run should stop."""
        if not self._resume.is_set():
            self.state = RunState.PAUSED
            self._emit(EventKind.PAUSED)
            self._resume.wait()
            if not self._stop.is_set():
                self.state = RunState.RUNNING
                self._emit(EventKind.RESUMED)
        return not self._stop.is_set()

    def _evaluate(self, card: Card, tree: Tree, candidate: Candidate, best: list[float], evaluator: Evaluator) -> None:
        ev = evaluator.evaluate(card, candidate.source, self.store, seed=candidate.id)
        self.store.set_evaluation(candidate.id, ev)
        tree.update(replace(candidate, evaluation=ev))
        self._emit(EventKind.EVALUATED, card.key, candidate.id, ev.summary(), status=ev.status.value,
                   speedup=ev.score, parent_id=candidate.parent_id)
        if ev.status is Status.FASTER and ev.speedup > best[0]:
            best[0] = ev.speedup
            self._emit(EventKind.NEW_BEST, card.key, candidate.id, f"{ev.speedup:.2f}x over eager",
                       speedup=ev.speedup)

    def _request(self, card: Card, tree: Tree, parent: Node, seed: int) -> ProposalRequest:
        tried = tuple(_attempt(n) for n in tree.nodes.values())  # pending ones too (no evaluation yet)
        siblings = tuple(_attempt(ch) for ch in parent.children if ch.candidate.is_evaluated)
        if parent.candidate is None:
            return ProposalRequest(card, self.evaluator.backend, self.device, None, (), siblings, seed, tried)
        lineage = tuple(_attempt(n) for n in parent.path()[1:-1])
        return ProposalRequest(card, self.evaluator.backend, self.device, _attempt(parent), lineage, siblings, seed,
                               tried)

    def _record_call(self, card: Card, proposal_or_error: Proposal | ProposerError) -> int | None:
        usage = proposal_or_error.usage
        if not (usage.input_tokens or usage.output_tokens or proposal_or_error.prompt):
            return None
        error = str(proposal_or_error) if isinstance(proposal_or_error, ProposerError) else None
        return self.store.add_llm_call(self.proposer.name, usage, proposal_or_error.prompt,
                                       proposal_or_error.response, card_key=card.key, error=error)

    def _build(self, source: str) -> None:
        """Compile into the shared cache, so compiles overlap with evaluations."""
        try:
            compile_source(source, self.evaluator.backend, self.evaluator.arch)
        except Exception:  # the evaluator reports compile errors with their log
            pass

    def _propose_and_record(self, card: Card, parent: Node, request: ProposalRequest,
                            seen: set[str]) -> Candidate | ProposerError | str:
        """In a pool thread: propose, store what was paid for at once, then compile.

        Returns the stored candidate, the proposer's error, or a message for a repeated source.
        """
        try:
            proposal = self.proposer.propose(request)
        except ProposerError as exc:
            self._record_failure(card, exc)
            return exc
        candidate = self._record(card, parent, proposal, seen)
        if isinstance(candidate, Candidate):
            self._build(candidate.source)
        return candidate

    def _record_failure(self, card: Card, exc: ProposerError) -> None:
        self._record_call(card, exc)
        with self._lock:
            key = f"proposer_failures:{card.key}"
            self.store.set_meta(key, int(self.store.get_meta(key) or 0) + 1)

    def _record(self, card: Card, parent: Node, proposal: Proposal, seen: set[str]) -> Candidate | str:
        """Store a proposal's LLM call and candidate (thread-safe); a repeated source is not stored."""
        call_id = self._record_call(card, proposal)
        with self._lock:
            if proposal.source in seen:
                return "the proposer repeated a candidate already evaluated; not evaluated again"
            seen.add(proposal.source)
        store = self.store
        cid = store.add_candidate(card.key, parent.id, self.proposer.name, proposal.source,
                                  strategy=proposal.strategy, config=proposal.config, intent=proposal.intent,
                                  dollars=proposal.usage.dollars)
        if call_id is not None:
            store.link_llm_call(call_id, cid)
        return store.candidate(cid)

    def _adopt(self, card: Card, tree: Tree, parent: Node,
               outcome: Candidate | ProposerError | str) -> Candidate | None:
        """In the search thread: put a stored candidate into the tree, or report the failure."""
        if not isinstance(outcome, Candidate):
            self._emit(EventKind.PROPOSER_FAILED, card.key, parent.id, str(outcome))
            return None
        tree.add(outcome)
        self._emit(EventKind.PROPOSED, card.key, outcome.id, outcome.intent, parent_id=parent.id,
                   strategy=outcome.strategy)
        return outcome

    def _search_card(self, card: Card, evaluator: Evaluator) -> None:
        """Grow the card's tree until a budget ends it.

        Slow proposers (LLMs) propose in a thread pool, ``parallel`` at once. A proposer marked
        ``fast`` (the built-in library) proposes in this thread, so each proposal sees the ones
        before it, and only the compiles run in the pool.
        """
        store, budget = self.store, self.budget
        tree = Tree(store.candidates(card.key))
        self._emit(EventKind.CARD_STARTED, card.key, message=card.signature, resumed=len(tree))
        best = [max((n.score for n in tree.evaluated if n.candidate.status is Status.FASTER), default=0.0)]
        # Proposals that were stored but never evaluated (the process died): evaluate them first.
        for node in list(tree.nodes.values()):
            if not node.candidate.is_evaluated and self._gate():
                self._evaluate(card, tree, node.candidate, best, evaluator)
        seen = {n.candidate.source for n in tree.nodes.values()}
        attempts = len(tree) + int(store.get_meta(f"proposer_failures:{card.key}") or 0)
        rng = random.Random(f"{self.seed}:{card.key}")
        fast = bool(getattr(self.proposer, "fast", False))
        started = time.monotonic()
        failures = 0
        reason = "iteration budget used"
        pool = cf.ThreadPoolExecutor(max_workers=max(1, budget.parallel), thread_name_prefix="kforge-propose")
        # future -> (parent, candidate already stored by a fast proposer, or None)
        inflight: dict[cf.Future, tuple[Node, Candidate | None]] = {}
        try:
            while True:
                if not self._gate():
                    reason = "stopped"
                    break
                if self._over_dollars():
                    reason = "dollar budget reached"
                    break
                if budget.seconds_per_card is not None and time.monotonic() - started > budget.seconds_per_card:
                    reason = "time budget reached"
                    break
                while (len(inflight) < budget.parallel and attempts + len(inflight) < budget.iterations
                       and failures < budget.max_proposer_failures
                       and (not fast or not inflight or getattr(self.strategy, "lookahead", True))):
                    parent = self.strategy.select(tree, rng)
                    request = self._request(card, tree, parent, seed=attempts + len(inflight))
                    if not fast:
                        for n in parent.path():
                            n.pending += 1
                        inflight[pool.submit(self._propose_and_record, card, parent, request, seen)] = (parent, None)
                        continue
                    try:
                        outcome: Candidate | ProposerError | str = self._record(
                            card, parent, self.proposer.propose(request), seen)
                    except ProposerError as exc:
                        self._record_failure(card, exc)
                        outcome = exc
                    candidate = self._adopt(card, tree, parent, outcome)
                    if candidate is None:
                        attempts += 1
                        failures += 1
                        continue
                    failures = 0
                    inflight[pool.submit(self._build, candidate.source)] = (parent, candidate)
                if not inflight:
                    if failures >= budget.max_proposer_failures:
                        reason = f"{failures} proposer failures in a row"
                    break
                done, _ = cf.wait(list(inflight), return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    parent, candidate = inflight.pop(fut)
                    attempts += 1
                    if candidate is None:
                        for n in parent.path():
                            n.pending -= 1
                        candidate = self._adopt(card, tree, parent, fut.result())
                        if candidate is None:
                            failures += 1
                            continue
                        failures = 0
                    if self._stop.is_set():
                        continue  # kept in the store; evaluated when the run resumes
                    self._evaluate(card, tree, candidate, best, evaluator)
                if failures >= budget.max_proposer_failures and not inflight:
                    reason = f"{failures} proposer failures in a row"
                    break
        finally:
            for fut in inflight:
                fut.cancel()
            pool.shutdown(wait=True)
        self._finish_card(card, tree, reason, evaluator)

    def _finish_card(self, card: Card, tree: Tree, reason: str, evaluator: Evaluator) -> None:
        """Guarded fallback: a winner only if correct and faster than eager beyond the noise."""
        winners = sorted((n for n in tree.evaluated if n.candidate.status is Status.FASTER),
                         key=lambda n: -n.score)
        verdict: dict = {"winner_id": None, "speedup": 1.0, "kernel_us": None, "eager_us": card.eager_us,
                         "candidates": len(tree), "search_ended": reason}
        for node in winners[:3]:
            ev: Evaluation = node.candidate.evaluation
            if self.budget.confirm and not self._stop.is_set():
                ev = evaluator.evaluate(card, node.candidate.source, self.store, seed=node.id + 7919)
            if ev.status is Status.FASTER:
                verdict.update(winner_id=node.id, speedup=ev.speedup, kernel_us=ev.candidate_us,
                               eager_us=ev.eager_us, roofline_fraction=ev.roofline_fraction,
                               status="winner", reason=f"candidate {node.id}: {ev.speedup:.2f}x over eager")
                break
        else:
            best = tree.best()
            if not tree.evaluated:
                why = "no candidate was evaluated"
            elif best is None:
                why = "no candidate was correct"
            elif winners:
                why = "the best candidates were not faster when timed again (noise)"
            else:
                why = f"no correct candidate beat eager beyond the noise (best {best.score:.2f}x)"
            verdict.update(status="eager", reason=why)
        self.store.save_result(card.key, verdict)
        self._emit(EventKind.CARD_FINISHED, card.key, verdict["winner_id"], verdict["reason"], **verdict)
