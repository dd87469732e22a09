"""Searching on a Ray cluster: a local two-worker cluster on the CPU, the built-in examples, an actor killed.

The cluster tests skip when Ray is not installed (pip install "kforge[ray]"); the checks of the
command line and of the missing-Ray message run everywhere.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time

import pytest

import kforge
from kforge import cli
from kforge.cluster import EvaluatorWorker, RayCluster
from kforge.evaluate import Status
from kforge.proposers import Proposal
from kforge.proposers.builtin import BuiltinProposer
from kforge.search import EventKind, RunState

OPS = ["gelu", "silu"]     # four built-in candidates each on the CPU: room for the budget
ITERATIONS = 3


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray cluster with two CPUs: room for two evaluator actors of one core each."""
    ray = pytest.importorskip("ray", reason='Ray is not installed: pip install "kforge[ray]" to run the cluster tests')
    attempts = 5
    for attempt in range(attempts):
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
            break
        except Exception as exc:  # NB: Ray gives its raylet a fixed 30 s to start; a loaded machine can miss that
            ray.shutdown()
            if attempt == attempts - 1 or "timed out during startup" not in str(exc):
                raise
    try:
        yield ray
    finally:
        ray.shutdown()


def _session(tmp_path, name: str) -> kforge.Session:
    model, ids = kforge.example("tiny_transformer")
    s = kforge.Session(model, ids, device="cpu", workdir=tmp_path / name)
    s.capture(timing_budget_ms=2, regions=False)
    return s


def _by_card(s: kforge.Session) -> dict[str, dict[str, Status]]:
    """Per searched card: each candidate's source and its verdict."""
    out = {}
    for r in s.results:
        if r.status != "not searched":
            out[r.key] = {c.source: c.status for c in s.store.candidates(r.key)}
    return out


def test_a_search_on_ray_gives_what_a_local_search_gives(ray_local, tmp_path):
    local = _session(tmp_path, "local")
    assert local.optimize(iterations=ITERATIONS, ops=OPS).state is RunState.FINISHED
    on_ray = _session(tmp_path, "ray")
    cluster = RayCluster(workers=2)
    try:
        run = on_ray.optimize(iterations=ITERATIONS, ops=OPS, cluster=cluster)
        assert run.state is RunState.FINISHED, run.error
        assert len(cluster.actors) == 2 and len({a.info.pid for a in cluster.actors}) == 2
        assert not cluster.lost
    finally:
        cluster.close()
    mine, theirs = _by_card(on_ray), _by_card(local)
    assert set(mine) == set(theirs) and len(mine) == len(OPS)
    for key, verdicts in mine.items():
        # the built-in proposer makes the same candidates; each is judged correct or not as locally
        assert set(verdicts) == set(theirs[key])
        assert all(st is not None and st is not Status.INFRA_ERROR for st in verdicts.values()), verdicts
        assert {src: st.is_correct for src, st in verdicts.items()} == \
               {src: st.is_correct for src, st in theirs[key].items()}
    assert all(r.status in ("winner", "eager", "not searched") for r in on_ray.results)
    kinds = [e.kind for e in run.events]
    started = [i for i, k in enumerate(kinds) if k is EventKind.CARD_STARTED]
    assert len(started) == 2 and started[1] < kinds.index(EventKind.CARD_FINISHED)   # two cards at once
    hardware = {on_ray.store.get_meta(f"hardware:{k}") for k in mine}      # each card pinned to what judged it
    assert len(hardware) == 1 and next(iter(hardware)).startswith("cpu: ")
    local.close()
    on_ray.close()


class PaidBuiltin:
    """The built-in library billed like an LLM, so proposals take the LLM path (a pool in the driver)."""

    name = "paid-builtin"

    def __init__(self, dollars: float):
        self.inner, self.dollars, self.calls = BuiltinProposer(), dollars, 0
        self._lock = threading.Lock()

    def propose(self, request):
        from dataclasses import replace

        p = self.inner.propose(request)
        with self._lock:        # the two cards' pools call at once
            self.calls += 1
        usage = replace(p.usage, model="paid", input_tokens=1000, output_tokens=100, dollars=self.dollars)
        return Proposal(p.source, p.intent, usage=usage, prompt=f"prompt {self.calls}", response="response",
                        strategy=p.strategy, config=p.config)


