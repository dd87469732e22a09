"""The anywidget views: card table, search tree, candidate source, run progress.

Each is traitlets plus the shared ES module (``widgets/kforge.js``). Everything a view shows is in
its traits, pushed from the run's events as they come (kernel-to-browser messages flow while a
cell runs; browser-to-kernel ones wait for the cell), so a click never needs the kernel: the views of
a dashboard share one :class:`Selection` model, moved in the browser, and the progress buttons post to the run's control
channel (:mod:`._control`). Requests over custom messages (``{"type": "request", "id", "method",
"params"}`` answered by ``{"type": "response", "id", "ok", "data" | "error"}``) remain for an idle
kernel. Every view's output also carries a static HTML rendering (``text/html``) that a saved or
shared notebook shows without a kernel.
"""
from __future__ import annotations

import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .._events import EventKind, Progress
from . import _data, _html
from ._optional import require
from ._snapshot import SnapshotDisplay
from ._static import static_file

# NB: through require, so that every way in (the dashboard, a display hook) says which extra to install
anywidget = require("anywidget")
ipywidgets = require("ipywidgets")
t = require("traitlets")

if TYPE_CHECKING:
    from ..ops import Cards
    from .._events import Event
    from ..store import Store
    from ._run import Run


class View(anywidget.AnyWidget):
    """Base of the kforge views: request/response over custom messages, errors shown in the widget."""

    _esm = static_file("kforge.js")
    _css = static_file("kforge.css")
    _view = t.Unicode("").tag(sync=True)
    error = t.Unicode("").tag(sync=True)
    kernel_busy = t.Bool(False).tag(sync=True)   # a cell is running: a request would wait for it (KernelWatch)
    kernel_id = t.Unicode("").tag(sync=True)     # the kernel that made the view: another one means it is gone

    @t.default("kernel_id")
    def _this_kernel(self) -> str:
        try:
            from ipykernel import get_connection_file

            name = Path(get_connection_file()).name   # kernel-<id>.json, as Jupyter servers name it
        except Exception:  # not in a kernel
            return ""
        return name[len("kernel-"):-len(".json")] if name.startswith("kernel-") and name.endswith(".json") else ""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.on_msg(self._on_custom)

    def handlers(self) -> dict[str, Callable[..., Any]]:
        """Request methods this view serves to its front end."""
        return {"snapshot": self.snapshot}

    def snapshot(self) -> dict[str, Any]:
        """What a newly rendered view needs beyond its traits."""
        return {}

    def to_html(self) -> str:
        """A static rendering of what the view shows now (no script: it survives sanitizers)."""
        return ""

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = super()._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        try:
            html = self.to_html()
        except Exception as exc:  # a snapshot must never hide the live view
            html = f"<pre>kforge: no static snapshot ({type(exc).__name__}: {exc})</pre>"
        if html and isinstance(data, dict):
            data["text/html"] = html
        return bundle

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


