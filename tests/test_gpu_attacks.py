"""The CUDA half of the attack corpus (tests/kernels/cuda/attack_*.cu) on a real GPU.

Same checks as tests/test_sandbox.py: each verdict is one the table allows (never FASTER), nothing
escapes the runner, and the next honest and wrong kernels get their verdicts. Run on the device:
`pytest -q tests/test_gpu_attacks.py` (skipped without a GPU).
"""
from __future__ import annotations

import json

import pytest
import torch

from attacks import CUDA_ATTACKS, FAKE_KEY, Jail, kill_children, loot_listener, received, surviving_children
from kforge.capture import Card
from kforge.evaluate import Evaluator, Status
from kforge.store import Store
from kernel_files import kernel_source

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def jail(tmp_path_factory):
    jail = Jail.make(tmp_path_factory.mktemp("gpu-sandbox"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(jail.home))
        mp.setenv("KFORGE_CACHE", str(jail.cache))
        mp.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        mp.setenv("KFORGE_SCREEN", "off")
        yield jail
    kill_children(surviving_children(jail.root))
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
    children = surviving_children(jail.root)
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


# ----------------------------------------------------------------------------- the judge wall (issue 42)

def test_cuda_arenas_share_no_allocator_segment_with_the_judges_tensors():
    """An IPC handle opens the whole allocator segment its tensor lies in: the arenas come from a pool of their own,
    so that the judge's copy of the inputs and eager's references (default pool) are never in a runner's reach."""
    from kforge.evaluate import _arena

    device = f"cuda:{torch.cuda.current_device()}"
    arena = _arena._cuda_arena(device, "judge-wall-test", 3 << 20)
    judge_own = [torch.empty(n, dtype=torch.uint8, device=device) for n in (4096, 1 << 20, 5 << 20, 12 << 20)]
    segments = [(s["address"], s["address"] + s["total_size"]) for s in torch.cuda.memory_snapshot()]
    lo, hi = next((a, b) for a, b in segments if a <= arena.data_ptr() < b)
    assert not [t.data_ptr() for t in judge_own if lo <= t.data_ptr() < hi]


def test_cuda_recheck_refuses_a_kernel_wrong_after_its_eighth_call(card):
    from kforge.deploy._recheck import recheck
    from kforge.kernels import compile_source, device_info, load_verified, param_vector

    arch = device_info(card.variant.device).arch
    kernel = load_verified(compile_source(kernel_source("cuda", "attack_wrong_after_calls"), "cuda", arch).path)
    params = param_vector(card.variant)

    def launch(inputs):
        y = torch.empty_like(inputs[0])
        kernel.launch([inputs[0]], [y], params, stream=torch.cuda.current_stream().cuda_stream)
        return [y]

    result = recheck(launch, card.variant)
    assert not result.ok and "differently in this process" in result.message, result.message
    honest = load_verified(compile_source(kernel_source("cuda", "softmax_rows"), "cuda", arch).path)

    def launch_honest(inputs):
        y = torch.empty_like(inputs[0])
        honest.launch([inputs[0]], [y], params, stream=torch.cuda.current_stream().cuda_stream)
        return [y]

    assert recheck(launch_honest, card.variant).ok


def test_cuda_input_rewritten_in_timed_calls_is_caught_as_modified(evaluator, card):
    """attack_reopen_input.cu zeros its input (device memory the runner can write) in the timed calls: eager's
    reference comes from the judge's own copy, and the comparison of every batch's inputs names it."""
    ev = evaluator.evaluate(card, kernel_source("cuda", "attack_reopen_input"))
    assert ev.status is Status.WRONG_RESULT and "modified an input" in ev.message, ev.summary()


def test_cuda_runner_holding_too_much_host_memory_is_blamed(evaluator, card):
    ev = evaluator.evaluate(card, kernel_source("cuda", "attack_hold_memory"))
    assert ev.status in (Status.CRASHED, Status.LAUNCH_ERROR) and ev.status.blames_candidate, ev.summary()
