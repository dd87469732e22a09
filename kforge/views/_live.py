"""A blocking ``optimize()`` in a notebook, shown live.

A kernel reads no widget message while a cell runs, and a search run in the cell's own thread
shows nothing until it ends. So in a notebook a blocking search runs exactly as a background one
does (its own thread, the views fed by its events, pause / resume / stop over the run's control
channel) while the cell waits on it: ``session.optimize()`` and ``%%kforge optimize`` show the same
live progress view.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._run import Run


def notebook_shell() -> Any:
    """The IPython shell of a notebook kernel (one that can show widgets), else None."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return shell if shell is not None and getattr(shell, "kernel", None) is not None else None


def run_live(run: "Run") -> bool:
    """Run ``run`` in its thread with its progress view shown, and wait for it; False (nothing done)
    where no live view can show: no notebook kernel, or no widget libraries."""
    if notebook_shell() is None:
        return False
    try:
        from ._dashboard import progress

        view = progress(run)
    except ImportError:
        return False
    from IPython.display import display

    display(view)
    run.shown_live = True
    run.start(background=True)
    try:
        run.wait()
    except KeyboardInterrupt:   # Kernel > Interrupt: the search stops after the evaluation in progress
        run.stop()
        run.wait()
        raise
    shell = notebook_shell()

    def shown(*_: Any) -> None:   # the cell's result is this run: the view above already shows it
        run.shown_live = False
        shell.events.unregister("post_run_cell", shown)

    shell.events.register("post_run_cell", shown)
    return True
