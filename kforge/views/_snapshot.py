"""The static snapshot in a saved notebook, kept current while a run goes.

A view's output carries a static rendering (HTML, or a PNG for charts) beside the live widget; the
notebook saves whatever the output held last. A view shown as a run starts would keep "running · 0
evaluated" forever, so the views that follow a run show their output under a display id and send it
again (``update_display``) when the run ends, and when a card ends at most once a minute.

NB: JupyterLab renders an updated output anew (new views of the same widget models), so updates are
rare and everything a user picked lives in synced traits, which the new views read back.
"""
from __future__ import annotations

import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .._events import EventKind

if TYPE_CHECKING:
    from .._events import Event


class SnapshotDisplay:
    """Shows ``bundle()`` (a mimebundle, or a ``(data, metadata)`` pair) under one display id, and
    sends it again at the run's milestones (a pump sink: :meth:`apply`)."""

    def __init__(self, bundle: Callable[[], Any], min_interval: float = 60.0):
        self._bundle = bundle
        self.display_id = f"kforge-{uuid.uuid4().hex}"
        self.min_interval = min_interval
        self.shown = False
        self.updates = 0
        self._last = 0.0
        self._lock = threading.Lock()

    def _parts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        bundle = self._bundle()
        if isinstance(bundle, tuple):
            return bundle[0], bundle[1] or {}
        return bundle, {}

    def show(self) -> None:
        """Display the output (IPython's ``_ipython_display_`` calls this)."""
        from IPython.display import display

        with self._lock:   # NB: an update racing the first display waits for it, or finds nothing shown yet
            data, metadata = self._parts()
            display(data, metadata=metadata, raw=True, display_id=self.display_id)
            self.shown = True
            self._last = time.monotonic()

    def update(self) -> None:
        """Send the output again: every place it is shown now holds the current state."""
        from IPython.display import update_display

        with self._lock:
            if not self.shown:   # never displayed (plain Python, a test): nothing to update
                return
            data, metadata = self._parts()
            update_display(data, metadata=metadata, raw=True, display_id=self.display_id)
            self.updates += 1
            self._last = time.monotonic()

    def apply(self, events: Sequence["Event"]) -> None:
        """A batch of run events: update at the run's end, and at a card's end if the last update is
        ``min_interval`` seconds old."""
        kinds = {e.kind for e in events}
        if EventKind.RUN_FINISHED in kinds or (
                EventKind.CARD_FINISHED in kinds and time.monotonic() - self._last >= self.min_interval):
            self.update()
