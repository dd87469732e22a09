"""The one owner of a run's mutable state: its state, its events and what they count, in all and per card.

Several threads write it: the search threads (one per evaluator) and the user's (pause, resume, stop,
from a notebook's buttons or the command line). Each write is a named transition taken under one
lock; a move that ``TRANSITIONS`` does not allow raises ``IllegalTransition``, which names the state
the run is in and the moves it allows.
"""
from __future__ import annotations

import enum
import threading
import traceback
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

from .._events import Event, EventKind


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


_S = RunState
TRANSITIONS: Mapping[RunState, frozenset[RunState]] = MappingProxyType({
    _S.PENDING: frozenset({_S.RUNNING, _S.STOPPING}),
    _S.RUNNING: frozenset({_S.PAUSED, _S.STOPPING, _S.FINISHED, _S.FAILED}),
    _S.PAUSED: frozenset({_S.RUNNING, _S.STOPPING, _S.FAILED}),
    _S.STOPPING: frozenset({_S.STOPPED, _S.FAILED}),   # NB: also where a run stopped before it started begins
    _S.STOPPED: frozenset(),
    _S.FINISHED: frozenset(),
    _S.FAILED: frozenset(),
})
"""The moves a run's state may make; any other raises IllegalTransition."""


class IllegalTransition(RuntimeError):
    """A move ``TRANSITIONS`` does not allow (finishing a run twice, resuming one that ended), or an event
    published after the run's end."""

    def __init__(self, state: RunState, action: str):
        allowed = ", ".join(s.value for s in RunState if s in TRANSITIONS[state]) or "nothing: it is over"
        super().__init__(f"cannot {action}: the run is {state.value} (from {state.value} it may become {allowed})")
        self.state, self.action = state, action


@dataclass(frozen=True)
class CardTally:
    """What a run's events say of one card: budget units used so far, and its verdict once it finished."""

    evaluated: int = 0            # evaluations that count
    proposer_failures: int = 0    # failed or repeated proposals: budget used, nothing judged
    finished: bool = False
    status: str | None = None     # the verdict's status (a CardStatus value) once finished
    ended: str = ""               # why its search ended


