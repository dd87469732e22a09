"""The attack corpus against the evaluator (CPU backend; the CUDA half is tests/test_gpu_attacks.py).

With the static screen off (KFORGE_SCREEN=off, honoured only under pytest) every attack reaches the
runner. For each: its verdict is one the table allows (never FASTER); nothing escaped (no file
outside the runner's folder, no cached library changed, no secret in the verdict, the store or any
file, nothing sent over the network, no surviving child process); the user's process is alive; and
the next honest and wrong kernels get their right verdicts.
"""
from __future__ import annotations

import json

import pytest
import torch

from attacks import CPU_ATTACKS, FAKE_KEY, Jail, kill_children, loot_listener, received, surviving_children
from kforge.capture import Card
from kforge.evaluate import Evaluator, Status
from kforge.kernels import compile_source, load_verified, param_vector
from kforge.store import Store
from kernel_files import kernel_source

SOFTMAX = Card.for_call("softmax", torch.randn(32, 256), -1)


@pytest.fixture(scope="module")
def jail(tmp_path_factory):
    """HOME, KFORGE_CACHE and a workdir of the module's own, a fake API key in the environment, and
    the screen off so the attacks reach the runner."""
    jail = Jail.make(tmp_path_factory.mktemp("sandbox"))
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
    with Evaluator("cpu", timeout_s=30) as ev:
        yield ev


@pytest.mark.parametrize("name", sorted(CPU_ATTACKS))
def test_attack_gets_a_safe_verdict_and_nothing_escapes(evaluator, jail, name):
    attack = CPU_ATTACKS[name]
    listener = loot_listener()
    try:
        ev = evaluator.evaluate(SOFTMAX, kernel_source("cpu", name))
        loot = received(listener)
    finally:
        if listener is not None:
            listener.close()
    children = surviving_children(jail.root)
    kill_children(children)
    print(f"{name}: {ev.summary()}")

    # NB: a timing while other processes held cores its threads needed (ev.contended) can read an attack's honest
    # fallback faster than an eager the load slowed (1.42x and 1.64x beside a full test run, 2026-12-07); such a
    # timing decides no card (search._decide.contended), so it is no win. Uncontended, FASTER is one.
    assert ev.status is not Status.FASTER or ev.contended, ev.summary()
    assert ev.status in attack.allowed or (ev.status is Status.FASTER and ev.contended), ev.summary()
    if ev.status.is_failure:
        assert ev.score == 0.0
    # nothing escaped
    assert jail.dropped_files() == []
    assert jail.tampered_cache_objects() == []
    assert children == [], "child processes outlived the runner"
    assert loot == b"", "the attack reached a local port"
    verdict = json.dumps(ev.to_json())
    assert FAKE_KEY not in verdict, "the API key reached the verdict"
    assert len(ev.message) + len(ev.compile_log) < 64_000, "an unbounded log reached the verdict"
    store = Store(jail.work / name)
    cid = store.add_candidate(SOFTMAX.key, None, "attack", kernel_source("cpu", name))
    store.set_evaluation(cid, ev)
    store.close()
    assert jail.files_with_secret() == []
    # the pool survives: the next honest and wrong kernels get their verdicts
    honest = evaluator.evaluate(SOFTMAX, kernel_source("cpu", "softmax_rows"))
    assert honest.status.is_correct, honest.summary()
    wrong = evaluator.evaluate(SOFTMAX, kernel_source("cpu", "softmax_wrong"))
    assert wrong.status is Status.WRONG_RESULT, wrong.summary()


def test_a_poisoned_cache_never_loads(evaluator, jail):
    """attack_write_outside overwrites every cached library it can reach: an honest winner built
    before it still loads as itself afterwards (or is rebuilt), never as the attacker's code."""
    src = kernel_source("cpu", "softmax_rows") + "\n/* poisoned-cache probe */\n"
    built = compile_source(src, "cpu", "native")
    evaluator.evaluate(SOFTMAX, kernel_source("cpu", "attack_write_outside"))
    again = compile_source(src, "cpu", "native")
    kernel = load_verified(again.path)
    x = torch.randn(32, 256)
    y = torch.empty_like(x)
    kernel.launch([x], [y], param_vector(SOFTMAX.variant))
    torch.testing.assert_close(y, x.softmax(-1))
    assert again.sha256 == built.sha256


def test_a_kernel_can_tell_the_runner_from_the_users_process(jail):
    """attack_detect_runner computes in a process without Python and writes zeros in the user's: the
    evaluator alone cannot see this; the apply/load re-check in the user's process must (issue 12)."""
    kernel = load_verified(compile_source(kernel_source("cpu", "attack_detect_runner"), "cpu", "native").path)
    x = torch.randn(32, 256)
    y = torch.full_like(x, 7.0)
    kernel.launch([x], [y], param_vector(SOFTMAX.variant))
    assert torch.count_nonzero(y) == 0
