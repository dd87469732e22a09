"""An optimization run: searches card after card, blocking or in a background thread.

Every proposal is written to the store before it is evaluated and every evaluation as soon as it
completes, so a killed process resumes where it stopped without evaluating or paying twice. The
run's state, events and counts have one owner, its ``RunLedger`` (``_ledger.py``).
"""
from __future__ import annotations

import threading
import traceback
from typing import Callable, Sequence

from ..evaluate import Evaluator
from ..kernels import DeviceInfo
from ..proposers._base import Proposer
from ..store import Store
from ._card_search import InlineSearch, PooledSearch, budget_units_left, proposes_inline
from .._events import Event, EventKind, Progress
from ._ledger import RunLedger, RunState
from ._planner import PlannedCard
from ._settings import Budget, RunSettings
from ._tree import SearchPolicy


class OptimizationRun:
    """Handle of a running (or finished) optimization: pause, resume, stop, wait, subscribe."""

    def __init__(self, *, store: Store, evaluator: Evaluator | Sequence[Evaluator], proposer: Proposer,
                 policy: SearchPolicy, planned: Sequence[PlannedCard], device: DeviceInfo,
                 budget: Budget, seed: int = 0, on_event: Callable[[Event], None] | None = None):
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
        self.ledger = RunLedger([on_event] if on_event else [])
        self.settings = RunSettings(store, proposer, policy, budget, device, seed, store.dollars())
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ control

    def subscribe(self, callback: Callable[[Event], None]) -> None:
        """Call ``callback(event)`` for every future event (from the run's thread)."""
        self.ledger.subscribe(callback)

    def pause(self) -> None:
        """Finish the evaluation in progress, then wait until resume() or stop()."""
        self.ledger.ask_pause()

    def resume(self) -> None:
        self.ledger.ask_resume()

    def stop(self) -> None:
        """Stop after the evaluation in progress; proposals in flight are kept in the store."""
        self.ledger.ask_stop()

    def wait(self, timeout: float | None = None) -> "OptimizationRun":
        """Block until the run ends; re-raise the exception that ended it, if any."""
        if self._thread is not None:
            self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self

    @property
    def state(self) -> RunState:
        return self.ledger.state

    @property
    def events(self) -> list[Event]:
        """The events published so far (a copy)."""
        return self.ledger.events

    @property
    def error(self) -> BaseException | None:
        """The exception that ended the run, if one did."""
        return self.ledger.error

    @property
    def left_out(self) -> list[tuple[str, str]]:
        """(card key, why): planned cards no evaluator of the run could judge."""
        return self.ledger.left_out

    @property
    def done(self) -> bool:
        return self.state.is_done

    @property
    def stopping(self) -> bool:
        return self.ledger.stopping

    @property
    def dollars(self) -> float:
        return self.settings.dollars()

    def start(self, background: bool) -> "OptimizationRun":
        self.ledger.begin()   # NB: here, in the caller's thread: a second start() raises at once
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
        return Progress.of(self.events, cards_total=len(self.planned), iterations=self.budget.iterations)

    def __repr__(self) -> str:
        evaluated, failed = self.ledger.evaluated, self.ledger.proposer_failures
        said = f", {failed} proposer failure{'s' * (failed != 1)}" if failed else ""
        return (f"<kforge run {self.state.value}: {len(self.planned)} card{'s' * (len(self.planned) != 1)}, "
                f"{evaluated} evaluation{'s' * (evaluated != 1)}{said}, ${self.dollars:.2f}>")

    # ------------------------------------------------------------------ the loop

    def _main(self) -> None:
        publish = self.ledger.publish
        left_out: list[tuple[str, str]] = []
        try:
            # NB: the run's total is planned once, here, from the plan and the budgets; progress only shrinks it,
            # with a reason (a card that stopped early, a run that ended): recounting it per card made it jump
            planned = {pc.card.key: budget_units_left(self.store, pc.card.key, self.budget.iterations)
                       for pc in self.planned}
            publish(EventKind.RUN_STARTED, message=f"{len(self.planned)} cards, policy {self.policy.name}, "
                    f"proposer {self.proposer.name}", planned=planned)
            queue = list(self.planned)
            lock = threading.Lock()
            errors: list[BaseException] = []

            def work(evaluator: Evaluator) -> None:
                while not errors:
                    with lock:
                        if not queue or self.ledger.stopping or self.settings.over_dollars():
                            return
                        pc = self._take(queue, evaluator)
                        if pc is None:
                            return
                    try:
                        search = InlineSearch if proposes_inline(self.proposer) else PooledSearch
                        search(self.settings, self.ledger, pc.card, evaluator).run()
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
            if not self.ledger.stopping and not self.settings.over_dollars():
                left_out = [(pc.card.key, f"judged on {self.store.get_meta('hardware:' + pc.card.key)}, which "
                             "no evaluator of this run has") for pc in queue]
            if self.settings.over_dollars():
                publish(EventKind.BUDGET_REACHED, message=f"dollar budget ${self.budget.dollars:.2f} reached")
            self.ledger.finish(left_out)
        except BaseException as exc:  # surfaces through wait() and the ERROR event
            self.ledger.fail(exc)
            publish(EventKind.ERROR, message=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        finally:
            publish(EventKind.RUN_FINISHED, message=self.state.value, left_out=self.left_out)

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
