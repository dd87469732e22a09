"""Display hooks that Session and OptimizationRun delegate to, with a text fallback."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..search import OptimizationRun
    from ..session import Session


def display_session(session: "Session") -> None:
    """Show the dashboard of ``session``; its text repr where there are no cards or no widgets."""
    from IPython.display import display

    if session._cards is None:
        display(_Text(repr(session)))
        return
    try:
        from ._dashboard import dashboard

        display(dashboard(session))
    except ImportError as exc:
        display(_Text(f"{session!r}\n({exc})"))


def display_run(run: "OptimizationRun") -> None:
    """Show the live progress view of ``run``; its text repr where there are no widgets."""
    from IPython.display import display

    try:
        from ._dashboard import progress

        display(progress(run))
    except ImportError as exc:
        display(_Text(f"{run!r}\n({exc})"))


class _Text:
    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text
