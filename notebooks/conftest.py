"""nbval runs the tutorials; the GPU walkthrough only where there is a GPU."""
from __future__ import annotations

from pathlib import Path


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    if collection_path.name == "03_gpu_walkthrough.ipynb":
        import torch

        return not torch.cuda.is_available()
    return None
