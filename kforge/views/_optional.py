"""Optional notebook dependencies, imported on first use with an actionable message."""
from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str) -> ModuleType:
    """Import ``module`` or explain how to install the notebook extras."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"kforge's notebook views need {module.split('.')[0]!r}: "
                          "install kforge[notebook] (pip install 'kforge[notebook]')") from exc
