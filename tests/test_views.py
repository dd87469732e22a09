"""Notebook views without a browser: traits after capture and run events, requests, errors, batching."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

import extras

extras.module("anywidget", "notebook")
extras.module("altair", "notebook")

import kforge
from kforge.evaluate import Evaluation, Status
from kforge.search import Event, EventKind
from kforge.views import CardTable, RunProgress, SearchTree, SourceView, charts, dashboard, progress
from kforge.views._data import best_path, line_diff, short_label
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
    assert row["candidates"] == 2 and row["status"] == "not searched"
    assert row["winner_speedup"] is None and row["best_candidate"] == 2.0, "a candidate's timing is not the card's"
    assert d.table.selected_key == key, "the first searched card is selected by default"
    assert [n["id"] for n in d.tree.nodes] == [a, b] and d.tree.best_path == [a, b]
    assert d.source.candidate_id == b, "the best candidate is shown first"
    other = next(c.key for c in session.cards if c.key != key)
    d.table.selected_key = other               # what a click on a row does
    assert d.tree.card_key == other and d.tree.nodes == [] and d.source.candidate_id is None


def _from_the_browser(widget, state: dict) -> None:
    """A state change as the front end sends it (applied when the kernel is idle)."""
    widget._handle_msg({"content": {"data": {"method": "update", "state": state, "buffer_paths": []}}, "buffers": []})


def test_one_selection_takes_the_browsers_changes_in_order_and_never_answers_back(session):
    key = _softmax_key(session)
    a = _add(session.store, key, None, "int a;\n", Status.FASTER, 1.5)
    b = _add(session.store, key, a, "int a;\nint b;\n", Status.FASTER, 2.0)
    other = next(c.key for c in session.cards if c.key != key)
    d = dashboard(session)
    assert d.table.selection is d.tree.selection is d.source.selection is d.selection
    sent = []
    d.selection.send_state = lambda key=None: sent.append(key)
    # clicks made while a cell ran reach the kernel together when it ends, each change whole, in order
    _from_the_browser(d.selection, {"card_key": other, "candidate_id": None, "follow_search": False})
    _from_the_browser(d.selection, {"card_key": key, "candidate_id": a})
    _from_the_browser(d.selection, {"candidate_id": b, "follow_newest": False})
    assert (d.table.selected_key, d.tree.card_key, d.tree.selected_id, d.source.candidate_id) == (key, key, b, b)
    assert sent == [], "the kernel never corrects the browser: nothing crosses a later click on its way back"
    assert f"Candidate #{b} " in d.to_html(), "the snapshot shows what the views show"
    # kernel code picks a card whole: its best candidate comes with it, in one message
    d.table.selected_key = other
    assert (d.tree.card_key, d.source.candidate_id) == (other, None) and len(sent) == 1


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
    assert row["status"] in ("winner", "noisy", "eager") and row["candidates"] == len(stored) == 6
    # NB: the front end moves the selection to the card searched (the table was made following it);
    # the kernel side never moves it, so that a busy kernel cannot override a row the user picked.
    assert d.table.following, "a dashboard made as the run starts follows the card it searches"
    nodes = d.tree.trees[key]
    assert sorted(n["id"] for n in nodes) == [c.id for c in stored]
    assert all(n["status"] != "pending" for n in nodes) and d.tree.live is False
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
    assert len(tree.nodes) == 300 and tree.card_label == short_label(session.cards[key])
    path = tree.best_path
    assert path[0] == ids[0] and path[-1] == ids[299]
    by_id = {n["id"]: n for n in tree.nodes}
    assert all(by_id[c]["parent"] == p for p, c in zip(path, path[1:]))
    assert by_id[ids[7]]["status"] == "compile_error" and by_id[ids[7]]["score"] == 0.0


def test_best_path_and_line_diff_helpers():
    assert best_path([{"id": 1, "parent": None, "score": 0.0}]) == []
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


def test_a_checkout_reads_the_one_copy_of_the_front_end_in_widgets(session):
    assert not (REPO / "kforge" / "views" / "static").exists(), "widgets/ is the only committed copy"
    table = CardTable(session.cards, session.store)
    assert table._esm == (REPO / "widgets" / "kforge.js").read_text() and "export default" in table._esm
    assert table._css == (REPO / "widgets" / "kforge.css").read_text()


@pytest.mark.slow
def test_the_wheel_ships_the_front_end(tmp_path):
    import subprocess
    import sys
    import zipfile

    import shutil

    src = tmp_path / "src"   # a copy: the build leaves nothing in the checkout
    for name in ("kforge", "widgets"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "static"))
    for name in ("setup.py", "pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy(REPO / name, src / name)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                          "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    wheel, = (tmp_path / "dist").glob("kforge-*.whl")
    with zipfile.ZipFile(wheel) as z:
        for name in ("kforge.js", "kforge.css"):
            assert z.read(f"kforge/views/static/{name}").decode() == (REPO / "widgets" / name).read_text()
        # the installed package finds the packaged copy (not a checkout's widgets/)
        z.extractall(tmp_path / "site")
    probe = subprocess.run([sys.executable, "-c", "from kforge.views._static import static_dir; print(static_dir())"],
                           capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path / "site")}, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == str(tmp_path / "site" / "kforge" / "views" / "static")


def test_session_display_falls_back_to_text_before_capture(tmp_path, capsys):
    from IPython.core.interactiveshell import InteractiveShell
    from kforge.views import display_session

    InteractiveShell.instance()
    s = kforge.Session(TwoOps(), torch.randn(4, 8), device="cpu", workdir=tmp_path / "empty")
    display_session(s)
    assert "kforge.Session" in capsys.readouterr().out


# ---------------------------------------------------------------------- live runs, control, snapshots

class GatedProposer(ScriptedProposer):
    """Proposes ``free`` candidates, then waits for ``gate`` before each further one."""

    def __init__(self, sources, free: int):
        super().__init__(sources)
        self.free, self.gate = free, threading.Event()

    def propose(self, request):
        if len(self.requests) >= self.free:
            assert self.gate.wait(60), "the test never opened the gate"
        return super().propose(request)


def _until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _data_of(bundle):
    return bundle[0] if isinstance(bundle, tuple) else bundle


def _post(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_dashboard_made_mid_run_is_live_and_has_everything_pushed(session):
    base = kernel_source("cpu", "softmax_rows")
    proposer = GatedProposer([base + f"\n/* variant {i} */\n" for i in range(4)], free=2)
    run = session.optimize(proposer=proposer, iterations=4, ops=["softmax"], policy="linear", background=True)
    key = _softmax_key(session)
    _until(lambda: sum(e.kind is EventKind.EVALUATED for e in list(run.events)) >= 2, "two evaluations")
    d = dashboard(session)
    assert d.tree.live and d.tree.following, "a view made after the run started still knows it is live"
    assert d.table.searching == key and d.table.following and d.table.selected_key == key
    assert next(r for r in d.table.rows if r["key"] == key)["status"] == "searching"
    assert d.progress.control_url.startswith("http://127.0.0.1:")
    proposer.gate.set()
    run.wait(120)
    stored = session.store.candidates(key)
    evaluated = sum(e.kind in (EventKind.EVALUATED, EventKind.PROPOSER_FAILED) for e in run.events)
    assert d.progress.done == evaluated == len(stored) == 4, "the progress count is the run's evaluations"
    assert not d.tree.live and d.table.searching == "" and d.progress.control_url == ""
    assert sorted(n["id"] for n in d.tree.trees[key]) == [c.id for c in stored]
    # every candidate's source, diff, log and verdict is in the view already: a click needs no kernel
    assert sorted(int(i) for i in d.source.details) == [c.id for c in stored]
    last = d.source.details[str(stored[-1].id)]
    assert last["source"] == stored[-1].source and last["evaluation"]["status"] == stored[-1].status.value
    for c in stored:
        diff = d.source.details[str(c.id)]["diff"]
        assert (diff is None) == (c.parent_id is None) and (diff is None or any(k == "+" for k, _ in diff))


def test_progress_buttons_reach_the_run_over_its_control_channel_while_the_kernel_is_busy(session):
    base = kernel_source("cpu", "softmax_rows")
    proposer = GatedProposer([base + f"\n/* variant {i} */\n" for i in range(6)], free=1)
    run = session.optimize(proposer=proposer, iterations=6, ops=["softmax"], policy="linear", background=True)
    view = progress(run)
    url = view.control_url
    # the test's thread stands for the busy kernel: the server answers from its own thread
    assert _post(f"{url}/pause") == (200, "pausing")
    proposer.gate.set()
    _until(lambda: run.state.value == "paused", "the run to pause")
    _until(lambda: view.state == "paused", "the view to show it")
    assert _post(f"{url}/resume")[0] == 200
    _until(lambda: run.state.value != "paused", "the run to resume")
    assert _post(f"{url}/stop")[0] == 200
    run.wait(120)
    assert run.state.value == "stopped" and view.state == "stopped"
    kinds = [e.kind for e in run.events]
    assert EventKind.PAUSED in kinds and EventKind.RESUMED in kinds


def test_the_control_channel_refuses_a_wrong_token_and_unknown_actions():
    from kforge.views._control import ControlChannel

    seen = []
    channel = ControlChannel(lambda action: seen.append(action) or "ok")
    try:
        root = channel.url.rsplit("/", 1)[0]
        assert _post(f"{root}/{'0' * 32}/stop")[0] == 403
        assert _post(f"{channel.url}/explode")[0] == 400
        assert _post(f"{channel.url}/stop") == (200, "ok") and seen == ["stop"]
    finally:
        channel.close()


def test_every_view_and_the_dashboard_carry_a_static_html_snapshot(session, tmp_path):
    key = _softmax_key(session)
    a = _add(session.store, key, None, "int a;\n", Status.FASTER, 1.5)
    _add(session.store, key, a, "int a; /* <b> */\n", Status.FASTER, 2.0)
    d = dashboard(session)
    for view in (d.table, d.tree, d.source):
        data = _data_of(view._repr_mimebundle_())
        assert "application/vnd.jupyter.widget-view+json" in data and "<script" not in data["text/html"]
    html = _data_of(d._repr_mimebundle_())["text/html"]
    assert short_label(session.cards[key]) in html and "Operator cards" in html
    assert "&lt;b&gt;" in html and "<b>" not in html, "sources are escaped"
    assert "2.00×" in html, "the tree's best candidate"
    out = d.export_html(tmp_path / "dash.html")
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("data:image/png;base64,") == 3


def test_a_reopened_session_shows_the_finished_search_whole(session):
    base = kernel_source("cpu", "softmax_rows")
    run = session.optimize(proposer=ScriptedProposer([base + f"\n/* v{i} */\n" for i in range(3)]), iterations=3,
                           ops=["softmax"])
    key = _softmax_key(session)
    workdir = session.workdir
    session.close()
    again = kforge.Session.open(workdir)
    try:
        d = again.dashboard()
        row = next(r for r in d.table.rows if r["key"] == key)
        assert row["status"] in ("winner", "noisy", "eager") and row["candidates"] == 3
        assert d.table.selected_key == key and len(d.tree.nodes) == 3 and d.progress is None
        assert d.source.candidate_id in {n["id"] for n in d.tree.nodes} and len(d.source.details) == 3
        assert not d.tree.live
    finally:
        again.close()
    assert run.done


def test_best_path_only_to_a_candidate_faster_than_eager():
    nodes = [{"id": 1, "parent": None, "score": 0.8, "status": "slower"},
             {"id": 2, "parent": 1, "score": 0.95, "status": "no_gain"}]
    assert best_path(nodes) == [], "no bold path when nothing beat eager"
    nodes.append({"id": 3, "parent": 2, "score": 1.3, "status": "faster"})
    assert best_path(nodes) == [1, 2, 3]
    # once the card has a winner the path ends there, even where another candidate's timing was higher
    nodes += [{"id": 4, "parent": 1, "score": 1.2, "status": "faster", "winner": True}]
    assert best_path(nodes) == [1, 4]


def test_cards_read_as_short_signatures_not_keys(session):
    key = _softmax_key(session)
    label = short_label(session.cards[key])
    assert label.startswith("softmax(f32[64,1000]") and key not in label and "dtype=None" not in label
    row = next(r for r in CardTable(session.cards, session.store).rows if r["key"] == key)
    assert row["label"] == label and row["vendor"] == (session.cards[key].vendor or "")


def test_speedup_chart_tooltip_has_each_candidates_status(session):
    key = _softmax_key(session)
    a = _add(session.store, key, None, "a\n", Status.FASTER, 1.2)
    _add(session.store, key, a, "b\n", Status.WRONG_RESULT, 0.0)
    spec = charts.speedup_over_iterations(session).to_dict()
    rows = [r for d in spec["datasets"].values() for r in d if "best speedup" in r]
    assert [r.get("status") for r in rows] == ["faster", "wrong_result"], "the tooltip's status field has values"
    axis = spec["layer"][0]["layer"][0]["encoding"]["x"]["axis"] if "layer" in spec["layer"][0] else None
    ticks = axis["values"] if axis else None
    assert ticks is None or len(ticks) == len(set(ticks))


def test_charts_say_no_data_yet_and_live_charts_redraw_and_carry_a_png(session):
    assert "no data yet" in str(charts.speedup_over_iterations(session).to_dict())
    assert "no data yet" in str(charts.cost_per_card(session).to_dict())
    chart = charts.live(charts.speedup_over_iterations, session)
    data = _data_of(chart._repr_mimebundle_())
    assert "application/vnd.jupyter.widget-view+json" in data and data["image/png"]
    key = _softmax_key(session)
    _add(session.store, key, None, "a\n", Status.FASTER, 1.4)
    chart.redraw()
    assert "no data yet" not in str(chart.chart.to_dict())


def test_a_region_card_reads_as_its_operators_not_its_ir(session):
    (region,) = session.cards.by_op("region")
    assert short_label(region) == "region[softmax,relu](f32[64,1000])"
    row = next(r for r in CardTable(session.cards, session.store).rows if r["key"] == region.key)
    assert row["label"] == short_label(region) and "softmax" in row["signature"]


def test_charts_read_in_both_themes_and_count_a_region_once(session):
    """No background of their own (the dark theme showed a white block); the time per operator is
    the time inside the forward, where the region's card has taken over the calls inside it."""
    for fn in (charts.speedup_over_iterations, charts.cost_per_card, charts.time_breakdown):
        spec = fn(session).to_dict()
        assert spec["config"]["background"] == "transparent", fn.__name__
    frame = charts.time_breakdown(session).data
    before = frame[frame["when"] == "before"]
    assert before["time (µs)"].sum() == pytest.approx(sum(c.forward_us for c in session.cards))
    timed = set(before[before["time (µs)"] > 0]["op"])
    assert timed == {c.op for c in session.cards if c.forward_us > 0} and "region" in timed


