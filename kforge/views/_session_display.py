"""Display hooks that Session and OptimizationRun delegate to, with a text fallback."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._run import Run
    from ._session import Session


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
    lines = model_level(session)
    if lines:
        display(_Text("\n".join(lines)))


def model_level(session: "Session") -> list[str]:
    """The model-level result per mode beside the cards' own: the last ``end_to_end()`` table's headline, or,
    where the session has searched but not timed the model, what to call (a card's speedup is its calls
    alone, not the model's)."""
    table = getattr(session, "last_end_to_end", None)
    if table is not None:
        return ["the model, timed whole (session.end_to_end()):", *(f"  {line}" for line in table.headline())]
    if session.run is None and not session.store.candidates():
        return []
    return ["the model: not timed yet (each card's speedup is its calls alone, against eager); "
            "session.end_to_end() times the whole model eager and compiled, with and without the winners"]


def display_run(run: "Run") -> None:
    """Show the live progress view of ``run``; its text repr where there are no widgets."""
    from IPython.display import display

    if getattr(run, "shown_live", False):   # a blocking optimize() just showed it live, in this cell
        display(_Text(repr(run)))
        return
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
