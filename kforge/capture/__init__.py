"""Capture: run a model under a recording mode and produce operator cards."""
from __future__ import annotations

from ._capture import Batches, CaptureError, CaptureLimits, capture_cards, split_batch, time_variant
from ..ops import Card, Cards

__all__ = ["Batches", "Card", "Cards", "CaptureError", "CaptureLimits", "capture_cards", "split_batch",
           "time_variant"]
