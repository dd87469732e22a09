"""A run's state has one owner (``RunLedger``): the moves its table allows, the ones it refuses, exact counts
under concurrent writers, and a stop that keeps everything already paid for."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn as nn

import kforge
from kforge.evaluate import Evaluation, Status
from kforge.search import TRANSITIONS, EventKind, IllegalTransition, RunLedger, RunState
from kernel_files import kernel_source
from scripted import ScriptedProposer

WAIT_S = 60   # NB: a guard against a hang only; no outcome below depends on timing


def _paused(ledger: RunLedger) -> threading.Thread:
    """A search thread parked in ``gate()`` with the run PAUSED."""
    parked = threading.Event()
    ledger.subscribe(lambda e: parked.set() if e.kind is EventKind.PAUSED else None)
    ledger.ask_pause()
    t = threading.Thread(target=ledger.gate, daemon=True)
    t.start()
    assert parked.wait(WAIT_S)
    return t


def _ledger_in(state: RunState) -> RunLedger:
    ledger = RunLedger()
    if state is RunState.PENDING:
        return ledger
    ledger.begin()
    if state is RunState.PAUSED:
        _paused(ledger)
    elif state is RunState.STOPPING:
        ledger.ask_stop()
    elif state is RunState.STOPPED:
        ledger.ask_stop()
        ledger.finish()
    elif state is RunState.FINISHED:
        ledger.finish()
    elif state is RunState.FAILED:
        ledger.fail(ValueError("boom"))
    assert ledger.state is state
    return ledger


# ----------------------------------------------------------------------------- the table


@pytest.mark.parametrize("state", list(RunState))
def test_finish_and_fail_move_only_where_the_table_allows(state):
    ledger = _ledger_in(state)
    target = RunState.STOPPED if state is RunState.STOPPING else RunState.FINISHED
    if target in TRANSITIONS[state]:
        assert ledger.finish() is target
    else:
        with pytest.raises(IllegalTransition, match=f"the run is {state.value}"):
            ledger.finish()
        assert ledger.state is state, "a refused move changes nothing"

    ledger = _ledger_in(state)
    if RunState.FAILED in TRANSITIONS[state]:
        ledger.fail(RuntimeError("x"))
        assert ledger.state is RunState.FAILED and isinstance(ledger.error, RuntimeError)
    else:
        with pytest.raises(IllegalTransition):
            ledger.fail(RuntimeError("x"))
        assert ledger.state is state


def test_every_state_is_reachable_and_the_ends_lead_nowhere():
    reached = {RunState.PENDING}
    frontier = [RunState.PENDING]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in reached:
                reached.add(nxt)
                frontier.append(nxt)
    assert reached == set(RunState)
    assert all(not TRANSITIONS[s] for s in RunState if s.is_done)
    assert all(TRANSITIONS[s] for s in RunState if not s.is_done)


def test_finishing_a_stopped_run_twice_says_what_is_wrong():
    ledger = _ledger_in(RunState.STOPPED)
    with pytest.raises(IllegalTransition) as info:
        ledger.finish()
    assert "the run is stopped" in str(info.value) and "nothing: it is over" in str(info.value)


def test_a_run_starts_once():
    ledger = RunLedger()
    ledger.begin()
    with pytest.raises(IllegalTransition, match="starts once"):
        ledger.begin()


def test_a_run_stopped_before_it_began_ends_as_stopped():
    ledger = RunLedger()
    ledger.ask_stop()
    ledger.begin()
    assert ledger.state is RunState.STOPPING and not ledger.gate()
    assert ledger.finish() is RunState.STOPPED


def test_a_paused_run_cannot_finish_and_resumes_or_stops():
    ledger = _ledger_in(RunState.PAUSED)
    with pytest.raises(IllegalTransition, match="may become running, stopping, failed"):
        ledger.finish()
    ledger.ask_stop()
    assert ledger.state is RunState.STOPPING and ledger.finish() is RunState.STOPPED


def test_the_users_requests_do_nothing_to_a_run_that_is_over():
    for state in (s for s in RunState if s.is_done):
        ledger = _ledger_in(state)
        ledger.ask_pause()
        ledger.ask_resume()
        ledger.ask_stop()
        assert ledger.state is state


def test_events_end_with_the_run():
    ledger = RunLedger()
    ledger.begin()
    with pytest.raises(IllegalTransition, match="before it finished"):
        ledger.publish(EventKind.RUN_FINISHED)
    ledger.finish()
    ledger.publish(EventKind.RUN_FINISHED)
    with pytest.raises(IllegalTransition, match="after the run's end"):
        ledger.publish(EventKind.EVALUATED, "card", 1)
    assert [e.kind for e in ledger.events] == [EventKind.RUN_FINISHED]


def test_a_card_finishes_once():
    ledger = RunLedger()
    ledger.begin()
    ledger.publish(EventKind.CARD_FINISHED, "card", status="eager")
    with pytest.raises(IllegalTransition, match="twice"):
        ledger.publish(EventKind.CARD_FINISHED, "card", status="eager")
    assert ledger.cards["card"].finished and ledger.cards["card"].status == "eager"


# ----------------------------------------------------------------------------- threads


def test_concurrent_writers_keep_every_count_exact():
    threads_n, each = 8, 400
    delivered = []
    ledger = RunLedger([delivered.append])
    ledger.begin()
    start = threading.Barrier(threads_n + 1)

    def search(i: int) -> None:
        start.wait()
        for j in range(each):
            key = f"card{(i + j) % 4}"
            if j % 3 == 0:
                ledger.publish(EventKind.PROPOSER_FAILED, key, None, "failed")
            else:
                ledger.publish(EventKind.EVALUATED, key, i * each + j, counts=j % 5 != 0)

    threads = [threading.Thread(target=search, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    start.wait()
    for _ in range(each):   # the user's thread at the same time
        ledger.ask_pause()
        ledger.ask_resume()
    for t in threads:
        t.join()

    kinds = [(j % 3 == 0, j % 5 != 0) for j in range(each)]
    failures = threads_n * sum(f for f, _ in kinds)
    evaluated = threads_n * sum(not f and c for f, c in kinds)
    assert ledger.proposer_failures == failures and ledger.evaluated == evaluated
    assert len(ledger.events) == threads_n * each
    assert delivered == ledger.events, "subscribers see the events in the order they were appended"
    cards = ledger.cards
    assert sum(c.evaluated for c in cards.values()) == evaluated
    assert sum(c.proposer_failures for c in cards.values()) == failures
    expected = {f"card{k}": sum(1 for i in range(threads_n) for j in range(each)
                                if (i + j) % 4 == k and j % 3 and j % 5) for k in range(4)}
    assert {k: c.evaluated for k, c in cards.items()} == expected
    assert ledger.state is RunState.RUNNING


def test_several_search_threads_pause_once_and_resume_once():
    ledger = RunLedger()
    ledger.begin()
    parked = _paused(ledger)
    others = [threading.Thread(target=ledger.gate, daemon=True) for _ in range(3)]
    for t in others:
        t.start()
    ledger.ask_resume()
    for t in [parked, *others]:
        t.join(WAIT_S)
        assert not t.is_alive()
    kinds = [e.kind for e in ledger.events]
    assert kinds == [EventKind.PAUSED, EventKind.RESUMED] and ledger.state is RunState.RUNNING


def test_a_stop_while_paused_releases_every_search_thread_without_resuming():
    ledger = RunLedger()
    ledger.begin()
    results = []
    parked = _paused(ledger)
    others = [threading.Thread(target=lambda: results.append(ledger.gate()), daemon=True) for _ in range(3)]
    for t in others:
        t.start()
    ledger.ask_stop()
    for t in [parked, *others]:
        t.join(WAIT_S)
        assert not t.is_alive()
    assert results == [False] * 3 and ledger.state is RunState.STOPPING
    assert [e.kind for e in ledger.events] == [EventKind.PAUSED]


# ----------------------------------------------------------------------------- a real run


class Softmax(nn.Module):
    def forward(self, x):
        return x.softmax(-1)


class CountingEvaluator:
    """Answers every candidate NO_GAIN at once, and remembers which candidates it was asked to judge."""

    backend, device, arch = "cpu", "cpu", "native"

    def __init__(self):
        self.seeds: list[int] = []

    def evaluate_variant(self, variant, source, examples=(), *, seed=0):
        self.seeds.append(seed)
        return Evaluation(Status.NO_GAIN, "scripted", speedup=1.0, candidate_us=10.0, eager_us=10.0)

    def close(self):
        pass


@pytest.mark.parametrize("parallel", [1, 3])
def test_stopping_mid_run_keeps_every_candidate_that_was_paid_for(tmp_path, parallel):
    s = kforge.Session(Softmax(), torch.randn(64, 1000), device="cpu", workdir=tmp_path / "wd")
    s.capture(timing_budget_ms=2)
    evaluator = s._evaluator = CountingEvaluator()
    base = kernel_source("cpu", "softmax_rows")
    sources = [base + f"\n/* variant {i} */\n" for i in range(10)]
    seen = []

    def stop_at_the_third(e):
        if e.kind is EventKind.EVALUATED:
            seen.append(e.candidate_id)
            if len(seen) == 3:
                s.run.stop()   # NB: from the search thread itself, right after the third evaluation: no race

    prop = ScriptedProposer(sources, dollars_per_call=0.01)
    run = s.optimize(proposer=prop, iterations=10, parallel=parallel, confirm=False, on_event=stop_at_the_third)
    assert run.state is RunState.STOPPED and len(seen) == 3
    with pytest.raises(IllegalTransition, match="starts once"):
        run.start(background=False)
    stored = {c.id: c for c in s.store.candidates()}
    assert {cid for cid, c in stored.items() if c.is_evaluated} == set(seen)
    assert len(stored) == len(prop.requests), "every answered proposal is stored, in flight ones too"
    calls = s.store.llm_calls()
    assert len(calls) == len(prop.requests) and {c.candidate_id for c in calls} == set(stored)
    assert s.store.dollars() == pytest.approx(0.01 * len(prop.requests))
    kept = {cid: stored[cid].evaluation for cid in seen}

    again = ScriptedProposer([src for src in sources if src not in {c.source for c in stored.values()}])
    run = s.optimize(proposer=again, iterations=10, parallel=parallel, confirm=False)
    assert run.state is RunState.FINISHED
    after = s.store.candidates()
    assert len(after) == 10 and all(c.is_evaluated for c in after)
    assert all(s.store.candidate(cid).evaluation == ev for cid, ev in kept.items()), "earlier verdicts untouched"
    assert sorted(evaluator.seeds) == sorted(c.id for c in after), "each candidate judged exactly once"
    assert len(prop.requests) + len(again.requests) == 10, "no proposal paid for twice"
    s.close()
