"""What kforge says about the whole model is what the model gets: a slower row is labelled slower, a mode that
keeps no kernel shows no time of its own, every ratio carries its noise, a long run says what it is doing; and a
search's progress counts evaluations apart from proposer failures, of a total that does not jump."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn

import kforge
from kforge.deploy._fallback import Arm, Comparison, FallbackReport, Outcome, comparison_of
from kforge.deploy._report import EndToEnd, Row, no_kernel_kept
from kforge.evaluate import Evaluation, Status
from kforge.proposers import Proposal, ProposerError, Usage
from kforge.proposers._base import ProposerExhausted
from kforge.search import EventKind, Progress
from kforge._events import ETA_AFTER_EVALUATIONS, ETA_AFTER_FRACTION
from kernel_files import kernel_source


class Chains(nn.Module):
    """A small block whose Python forward counts the calls it runs eagerly (not while dynamo traces it)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 32)
        self.eager_calls = 0

    def forward(self, x):
        if not torch.compiler.is_compiling():
            self.eager_calls += 1
        h = self.proj(x)
        return torch.softmax(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6), -1)


def _runs_eagerly(model: Chains, arm: Arm) -> bool:
    before = model.eager_calls
    arm.enter()
    try:
        with torch.no_grad():
            arm.forward()
    finally:
        arm.exit()
    return model.eager_calls > before


def _timer(model: Chains, eager_us: float, compiled_us: float, *, eager_next_to_compiled_us: float | None = None,
           noise_us: float = 5.0):
    """A deterministic Compare: eager forwards cost ``eager_us`` (``eager_next_to_compiled_us`` when timed against
    a compiled forward: the load the issue saw), compiled ones ``compiled_us``; rounds spread by ``noise_us``."""
    def compare(a: Arm, b: Arm) -> Comparison:
        eager_a, eager_b = _runs_eagerly(model, a), _runs_eagerly(model, b)
        mixed = eager_a != eager_b and eager_next_to_compiled_us is not None
        t = lambda eager: (eager_next_to_compiled_us if mixed else eager_us) if eager else compiled_us  # noqa: E731
        jitter = [(-noise_us if i % 2 else noise_us) for i in range(12)]
        return comparison_of([t(eager_a) + j for j in jitter], [t(eager_b) for _ in jitter])
    return compare


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    model = Chains().eval()
    s = kforge.Session(model, torch.randn(8, 32), device="cpu", workdir=tmp_path_factory.mktemp("truth") / "wd")
    s.capture(timing_budget_ms=2.0)
    yield s
    s.close()
    torch._dynamo.reset()


def _row(table: EndToEnd, label: str) -> Row:
    return next(r for r in table.rows if r.label == label)


def _line(table: EndToEnd, label: str) -> str:
    return next(line for line in table.table().splitlines() if line.split("  ")[0].strip() == label)


# ----------------------------------------------------------------------------- end_to_end's table


def test_a_slower_compiled_row_is_labelled_slower_and_a_mode_that_keeps_nothing_shows_no_time(session):
    model = session.model
    lines: list[str] = []
    table = session.end_to_end(modes=("default",), compile_backend="eager", progress=lines.append,
                               compare=_timer(model, eager_us=500.0, compiled_us=3000.0))
    compiled = _row(table, "compile default")
    assert compiled.comparison.outcome is Outcome.SLOWER and compiled.comparison.speedup < 1.0
    assert compiled.us > compiled.comparison.without_us, "the row's time is the slower one"
    assert "slower" in _line(table, "compile default") and "faster" not in table.table()
    assert f"{compiled.comparison.speedup:.3f}x ± " in _line(table, "compile default")
    for label in ("eager + kforge", "compile default + kforge"):
        row = _row(table, label)
        assert row.us is None and row.no_kernel == "no winner to install", label
        line = _line(table, label)
        assert "no kernel kept (no winner to install)" in line and " ms" not in line, line
    assert table.headline() == [
        "eager: + kforge: no kernel kept (no winner to install)",
        f"compile default: {compiled.comparison.ratio()} than eager; + kforge: no kernel kept (no winner to install)"]
    assert "slower than eager" in table.headline()[1]
    # what a run of minutes says while it runs: each step as it starts, each mode's result as it ends
    assert any("eager (1 of 2): timing the model" in line for line in lines), lines
    assert any("compile default (2 of 2): compiling the model, then timing it against eager" in line
               for line in lines), lines
    assert any(line.endswith(table.headline()[1]) for line in lines), lines
    assert lines[-1].endswith(" s") and "done in" in lines[-1]
    assert session.last_end_to_end is table
    data = table.to_json()
    assert data["rows"][1]["comparison"]["outcome"] == "slower" and data["rows"][2]["no_kernel_kept"]
    assert data["headline"] == table.headline()
    torch._dynamo.reset()


