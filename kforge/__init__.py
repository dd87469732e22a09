"""kforge: capture the operators a PyTorch model runs, search for faster kernels, put them back."""
from __future__ import annotations

__version__ = "0.1.0"

from .capture import Batches, Card, Cards, CaptureError, CaptureLimits
from .examples import example
from .session import Session

__all__ = ["Batches", "Card", "Cards", "CaptureError", "CaptureLimits", "Session", "example", "__version__"]