class RunLedger:
    """The state, events and counts of one run, and the only way to change them.

    Transitions (the run's thread): ``begin``, ``finish``, ``fail``; (the search threads) ``gate`` at each
    point where a pause may take hold; (the user's thread) ``ask_pause``, ``ask_resume``, ``ask_stop``:
    requests, which do nothing on a run that is over, since a button may be pressed just as it ends.
    ``publish`` appends an event, counts it and hands it to the subscribers, in the order appended.
    """

    def __init__(self, subscribers: list[Callable[[Event], None]] | None = None):
        self._lock = threading.Condition(threading.RLock())
        self._deliver = threading.RLock()   # NB: held while subscribers run, so they see events in list order
        self._state = RunState.PENDING
        self._began = False
        self._pause_asked = False
        self._stop_asked = False
        self._closed = False                # RUN_FINISHED published: nothing more may be
        self._events: list[Event] = []
        self._subscribers = list(subscribers or [])
        self._cards: dict[str, CardTally] = {}
        self._evaluated = 0
        self._proposer_failures = 0
        self._error: BaseException | None = None
        self._left_out: tuple[tuple[str, str], ...] = ()

    # ------------------------------------------------------------------ reads (snapshots)

    @property
    def state(self) -> RunState:
        return self._state

    @property
    def stopping(self) -> bool:
        """Whether a stop was asked: searches end after the evaluation in progress."""
        return self._stop_asked

    @property
    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    @property
    def evaluated(self) -> int:
        """Evaluations that count, over every card."""
        return self._evaluated

    @property
    def proposer_failures(self) -> int:
        return self._proposer_failures

    @property
    def cards(self) -> dict[str, CardTally]:
        with self._lock:
            return dict(self._cards)

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def left_out(self) -> list[tuple[str, str]]:
        """(card key, why): planned cards that no evaluator of the run could judge."""
        return list(self._left_out)

    # ------------------------------------------------------------------ transitions

    def _move(self, target: RunState, why: str = "") -> None:
        if target not in TRANSITIONS[self._state]:
            raise IllegalTransition(self._state, f"make it {target.value}{' (' + why + ')' if why else ''}")
        self._state = target

    def begin(self) -> None:
        """PENDING -> RUNNING (a run stopped before it began stays STOPPING, and ends at once)."""
        with self._lock:
            if self._began:
                raise IllegalTransition(self._state, "start it again: a run starts once (optimize() again makes a "
                                        "new run that continues from the store)")
            self._began = True
            if self._state is not RunState.STOPPING:
                self._move(RunState.RUNNING)

    def finish(self, left_out: list[tuple[str, str]] | tuple = ()) -> RunState:
        """RUNNING -> FINISHED, or STOPPING -> STOPPED when a stop was asked."""
        with self._lock:
            self._move(RunState.STOPPED if self._state is RunState.STOPPING else RunState.FINISHED)
            self._left_out = tuple(left_out)
            self._lock.notify_all()
            return self._state

    def fail(self, error: BaseException) -> None:
        """Any state not over -> FAILED, keeping the error that ended the run."""
        with self._lock:
            self._move(RunState.FAILED, f"{type(error).__name__}: {error}")
            self._error = error
            self._lock.notify_all()

    def ask_pause(self) -> None:
        """Pause at the next gate (after the evaluation in progress)."""
        with self._lock:
            if not self._state.is_done and not self._stop_asked:
                self._pause_asked = True

    def ask_resume(self) -> None:
        with self._lock:
            self._pause_asked = False
            self._lock.notify_all()

    def ask_stop(self) -> None:
        """Stop after the evaluation in progress: RUNNING, PAUSED or PENDING -> STOPPING."""
        with self._lock:
            self._stop_asked = True
            self._pause_asked = False
            if self._state in (RunState.PENDING, RunState.RUNNING, RunState.PAUSED):
                self._move(RunState.STOPPING)
            self._lock.notify_all()

    def gate(self) -> bool:
        """In a search thread, where a pause may take hold: RUNNING -> PAUSED while a pause is asked, waiting
        there until resumed (PAUSED -> RUNNING) or stopped. False once the run should stop."""
        with self._lock:
            paused = self._pause_asked and self._state is RunState.RUNNING
            if paused:
                self._move(RunState.PAUSED)
        if paused:
            self.publish(EventKind.PAUSED)
        with self._lock:
            while self._pause_asked and not self._stop_asked:
                self._lock.wait()
            resumed = self._state is RunState.PAUSED and not self._stop_asked
            if resumed:   # NB: the first search thread to wake moves the run; the others find it RUNNING
                self._move(RunState.RUNNING)
        if resumed:
            self.publish(EventKind.RESUMED)
        return not self._stop_asked

    # ------------------------------------------------------------------ events and what they count

    def subscribe(self, callback: Callable[[Event], None]) -> None:
        with self._lock:
            self._subscribers.append(callback)

    def publish(self, kind: EventKind, card_key: str | None = None, candidate_id: int | None = None,
                message: str = "", **data: Any) -> Event:
        """Append an event, count it, and call every subscriber with it (a subscriber that raises is reported
        and skipped: a broken view must not end the search). Nothing may be published after RUN_FINISHED."""
        event = Event(kind, card_key, candidate_id, message, data)
        with self._deliver:
            with self._lock:
                if self._closed:
                    raise IllegalTransition(self._state, f"publish {kind.value} after the run's end")
                if kind is EventKind.RUN_FINISHED and not self._state.is_done:
                    raise IllegalTransition(self._state, "publish the run's end before it finished or failed")
                self._count(event)
                self._events.append(event)
                self._closed = kind is EventKind.RUN_FINISHED
                subscribers = list(self._subscribers)
            for cb in subscribers:
                try:
                    cb(event)
                except Exception:
                    traceback.print_exc()
        return event

    def _count(self, event: Event) -> None:
        key = event.card_key
        if key is None:
            return
        tally = self._cards.get(key, CardTally())
        if event.kind is EventKind.EVALUATED and event.data.get("counts", True):
            self._evaluated += 1
            tally = CardTally(tally.evaluated + 1, tally.proposer_failures, tally.finished, tally.status, tally.ended)
        elif event.kind is EventKind.PROPOSER_FAILED:
            self._proposer_failures += 1
            tally = CardTally(tally.evaluated, tally.proposer_failures + 1, tally.finished, tally.status, tally.ended)
        elif event.kind is EventKind.CARD_FINISHED:
            if tally.finished:
                raise IllegalTransition(self._state, f"finish card {key[:8]} twice")
            tally = CardTally(tally.evaluated, tally.proposer_failures, True, event.data.get("status"),
                              str(event.data.get("search_ended") or event.data.get("ended") or ""))
        self._cards[key] = tally
