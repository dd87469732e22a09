"""kforge: capture the operators a PyTorch model runs, search for faster kernels, put them back."""
from __future__ import annotations

from ._version import __version__

from .capture import Batches, CaptureError, CaptureLimits
from .ops import Card, Cards
from . import regions as _regions  # noqa: F401  (registers the "region" op spec)
from .examples import example
from .session import Session


def load(model, path, *, device=None, revalidate=None, all_winners=False, dispatch_cost=None, inputs=None,
         rewrites=None):
    """Install the kernels exported to ``path`` into ``model`` (no LLM, no search, no store).

    Returns a Deployment (``remove()`` undoes it); ``.compile(model, mode=...)`` on it returns the model
    compiled by torch.compile with the kernels inside its graphs. Kernels built for another GPU architecture or
    torch version are rebuilt and re-validated against eager first; failures stay on eager. An
    operator's kernels are left out when dispatching it costs this host more than they save
    (listed in ``Deployment.skipped``); ``all_winners=True`` installs them anyway. That cost is
    measured in this process; ``dispatch_cost=kforge.deploy.DispatchCost(hit_us, miss_us)`` or
    ``KFORGE_DISPATCH_COST=hit_us,miss_us`` gives it instead.

    The inference rewrites the artifact was exported with (``Session.export(path, rewrites=...)``) and kept are made
    again on ``model``, eagerly and in ``.compile(...)``'s graphs (``rewrites=()`` for none, or the names wanted),
    each once ``model``'s output with it checks equal to its output without it: on ``inputs`` (what the model runs
    on, as for ``Session(model, inputs)``) where given, else on inputs drawn like the exported session's (the
    artifact describes their shapes and ranges). ``Deployment.rewrite_checks`` says what each got, with the ratio
    and noise it was kept on at export; ``revalidate=False`` skips the check.
    """
    from .deploy import load_artifact

    return load_artifact(model, path, device=device, revalidate=revalidate, all_winners=all_winners,
                         dispatch_cost=dispatch_cost, inputs=inputs, rewrites=rewrites)

def load_ipython_extension(ipython) -> None:
    """``%load_ext kforge``: registers the ``%kforge`` magics (IPython stays optional)."""
    from .magics import load_ipython_extension as _load

    _load(ipython)


__all__ = ["Batches", "Card", "Cards", "CaptureError", "CaptureLimits", "Session", "example", "load", "__version__"]
