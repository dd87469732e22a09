"""Search: tree growth, budgets, pause/resume/stop, resume after SIGKILL, guarded fallback."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
import torch.nn as nn

import kforge
from kforge.evaluate import Evaluation, Status
from kforge.kernels import device_info
from kforge.proposers.builtin import BuiltinProposer
from kforge.search import MCTS, BestOfN, EventKind, LinearRefinement, RunState, Tree
from kforge.store import Candidate
from scripted import ScriptedProposer
from kernel_files import kernel_source


class Softmax(nn.Module):
    def forward(self, x):
        return x.softmax(-1)


def _session(tmp_path, name="wd"):
    s = kforge.Session(Softmax(), torch.randn(64, 1000), device="cpu", workdir=tmp_path / name)
    s.capture(timing_budget_ms=2)
    return s


def _variants(n: int, *, wrong_every: int = 0) -> list[str]:
    base = kernel_source("cpu", "softmax_rows")
    out = []
    for i in range(n):
        src = base + f"\n/* variant {i} */\n"
        if wrong_every and i % wrong_every == 0:
            src = src.replace("yr[c] *= inv;", "yr[c] *= inv * 1.01f;")
        out.append(src)
    return out


def _cand(cid, parent, speedup, status=Status.FASTER):
    ev = Evaluation(status, speedup=speedup if status.is_correct else 0.0)
    return Candidate(cid, "k", parent, "t", None, {}, "", f"src{cid}", ev, 0.0, 0.0)


# ----------------------------------------------------------------------------- the tree itself


def test_mcts_widens_good_nodes_and_revisits_poor_branches():
    tree = Tree([_cand(1, None, 1.1), _cand(2, None, 0.0, Status.WRONG_RESULT)])
    mcts, rng = MCTS(), random.Random(0)
    picks = []
    for cid in range(3, 40):
        node = mcts.select(tree, rng)
        picks.append(node.id)
        # revisions of candidate 1's line get better; everything under 2 stays broken
        line_of_1 = node.id is not None and node.path()[1].id == 1
        speedup = 1.1 + 0.05 * len(node.path()) if line_of_1 else 0.0
        tree.add(_cand(cid, node.id, speedup, Status.FASTER if speedup else Status.WRONG_RESULT))
    assert picks.count(None) >= 2                         # the root widened beyond its first children
    assert any(len(n.children) >= 2 for n in tree.nodes.values())  # progressive widening below the root
    assert max(len(n.path()) for n in tree.nodes.values()) >= 4     # depth: good lines are refined
    assert 2 in picks                                      # the poor branch was revisited (exploration)
    assert tree.best().score >= 1.25


def test_linear_refines_the_best_and_best_of_n_samples_the_root():
    tree = Tree([_cand(1, None, 1.2), _cand(2, 1, 1.5), _cand(3, None, 1.3)])
    rng = random.Random(0)
    assert LinearRefinement().select(tree, rng).id == 2
    assert BestOfN().select(tree, rng) is tree.root
    empty = Tree()
    assert LinearRefinement().select(empty, rng) is empty.root


def test_virtual_loss_spreads_parallel_selections():
    tree = Tree([_cand(1, None, 1.5), _cand(2, None, 1.4)])
    mcts, rng = MCTS(root_children=2), random.Random(0)
    first = mcts.select(tree, rng)
    for n in first.path():
        n.pending += 1
    second = mcts.select(tree, rng)
    assert second is not first or second.candidate is None


# ----------------------------------------------------------------------------- runs


def test_iteration_budget_feedback_and_records(tmp_path):
    s = _session(tmp_path)
    prop = ScriptedProposer(_variants(10, wrong_every=3))
    run = s.optimize(proposer=prop, iterations=5, confirm=False, parallel=1)
    assert run.state is RunState.FINISHED
    cands = s.store.candidates()
    assert len(cands) == 5 and all(c.is_evaluated for c in cands)
    assert cands[0].status is Status.WRONG_RESULT and "outside tolerance" in cands[0].evaluation.message
    assert all(c.status.is_correct for c in cands[1:3])
    # the proposer saw the parent's feedback, lineage and siblings
    revised = [r for r in prop.requests if r.parent is not None]
    assert revised and all(r.parent.evaluation is not None for r in revised)
    # every paid call is in the store, linked to its candidate
    calls = s.store.llm_calls()
    assert len(calls) == 5 and {c.candidate_id for c in calls} == {c.id for c in cands}
    kinds = [e.kind for e in run.events]
    assert kinds[0] is EventKind.RUN_STARTED and kinds[-1] is EventKind.RUN_FINISHED
    assert kinds.count(EventKind.EVALUATED) == 5 and EventKind.CARD_FINISHED in kinds
    assert "5 evaluations," in repr(run) and "proposer failures" not in repr(run)
    s.close()


def test_the_runs_repr_counts_what_the_proposer_failed_to_make(tmp_path):
    s = _session(tmp_path)
    run = s.optimize(proposer=ScriptedProposer(_variants(1)), iterations=3, confirm=False, parallel=1)
    failed = sum(e.kind is EventKind.PROPOSER_FAILED for e in run.events)
    said = f"1 evaluation, {failed} proposer failure{'s' * (failed != 1)}"
    assert failed >= 1 and said in repr(run), repr(run)
    s.close()


def test_dollar_budget_stops_the_run(tmp_path):
    s = _session(tmp_path)
    prop = ScriptedProposer(_variants(20), dollars_per_call=0.40)
    run = s.optimize(proposer=prop, iterations=20, dollars=1.0, confirm=False, parallel=1)
    assert 3 <= len(s.store.candidates()) <= 4
    assert run.dollars >= 1.0 and abs(s.store.dollars() - 0.40 * len(s.store.llm_calls())) < 1e-9
    assert any(e.kind is EventKind.BUDGET_REACHED for e in run.events)
    s.close()


def test_fallback_keeps_eager_when_nothing_wins(tmp_path):
    s = _session(tmp_path)
    slow = kernel_source("cpu", "softmax_rows").replace(
        "return 0;\n}", "for (volatile long i = 0; i < 20000000; ++i) {}\n    return 0;\n}")
    run = s.optimize(proposer=ScriptedProposer([slow]), iterations=1)
    (result,) = [r for r in s.results if r.op == "softmax"]
    assert result.status == "eager" and result.winner_id is None and result.winner_speedup is None
    assert "no correct candidate beat eager" in result.reason
    assert s.store.candidates()[0].status is Status.SLOWER
    assert s.winners() == []
    assert run.state is RunState.FINISHED
    s.close()


def test_pause_resume_stop_from_another_thread(tmp_path):
    # NB: pause and stop are asked for at known points (the run's own events), with one proposal in
    # flight at most, so what the run has done when it pauses and stops does not depend on speed.
    s = _session(tmp_path)
    ready = threading.Event()

    class Gated(ScriptedProposer):
        def propose(self, request):
            ready.wait(120)  # until the test holds the run's handle
            return super().propose(request)

    prop = Gated(_variants(30))
    evaluated = threading.Semaphore(0)
    control: dict = {}

    def on_event(e):
        if e.kind is EventKind.EVALUATED:
            evaluated.release()
            if "paused" not in control:
                control["paused"] = True
                control["run"].pause()
            elif "stopped" not in control:
                control["stopped"] = True
                control["run"].stop()

    run = s.optimize(proposer=prop, iterations=30, background=True, confirm=False, parallel=1, on_event=on_event)
    control["run"] = run
    ready.set()
    if not evaluated.acquire(timeout=120):
        pytest.fail("no evaluation within 120 s")
    deadline = time.time() + 120
    while run.state is not RunState.PAUSED and time.time() < deadline:
        time.sleep(0.01)
    assert run.state is RunState.PAUSED
    frozen = len(s.store.candidates())
    requests = len(prop.requests)
    time.sleep(0.2)
    assert len(s.store.candidates()) == frozen and len(prop.requests) == requests  # nothing moves while paused
    run.resume()
    run.wait(120)
    assert run.state is RunState.STOPPED
    assert len(s.store.candidates()) == frozen + 1      # exactly the one evaluation made after resuming
    kinds = [e.kind for e in run.events]
    assert EventKind.PAUSED in kinds and EventKind.RESUMED in kinds
    s.close()


def test_errors_in_the_run_surface_to_the_user(tmp_path):
    class Exploding:
        name = "exploding"

        def propose(self, request):
            raise KeyError("bug in a custom proposer")

    s = _session(tmp_path)
    run = s.optimize(proposer=Exploding(), iterations=3, background=True)
    with pytest.raises(KeyError, match="bug in a custom proposer"):
        run.wait(60)
    assert run.state is RunState.FAILED
    assert run.events[-2].kind is EventKind.ERROR
    s.close()


_KILLED_RUN = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    import kforge
    from scripted import ScriptedProposer
    from test_search import Softmax, _variants
    s = kforge.Session.open({wd!r}, model=Softmax())
    def on_event(e):
        if e.kind.value == "evaluated":
            print("EVALUATED", e.candidate_id, flush=True)
    s.optimize(proposer=ScriptedProposer(_variants(12)), iterations=12, confirm=False, on_event=on_event)
""")