def _recording_shell(monkeypatch):
    """IPython's shell with its display messages recorded as (data, display id, update)."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    sent = []

    def publish(data, metadata=None, *, transient=None, update=False, **_):
        sent.append((data, (transient or {}).get("display_id"), update))

    monkeypatch.setattr(shell.display_pub, "publish", publish)
    return shell, sent


def test_views_shown_as_a_run_starts_end_with_its_last_state(session, monkeypatch):
    from IPython.display import display

    _shell, sent = _recording_shell(monkeypatch)
    base = kernel_source("cpu", "softmax_rows")
    proposer = GatedProposer([base + f"\n/* variant {i} */\n" for i in range(4)], free=1)
    run = session.optimize(proposer=proposer, iterations=4, ops=["softmax"], policy="linear", background=True)
    d = dashboard(session)
    chart = charts.live(charts.speedup_over_iterations, session)
    alone = progress(run)
    for view in (d, chart, alone):
        display(view)
    shown = [(data, display_id) for data, display_id, update in sent if not update]
    assert len(shown) == 3 and all(display_id for _, display_id in shown), "each shown under a display id"
    assert "finished" not in shown[0][0]["text/html"]
    proposer.gate.set()
    run.wait(120)
    last = {display_id: data for data, display_id, update in sent if update}   # the last update of each
    assert set(last) == {display_id for _, display_id in shown}, "every output is sent again by the run's end"
    evaluated = sum(e.kind in (EventKind.EVALUATED, EventKind.PROPOSER_FAILED) for e in run.events)
    for data in (last[shown[0][1]], last[shown[2][1]]):
        assert "application/vnd.jupyter.widget-view+json" in data, "the live view stays"
        assert "finished" in data["text/html"] and f"{evaluated} evaluated" in data["text/html"]
    assert last[shown[1][1]]["image/png"] != shown[1][0]["image/png"], "the chart's picture is drawn again"
    # the kernel never moves the selection (the front end follows the search), yet the snapshot shows
    # the card searched and its best candidate, as the front end does
    label = short_label(session.cards[_softmax_key(session)])
    html = last[shown[0][1]]["text/html"]
    assert f"Search tree · {label}" in html.replace("&#x27;", "'") and "Candidate #" in html


def test_a_snapshot_is_sent_again_at_a_card_end_at_most_once_a_minute(monkeypatch):
    from kforge.views._snapshot import SnapshotDisplay

    _shell, sent = _recording_shell(monkeypatch)
    states = iter(range(100))
    snap = SnapshotDisplay(lambda: {"text/plain": f"state {next(states)}"}, min_interval=60.0)
    snap.apply([Event(EventKind.RUN_FINISHED, None, None)])
    assert sent == [], "nothing shown yet: nothing to update"
    snap.show()
    for kind in (EventKind.CARD_FINISHED, EventKind.EVALUATED, EventKind.CARD_FINISHED):
        snap.apply([Event(kind, "k", None)])
    assert len(sent) == 1, "card ends within a minute of the display send nothing"
    snap._last -= 61
    snap.apply([Event(EventKind.CARD_FINISHED, "k", None)])
    snap.apply([Event(EventKind.RUN_FINISHED, None, None)])
    assert [(data["text/plain"], update) for data, _, update in sent] == [
        ("state 0", False), ("state 1", True), ("state 2", True)]
    assert {display_id for _, display_id, _ in sent} == {snap.display_id}


def test_views_know_at_once_when_a_cell_holds_the_kernel(session):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    base = kernel_source("cpu", "softmax_rows")
    proposer = GatedProposer([base + f"\n/* variant {i} */\n" for i in range(4)], free=0)
    run = session.optimize(proposer=proposer, iterations=4, ops=["softmax"], policy="linear", background=True)
    d = dashboard(session)
    cell = SimpleNamespace(raw_cell="", store_history=False, silent=False, shell_futures=True, cell_id=None)
    shell.events.trigger("post_run_cell", SimpleNamespace(info=cell, success=True))
    assert not d.progress.kernel_busy and not d.source.kernel_busy
    shell.events.trigger("pre_run_cell", cell)
    assert d.progress.kernel_busy and d.source.kernel_busy, "the front end says at once that a request would wait"
    run.stop()
    proposer.gate.set()
    run.wait(120)
    shell.events.trigger("post_run_cell", SimpleNamespace(info=cell, success=True))
    assert d.progress.kernel_busy, "a finished run's views are no longer told"


def test_a_blocking_optimize_in_a_notebook_runs_in_a_thread_behind_its_live_view(session, monkeypatch):
    """In a notebook kernel, optimize() without background shows the progress view before the search
    starts and feeds it while the cell waits; the cell's result is then the run's one line."""
    from IPython.core.interactiveshell import InteractiveShell

    from kforge.views import _live, _session_display

    shell = InteractiveShell.instance()
    monkeypatch.setattr(shell, "kernel", object(), raising=False)   # what an ipykernel shell has
    shown, threads = [], []
    monkeypatch.setattr("IPython.display.display", lambda obj, **_: shown.append(obj))
    base = kernel_source("cpu", "softmax_rows")

    class Watching(ScriptedProposer):
        def propose(self, request):
            threads.append((threading.current_thread().name, [type(v).__name__ for v in shown]))
            return super().propose(request)

    try:
        run = session.optimize(proposer=Watching([base + f"\n/* v{i} */\n" for i in range(3)]), iterations=3,
                               ops=["softmax"])
        assert run.done and run.shown_live
        assert threads and all(name != "MainThread" and views == ["RunProgress"] for name, views in threads), threads
        view = shown[0]
        assert view.state == "finished" and view.done == 3
        _session_display.display_run(run)
        assert repr(shown[-1]) == repr(run), "the cell's result: one line, not a second view"
        shell.events.trigger("post_run_cell", None)
        assert not run.shown_live, "a later cell showing the run gets its view"
        monkeypatch.setattr(shell, "kernel", None)
        assert _live.notebook_shell() is None
        again = session.optimize(proposer=Watching([base + "\n/* w */\n"]), iterations=4, ops=["softmax"])
        assert again.done and not getattr(again, "shown_live", False), "outside a kernel it runs in place"
    finally:
        InteractiveShell.clear_instance()


def test_a_card_searched_start_to_end_between_two_pushes_is_still_the_one_followed(session):
    key = _softmax_key(session)
    first = session.cards[0].key
    assert first != key, "the default row must differ from the searched card for this test to mean anything"
    events: list[Event] = [Event(EventKind.RUN_STARTED)]
    run = SimpleNamespace(events=events, done=False)
    table = CardTable(session.cards, session.store, run=run)
    assert table.following and table.followed == "" and table.selected_key == first
    # the whole card, and the run's end, in one batch: "searching" never shows it
    events += [Event(EventKind.CARD_STARTED, key), Event(EventKind.EVALUATED, key), Event(EventKind.CARD_FINISHED, key),
               Event(EventKind.RUN_FINISHED)]
    run.done = True
    table.apply(events[1:])
    assert table.searching == ""
    assert table.followed == key, "the front end moves the selection to the card followed"
    assert table.shown_key == key, "and the static snapshot shows the same card"
    # a user who pinned a row keeps it in the snapshot
    table.following = False
    assert table.shown_key == first
