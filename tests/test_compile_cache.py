"""The content-addressed kernel cache: a library changed after it was built is never loaded."""
from __future__ import annotations

import json
import threading

import pytest
import torch

from kforge.capture import Card
from kforge.deploy import ExportedKernel
from kforge.deploy._artifact import export_artifact
from kforge.kernels import (CacheTamperedWarning, KernelIntegrityError, compile_source, load_verified, param_vector,
                            verify_binary)
from kernel_files import kernel_source

SOFTMAX = Card.for_call("softmax", torch.randn(8, 64), -1)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KFORGE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "kernels"


def _run(path) -> torch.Tensor:
    x = torch.randn(8, 64)
    y = torch.empty_like(x)
    load_verified(path).launch([x], [y], param_vector(SOFTMAX.variant))
    return (y - x.softmax(-1)).abs().max()


def test_a_build_records_the_hash_of_its_binary(cache):
    built = compile_source(kernel_source("cpu", "softmax_rows"), "cpu", "native")
    assert not built.cached and len(built.sha256) == 64
    assert built.path.parent == cache / "objects" and built.path.stem == built.sha256
    built.verify()
    (entry,) = (cache / "index").glob("*.json")
    assert json.loads(entry.read_text())["sha256"] == built.sha256
    hit = compile_source(kernel_source("cpu", "softmax_rows"), "cpu", "native")
    assert hit.cached and hit.path == built.path and hit.sha256 == built.sha256
    assert _run(hit.path) < 1e-6


def test_an_overwritten_library_is_reported_deleted_and_rebuilt(cache):
    """The attack of issue 12: a candidate overwrote a cached winner with its own library."""
    honest = compile_source(kernel_source("cpu", "softmax_rows"), "cpu", "native")
    evil = compile_source(kernel_source("cpu", "softmax_wrong"), "cpu", "native")
    honest.path.write_bytes(evil.path.read_bytes())
    with pytest.raises(KernelIntegrityError, match="modified after it was built"):
        honest.verify()
    with pytest.warns(CacheTamperedWarning, match="rebuilt"):
        again = compile_source(kernel_source("cpu", "softmax_rows"), "cpu", "native")
    assert not again.cached and "rebuilt" in again.log
    again.verify()
    assert again.sha256 == honest.sha256     # gcc is deterministic: the same bytes come back
    assert _run(again.path) < 1e-6


def test_load_verified_refuses_and_removes_a_changed_library(cache):
    built = compile_source(kernel_source("cpu", "softmax_rows"), "cpu", "native")
    with open(built.path, "ab") as f:
        f.write(b"\0")
    with pytest.raises(KernelIntegrityError, match="refusing to load it"):
        load_verified(built.path)
    assert not built.path.exists()
    # the index entry now names a missing object: the next build says so and makes it again
    with pytest.warns(CacheTamperedWarning, match="missing"):
        again = compile_source(kernel_source("cpu", "softmax_rows"), "cpu", "native")
    assert again.path.exists() and _run(again.path) < 1e-6


def test_a_library_outside_the_cache_needs_its_expected_hash(cache, tmp_path):
    built = compile_source(kernel_source("cpu", "softmax_rows"), "cpu", "native")
    copy = tmp_path / "copy.so"
    copy.write_bytes(built.path.read_bytes())
    with pytest.raises(KernelIntegrityError, match="no recorded SHA-256"):
        verify_binary(copy)
    assert verify_binary(copy, built.sha256) == copy
    with pytest.raises(KernelIntegrityError):
        verify_binary(copy, "0" * 64)


def test_a_changed_cache_entry_never_reaches_an_exported_artifact(cache, tmp_path):
    built = compile_source(kernel_source("cpu", "softmax_rows"), "cpu", "native")
    with open(built.path, "ab") as f:
        f.write(b"\0")
    with pytest.raises(KernelIntegrityError):
        export_artifact(tmp_path / "artifact", [ExportedKernel(SOFTMAX.variant, "src", built.path, 1, 2.0)], "cpu")


def test_a_corrupt_index_entry_is_rebuilt(cache):
    built = compile_source(kernel_source("cpu", "softmax_rows"), "cpu", "native")
    (entry,) = (cache / "index").glob("*.json")
    entry.write_text("{not json")
    with pytest.warns(CacheTamperedWarning, match="unreadable"):
        again = compile_source(kernel_source("cpu", "softmax_rows"), "cpu", "native")
    assert again.sha256 == built.sha256 and json.loads(entry.read_text())["sha256"] == built.sha256


def test_concurrent_builders_of_one_source_agree(cache):
    src = kernel_source("cpu", "softmax_rows") + "\n/* concurrent */\n"
    results = []
    threads = [threading.Thread(target=lambda: results.append(compile_source(src, "cpu", "native")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3
    for r in results:
        r.verify()
    final = compile_source(src, "cpu", "native")
    assert final.cached
    final.verify()