def test_sigkill_mid_run_resumes_without_evaluating_twice(tmp_path):
    s = _session(tmp_path)
    s.close()
    tests = os.path.dirname(__file__)
    script = _KILLED_RUN.format(tests=tests, wd=str(tmp_path / "wd"))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), tests])})
    seen = 0
    deadline = time.time() + 120
    while seen < 3 and time.time() < deadline:
        line = proc.stdout.readline()
        if line.startswith("EVALUATED"):
            seen += 1
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert seen == 3

    s2 = kforge.Session.open(tmp_path / "wd", model=Softmax())
    before = {c.id: c for c in s2.store.candidates()}
    evaluated_before = {cid: c.evaluation for cid, c in before.items() if c.is_evaluated}
    assert len(evaluated_before) >= 3
    stored = {c.source for c in before.values()}
    prop = ScriptedProposer([v for v in _variants(12) if v not in stored])
    s2.optimize(proposer=prop, iterations=12, confirm=False)
    after = s2.store.candidates()
    assert len(after) == 12
    assert len({c.source for c in after}) == 12                 # nothing proposed or evaluated twice
    for cid, ev in evaluated_before.items():
        assert s2.store.candidate(cid).evaluation == ev          # earlier verdicts untouched
    assert len(prop.requests) == 12 - len(before)               # only the missing proposals were paid for
    s2.close()


