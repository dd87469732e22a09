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


@pytest.fixture(autouse=True, scope="session")
def _no_dispatch_cost():
    """apply/export/load do not filter winners by a measured dispatch cost in tests (whether a
    winner survives would depend on this machine's load); the tests of the filter give costs."""
    before = os.environ.get("KFORGE_DISPATCH_COST")
    os.environ["KFORGE_DISPATCH_COST"] = "0,0"
    yield
    if before is None:
        os.environ.pop("KFORGE_DISPATCH_COST", None)
    else:
        os.environ["KFORGE_DISPATCH_COST"] = before


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test's compiled code is its own: dynamo's caches are per code object and outlive a test, so a
    model class many tests compile (region capture compiles every captured model) reached dynamo's recompile
    limit in whichever test came ninth."""
    yield
    import sys

    if "torch._dynamo" in sys.modules:
        sys.modules["torch._dynamo"].reset()