class Selection(ipywidgets.Widget):
    """What one dashboard shows: a card, a candidate, and whether each follows the run. Every view of
    the dashboard reads and writes this one model, so they agree by construction.

    The front end moves it (clicks, following the run) and sends each change whole, in order; the
    kernel applies them when it is idle and never moves it in answer, so a click made while a cell
    runs lands once, in order, and nothing crosses it on the way back. Kernel code picks a card with
    :meth:`pick`.
    """

    card_key = t.Unicode("").tag(sync=True)
    candidate_id = t.Int(None, allow_none=True).tag(sync=True)
    follow_search = t.Bool(False).tag(sync=True)   # the card follows the one being searched (until a row is picked)
    follow_newest = t.Bool(False).tag(sync=True)   # the candidate follows the newest (until a node is picked)

    def __init__(self, default_candidate: "Callable[[str], int | None] | None" = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.default_candidate = default_candidate

    def pick(self, card_key: str) -> None:
        """Show ``card_key`` with its default candidate (the end of its best path, else its newest)."""
        with self.hold_sync():
            self.card_key = card_key
            self.candidate_id = self.default_candidate(card_key) if self.default_candidate is not None else None


def _selection_of(kwargs: dict[str, Any], **values: Any) -> Selection:
    """The view's selection: the one passed (a dashboard's), else a new one holding ``values`` given."""
    selection = kwargs.pop("selection", None) or Selection()
    for name, value in values.items():
        if value is not None:
            setattr(selection, name, value)
    return selection


def _last_started(run: "Run | None") -> str:
    """The card a run started last ("" when none)."""
    keys = [e.card_key for e in list(run.events) if e.kind is EventKind.CARD_STARTED] if run is not None else []
    return (keys[-1] or "") if keys else ""


def _searching(run: "Run | None") -> str:
    """The card a run is searching now ("" when none): right for views made mid-run too."""
    if run is None or run.done:
        return ""
    current = ""
    for e in list(run.events):
        if e.kind is EventKind.CARD_STARTED:
            current = e.card_key or ""
        elif e.kind is EventKind.CARD_FINISHED and e.card_key == current:
            current = ""
    return current


class CardTable(View):
    """One row per card; clicking a row sets ``selected_key``, which drives the other views.

    ``following``: the selection follows the card being searched (``searching``) until the user
    picks a row (pinned); the front end owns it, so a busy kernel cannot override the user.
    """

    _view = t.Unicode("card_table").tag(sync=True)
    rows = t.List(t.Dict()).tag(sync=True)
    selection = t.Instance(Selection).tag(sync=True, **ipywidgets.widget_serialization)
    searching = t.Unicode("").tag(sync=True)
    # NB: what "following the search" shows: the card searched, else the last one started. A card
    # searched start to end between two pushes never shows in ``searching``; here it does
    followed = t.Unicode("").tag(sync=True)
    sort_by = t.Unicode("share").tag(sync=True)
    sort_desc = t.Bool(True).tag(sync=True)
    filter_status = t.Unicode("").tag(sync=True)
    filter_op = t.Unicode("").tag(sync=True)
    filter_vendor = t.Unicode("").tag(sync=True)   # "-": cards with no vendor library
    filter_text = t.Unicode("").tag(sync=True)
    model_us = t.Float(None, allow_none=True).tag(sync=True)

    def __init__(self, cards: "Cards", store: "Store", run: "Run | None" = None, **kwargs: Any):
        selection = _selection_of(kwargs, card_key=kwargs.pop("selected_key", None))
        super().__init__(selection=selection, **kwargs)
        self._cards, self._store, self._run = cards, store, run
        self.searching = _searching(run)
        self._last_started = _last_started(run)
        self.followed = self.searching or self._last_started
        self.following = run is not None and not run.done   # NB: also before the run's first card starts
        self.model_us = cards.model_us
        self.refresh()
        if not self.selected_key and self.rows:
            searched = [r for r in self.rows if r["candidates"]]
            self.selected_key = self.searching or (searched or self.rows)[0]["key"]

    @property
    def selected_key(self) -> str:
        """The card selected (the dashboard's selection)."""
        return self.selection.card_key

    @selected_key.setter
    def selected_key(self, key: str) -> None:
        self.selection.pick(key)

    @property
    def following(self) -> bool:
        """The selection follows the card being searched."""
        return self.selection.follow_search

    @following.setter
    def following(self, on: bool) -> None:
        self.selection.follow_search = on

    def refresh(self) -> None:
        """Re-read the rows from the store."""
        self._guard("refresh", lambda: setattr(self, "rows", _data.card_rows(
            self._cards, self._store, self.searching or None)))

    def apply(self, events: Sequence["Event"]) -> None:
        """Apply a batch of run events: track the card being searched, then refresh once.

        NB: with a run, re-read from its whole event list: exact even for events published between
        this view's first read and its subscription."""
        searching = self.searching
        if self._run is not None:
            searching, self._last_started = _searching(self._run), _last_started(self._run)
            events = ()
        for e in events:
            if e.kind is EventKind.CARD_STARTED:
                searching = e.card_key or ""
                self._last_started = searching or self._last_started
            elif e.kind is EventKind.CARD_FINISHED and e.card_key == searching or e.kind is EventKind.RUN_FINISHED:
                searching = ""
        with self.hold_sync():
            self.searching = searching
            self.followed = searching or self._last_started
            self.refresh()

    @property
    def shown_key(self) -> str:
        """The card the front end shows: while following, the one searched (last); else the user's pick.

        NB: the kernel never moves ``selected_key`` itself (a busy kernel must not override a row the
        user picked), so a static snapshot asks this instead."""
        if self.following and self.followed:
            return self.followed
        return self.selected_key

    def to_html(self) -> str:
        return _html.card_table(self.rows, self.shown_key)


class SearchTree(View):
    """The search trees of every card (``trees``); the selection's card picks the one shown, a click
    picks its candidate. ``following``: the newest candidate is selected until the user picks one."""

    _view = t.Unicode("search_tree").tag(sync=True)
    selection = t.Instance(Selection).tag(sync=True, **ipywidgets.widget_serialization)
    trees = t.Dict().tag(sync=True)          # card key -> nodes
    best_paths = t.Dict().tag(sync=True)     # card key -> ids down to the fastest candidate faster than eager
    labels = t.Dict().tag(sync=True)         # card key -> short signature
    live = t.Bool(False).tag(sync=True)

    def __init__(self, store: "Store", cards: "Cards | None" = None, card_key: str = "",
                 run: "Run | None" = None, **kwargs: Any):
        selection = _selection_of(kwargs, card_key=card_key or None, candidate_id=kwargs.pop("selected_id", None))
        super().__init__(selection=selection, **kwargs)
        self._store, self._cards = store, cards
        if selection.default_candidate is None:
            selection.default_candidate = self.default_for
        self.live = run is not None and not run.done
        self.following = self.live
        if cards is not None:
            self.labels = {c.key: _data.short_label(c) for c in cards}
        self.refresh()

    @property
    def card_key(self) -> str:
        """The card shown (the dashboard's selection)."""
        return self.selection.card_key

    @card_key.setter
    def card_key(self, key: str) -> None:
        self.selection.pick(key)

    @property
    def selected_id(self) -> int | None:
        """The candidate selected (the dashboard's selection)."""
        return self.selection.candidate_id

    @selected_id.setter
    def selected_id(self, candidate_id: int | None) -> None:
        self.selection.candidate_id = candidate_id

    @property
    def following(self) -> bool:
        """The selection follows the newest candidate."""
        return self.selection.follow_newest

    @following.setter
    def following(self, on: bool) -> None:
        self.selection.follow_newest = on

    def default_for(self, card_key: str) -> int | None:
        """The candidate shown first for ``card_key``: the end of its best path, else its newest, else None."""
        best = self.best_paths.get(card_key, [])
        nodes = self.trees.get(card_key, [])
        return best[-1] if best else nodes[-1]["id"] if nodes else None

    def default_candidate(self) -> int | None:
        """The end of the best path, else the newest candidate, else None (of the card shown)."""
        return self.default_for(self.card_key)

    @property
    def nodes(self) -> list[dict[str, Any]]:
        """The candidates of the card shown."""
        return self.trees.get(self.card_key, [])

    @property
    def best_path(self) -> list[int]:
        return self.best_paths.get(self.card_key, [])

    @property
    def card_label(self) -> str:
        return self.labels.get(self.card_key, self.card_key)

    def refresh(self, keys: "set[str] | None" = None) -> None:
        """Re-read the candidates of ``keys`` (every card by default) from the store."""
        def read() -> None:
            trees = dict(self.trees)
            wanted = keys if keys is not None else {c.card_key for c in self._store.candidates()}
            for key in wanted:
                trees[key] = _data.tree_nodes(self._store, key)
            with self.hold_sync():
                self.trees = trees
                self.best_paths = {k: _data.best_path(v) for k, v in trees.items()}
        self._guard("refresh", read)

    def apply(self, events: Sequence["Event"]) -> None:
        """Apply a batch of run events: refresh the trees they touched."""
        for e in events:
            if e.kind is EventKind.RUN_STARTED:
                self.live = True
            elif e.kind is EventKind.RUN_FINISHED:
                self.live = False
        touched = {e.card_key for e in events if e.card_key}
        if touched:
            self.refresh(touched)

    def shown_id(self, card_key: str | None = None) -> int | None:
        """The candidate shown for ``card_key`` (default: the card shown): the user's pick, or while
        following (the front end moves it, not the kernel) the end of the best path, else the newest."""
        key = self.card_key if card_key is None else card_key
        nodes = self.trees.get(key, [])
        if not self.following and key == self.card_key and any(n["id"] == self.selected_id for n in nodes):
            return self.selected_id
        best = self.best_paths.get(key, [])
        return best[-1] if best else nodes[-1]["id"] if nodes else None

    def to_html(self, card_key: str | None = None) -> str:
        key = self.card_key if card_key is None else card_key
        return _html.search_tree(self.trees.get(key, []), self.best_paths.get(key, []), self.shown_id(key),
                                 self.labels.get(key, key))


class SourceView(View):
    """Candidate ``candidate_id``: source, diff against its parent, intent, compile log, validation.

    ``details`` holds every candidate of the session, refreshed as the run proposes and evaluates
    them, so the view follows any click at once.
    """

    _view = t.Unicode("source_view").tag(sync=True)
    selection = t.Instance(Selection).tag(sync=True, **ipywidgets.widget_serialization)
    details = t.Dict().tag(sync=True)        # str(candidate id) -> detail
    tab = t.Unicode("source").tag(sync=True)   # "source", "diff" or "log"

    def __init__(self, store: "Store", **kwargs: Any):
        selection = _selection_of(kwargs, candidate_id=kwargs.pop("candidate_id", None))
        super().__init__(selection=selection, **kwargs)
        self._store = store
        self.refresh()

    @property
    def candidate_id(self) -> int | None:
        """The candidate shown (the dashboard's selection)."""
        return self.selection.candidate_id

    @candidate_id.setter
    def candidate_id(self, candidate_id: int | None) -> None:
        self.selection.candidate_id = candidate_id

    def handlers(self) -> dict[str, Callable[..., Any]]:
        return {**super().handlers(), "candidate": self.candidate}

    def snapshot(self) -> dict[str, Any]:
        return {"candidate": self.candidate(self.candidate_id) if self.candidate_id is not None else None}

    def candidate(self, id: int) -> dict[str, Any]:
        """Source, diff, log and validation of one candidate."""
        return _data.candidate_detail(self._store, int(id))

    def refresh(self, ids: "set[int] | None" = None) -> None:
        """Re-read the candidates ``ids`` (all by default)."""
        def read() -> None:
            if ids is None:
                self.details = _data.all_details(self._store)
            else:
                self.details = {**self.details, **{str(i): self.candidate(i) for i in ids}}
        self._guard("refresh", read)

    def apply(self, events: Sequence["Event"]) -> None:
        """Apply a batch of run events: re-read the candidates they proposed or evaluated."""
        ids = {e.candidate_id for e in events if e.candidate_id is not None
               and e.kind in (EventKind.PROPOSED, EventKind.EVALUATED, EventKind.NEW_BEST)}
        if ids:
            self.refresh(ids)

    def to_html(self, candidate_id: int | None = None) -> str:
        shown = self.candidate_id if candidate_id is None else candidate_id
        return _html.source_view(self.details.get(str(shown)) if shown is not None else None)


class RunProgress(View):
    """A run's state and progress bar, elapsed / rate / ETA, the latest events, and pause / resume /
    stop buttons that post to the run's control channel (they work while the kernel is busy)."""

    _view = t.Unicode("run_progress").tag(sync=True)
    state = t.Unicode("pending").tag(sync=True)
    done = t.Int(0).tag(sync=True)           # budget units used: evaluations and proposer failures
    total = t.Int(0).tag(sync=True)          # planned at the run's start; shrinks only by what cards left unused
    evaluated = t.Int(0).tag(sync=True)      # candidates judged
    failures = t.Int(0).tag(sync=True)       # proposer failures (budget used, nothing judged)
    eta_at = t.Float(None, allow_none=True).tag(sync=True)   # epoch seconds; None until an ETA means something
    cards_done = t.Int(0).tag(sync=True)
    cards_total = t.Int(0).tag(sync=True)
    current = t.Unicode("").tag(sync=True)
    best = t.Dict().tag(sync=True)           # card label -> the card's speedup (its verdict's), once it has a winner
    best_candidates = t.Dict().tag(sync=True)   # card label -> its best candidate's one timing while it is searched
    dollars = t.Float(0.0).tag(sync=True)
    log = t.List(t.Unicode()).tag(sync=True)
    notes = t.List(t.Unicode()).tag(sync=True)    # why a card got nothing new
    started_at = t.Float(None, allow_none=True).tag(sync=True)   # epoch seconds
    ended_at = t.Float(None, allow_none=True).tag(sync=True)
    control_url = t.Unicode("").tag(sync=True)

    LOG_LINES = 8

    def __init__(self, run: "Run", control: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        self._run = run
        self._lock = threading.Lock()
        self._labels = {p.card.key: _data.short_label(p.card) for p in getattr(run, "planned", [])
                        if hasattr(p, "card")}
        self.cards_total = len(run.planned)
        self.total = self._progress().total
        self._channel = None
        self._watch = None
        if not run.done:
            from ._control import ControlChannel, KernelWatch

            if control:
                self._channel = ControlChannel(lambda action: self.control(action)["state"])
                self.control_url = self._channel.url
            self._watch = KernelWatch.of_current_shell()
            if self._watch is not None:
                self._watch.watch(self)
        self._snapshot = SnapshotDisplay(self._repr_mimebundle_)
        self.apply()

    def _ipython_display_(self) -> None:
        """Shown under a display id, so that the output's static snapshot can follow the run."""
        self._snapshot.show()

    def handlers(self) -> dict[str, Callable[..., Any]]:
        return {**super().handlers(), "control": self.control}

    def control(self, action: str) -> dict[str, Any]:
        """Pause, resume or stop the run (served while the search runs in its thread)."""
        if action not in ("pause", "resume", "stop"):
            raise ValueError(f"unknown action {action!r}: pause, resume or stop")
        getattr(self._run, action)()
        self.state = "pausing" if action == "pause" and not self._run.done else self._run.state.value
        return {"state": self.state}

    def _progress(self) -> Progress:
        return Progress.of(list(self._run.events), cards_total=len(self._run.planned),
                           iterations=self._run.budget.iterations)

    def _label(self, key: str | None) -> str:
        return self._labels.get(key or "", (key or "")[:8])

    def apply(self, _events: Sequence["Event"] = ()) -> None:
        """Recount from the run's event list (exact however events and batches interleave)."""
        with self._lock:
            current = ""
            started = ended = None
            best: dict[str, float] = {}
            candidates: dict[str, float] = {}
            log: list[str] = []
            # NB: the counts are the run's Progress (kforge.search): evaluations and proposer failures apart, of a
            # total planned once at the run's start (counting failures as evaluations and re-planning per card
            # showed "64 evaluated" for 37, and a total that went 206 -> 198 -> 99 -> 84)
            progress = self._progress()
            for e in list(self._run.events):
                if e.kind is EventKind.RUN_STARTED:
                    started = e.time
                elif e.kind is EventKind.RUN_FINISHED:
                    ended = e.time
                elif e.kind is EventKind.CARD_STARTED:
                    current = self._label(e.card_key)
                elif e.kind is EventKind.NEW_BEST and e.card_key:   # a candidate's one timing, not the card's
                    candidates[self._label(e.card_key)] = float(e.data.get("speedup", 0.0))
                elif e.kind is EventKind.CARD_FINISHED:
                    label = self._label(e.card_key)
                    candidates.pop(label, None)
                    if e.data.get("status") == "winner":  # the verdict's speedup: the card's, as every view shows it
                        best[label] = float(e.data.get("winner_speedup") or 0.0)
                    else:
                        best.pop(label, None)
                if e.kind is not EventKind.PROPOSED:
                    card = f"{self._label(e.card_key)}: " if e.card_key else ""
                    log.append(f"{time.strftime('%H:%M:%S', time.localtime(e.time))} {e.kind.value:<15} "
                               f"{card}{e.message}")
            with self.hold_sync():
                self.total = progress.total
                self.done, self.cards_done, self.current, self.best = (min(progress.used, progress.total),
                                                                       progress.cards_done, current, best)
                self.evaluated, self.failures = progress.evaluated, progress.proposer_failures
                self.best_candidates = candidates
                self.eta_at = None if progress.eta_s is None else time.time() + progress.eta_s
                self.started_at, self.ended_at = started, ended
                self.log = log[-self.LOG_LINES:]
                self.notes = _data.run_notes(self._run, self._labels) if hasattr(self._run, "budget") else []
                if progress.finished and best:
                    # NB: the chips are each card's calls alone; the model's speedup is another measurement
                    self.notes = [*self.notes, "the model is not timed by a search: session.end_to_end() times it "
                                  "whole, eager and compiled, with and without these winners"]
                self.dollars = self._run.dollars
                state = self._run.state.value
                self.state = "pausing" if self.state == "pausing" and state == "running" else state
                if self._run.error is not None:
                    self.error = f"{type(self._run.error).__name__}: {self._run.error}"
            if self._run.done and self._channel is not None:
                self._channel.close()
                self._channel = None
                self.control_url = ""
            if self._run.done and self._watch is not None:
                self._watch.forget(self)
                self._watch = None

    def to_html(self) -> str:
        return _html.run_progress(self.state, self.done, self.total, self.cards_done, self.cards_total,
                                  self.started_at, self.ended_at, self.best, self.log, self.notes,
                                  evaluated=self.evaluated, failures=self.failures, candidates=self.best_candidates)