def test_a_row_whose_baseline_read_slower_in_its_own_run_shows_that_time_and_says_the_load_changed(session):
    """The issue's table: eager 0.534 ms beside compile default 3.365 ms "1.386x, within noise (+/-3818.5 us)".
    The ratio was read against eager's time in the compiled row's own run (4.66 ms): the row now shows that
    time beside the ratio, the ratio its noise, and the table says that eager read differently in two runs."""
    model = session.model
    table = session.end_to_end(modes=("default",), compile_backend="eager", progress=False,
                               compare=_timer(model, eager_us=534.0, compiled_us=3365.0,
                                              eager_next_to_compiled_us=4664.0, noise_us=3000.0))
    compiled = _row(table, "compile default")
    cmp = compiled.comparison
    assert cmp.outcome is Outcome.WITHIN_NOISE and cmp.speedup > 1.0
    line = _line(table, "compile default")
    assert f"eager {cmp.without_us / 1e3:.3f} ms in the same run" in line and "within noise" in line
    assert compiled.us < cmp.without_us, "a ratio above 1 sits beside a baseline time above the row's"
    assert "faster" not in table.table()
    assert "note: eager read 0.534 ms in its own row and 4.664 ms in the run against compile default" in table.table()
    torch._dynamo.reset()


def test_every_ratio_carries_a_noise_that_agrees_with_its_label():
    """faster: the ratio less its ± stays above 1; slower: plus its ± stays below 1; within noise: 1 is
    inside. Read over a grid of savings, noises and margins, with paired rounds and without."""
    for without, saved, noise, margin in itertools.product((50.0, 1000.0), (-400.0, -30.0, -4.0, 0.0, 3.0, 30.0, 45.0),
                                                           (0.5, 5.0, 40.0, 2000.0), (0.0, 10.0)):
        c = Comparison(without - saved, without, noise, paired_us=saved, margin_us=margin)
        s, pm = c.speedup, c.speedup_noise
        if c.outcome is Outcome.FASTER:
            assert s > 1.0 and s - pm >= 1.0 - 1e-12, c
        elif c.outcome is Outcome.SLOWER:
            assert s < 1.0 and s + pm <= 1.0 + 1e-12, c
        else:
            assert s - pm <= 1.0 + 1e-12 <= s + pm + 2e-12, c
        assert c.outcome.value in c.describe() and c.ratio().startswith(f"{s:.3f}x")
    wide = Comparison(3365.0, 4664.0, 3818.5, paired_us=1299.0)
    assert "1.386x (from 0.65x up: the noise exceeds the time)" in wide.ratio() and "within noise" in wide.ratio()
    assert Comparison(90.0, 100.0, 2.0, paired_us=10.0).ratio() == "1.111x ± 0.024, faster"   # low end 100 / 92


def test_a_mode_that_keeps_nothing_says_why():
    cmp = Comparison(1000.0, 1001.0, 5.0, paired_us=1.0)
    assert no_kernel_kept(0, None) == "no winner to install"
    assert no_kernel_kept(2, FallbackReport("default", (), (), cmp, 3)).startswith(
        "the model is not measurably faster with them: 1.001x ± ")
    assert no_kernel_kept(1, FallbackReport("eager", (), (), Comparison(0, 0, 0), 0, ("region[add,relu]",))) == \
        "its 1 kernel(s) run in graph mode only"
    assert no_kernel_kept(1, FallbackReport("default", (), (), cmp, 0, not_placed=("relu(x)",))).startswith(
        "no call in this mode's graphs")
    dropped = FallbackReport("default", (), (), cmp, 3, wrong_output="with them the output differs")
    assert no_kernel_kept(1, dropped) == "dropped: with them the output differs"