def test_an_actor_killed_mid_evaluation_loses_nothing_and_blames_no_one(ray_local, tmp_path):
    died, log, victim = tmp_path / "died", tmp_path / "judged.log", 2

    class DiesOnce(EvaluatorWorker):
        """Kills its own process when candidate ``victim`` starts (once, whichever actor gets it)."""

        def evaluate(self, variant, source, examples, blobs_ref, seed):
            if seed == victim and not died.exists():
                died.write_text(str(os.getpid()))
                os._exit(1)
            ev = super().evaluate(variant, source, examples, blobs_ref, seed)
            with open(log, "a") as f:
                f.write(f"{seed} {os.getpid()}\n")
            return ev

    s = _session(tmp_path, "wd")
    proposer = PaidBuiltin(dollars=0.25)
    cluster = RayCluster(workers=2, worker_class=DiesOnce)
    try:
        # parallel=1: each proposal sees the last, so the built-in library never repeats itself
        run = s.optimize(proposer=proposer, iterations=ITERATIONS, ops=OPS, parallel=1, cluster=cluster)
        assert run.state is RunState.FINISHED, run.error
        assert died.exists(), "no actor was killed: the test proves nothing"
        dead_pid = int(died.read_text())
        assert [w.pid for w in cluster.lost] == [dead_pid]

        candidates = s.store.candidates()
        judged = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
        # every candidate judged exactly once; the victim by another actor
        assert collections.Counter(seed for seed, _ in judged) == {c.id: 1 for c in candidates}
        assert [pid for seed, pid in judged if seed == victim] != [dead_pid]
        # every candidate has its verdict; the victim's is what a local judge says of it
        assert all(c.is_evaluated and c.status is not Status.INFRA_ERROR for c in candidates)
        cand = s.store.candidate(victim)
        local = s.evaluator.evaluate_variant(s.cards[cand.card_key].variant, cand.source,
                                             s.store.example_paths(cand.card_key), seed=victim)
        assert cand.status not in (Status.CRASHED, Status.TIMED_OUT)
        assert cand.status.is_correct == local.status.is_correct
        # each proposal paid for once
        assert proposer.calls == len(candidates) == len(s.store.llm_calls()) == len(OPS) * ITERATIONS
        assert s.store.dollars() == pytest.approx(0.25 * len(candidates))

        # resuming on what is left of the cluster evaluates and pays for nothing again
        again = s.optimize(proposer=proposer, iterations=ITERATIONS, ops=OPS, cluster=cluster)
        assert again.state is RunState.FINISHED, again.error
        assert len(log.read_text().splitlines()) == len(judged)
        assert proposer.calls == len(candidates)
    finally:
        cluster.close()
        s.close()


def test_command_line_optimizes_on_the_cluster(ray_local, tmp_path, capsys):
    import json

    workdir = tmp_path / "cli"
    rc = cli.main(["optimize", "--example", "tiny_transformer", "--device", "cpu", "--ops", "gelu", "--iterations", "2",
                   "--cluster", "ray", "--json", "--workdir", str(workdir)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["summary"]["state"] == "finished" and out["summary"]["evaluations"] == 2, out["summary"]
    s = kforge.Session.open(workdir)
    (key,) = {c.card_key for c in s.store.candidates()}
    assert s.store.get_meta(f"hardware:{key}").startswith("cpu: ")   # judged by the cluster's actors
    deadline = time.monotonic() + 60                                    # Ray frees a killed actor's core soon after
    while ray_local.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray_local.available_resources().get("CPU", 0) == 2           # the CLI gave the actors back
    s.close()


def test_cards_are_judged_on_one_hardware_only(tmp_path):
    """A card started on one GPU model is never given to an evaluator of another (store-pinned)."""
    from kforge.kernels import device_info
    from kforge.search import MCTS, Budget, OptimizationRun, plan

    s = _session(tmp_path, "wd")
    chosen, _ = plan(s.cards, device_info("cpu"), ops=OPS)
    pinned = chosen[0].card.key
    s.store.set_meta(f"hardware:{pinned}", "NVIDIA H100 (sm_90)")

    class Elsewhere:
        """An evaluator that names its hardware, as a cluster's does."""
        backend, arch, device, hardware = "cpu", "native", "cpu", "NVIDIA H200 (sm_90)"

        def __init__(self, ev):
            self.ev = ev

        def evaluate_variant(self, *a, **k):
            return self.ev.evaluate_variant(*a, **k)

    run = OptimizationRun(store=s.store, evaluator=[Elsewhere(s.evaluator)], proposer=BuiltinProposer(),
                          policy=MCTS(), planned=chosen, device=device_info("cpu"), budget=Budget(iterations=1))
    run.start(background=False)
    assert run.state is RunState.FINISHED
    assert not s.store.candidates(pinned)
    assert [k for k, _ in run.left_out] == [pinned] and "NVIDIA H100" in run.left_out[0][1]
    others = [pc.card.key for pc in chosen[1:]]
    assert all(s.store.candidates(k) for k in others)
    assert {s.store.get_meta(f"hardware:{k}") for k in others} == {"NVIDIA H200 (sm_90)"}
    s.close()


def test_cluster_names_and_missing_ray_say_what_to_do(monkeypatch, capsys):
    with pytest.raises(ValueError, match="'ray' or 'ray:ADDRESS'"):
        RayCluster.from_spec("slurm")
    monkeypatch.setitem(sys.modules, "ray", None)     # import ray fails as if it were not installed
    with pytest.raises(ImportError, match=r'pip install "kforge\[ray\]"'):
        RayCluster.from_spec("ray")
    rc = cli.main(["optimize", "--cluster", "ray:auto"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and 'pip install "kforge[ray]"' in err[0], err
