"""kforge: capture the operators a PyTorch model runs, search for faster kernels, put them back."""
from __future__ import annotations

__version__ = "0.1.0"

from .capture import Batches, Card, Cards, CaptureError, CaptureLimits
from .examples import example
from .session import Session


def load(model, path, *, device=None, revalidate=None):
    """Install the kernels exported to ``path`` into ``model`` (no LLM, no search, no store).

    Returns a Deployment (``remove()`` undoes it); ``.compile(model, mode=...)`` on it returns the model
    compiled by torch.compile with the kernels inside its graphs. Kernels built for another GPU architecture or
    torch version are rebuilt and re-validated against eager first; failures stay on eager.
    """
    from .deploy import load_artifact

    return load_artifact(model, path, device=device, revalidate=revalidate)

def load_ipython_extension(ipython) -> None:
    """``%load_ext kforge``: registers the ``%kforge`` magics (IPython stays optional)."""
    from .magics import load_ipython_extension as _load

    _load(ipython)


__all__ = ["Batches", "Card", "Cards", "CaptureError", "CaptureLimits", "Session", "example", "load", "__version__"]