def test_a_real_cpu_run_on_a_tiny_model_labels_each_row_by_its_own_measurement(tmp_path):
    """Real timings on this busy machine: which label each row gets is chance, but a label never contradicts
    the ratio and times beside it, and with no winner no "+ kforge" row shows a time."""
    model = Chains().eval()
    with kforge.Session(model, torch.randn(8, 32), device="cpu", workdir=tmp_path / "wd") as s:
        s.capture(timing_budget_ms=2.0)
        lines: list[str] = []
        table = s.end_to_end(modes=("default",), progress=lines.append)
    for r in table.rows:
        if r.label.endswith("+ kforge"):
            assert r.us is None and "no kernel kept" in r.cell()
            continue
        if r.comparison is None:
            continue
        c = r.comparison
        assert r.us == pytest.approx(c.with_paired_us)
        if c.outcome is Outcome.FASTER:
            assert c.speedup > 1.0 and r.us < c.without_us
        elif c.outcome is Outcome.SLOWER:
            assert c.speedup < 1.0 and r.us > c.without_us and "faster" not in r.cell()
    assert len(table.headline()) == 2 and len(lines) >= 4
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- a search's progress


class _Softmaxes(nn.Module):
    """Three softmax cards (three shapes): one whose proposer fails, one it runs out of, one that goes well."""

    def forward(self, a, b, c):
        return a.softmax(-1).sum() + b.softmax(-1).sum() + c.softmax(-1).sum()


class _Proposer:
    """By card: "fails" answers twice then fails for good; "runs out" answers once then has nothing new."""

    name = "scripted-by-card"
    instant = True

    def __init__(self, roles: dict[str, str]):
        self.roles, self.asked = roles, {}
        self.source = kernel_source("cpu", "softmax_rows")

    def propose(self, request):
        key = request.card.key
        n = self.asked[key] = self.asked.get(key, 0) + 1
        role = self.roles[key]
        if role == "fails" and n > 2:
            raise ProposerError("the model refused")
        if role == "runs out" and n > 1:
            raise ProposerExhausted("every strategy that fits was tried")
        usage = Usage("scripted", 10, 10, 0, 0, 0.0, 0.0)
        return Proposal(self.source + f"\n/* {key} {n} */\n", f"candidate {n}", usage=usage)


class _Evaluator:
    backend, device, arch = "cpu", "cpu", "native"

    def __init__(self):
        self.n = 0

    def evaluate_variant(self, variant, source, examples=(), *, seed=0):
        self.n += 1
        if self.n == 2:   # one evaluation fails outside the candidate's control: it counts for nothing
            return Evaluation(Status.INFRA_ERROR, "the runner's host went away")
        return Evaluation(Status.NO_GAIN, "scripted", speedup=1.0, candidate_us=10.0, eager_us=10.0)

    def close(self):
        pass


def test_progress_counts_evaluations_apart_from_failures_and_its_total_only_shrinks(tmp_path):
    xs = (torch.randn(16, 64), torch.randn(16, 128), torch.randn(16, 256))
    s = kforge.Session(_Softmaxes(), xs, device="cpu", workdir=tmp_path / "wd")
    cards = [c for c in s.capture(timing_budget_ms=2.0) if c.op == "softmax"]
    assert len(cards) == 3
    roles = dict(zip((c.key for c in cards), ("fails", "runs out", "goes well")))
    s._evaluator = _Evaluator()
    run = s.optimize(proposer=_Proposer(roles), iterations=6, parallel=1, confirm=False, ops=["softmax"])
    events = run.events
    kinds = [e.kind for e in events]
    judged = sum(1 for e in events if e.kind is EventKind.EVALUATED and e.data["counts"])
    failed = kinds.count(EventKind.PROPOSER_FAILED)
    assert judged >= 3 and failed == 3 and EventKind.EXHAUSTED in kinds
    assert kinds.count(EventKind.EVALUATED) == judged + 1, "one evaluation failed outside the candidate"
    final = run.progress
    assert (final.evaluated, final.proposer_failures) == (judged, failed)
    assert final.planned == 18 and final.total == final.used == judged + failed and final.finished
    whys = {r.card_key: r.why for r in final.released}
    assert whys[cards[0].key] == "3 proposer failures in a row"
    assert whys[cards[1].key].startswith("nothing left to propose")
    line = final.line()
    assert line.startswith(f"{judged} evaluated, 3 proposer failures: {judged + 3} of {judged + 3} budget units "
                           "(planned 18;") and "ETA" not in line
    assert f"{judged} evaluations, 3 proposer failures" in repr(run)
    totals, etas = [], []
    for i in range(1, len(events) + 1):
        p = Progress.of(events[:i], cards_total=3, iterations=6, now=events[i - 1].time)
        totals.append(p.total)
        if p.evaluated < ETA_AFTER_EVALUATIONS or p.used < ETA_AFTER_FRACTION * p.total:
            assert p.eta_s is None and (p.finished or "ETA —" in p.line()), p
        etas.append(p.eta_s)
    assert totals[0] == 18 and all(b <= a for a, b in zip(totals, totals[1:])), totals
    assert totals[-1] < 18
    s.close()


