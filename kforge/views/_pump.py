"""Events from a run's thread, applied to views in batches a few times a second.

The run calls back from its own thread; the pump only queues there. A flusher thread drains the
queue every ``interval`` seconds and hands the batch to the views, which update traits (allowed
from a thread; creating widgets is not). The kernel stays responsive however fast events come.
"""
from __future__ import annotations

import queue
import threading
import traceback
from typing import TYPE_CHECKING, Callable, Sequence

from .._events import EventKind

if TYPE_CHECKING:
    from .._events import Event
    from ._run import Run

Sink = Callable[["Sequence[Event]"], None]


class EventPump:
    """Subscribes to runs; delivers their events to ``sinks`` in batches, from one flusher thread."""

    def __init__(self, sinks: Sequence[Sink] = (), interval: float = 0.25):
        self.sinks: list[Sink] = list(sinks)
        self.interval = interval
        self._queue: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._runs: list[Run] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._flushing = threading.Lock()
        self.batches = 0

    def follow(self, run: "Run") -> None:
        """Deliver ``run``'s future events; the flusher runs until every followed run is done."""
        with self._lock:
            if run in self._runs:
                return
            self._runs.append(run)
            run.subscribe(self._on_event)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="kforge-views", daemon=True)
                self._thread.start()

    def _on_event(self, event: "Event") -> None:
        """Queued; a run's last event is delivered at once, in the run's thread, so that the views
        show the final state before ``run.wait()`` returns (no flusher tick can lag behind it)."""
        self._queue.put(event)
        if event.kind is EventKind.RUN_FINISHED:
            self.flush()

    def flush(self) -> int:
        """Deliver every queued event now, as one batch; returns how many."""
        with self._flushing:  # one delivery at a time, in order, whichever thread flushes
            return self._flush()

    def _flush(self) -> int:
        batch: list[Event] = []
        while True:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if batch:
            self.batches += 1
            for sink in self.sinks:
                try:
                    sink(batch)
                except Exception:  # a broken view must not stop the others
                    traceback.print_exc()
        return len(batch)

    def close(self) -> None:
        """Stop the flusher after a last flush."""
        with self._lock:
            self._runs.clear()
        self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self.flush()
            with self._lock:
                if self._wake.is_set() or all(r.done for r in self._runs):
                    self._runs = [r for r in self._runs if not r.done]
                    self._thread = None
                    self._wake.clear()
                    self.flush()
                    return
