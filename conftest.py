"""pyproject's addopts name nbval's --nbval-lax; where nbval is not installed (kforge without its test
extra) the option is registered here as a no-op, so the suite still starts and notebooks/conftest.py
skips the tutorials with a reason."""
from __future__ import annotations

import importlib.util


def pytest_addoption(parser) -> None:
    if importlib.util.find_spec("nbval") is None:
        parser.addoption("--nbval-lax", action="store_true", help="(nbval is not installed: no effect)")
