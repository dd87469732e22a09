"""The CUDA half of the attack corpus (tests/kernels/cuda/attack_*.cu) on a real GPU.

Same checks as tests/test_sandbox.py: each verdict is one the table allows (never FASTER), nothing
escapes the runner, and the next honest and wrong kernels get their verdicts. Run on the device:
`pytest -q tests/test_gpu_attacks.py` (skipped without a GPU, and until branch judge's runner lands).
"""
from __future__ import annotations

import json

import pytest
import torch

from attacks import (CUDA_ATTACKS, FAKE_KEY, HAS_RUNNER, NEEDS_RUNNER_REASON, Jail, kill_children, loot_listener,
                     received, surviving_children)
from kforge.capture import Card
from kforge.evaluate import Evaluator, Status
from kforge.store import Store
from kernel_files import kernel_source

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_RUNNER, reason=NEEDS_RUNNER_REASON)]


@pytest.fixture(scope="module")
def jail(tmp_path_factory):
    jail = Jail.make(tmp_path_factory.mktemp("gpu-sandbox"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(jail.home))
        mp.setenv("KFORGE_CACHE", str(jail.cache))
        mp.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        mp.setenv("KFORGE_SCREEN", "off")
        yield jail
    kill_children(surviving_children())
    jail.clean()


@pytest.fixture(scope="module")
def evaluator(jail):
    with Evaluator("cuda", timeout_s=60) as ev:
        yield ev


@pytest.fixture(scope="module")
def card():
    return Card.for_call("softmax", torch.randn(32, 256, device="cuda"), -1)


@pytest.mark.parametrize("name", sorted(CUDA_ATTACKS))
def test_cuda_attack_gets_a_safe_verdict_and_nothing_escapes(evaluator, jail, card, name):
    attack = CUDA_ATTACKS[name]
    listener = loot_listener()
    try:
        ev = evaluator.evaluate(card, kernel_source("cuda", name))
        loot = received(listener)
    finally:
        if listener is not None:
            listener.close()
    children = surviving_children()
    kill_children(children)
    print(f"{name}: {ev.summary()}")

    assert ev.status is not Status.FASTER, ev.summary()
    assert ev.status in attack.allowed, ev.summary()
    assert jail.dropped_files() == []
    assert jail.tampered_cache_objects() == []
    assert children == [], "child processes outlived the runner"
    assert loot == b"", "the attack reached a local port"
    assert FAKE_KEY not in json.dumps(ev.to_json())
    assert len(ev.message) + len(ev.compile_log) < 64_000
    store = Store(jail.work / name)
    store.set_evaluation(store.add_candidate(card.key, None, "attack", "src"), ev)
    store.close()
    assert jail.files_with_secret() == []
    honest = evaluator.evaluate(card, kernel_source("cuda", "softmax_base"))
    assert honest.status.is_correct, honest.summary()
    wrong = evaluator.evaluate(card, kernel_source("cuda", "fault_oob_read"))
    assert wrong.status is Status.WRONG_RESULT, wrong.summary()