def test_the_command_lines_progress_line_counts_failures_apart(capsys):
    from kforge import cli
    from kforge.search import Event

    progress = cli._Progress(quiet=False, cards_total=2, iterations=4, every_s=3600.0)
    t0 = 1000.0
    events = [Event(EventKind.RUN_STARTED, data={"planned": {"a": 4, "b": 4}}, time=t0),
              Event(EventKind.CARD_STARTED, "a", message="softmax(...)", time=t0)]
    events += [Event(EventKind.EVALUATED, "a", i, "no gain", {"counts": True}, time=t0 + i) for i in range(1, 3)]
    events += [Event(EventKind.PROPOSER_FAILED, "a", None, "refused", time=t0 + 3 + i) for i in range(2)]
    events += [Event(EventKind.CARD_FINISHED, "a", None, "no candidate beat eager",
                     {"ended": "2 proposer failures in a row"}, time=t0 + 6)]
    for e in events:
        progress(e)
    err = capsys.readouterr().err
    assert "progress  0 evaluated: 0 of 8 budget units · 0 / 2 cards" in err
    assert "progress  2 evaluated, 2 proposer failures: 4 of 8 budget units · 1 / 2 cards" in err
    assert progress.evaluations == 2 and progress.progress.total == 8


def test_after_a_run_the_summaries_give_the_models_result_per_mode_or_say_what_times_it(session):
    """A search times each card's calls alone: the command line's summary says the model was not timed and
    what times it; a session display shows the last end_to_end() headline beside the cards."""
    from types import SimpleNamespace

    from kforge import cli
    from kforge.views._session_display import model_level

    summary = {"skipped": [], "out_of_reach": [], "noisy": [], "evaluations": 7, "proposer_failures": 2,
               "winners": [{"key": "k", "op": "softmax", "signature": "softmax(x)", "speedup": 2.0,
                            "winner_speedup": 2.0, "speedup_low": 1.9, "speedup_high": 2.1, "confirmed": True}],
               "dollars": 0.0, "seconds": 3.0, "resume": "kforge optimize --resume --workdir /tmp/wd"}
    lines = cli._optimize_summary(summary, SimpleNamespace(outside=()))
    assert "1 winner(s), 7 evaluation(s), 2 proposer failure(s)" in "\n".join(lines)
    model_line = next(line for line in lines if line.startswith("the model: "))
    assert "not timed by this search" in model_line and "Session.open('/tmp/wd'" in model_line
    assert model_line.endswith(".end_to_end() in Python")
    table = session.end_to_end(modes=("default",), compile_backend="eager", progress=False,
                               compare=_timer(session.model, eager_us=500.0, compiled_us=400.0))
    shown = model_level(session)
    assert shown[0].startswith("the model, timed whole") and shown[1:] == [f"  {line}" for line in table.headline()]
    session.last_end_to_end = None
    assert model_level(session) == [], "no search and no table: nothing to say"
    torch._dynamo.reset()


def test_on_the_cpu_every_block_of_a_comparison_starts_with_an_untimed_forward():
    """On this CPU the first eager forward after a block of compiled forwards stalled for 10-45 ms (0.25 ms
    otherwise), so eager read 3.2 ms while alternating with compiled code: each CPU block warms up first."""
    from kforge.deploy._fallback import interleaved

    calls = {"a": 0, "b": 0}

    def counting(name):
        def forward():
            calls[name] += 1
        return forward

    compare = interleaved("cpu", budget_s=0.0, block_s=1e-9, min_rounds=10, max_rounds=60, max_s=60.0)
    cmp = compare(Arm(counting("a")), Arm(counting("b")))
    assert len(cmp.rounds) == 10 and calls["a"] == calls["b"] == 2 + 2 * 10
