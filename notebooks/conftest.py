"""nbval runs the tutorials; the GPU walkthrough only where there is a GPU. Without nbval (kforge installed
without its test extra) each tutorial is one skipped item that says what to install."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    if collection_path.name == "03_gpu_walkthrough.ipynb":
        import torch

        return not torch.cuda.is_available()
    return None


class _NoNbval(pytest.Item):
    def runtest(self) -> None:
        pytest.skip('the tutorials run under nbval: pip install "kforge[test]" (or pip install nbval)')


class _Tutorial(pytest.File):
    def collect(self):
        yield _NoNbval.from_parent(self, name=self.path.name)


def pytest_collect_file(file_path: Path, parent):
    if file_path.suffix == ".ipynb" and importlib.util.find_spec("nbval") is None:
        return _Tutorial.from_parent(parent, path=file_path)
    return None
