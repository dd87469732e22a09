"""The session dashboard: run progress, card table, search tree and source view, wired together.

One selection (:class:`~._widgets.Selection`) is shared by every view: a row click shows that card's
tree, a node click that candidate, in the browser, with no round trip to a kernel that may be busy;
the kernel gets the changes, whole and in order, when it is idle. The run's events flow into every view.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import _html
from ._optional import require
from ._pump import EventPump
from ._snapshot import SnapshotDisplay

if TYPE_CHECKING:
    from ._run import Run
    from ._session import Session


class Dashboard:
    """The views of one session; selection flows table → tree → source, run events flow into all."""

    def __init__(self, session: "Session", run: "Run | None" = None, interval: float = 0.25):
        from ._widgets import CardTable, RunProgress, SearchTree, Selection, SourceView

        ipywidgets = require("ipywidgets")
        self.session = session
        run = run if run is not None else session.run
        self.run = run
        self.selection = Selection()
        self.table = CardTable(session.cards, session.store, run=run, selection=self.selection)
        self.tree = SearchTree(session.store, session.cards, run=run, selection=self.selection)
        self.source = SourceView(session.store, selection=self.selection)
        self.pump = EventPump([self.table.apply, self.tree.apply, self.source.apply], interval=interval)
        self.progress: RunProgress | None = None
        self.snapshot = SnapshotDisplay(self._repr_mimebundle_)
        self._watch = None
        if run is not None:
            self.progress = RunProgress(run)
            self.pump.sinks.insert(0, self.progress.apply)
            if not run.done:
                self.pump.sinks.append(self.snapshot.apply)   # after the views: it renders what they show
                self._watch_kernel()
                self.pump.follow(run)
                self._resync(run)
        self.tree.selected_id = self.tree.default_candidate()
        parts = [self.progress] if self.progress is not None else []
        # NB: side by side where both get 440 px, else the source under the tree, full width (a 1024 px
        # window with the file browser open, a side panel): code and tabs stay readable
        self.widget = ipywidgets.VBox(parts + [self.table, ipywidgets.HBox(
            [self.tree, self.source], layout=ipywidgets.Layout(width="100%", align_items="stretch",
                                                               flex_flow="row wrap"))])
        self.tree.layout = ipywidgets.Layout(flex="1 1 440px", min_width="0")
        self.source.layout = ipywidgets.Layout(flex="1 1 440px", min_width="0")

    def _resync(self, run: "Run") -> None:
        """Re-read once after subscribing: nothing the run did while the views were built is lost."""
        self.table.apply([])
        self.tree.refresh()
        self.source.refresh()
        if run.done:
            self.tree.live = False
            self.table.searching = ""
        if self.progress is not None:
            self.progress.apply()

    def _watch_kernel(self) -> None:
        """The source view asks the kernel for a candidate not pushed yet: let it know when it would wait."""
        from ._control import KernelWatch

        self._watch = KernelWatch.of_current_shell()
        if self._watch is not None:
            self._watch.watch(self.source)
            self.pump.sinks.append(self._forget_kernel)

    def _forget_kernel(self, _events: object) -> None:
        if self._watch is not None and self.run is not None and self.run.done:
            self._watch.forget(self.source)
            self._watch = None

    def to_html(self) -> str:
        """The dashboard as it is now, as static HTML (no script): the card and candidate the front end
        shows (the one searched while it follows the search)."""
        parts = [self.progress.to_html()] if self.progress is not None else []
        key = self.table.shown_key
        shown = self.tree.shown_id(key)
        source = self.source.to_html(shown) if shown is not None else _html.source_view(None)
        return "".join(parts + [self.table.to_html(), self.tree.to_html(key), source])

    def _ipython_display_(self) -> None:
        """Shown under a display id: the output's static snapshot follows the run to its end."""
        self.snapshot.show()

    def export_html(self, path: str | Path, charts: bool = True) -> Path:
        """Write a standalone HTML page of the dashboard (and the charts as images) to ``path``."""
        parts = [self.to_html()]
        if charts:
            from .charts import static_images

            parts += static_images(self.session)
        path = Path(path)
        path.write_text(_html.page(f"kforge · {self.session.workdir.name}", parts), encoding="utf-8")
        return path

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        if isinstance(data, dict):
            data["text/html"] = self.to_html()
        return bundle


def dashboard(session: "Session", run: "Run | None" = None) -> Dashboard:
    """The session's views in one display: progress (if a run exists), cards, search tree, source."""
    return Dashboard(session, run)


def progress(run: "Run") -> Any:
    """A progress view of ``run`` with pause / resume / stop, updated live while it searches."""
    from ._widgets import RunProgress

    view = RunProgress(run)
    if not run.done:
        view._pump = EventPump([view.apply, view._snapshot.apply])
        view._pump.follow(run)
    return view