def test_full_search_with_the_builtin_proposer(tmp_path):
    model, ids = kforge.example("tiny_transformer")
    s = kforge.Session(model, ids, device="cpu", workdir=tmp_path / "wd")
    s.capture(timing_budget_ms=2)
    run = s.optimize(iterations=4, ops=["softmax", "layer_norm"])
    assert run.state is RunState.FINISHED
    frame = s.results.to_frame()
    searched = frame[frame["status"] != "not searched"]
    assert set(searched["op"]) == {"softmax", "layer_norm"}
    assert (searched["candidates"] >= 2).all()
    for key in searched["key"]:
        cands = s.store.candidates(key)
        assert any(c.status is not None and c.status.is_correct for c in cands), [c.evaluation for c in cands]
        assert all(c.proposer == "builtin" and c.strategy for c in cands)
    # a second optimize continues the same tree, up to what the built-in library can offer
    card = s.cards.by_op("softmax")[0]
    before = len(s.store.candidates(card.key))
    s.optimize(iterations=before + 3, ops=["softmax"])
    space = BuiltinProposer().space_size(card, device_info("cpu"))
    after = s.store.candidates(card.key)
    assert len(after) == min(before + 3, space)
    assert len({(c.strategy, str(sorted(c.config.items()))) for c in after}) == len(after)  # no repeats
    s.close()


