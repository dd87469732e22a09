"""Notebook views of a session: card table, search tree, candidate source, run progress, charts.

Needs the notebook extras (``pip install 'kforge[notebook]'``); imported on first use.
"""
from __future__ import annotations

import importlib
from typing import Any

from ._optional import require

_WIDGETS = ("CardTable", "SearchTree", "SourceView", "RunProgress", "View")
_DASHBOARD = ("Dashboard", "dashboard", "progress")

__all__ = [*_WIDGETS, *_DASHBOARD, "charts", "display_session", "display_run"]


def __getattr__(name: str) -> Any:
    if name in _WIDGETS:
        require("anywidget")
        from . import _widgets

        return getattr(_widgets, name)
    if name in _DASHBOARD:
        require("anywidget")
        from . import _dashboard

        return getattr(_dashboard, name)
    if name in ("display_session", "display_run"):
        from . import _session_display

        return getattr(_session_display, name)
    if name == "charts":
        require("altair")
        return importlib.import_module(f"{__name__}.charts")
    raise AttributeError(f"module 'kforge.views' has no attribute {name!r}")
