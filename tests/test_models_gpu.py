"""The language-model measurement on a real GPU: compare_decode with compiled arms.

Skipped cleanly where there is no GPU (CI); run on the device with `pytest tests/test_models_gpu.py`.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from kforge import models

import extras

pytestmark = pytest.mark.gpu


# NB: on the H200 (torch 2.11) reduce-overhead segfaulted in a Triton launch under cudagraph_trees
# (2026-12-02/03) while the whole generate was compiled with dynamic=False; compiling the one-token
# steps with dynamic=None (decode_steps, as generate compiles) ran every case, both modes in one
# process included (2026-12-03, device_session.sh accuracy).
@pytest.mark.parametrize("modes", [pytest.param(("default",), id="default"),
                                   pytest.param(("reduce-overhead",), id="reduce-overhead"),
                                   pytest.param(("default", "reduce-overhead"), id="both")])
def test_compare_decode_alternates_compiled_forwards_on_cuda(modes):
    """Plain eager and compiled forwards (reduce-overhead: CUDA graphs) alternate round by round in
    one process: every arm keeps its own compiled code (no recompile into eager), and all agree."""
    extras.module("transformers", "models")
    from kforge.deploy._graph import compile_with

    model, ids = models.gemma4_e2b(device="cuda", dtype=torch.float32, layers=1, tokens=16,
                                   overrides={"vocab_size": 4096, "vocab_size_per_layer_input": 4096})
    torch._dynamo.reset()
    arms = {"eager": contextlib.nullcontext}
    forwards = {}
    for mode in modes:
        # NB: as the benchmark decodes (and transformers' generate compiles): the steps only, dynamic=None
        forwards[mode] = compile_with(model.forward, [], mode=mode, dynamic=None)
        arms[f"compile {mode}"] = lambda f=models.decode_steps(model, forwards[mode]): models.forward_as(model, f)
    try:
        result = models.compare_decode(model, ids, 8, arms, rounds=3)
    finally:
        torch._dynamo.reset()
    assert all(arm.error is None for arm in result.values()), {k: a.error for k, a in result.items()}
    assert result["eager"].decode.cache == "static"
    for label in (f"compile {m}" for m in modes):
        arm = result[label]
        assert arm.logit_rel_diff < 1e-3 and arm.same_tokens, (label, arm.logit_rel_diff)
        assert arm.ratio > 0 and arm.decode.tokens_per_s > 0
    for f in forwards.values():
        assert f.kforge_backend.graphs, "the compiled forward never reached kforge's backend"