def test_two_evaluators_search_cards_concurrently(tmp_path):
    class Two(nn.Module):
        def forward(self, x):
            return x.softmax(-1), x[:32].softmax(-1)

    s = kforge.Session(Two(), torch.randn(64, 1000), device="cpu", workdir=tmp_path / "wd")
    s.capture(timing_budget_ms=2)
    base = kernel_source("cpu", "softmax_rows")
    run = s.optimize(proposer=ScriptedProposer([base + f"\n/* {i} */\n" for i in range(4)]), iterations=2,
                     confirm=False, parallel=1, devices=["cpu", "cpu"])
    assert run.state is RunState.FINISHED
    assert len(s._extra_evaluators) == 1              # a second worker process for the second device
    by_card = {c.key: [x for x in s.store.candidates(c.key)] for c in s.cards}
    assert all(len(v) == 2 and all(x.is_evaluated for x in v) for v in by_card.values())
    kinds = [e.kind for e in run.events]
    started = [i for i, k in enumerate(kinds) if k is EventKind.CARD_STARTED]
    assert len(started) == 2 and started[1] < kinds.index(EventKind.CARD_FINISHED)  # both at once
    s.close()


def test_linear_refinement_with_an_instant_proposer_waits_for_each_verdict(tmp_path):
    s = _session(tmp_path)
    prop = ScriptedProposer(_variants(4))
    prop.instant = True
    s.optimize(proposer=prop, policy="linear", iterations=4, confirm=False, parallel=4)
    cands = s.store.candidates()
    assert len(cands) == 4
    assert cands[0].parent_id is None
    assert all(c.parent_id is not None for c in cands[1:])   # each revises an evaluated candidate
    assert all(r.parent is None or r.parent.evaluation is not None for r in prop.requests)
    s.close()


def test_linear_refinement_with_a_pooled_proposer_has_one_call_in_flight(tmp_path):
    """An LLM-like proposer (not instant: proposals on the pool) with ``parallel=3``: linear
    refinement still waits for each verdict, so every revision sees the one before it scored."""
    s = _session(tmp_path)
    prop = ScriptedProposer(_variants(4), delay_s=0.05)
    s.optimize(proposer=prop, policy="linear", iterations=4, confirm=False, parallel=3)
    cands = s.store.candidates()
    assert len(cands) == 4 and cands[0].parent_id is None
    assert all(c.parent_id is not None for c in cands[1:])
    assert all(r.parent is None or r.parent.evaluation is not None for r in prop.requests)
    assert [len(r.tried) for r in prop.requests] == [0, 1, 2, 3]   # each saw every verdict before it
    s.close()


def test_an_instant_proposer_sees_pending_candidates(tmp_path):
    s = _session(tmp_path)
    prop = ScriptedProposer(_variants(4))
    prop.instant = True
    s.optimize(proposer=prop, policy="best_of_n", iterations=4, confirm=False, parallel=4)
    assert [len(r.tried) for r in prop.requests] == [0, 1, 2, 3]   # pending ones included
    s.close()


def test_a_built_in_library_with_nothing_left_ends_the_cards_search_once_and_is_no_failure(tmp_path):
    """A new user's first run printed "proposer_failed" three times for most cards: the built-in library had tried
    every strategy and config that fits, which is how such a card's search ends, not a failure."""
    model, x = kforge.example("tiny_cnn")
    s = kforge.Session(model, x, device="cpu", workdir=tmp_path / "wd")
    s.capture(timing_budget_ms=2.0)
    (card,) = [c for c in s.cards if c.op == "max_pool2d"]
    size = BuiltinProposer().space_size(card, device_info("cpu"))
    assert 0 < size < 20
    run = s.optimize(proposer="builtin", iterations=size + 20, ops=["max_pool2d"], confirm=False)
    events = [e for e in run.events if e.card_key == card.key]
    assert [e.kind for e in events].count(EventKind.EXHAUSTED) == 1
    assert not any(e.kind is EventKind.PROPOSER_FAILED for e in events)
    assert "proposer failure" not in repr(run), repr(run)
    finished = next(e for e in events if e.kind is EventKind.CARD_FINISHED)
    assert "nothing left to propose" in str(finished.data.get("search_ended")), finished.data
    assert len(s.store.candidates(card.key)) == size
    again = s.optimize(proposer="builtin", iterations=size + 20, ops=["max_pool2d"], confirm=False)
    assert [e.kind for e in again.events if e.card_key == card.key].count(EventKind.EXHAUSTED) == 1
    assert len(s.store.candidates(card.key)) == size, "a resumed search asks once and ends"
    s.close()
