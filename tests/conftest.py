from __future__ import annotations

import os

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _kernel_cache(tmp_path_factory):
    """Compiled kernels go to a per-run cache, never the user's ~/.cache."""
    if "KFORGE_CACHE" not in os.environ:
        os.environ["KFORGE_CACHE"] = str(tmp_path_factory.mktemp("kforge-cache"))
    yield
