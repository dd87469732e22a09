"""The session dashboard: run progress, card table, search tree and source view, wired together."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._optional import require
from ._pump import EventPump

if TYPE_CHECKING:
    from ..search import OptimizationRun
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
        run = run if run is not None else session.run
        if run is not None:
            self.progress = RunProgress(run)
            self.pump.sinks.insert(0, self.progress.apply)
            if not run.done:
                self.pump.follow(run)
        self.tree.selected_id = self._default_candidate()
        parts = [self.progress] if self.progress is not None else []
        self.widget = ipywidgets.VBox(parts + [self.table, ipywidgets.HBox(
            [self.tree, self.source], layout=ipywidgets.Layout(width="100%", align_items="stretch"))])
        self.tree.layout = ipywidgets.Layout(flex="1 1 0", min_width="0")
        self.source.layout = ipywidgets.Layout(flex="1 1 0", min_width="0")

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
