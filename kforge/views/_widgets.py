"""The anywidget views: card table, search tree, candidate source, run progress.

Each is traitlets for durable state plus the shared ES module in ``static/``. Large texts are
served on request over custom messages (``{"type": "request", "id", "method", "params"}`` answered
by ``{"type": "response", "id", "ok", "data" | "error"}``); a view asks when it renders, so
nothing is lost to messages sent before it existed.
"""
from __future__ import annotations

import threading
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import anywidget
import traitlets as t

from ..search import EventKind
from . import _data

if TYPE_CHECKING:
    from ..ops import Cards
    from ..search import Event, OptimizationRun
    from ..store import Store

STATIC = Path(__file__).parent / "static"


class View(anywidget.AnyWidget):
    """Base of the kforge views: request/response over custom messages, errors shown in the widget."""

    _esm = STATIC / "kforge.js"
    _css = STATIC / "kforge.css"
    _view = t.Unicode("").tag(sync=True)
    error = t.Unicode("").tag(sync=True)

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.on_msg(self._on_custom)

    def handlers(self) -> dict[str, Callable[..., Any]]:
        """Request methods this view serves to its front end."""
        return {"snapshot": self.snapshot}

    def snapshot(self) -> dict[str, Any]:
        """What a newly rendered view needs beyond its traits."""
        return {}

    def serve(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Answer one request as the front end would receive it (also used by the tests)."""
        handler = self.handlers().get(method)
        if handler is None:
            return {"ok": False, "error": f"unknown request {method!r}"}
        try:
            data = handler(**(params or {}))
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            self.error = f"{method}: {message}"
            return {"ok": False, "error": message, "traceback": traceback.format_exc()}
        return {"ok": True, "data": data}

    def _on_custom(self, _widget: Any, content: Any, _buffers: Sequence[Any]) -> None:
        if not isinstance(content, dict) or content.get("type") != "request":
            return
        reply = self.serve(str(content.get("method")), content.get("params") or {})
        self.send({"type": "response", "id": content.get("id"), **reply})

    def _guard(self, what: str, fn: Callable[[], None]) -> None:
        """Run a refresh; a failure lands in ``error`` (visible in the widget) instead of a log."""
        try:
            fn()
        except Exception as exc:
            self.error = f"{what}: {type(exc).__name__}: {exc}"


class CardTable(View):
    """One row per card; clicking a row sets ``selected_key``, which drives the other views."""

    _view = t.Unicode("card_table").tag(sync=True)
    rows = t.List(t.Dict()).tag(sync=True)
    selected_key = t.Unicode("").tag(sync=True)
    sort_by = t.Unicode("share").tag(sync=True)
    sort_desc = t.Bool(True).tag(sync=True)
    model_us = t.Float(None, allow_none=True).tag(sync=True)

    def __init__(self, cards: "Cards", store: "Store", **kwargs: Any):
        super().__init__(**kwargs)
        self._cards, self._store = cards, store
        self._searching: str | None = None
        self.model_us = cards.model_us
        self.refresh()
        if not self.selected_key and self.rows:
            searched = [r for r in self.rows if r["candidates"]]
            self.selected_key = (searched or self.rows)[0]["key"]

    def refresh(self) -> None:
        """Re-read the rows from the store."""
        self._guard("refresh", lambda: setattr(self, "rows", _data.card_rows(self._cards, self._store,
                                                                              self._searching)))

    def apply(self, events: Sequence["Event"]) -> None:
        """Apply a batch of run events: track the card being searched, then refresh once."""
        for e in events:
            if e.kind is EventKind.CARD_STARTED:
                self._searching = e.card_key
            elif e.kind in (EventKind.CARD_FINISHED, EventKind.RUN_FINISHED):
                self._searching = None
        self.refresh()


class SearchTree(View):
    """The search tree of card ``card_key``: one node per candidate; clicking sets ``selected_id``."""

    _view = t.Unicode("search_tree").tag(sync=True)
    card_key = t.Unicode("").tag(sync=True)
    card_label = t.Unicode("").tag(sync=True)
    nodes = t.List(t.Dict()).tag(sync=True)
    best_path = t.List(t.Int()).tag(sync=True)
    selected_id = t.Int(None, allow_none=True).tag(sync=True)
    live = t.Bool(False).tag(sync=True)

    def __init__(self, store: "Store", cards: "Cards | None" = None, card_key: str = "", **kwargs: Any):
        super().__init__(**kwargs)
        self._store, self._cards = store, cards
        self.observe(lambda _change: self.refresh(), names="card_key")
        self.card_key = card_key
        self.refresh()

    def refresh(self) -> None:
        """Re-read the selected card's candidates from the store."""
        def read() -> None:
            nodes = _data.tree_nodes(self._store, self.card_key) if self.card_key else []
            with self.hold_sync():
                self.nodes = nodes
                self.best_path = _data.best_path(nodes)
                if self._cards is not None and self.card_key:
                    self.card_label = self._cards[self.card_key].signature
                if self.selected_id is not None and all(n["id"] != self.selected_id for n in nodes):
                    self.selected_id = None
        self._guard("refresh", read)

    def apply(self, events: Sequence["Event"]) -> None:
        """Apply a batch of run events: refresh once if any touched this card."""
        for e in events:
            if e.kind is EventKind.RUN_STARTED:
                self.live = True
            elif e.kind is EventKind.RUN_FINISHED:
                self.live = False
        if any(e.card_key == self.card_key for e in events):
            self.refresh()


class SourceView(View):
    """Candidate ``candidate_id``: source, diff against its parent, intent, compile log, validation."""

    _view = t.Unicode("source_view").tag(sync=True)
    candidate_id = t.Int(None, allow_none=True).tag(sync=True)

    def __init__(self, store: "Store", **kwargs: Any):
        super().__init__(**kwargs)
        self._store = store

    def handlers(self) -> dict[str, Callable[..., Any]]:
        return {**super().handlers(), "candidate": self.candidate}

    def snapshot(self) -> dict[str, Any]:
        return {"candidate": self.candidate(self.candidate_id) if self.candidate_id is not None else None}

    def candidate(self, id: int) -> dict[str, Any]:
        """Source, diff, log and validation of one candidate."""
        return _data.candidate_detail(self._store, int(id))


class RunProgress(View):
    """A run's state and progress bar, the latest events, and pause / resume / stop buttons."""

    _view = t.Unicode("run_progress").tag(sync=True)
    state = t.Unicode("pending").tag(sync=True)
    done = t.Int(0).tag(sync=True)
    total = t.Int(0).tag(sync=True)
    cards_done = t.Int(0).tag(sync=True)
    cards_total = t.Int(0).tag(sync=True)
    current = t.Unicode("").tag(sync=True)
    best = t.Dict().tag(sync=True)
    dollars = t.Float(0.0).tag(sync=True)
    log = t.List(t.Unicode()).tag(sync=True)

    LOG_LINES = 8

    def __init__(self, run: "OptimizationRun", **kwargs: Any):
        super().__init__(**kwargs)
        self._run = run
        self._lock = threading.Lock()
        self.cards_total = len(run.planned)
        self.total = len(run.planned) * run.budget.iterations
        self.apply()

    def handlers(self) -> dict[str, Callable[..., Any]]:
        return {**super().handlers(), "control": self.control}

    def control(self, action: str) -> dict[str, Any]:
        """Pause, resume or stop the run (served while the search runs in its thread)."""
        if action not in ("pause", "resume", "stop"):
            raise ValueError(f"unknown action {action!r}: pause, resume or stop")
        getattr(self._run, action)()
        self.state = "pausing" if action == "pause" and not self._run.done else self._run.state.value
        return {"state": self.state}

    def apply(self, _events: Sequence["Event"] = ()) -> None:
        """Recount from the run's event list (exact however events and batches interleave)."""
        with self._lock:
            done = cards_done = 0
            current = ""
            best: dict[str, float] = {}
            log: list[str] = []
            # NB: true counts: evaluations and proposer failures made; a card's share of the total is its
            # remaining budget until it finishes, then what it used.
            iterations = self._run.budget.iterations
            planned: dict[str, int] = {}
            used: dict[str, int] = {}
            finished: set[str] = set()
            for e in list(self._run.events):
                if e.kind is EventKind.EVALUATED and e.data.get("counts", True) or e.kind is EventKind.PROPOSER_FAILED:
                    done += 1
                    if e.card_key not in finished:
                        used[e.card_key] = used.get(e.card_key, 0) + 1
                elif e.kind is EventKind.CARD_STARTED:
                    current = e.message
                    planned[e.card_key] = int(e.data.get("budget", iterations))
                elif e.kind is EventKind.NEW_BEST and e.card_key:
                    best[e.card_key] = float(e.data.get("speedup", 0.0))
                elif e.kind is EventKind.CARD_FINISHED:
                    cards_done += 1
                    finished.add(e.card_key)
                    planned[e.card_key] = used.get(e.card_key, 0)
                    if e.data.get("status") == "winner":  # the verdict's speedup: confirmed, or the one timing
                        best[e.card_key] = float(e.data.get("speedup", 0.0))
                    else:
                        best.pop(e.card_key, None)
                if e.kind is not EventKind.PROPOSED:
                    card = f"[{e.card_key[:8]}] " if e.card_key else ""
                    log.append(f"{e.kind.value}: {card}{e.message}")
            total = sum(planned.values()) + max(len(self._run.planned) - len(planned), 0) * iterations
            with self.hold_sync():
                self.total = total
                self.done, self.cards_done, self.current, self.best = min(done, self.total), cards_done, current, best
                self.log = log[-self.LOG_LINES:]
                self.dollars = self._run.dollars
                state = self._run.state.value
                self.state = "pausing" if self.state == "pausing" and state == "running" else state
                if self._run.error is not None:
                    self.error = f"{type(self._run.error).__name__}: {self._run.error}"
