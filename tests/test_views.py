"""Notebook views without a browser: traits after capture and run events, requests, errors, batching."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

pytest.importorskip("anywidget")
pytest.importorskip("altair")

import kforge
from kforge.evaluate import Evaluation, Status
from kforge.search import Event, EventKind
from kforge.views import CardTable, RunProgress, SearchTree, SourceView, charts, dashboard, progress
from kforge.views._data import best_path, line_diff
from kforge.views._pump import EventPump
from kernel_files import kernel_source
from scripted import ScriptedProposer

REPO = Path(__file__).resolve().parents[1]


class TwoOps(nn.Module):
    def forward(self, x):
        return torch.relu(x.softmax(-1))


@pytest.fixture
def session(tmp_path):
    s = kforge.Session(TwoOps(), torch.randn(64, 1000), device="cpu", workdir=tmp_path / "wd")
    s.capture(timing_budget_ms=2)
    yield s
    s.close()


def _softmax_key(session) -> str:
    return session.cards.by_op("softmax")[0].key


def _add(store, key, parent, source, status=Status.NO_GAIN, speedup=1.0, intent="try"):
    cid = store.add_candidate(key, parent, "test", source, strategy="s", intent=intent)
    store.set_evaluation(cid, Evaluation(status, message=status.value, speedup=speedup, candidate_us=10.0,
                                         eager_us=10.0 * speedup, compile_log=f"log of {cid}"))
    return cid


def _replies(widget):
    sent = []
    widget.send = lambda content, buffers=None: sent.append(content)
    return sent


def test_card_table_rows_follow_capture_and_selection_drives_tree_and_source(session):
    key = _softmax_key(session)
    a = _add(session.store, key, None, "int a;\n", Status.FASTER, 1.5)
    b = _add(session.store, key, a, "int a;\nint b;\n", Status.FASTER, 2.0)
    d = dashboard(session)
    assert [r["key"] for r in d.table.rows] == [c.key for c in session.cards]
    row = next(r for r in d.table.rows if r["key"] == key)
    assert row["candidates"] == 2 and row["speedup"] == 2.0 and row["status"] == "not searched"
    assert d.table.selected_key == key, "the first searched card is selected by default"
    assert [n["id"] for n in d.tree.nodes] == [a, b] and d.tree.best_path == [a, b]
    assert d.source.candidate_id == b, "the best candidate is shown first"
    other = next(c.key for c in session.cards if c.key != key)
    d.table.selected_key = other               # what a click on a row does
    assert d.tree.card_key == other and d.tree.nodes == [] and d.source.candidate_id is None


def test_snapshot_and_candidate_requests_answer_by_id(session):
    key = _softmax_key(session)
    a = _add(session.store, key, None, "int x = 1;\nint y = 2;\n")
    b = _add(session.store, key, a, "int x = 1;\nint y = 3;\n", intent="change y\nbecause")
    view = SourceView(session.store, candidate_id=b)
    sent = _replies(view)
    view._on_custom(view, {"type": "request", "id": "r7", "method": "snapshot", "params": {}}, [])
    view._on_custom(view, {"type": "request", "id": "r8", "method": "candidate", "params": {"id": a}}, [])
    snap, first = sent
    assert snap["id"] == "r7" and snap["ok"] and snap["type"] == "response"
    c = snap["data"]["candidate"]
    assert c["id"] == b and c["parent_id"] == a and c["intent"] == "change y\nbecause"
    assert ["-", "int y = 2;"] in c["diff"] and ["+", "int y = 3;"] in c["diff"]
    assert c["compile_log"] == f"log of {b}" and c["evaluation"]["status"] == "no_gain"
    assert first["id"] == "r8" and first["data"]["diff"] is None and first["data"]["source"].startswith("int x")


def test_errors_while_serving_are_shown_in_the_widget(session):
    view = SourceView(session.store)
    sent = _replies(view)
    view._on_custom(view, {"type": "request", "id": "r1", "method": "candidate", "params": {"id": 424242}}, [])
    assert sent[0]["id"] == "r1" and sent[0]["ok"] is False and "424242" in sent[0]["error"]
    assert "424242" in view.error, "the error trait drives the banner in the front end"
    view._on_custom(view, {"type": "request", "id": "r2", "method": "nope"}, [])
    assert sent[1]["ok"] is False and "unknown request" in sent[1]["error"]


def test_a_real_background_run_reaches_every_view_in_batches(session):
    base = kernel_source("cpu", "softmax_rows")
    proposer = ScriptedProposer([base + f"\n/* variant {i} */\n" for i in range(6)], delay_s=0.05)
    run = session.optimize(proposer=proposer, iterations=6, ops=["softmax"], background=True)
    d = dashboard(session)
    assert d.progress is not None and d.progress.total == 6
    alone = progress(run)
    run.wait(120)
    assert d.progress.state == alone.state == "finished", "views show the end before wait() returns"
    key = _softmax_key(session)
    stored = session.store.candidates(key)
    assert d.progress.state == "finished" and d.progress.done == 6 and d.progress.cards_done == 1
    assert any("card_finished" in line for line in d.progress.log)
    row = next(r for r in d.table.rows if r["key"] == key)
    assert row["status"] in ("winner", "eager") and row["candidates"] == len(stored) == 6
    assert d.tree.card_key == key and sorted(n["id"] for n in d.tree.nodes) == [c.id for c in stored]
    assert all(n["status"] != "pending" for n in d.tree.nodes) and d.tree.live is False
    assert d.pump.batches > 0, "the events reached the views through the pump"


def test_pump_batches_events_published_from_another_thread():
    batches: list[list[Event]] = []
    subscribers = []
    run = SimpleNamespace(done=False, subscribe=subscribers.append)
    pump = EventPump([batches.append], interval=3600)  # NB: no tick during the test: batching by construction
    pump.follow(run)

    def publish():
        for i in range(2000):
            subscribers[0](Event(EventKind.EVALUATED, "k", i))
        run.done = True

    worker = threading.Thread(target=publish)
    worker.start()
    worker.join()
    flusher = pump._thread
    pump.close()
    flusher.join(60)
    assert not flusher.is_alive() and pump._thread is None, "the flusher stops once closed"
    ids = [e.candidate_id for batch in batches for e in batch]
    assert ids == list(range(2000)) and len(batches) == 1, "2000 events queued between ticks arrive as one batch"


def test_progress_buttons_pause_resume_and_stop_the_run(session):
    calls = []
    state = SimpleNamespace(value="running")
    run = SimpleNamespace(planned=[1, 2], budget=SimpleNamespace(iterations=5), events=[], dollars=0.0, error=None,
                          done=False, state=state,
                          pause=lambda: calls.append("pause"), resume=lambda: calls.append("resume"),
                          stop=lambda: calls.append("stop"))
    view = RunProgress(run)
    assert view.total == 10 and view.cards_total == 2
    sent = _replies(view)
    for i, action in enumerate(["pause", "resume", "stop", "explode"]):
        view._on_custom(view, {"type": "request", "id": i, "method": "control", "params": {"action": action}}, [])
    assert calls == ["pause", "resume", "stop"]
    assert [m["ok"] for m in sent] == [True, True, True, False] and "explode" in view.error


def test_tree_of_hundreds_of_nodes_and_its_best_path(session):
    key = _softmax_key(session)
    ids = [_add(session.store, key, None, "root\n", Status.NO_GAIN, 1.0)]
    for i in range(1, 300):
        parent = ids[(i - 1) // 3]
        status, speedup = (Status.FASTER, 1.0 + i / 1000) if i % 7 else (Status.COMPILE_ERROR, 0.0)
        ids.append(_add(session.store, key, parent, f"v{i}\n", status, speedup))
    tree = SearchTree(session.store, session.cards, card_key=key)
    assert len(tree.nodes) == 300 and tree.card_label == session.cards[key].signature
    path = tree.best_path
    assert path[0] == ids[0] and path[-1] == ids[299]
    by_id = {n["id"]: n for n in tree.nodes}
    assert all(by_id[c]["parent"] == p for p, c in zip(path, path[1:]))
    assert by_id[ids[7]]["status"] == "compile_error" and by_id[ids[7]]["speedup"] == 0.0


def test_best_path_and_line_diff_helpers():
    assert best_path([{"id": 1, "parent": None, "speedup": 0.0}]) == []
    assert line_diff("a\nb\n", "a\nb\n") == []
    diff = line_diff("a\nb\nc\n", "a\nB\nc\n")
    assert diff[0][0] == "@" and ["-", "b"] in diff and ["+", "B"] in diff


def test_charts_are_altair_and_save_for_reports(session, tmp_path):
    import altair as alt

    key = _softmax_key(session)
    a = _add(session.store, key, None, "a\n", Status.FASTER, 1.2)
    _add(session.store, key, a, "b\n", Status.FASTER, 1.6)
    for fn in (charts.speedup_over_iterations, charts.cost_per_card, charts.time_breakdown):
        chart = fn(session)
        assert isinstance(chart, alt.TopLevelMixin)
        out = tmp_path / f"{fn.__name__}.svg"
        chart.save(out)
        assert out.read_text().startswith("<svg")
    datasets = charts.speedup_over_iterations(session).to_dict()["datasets"].values()
    assert [[r["best speedup"] for r in d] for d in datasets if d and "best speedup" in d[0]] == [[1.2, 1.6]]


def test_the_package_ships_the_front_end_built_from_widgets(session):
    for name in ("kforge.js", "kforge.css"):
        shipped = REPO / "kforge" / "views" / "static" / name
        assert shipped.read_text() == (REPO / "widgets" / name).read_text(), "run python widgets/build.py"
    assert "export default" in CardTable(session.cards, session.store)._esm


def test_session_display_falls_back_to_text_before_capture(tmp_path, capsys):
    from IPython.core.interactiveshell import InteractiveShell
    from kforge.views import display_session

    InteractiveShell.instance()
    s = kforge.Session(TwoOps(), torch.randn(4, 8), device="cpu", workdir=tmp_path / "empty")
    display_session(s)
    assert "kforge.Session" in capsys.readouterr().out
