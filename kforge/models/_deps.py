"""Lazy imports of the optional packages the model builders need, with an actionable message."""
from __future__ import annotations

import importlib
import os
from types import ModuleType


class MissingDependency(ImportError):
    """A model builder needs a package that is not installed (or does not import here)."""


_INSTALL = {
    "transformers": "pip install 'kforge[models]'",
    "diffusers": "pip install 'kforge[models]'",
    "torchvision": "pip install torchvision (the build that matches your torch)",
}


def require(package: str, model: str) -> ModuleType:
    """Import ``package`` for the builder of ``model``, or raise MissingDependency saying what to install."""
    if package in ("transformers", "diffusers"):
        # NB: the builders never download; set before huggingface_hub reads it on first import.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        return importlib.import_module(package)
    except Exception as exc:  # a CUDA-only torchvision raises RuntimeError/OSError, not ImportError
        raise MissingDependency(
            f"kforge.models.build({model!r}) needs {package}: {_INSTALL[package]} "
            f"(importing it failed with {type(exc).__name__}: {exc})") from exc
