"""Tests of what kforge's optional extras provide skip, naming the extra to install, where it is missing.

The extras are read from pyproject.toml, so a test names an extra, never a list of its packages.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import re
import tomllib
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


@cache
def _extras() -> dict[str, list[str]]:
    with _PYPROJECT.open("rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def _install(extra: str) -> str:
    return f'pip install "kforge[{extra}]"'


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@cache
def distributions(extra: str) -> tuple[str, ...]:
    """The distributions ``kforge[extra]`` asks for, as pyproject.toml names them."""
    if extra not in _extras():
        raise KeyError(f"pyproject.toml has no extra {extra!r}: {sorted(_extras())}")
    return tuple(re.match(r"[A-Za-z0-9._-]+", requirement).group(0) for requirement in _extras()[extra])


@cache
def missing(extra: str) -> tuple[str, ...]:
    """The distributions of ``kforge[extra]`` that are not installed here."""
    gone = []
    for name in distributions(extra):
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            gone.append(name)
    return tuple(gone)


def modules(extra: str) -> set[str]:
    """The top-level modules that the installed distributions of ``kforge[extra]`` provide."""
    wanted = {_normalised(d) for d in distributions(extra)}
    return {module for module, dists in importlib.metadata.packages_distributions().items()
            if wanted & {_normalised(d) for d in dists}}


def needs(extra: str) -> pytest.MarkDecorator:
    """Skip the test (as ``pytestmark``, the module) where a package of ``kforge[extra]`` is not installed."""
    gone = missing(extra)
    return pytest.mark.skipif(bool(gone), reason=f"needs kforge[{extra}] ({', '.join(gone)} not installed): "
                                                 f"{_install(extra)}")


def module(name: str, extra: str) -> ModuleType:
    """Import ``name`` (which ``kforge[extra]`` provides) or skip, at module level too, saying what to install."""
    __tracebackhide__ = True   # the skip is reported at the caller's line
    try:
        return importlib.import_module(name)
    except Exception as exc:  # NB: not only ImportError: transformers fails so where a CUDA-only torchvision is installed
        pytest.skip(f"needs kforge[{extra}] ({name} does not import: {type(exc).__name__}: {exc}): {_install(extra)}",
                    allow_module_level=True)
