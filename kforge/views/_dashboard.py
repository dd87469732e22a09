"""The session dashboard: run progress, card table, search tree and source view, wired together."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ..search import EventKind

from ._optional import require
from ._pump import EventPump

if TYPE_CHECKING:
    from ..search import Event, OptimizationRun
    from ..session import Session


class Dashboard:
    """The views of one session; selection flows table → tree → source, run events flow into all."""

    def __init__(self, session: "Session", run: "OptimizationRun | None" = None, interval: float = 0.25):
        from ._widgets import CardTable, RunProgress, SearchTree, SourceView

        ipywidgets = require("ipywidgets")
        self.session = session
        self.table = CardTable(session.cards, session.store)
        self.tree = SearchTree(session.store, session.cards, card_key=self.table.selected_key)
        self.source = SourceView(session.store)
        self.pump = EventPump([self.table.apply, self.tree.apply], interval=interval)
        ipywidgets.dlink((self.table, "selected_key"), (self.tree, "card_key"))
        ipywidgets.dlink((self.tree, "selected_id"), (self.source, "candidate_id"))
        self.progress: RunProgress | None = None
        self._following = self._selecting = False
        run = run if run is not None else session.run
        if run is not None:
            self.progress = RunProgress(run)
            self.pump.sinks.insert(0, self.progress.apply)
            if not run.done:
                self._follow_search(run)
                self.pump.follow(run)
        self.tree.selected_id = self._default_candidate()
        parts = [self.progress] if self.progress is not None else []
        self.widget = ipywidgets.VBox(parts + [self.table, ipywidgets.HBox(
            [self.tree, self.source], layout=ipywidgets.Layout(width="100%", align_items="stretch"))])
        self.tree.layout = ipywidgets.Layout(flex="1 1 0", min_width="0")
        self.source.layout = ipywidgets.Layout(flex="1 1 0", min_width="0")

    def _follow_search(self, run: "OptimizationRun") -> None:
        """Show the card being searched until the user picks one."""
        started = [e.card_key for e in list(run.events) if e.kind is EventKind.CARD_STARTED]
        self._select(started[-1] if started else run.planned[0].card.key)
        self._following = True
        self.table.observe(self._user_selected, names="selected_key")
        self.pump.sinks.append(self._apply)

    def _select(self, key: str | None) -> None:
        self._selecting = True
        try:
            self.table.selected_key = key or ""
        finally:
            self._selecting = False

    def _user_selected(self, _change: Any) -> None:
        if not self._selecting:
            self._following = False

    def _apply(self, events: Sequence["Event"]) -> None:
        if not self._following:
            return
        for e in events:
            if e.kind is EventKind.CARD_STARTED:
                self._select(e.card_key)
        if self.tree.selected_id is None and self.tree.nodes:
            self.tree.selected_id = self.tree.nodes[-1]["id"]

    def _default_candidate(self) -> int | None:
        path = self.tree.best_path
        if path:
            return path[-1]
        return self.tree.nodes[-1]["id"] if self.tree.nodes else None

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)


def dashboard(session: "Session", run: "OptimizationRun | None" = None) -> Dashboard:
    """The session's views in one display: progress (if a run exists), cards, search tree, source."""
    return Dashboard(session, run)


def progress(run: "OptimizationRun") -> Any:
    """A progress view of ``run`` with pause / resume / stop, updated live while it searches."""
    from ._widgets import RunProgress

    view = RunProgress(run)
    if not run.done:
        view._pump = EventPump([view.apply])
        view._pump.follow(run)
    return view
