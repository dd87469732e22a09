"""Where the front end (one ES module, one stylesheet) is: one committed copy, in ``widgets/``.

A wheel carries it as ``kforge/views/static/`` (``setup.py``'s build step copies ``widgets/`` there);
a source checkout reads ``widgets/`` itself, so an edit shows on the next widget without a build.
"""
from __future__ import annotations

from pathlib import Path

PACKAGED = Path(__file__).parent / "static"
CHECKOUT = Path(__file__).resolve().parents[2] / "widgets"


def static_dir() -> Path:
    """The folder holding kforge.js and kforge.css, packaged copy first."""
    for folder in (PACKAGED, CHECKOUT):
        if (folder / "kforge.js").is_file() and (folder / "kforge.css").is_file():
            return folder
    raise FileNotFoundError(f"kforge's notebook front end is missing: neither {PACKAGED} nor {CHECKOUT} holds "
                            "kforge.js and kforge.css; reinstall kforge (pip install 'kforge[notebook]')")


def static_file(name: str) -> Path:
    return static_dir() / name
