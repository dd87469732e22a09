"""The attack corpus through the user's process (issue 42): every CPU attack of tests/attacks.py that builds with the
screen off, deployed as `Session.apply()` and `kforge.load()` deploy a kernel (`DeployedKernel.from_binary`: the
binary wall, then a sandboxed worker that loads it; then the re-check before install, `refuse_failing`), with a fake
API key in the environment and a listener on the port the attacks send to.

For each: nothing is reached (no file dropped, no secret written anywhere, nothing received on the port, no child
left behind, no mark of a constructor in the user's own environment), and the kernel is refused, by the binary wall
before anything of it runs or by the re-check, with a message naming why, unless it computes what eager computes
where it runs (attacks on the judge's timing, honest in a worker that times nothing; attacks that act in the
process they run in, which on the CPU is the worker's sandbox). An attack the table marks `acts_in_process` is a
hole this wall does not close: its test is an expected failure, strict, so that closing the hole shows (none is left
on the CPU since deployed CPU kernels run in their worker, deploy/_worker.py).

Each kernel that passes the wall is deployed from a child process of its own (that is the user's process here).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attacks import CPU_ATTACKS, FAKE_KEY, LOOT_PORT, Jail, kill_children, loot_listener, received, surviving_children
from kforge.capture import Card
from kforge.evaluate import Status
from kforge.kernels import BinaryRejected, CompileError, compile_source, verify_binary
from kernel_files import kernel_source

SOFTMAX = Card.for_call("softmax", torch.randn(32, 256), -1)

# NB: the user's process: loads the kernel as apply/load do and re-checks it, under an address-space limit so that a
# kernel taking all memory fails there; prints one JSON line
CHILD = r"""
import ctypes, json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
import torch
from kforge.deploy._launch import DeployedKernel
from kforge.deploy._recheck import refuse_failing
from kforge.kernels import BinaryRejected
from kforge.ops import Variant
variant = Variant.from_json(json.loads(sys.argv[2]))
try:
    kernel = DeployedKernel.from_binary(variant, sys.argv[1], None, 0, 2.0)
except BinaryRejected as exc:
    print(json.dumps({"refused": "wall", "message": str(exc)}), flush=True)
    sys.exit(0)
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    kept, refused = refuse_failing([kernel])
    for dk in kept:   # the model's calls after install
        for _ in range(3):
            dk((torch.randn(variant.inputs[0].shape),))
        dk.close()
getenv = ctypes.CDLL(None).getenv
getenv.restype = ctypes.c_char_p
mark = getenv(b"KFORGE_ATTACK_CTOR")   # NB: the C environment, where a constructor run here would leave its mark
message = refused[0][1] if refused else "matched eager on every compared call"
print(json.dumps({"refused": "recheck" if refused else "", "message": message,
                  "mark": mark.decode() if mark else None}), flush=True)
"""


@pytest.fixture(scope="module")
def jail(tmp_path_factory):
    """HOME, KFORGE_CACHE and a workdir of the module's own, a fake API key in the environment."""
    jail = Jail.make(tmp_path_factory.mktemp("apply"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(jail.home))
        mp.setenv("KFORGE_CACHE", str(jail.cache))
        mp.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        yield jail
    kill_children(surviving_children(jail.root))
    jail.clean()


def _in_users_process(path: Path, jail: Jail) -> tuple[dict, int]:
    env = {**os.environ, "KFORGE_SCREEN": "binary", "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), json.dumps(SOFTMAX.variant.to_json())],
                          env=env, cwd=jail.work, capture_output=True, text=True, timeout=600, start_new_session=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if lines:
        return json.loads(lines[-1]), proc.returncode
    return {"refused": "", "message": f"the process died ({proc.returncode}): {proc.stderr[-2000:]}"}, proc.returncode


def _cases() -> list:
    return [pytest.param(name, id=name, marks=[pytest.mark.xfail(reason=a.acts_in_process, strict=True)]
                         if a.acts_in_process else []) for name, a in sorted(CPU_ATTACKS.items())]


@pytest.mark.parametrize("name", _cases())
def test_an_attack_deployed_in_the_users_process_reaches_nothing(jail, name, monkeypatch):
    attack = CPU_ATTACKS[name]
    monkeypatch.setenv("KFORGE_SCREEN", "off")     # built as the runner would get it: no screen, no wall
    try:
        built = compile_source(kernel_source("cpu", name), "cpu", "native")
    except CompileError as exc:
        # NB: never built, so never deployed: the table must say so
        assert not isinstance(exc, BinaryRejected)
        assert Status.COMPILE_ERROR in attack.allowed, exc
        return
    monkeypatch.setenv("KFORGE_SCREEN", "binary")  # the wall on, as in every user's process
    listener = loot_listener()
    if listener is None and attack.acts_in_process:
        # NB: what it sends would reach the session that holds the port (another run of the corpus) and fail it
        pytest.skip(f"port {LOOT_PORT} is taken: {name} would send the key to whoever holds it")
    try:
        try:
            verify_binary(built.path)
            outcome, code = _in_users_process(built.path, jail)
        except BinaryRejected as exc:
            outcome, code = {"refused": "wall", "message": str(exc)}, 0
        loot = received(listener)
    finally:
        if listener is not None:
            listener.close()
    children = surviving_children(jail.root)
    kill_children(children)
    monkeypatch.setenv("KFORGE_SCREEN", "off")     # the cache's attack objects: their checksums, not the wall again
    tampered = jail.tampered_cache_objects()
    print(f"{name}: {outcome['refused'] or 'kept'}: {outcome['message'][:200]} (exit {code})")

    dropped, secret = jail.dropped_files(), jail.files_with_secret()
    jail.clean()
    assert loot == b"", "the attack reached a local port from the user's process"
    assert dropped == [], "the attack wrote a file from the user's process"
    assert secret == [], "the API key reached a file"
    assert children == [], "child processes outlived the user's process"
    assert tampered == [], "a cached library changed"
    assert outcome.get("mark") is None, "the kernel's constructor ran in the user's process"
    if outcome["refused"] == "wall":
        assert outcome["message"].startswith("the built library was refused before loading: the library"), outcome
        assert "`" in outcome["message"] or "system calls" in outcome["message"], outcome   # names what
    elif outcome["refused"] == "recheck":
        assert outcome["message"].startswith("refused at apply: "), outcome
        assert len(outcome["message"]) > len("refused at apply: ") + 10
    else:
        # kept: it computed what eager computes on every compared call of the re-check (an attack on the judge's
        # clock, batches or caches has nothing to forge in a worker that times nothing; one that acts on the process
        # it runs in acts on its worker's sandbox). NB: before the worker, an out-of-bounds write could corrupt the
        # user's heap here; now it costs its worker (refused) and never the user's process
        assert code == 0 and outcome["refused"] == "" and outcome["message"].startswith("matched eager"), outcome
