"""An optimization run: searches card after card, blocking or in a background thread.

Every proposal is written to the store before it is evaluated and every evaluation as soon as it
completes, so a killed process resumes where it stopped without evaluating or paying twice.
"""
from __future__ import annotations

import enum
import threading
import traceback
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

from ..evaluate import Evaluator
from ..kernels import DeviceInfo
from ..proposers._base import Proposer
from ..store import Store
from ._card_search import InlineSearch, PooledSearch, budget_units_left, proposes_inline
from ._events import Event, EventKind, Progress
from ._planner import PlannedCard
from ._tree import SearchPolicy


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


class OptimizationRun:
    """Handle of a running (or finished) optimization: pause, resume, stop, wait, subscribe."""

    def __init__(self, *, store: Store, evaluator: Evaluator | Sequence[Evaluator], proposer: Proposer,
                 policy: SearchPolicy | None = None, planned: Sequence[PlannedCard], device: DeviceInfo,
                 budget: Budget, seed: int = 0, on_event: Callable[[Event], None] | None = None,
                 strategy: SearchPolicy | None = None):
        if strategy is not None:
            warnings.warn("OptimizationRun(strategy=...) is now policy=... (a search policy; built-in kernel "
                          "families are the strategies)", DeprecationWarning, stacklevel=2)
            policy = policy or strategy
        if policy is None:
            raise TypeError("OptimizationRun needs policy= (a search policy such as MCTS())")
        self.store = store
        # NB: one evaluator per device; with several, cards are searched concurrently, one per device.
        self.evaluators = list(evaluator) if isinstance(evaluator, (list, tuple)) else [evaluator]
        self.evaluator = self.evaluators[0]
        self.proposer = proposer
        self.policy = policy
        self.planned = list(planned)
        self.device = device
        self.budget = budget
        self.seed = seed
        self.events: list[Event] = []
        self.error: BaseException | None = None
        self.left_out: list[tuple[str, str]] = []   # (card key, why): planned cards no evaluator could judge
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

    @property
    def progress(self) -> Progress:
        """How far the run has got: evaluations and proposer failures apart, of a total planned at its start."""
        return Progress.of(list(self.events), cards_total=len(self.planned), iterations=self.budget.iterations)

    def __repr__(self) -> str:
        progress = self.progress
        evaluated, failed = progress.evaluated, progress.proposer_failures
        said = f", {failed} proposer failure{'s' * (failed != 1)}" if failed else ""
        return (f"<kforge run {self.state.value}: {len(self.planned)} card{'s' * (len(self.planned) != 1)}, "
                f"{evaluated} evaluation{'s' * (evaluated != 1)}{said}, ${self.dollars:.2f}>")

    # ------------------------------------------------------------------ the loop

    @property
    def strategy(self) -> SearchPolicy:
        """Deprecated name of ``policy``."""
        warnings.warn("OptimizationRun.strategy is now .policy", DeprecationWarning, stacklevel=2)
        return self.policy

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
        # NB: the run's total is planned once, here, from the plan and the budgets; progress only shrinks it, with
        # a reason (a card that stopped early, a run that ended): recounting it per card made it jump (206 -> 84)
        planned = {pc.card.key: budget_units_left(self.store, pc.card.key, self.budget.iterations)
                   for pc in self.planned}
        self._emit(EventKind.RUN_STARTED, message=f"{len(self.planned)} cards, policy {self.policy.name}, "
                   f"proposer {self.proposer.name}", planned=planned)
        try:
            queue = list(self.planned)
            lock = threading.Lock()
            errors: list[BaseException] = []

            def work(evaluator: Evaluator) -> None:
                while not errors:
                    with lock:
                        if not queue or self._stop.is_set() or self._over_dollars():
                            return
                        pc = self._take(queue, evaluator)
                        if pc is None:
                            return
                    try:
                        search = InlineSearch if proposes_inline(self.proposer) else PooledSearch
                        search(self, pc.card, evaluator).run()
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
            if not self._stop.is_set() and not self._over_dollars():
                self.left_out = [(pc.card.key, f"judged on {self.store.get_meta('hardware:' + pc.card.key)}, which "
                                  "no evaluator of this run has") for pc in queue]
            if self._over_dollars():
                self._emit(EventKind.BUDGET_REACHED, message=f"dollar budget ${self.budget.dollars:.2f} reached")
            self.state = RunState.STOPPED if self._stop.is_set() else RunState.FINISHED
        except BaseException as exc:  # surfaces through wait() and the ERROR event
            self.error = exc
            self.state = RunState.FAILED
            self._emit(EventKind.ERROR, message=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        finally:
            self._emit(EventKind.RUN_FINISHED, message=self.state.value, left_out=list(self.left_out))

    def _take(self, queue: list[PlannedCard], evaluator: Evaluator) -> PlannedCard | None:
        """The first planned card this evaluator may judge, taken from the queue.

        An evaluator that names its ``hardware`` (a cluster's) judges only cards never judged on
        other hardware, and pins the card it takes to its own, in the store: a card's timings are
        never compared across GPUs, in this run or on resume.
        """
        hardware = getattr(evaluator, "hardware", None)
        for i, pc in enumerate(queue):
            if hardware is None:
                return queue.pop(i)
            judged_on = self.store.get_meta(f"hardware:{pc.card.key}")
            if judged_on in (None, hardware):
                if judged_on is None:
                    self.store.set_meta(f"hardware:{pc.card.key}", hardware)
                return queue.pop(i)
        return None

    def _over_dollars(self) -> bool:
        return self.budget.dollars is not None and self.dollars >= self.budget.dollars

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

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

