"""Inference rewrites beyond the session: exported with their verdicts, made again by ``kforge.load`` in a fresh
process (checked there on a probe input, never stale, under ``Deployment.compile`` too), an artifact from before
rewrites were exported still loading, and the end-to-end table timing each rewrite as a row of its own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import kforge
from kforge import cli
from kforge.deploy import ArtifactError, read_manifest
from kforge.deploy._fallback import Comparison, Outcome, RewriteVerdict
from kforge.deploy._report import rewrite_rows

from test_rewrites import DEEP_RTOL, FOLD, SINGLE_LAYER_RTOL, ConvBnRelu, _norms, _ops_run, _randomised, _rel, _timer
from test_vendor_chains import SmallResNet

ROOT = Path(__file__).resolve().parents[1]


def _exported(tmp_path: Path, model: torch.nn.Module, x: torch.Tensor, monkeypatch, faster: bool = True) -> Path:
    """``model``'s session exported with the fold, the model-level timer replaced (faster or slower with it)."""
    import kforge.deploy._fallback as fallback

    arms: list = []
    monkeypatch.setattr(fallback, "interleaved", _timer(faster, arms))
    session = kforge.Session(model, x, device="cpu", workdir=tmp_path / "wd")
    path = session.export(tmp_path / "artifact", rewrites=(FOLD,))
    assert arms == [((FOLD,), ())]   # timed as apply times it: with the fold against without
    session.close()
    return path


_LOAD = textwrap.dedent("""
    import json, warnings, torch
    import kforge
    from test_rewrites import _norms, _ops_run, _rel
    from test_vendor_chains import SmallResNet

    model = SmallResNet().eval()
    model.load_state_dict(torch.load({weights!r}, weights_only=True))
    x = torch.load({x!r}, weights_only=True)
    with torch.no_grad():
        eager = model(x)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dep = kforge.load(model, {path!r}, device="cpu")
        out = model(x)
        norms = _norms(_ops_run(model, x))
        # a statistic changed after the load reaches the next forward (the folded constants are made again)
        model.blocks[1].bn2.running_mean.add_(0.5)
        model.bn1.weight.mul_(-1.5)
        dep.remove()
        eager_changed = model(x)
        dep.install()
        changed = model(x)
        compiled = dep.compile(model, backend="eager")
        compiled_out = compiled(x)
        compiled_sites = sum(len(r.sites) for r in compiled.kforge_backend.rewritten)
    print(json.dumps({{"rewrites": list(dep.rewrites), "checks": [v.to_json() for v in dep.rewrite_checks],
                      "skipped": dep.skipped, "warnings": [str(w.message) for w in caught if "kforge" in str(w.message)],
                      "norms": norms, "sites": len(dep.rewritten), "rel": _rel(out, eager),
                      "moved": _rel(eager_changed, eager), "rel_changed": _rel(changed, eager_changed),
                      "compiled_sites": compiled_sites, "rel_compiled": _rel(compiled_out, eager_changed)}}))
""")


def test_an_exported_fold_is_made_again_by_load_in_a_fresh_process(tmp_path, monkeypatch):
    model = _randomised(SmallResNet())
    x = torch.randn(2, 3, 32, 32)
    path = _exported(tmp_path, model, x, monkeypatch)
    manifest = read_manifest(path)
    (entry,) = manifest["rewrites"]
    assert entry["name"] == FOLD and entry["kept"] and entry["mode"] == "eager" and len(entry["sites"]) == 12
    # the verdict's ratio and noise, as the check measured them (the timer gave 80 us against 100)
    assert entry["comparison"]["speedup"] == pytest.approx(1.25) and entry["comparison"]["outcome"] == "faster"
    assert 0 < entry["comparison"]["speedup_noise"] < 0.25
    (leaf,) = manifest["probe"]["leaves"]
    assert leaf["tensor"]["shape"] == [2, 3, 32, 32] and leaf["tensor"]["dtype"] == "float32"

    torch.save(model.state_dict(), tmp_path / "weights.pt")
    torch.save(x, tmp_path / "x.pt")
    tests = str(Path(__file__).parent)
    script = _LOAD.format(weights=str(tmp_path / "weights.pt"), x=str(tmp_path / "x.pt"), path=str(path))
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), tests])})
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["rewrites"] == [FOLD] and got["skipped"] == [] and got["warnings"] == []
    (check,) = got["checks"]
    assert check["kept"] and len(check["sites"]) == 12 and "probe inputs" in check["why"]
    assert check["comparison"]["speedup"] == pytest.approx(1.25)   # the export's figure travels with it
    assert got["norms"] == 0 and got["sites"] == 12                  # every batch norm folded away
    assert got["rel"] < DEEP_RTOL
    assert got["moved"] > 1e-2 and got["rel_changed"] < DEEP_RTOL    # never a stale fold
    assert got["compiled_sites"] == 12 and got["rel_compiled"] < DEEP_RTOL


def test_a_fold_whose_output_moves_on_load_is_left_out(tmp_path, monkeypatch):
    """The check at load runs the loaded model with and without the fold on probe inputs: a wrong fold (here its
    channels' scales reversed, as a broken kforge would make them) stays out, saying why."""
    import kforge.rewrites._batch_norm as batch_norm

    model = _randomised(ConvBnRelu())
    x = torch.randn(2, 3, 12, 12)
    path = _exported(tmp_path, model, x, monkeypatch)
    right = batch_norm.folded
    monkeypatch.setattr(batch_norm, "folded", lambda site, values: tuple(t.flip(0) for t in right(site, values)))
    with torch.no_grad():
        eager = model(x)
        dep = kforge.load(model, path, device="cpu")
        out = model(x)
    assert dep.rewrites == () and dep.rewritten == []
    why = dict(dep.skipped)[FOLD]
    assert why.startswith("on load: ") and "differs from eager's" in why, why
    assert _rel(out, eager) == 0.0
    dep.remove()


def test_load_checks_the_fold_on_the_inputs_it_is_given_and_leaves_it_out_where_it_has_none(tmp_path, monkeypatch):
    model = _randomised(ConvBnRelu())
    x = torch.randn(2, 3, 12, 12)
    path = _exported(tmp_path, model, x, monkeypatch)
    with torch.no_grad():
        eager = model(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")   # a probe in the artifact: nothing to warn about
            with kforge.load(model, path, device="cpu", inputs=x) as dep:
                assert _rel(model(x), eager) < SINGLE_LAYER_RTOL and len(dep.rewritten) == 2
        (check,) = dep.rewrite_checks
        assert check.kept and "the inputs given to kforge.load" in check.why
        data = json.loads((path / "manifest.json").read_text())
        del data["probe"]   # as an artifact whose export could describe no inputs, or a damaged one
        (path / "manifest.json").write_text(json.dumps(data))
        with kforge.load(model, path, device="cpu") as dep:   # nothing to check its output on: it stays out
            assert _rel(model(x), eager) == 0.0 and dep.rewrites == () and dep.rewritten == []
            assert "cannot be checked here: pass inputs= to kforge.load" in dict(dep.skipped)[FOLD]
        with kforge.load(model, path, device="cpu", inputs=x) as dep:   # the load's own inputs check it
            assert _rel(model(x), eager) < SINGLE_LAYER_RTOL and len(dep.rewritten) == 2
        with kforge.load(model, path, device="cpu", revalidate=False) as dep:   # unchecked, asked for
            assert _rel(model(x), eager) < SINGLE_LAYER_RTOL and len(dep.rewritten) == 2
        with kforge.load(model, path, device="cpu", rewrites=()) as dep:   # asked for none
            model(x)
            assert dep.rewrites == () and dep.rewritten == []


def _forged(path, change) -> None:
    data = json.loads((path / "manifest.json").read_text())
    change(data)
    (path / "manifest.json").write_text(json.dumps(data))


@pytest.mark.parametrize("damage", ["huge", "negative", "not_a_number", "no_probe_at_all"])
def test_a_forged_verdict_with_a_probe_kforge_cannot_draw_installs_nothing(tmp_path, monkeypatch, damage):
    """A manifest that says kept for a fold that was left out, beside a probe that is absent, far too large, or
    not numbers: the load draws nothing it cannot afford, checks nothing, and leaves the fold out."""
    model = _randomised(ConvBnRelu())
    x = torch.randn(2, 3, 12, 12)
    path = _exported(tmp_path, model, x, monkeypatch, faster=False)

    def forge(data):
        data["rewrites"][0]["kept"] = True
        leaf = data["probe"]["leaves"][0]["tensor"]
        if damage == "huge":
            leaf["shape"] = [100000, 100000, 100]
        elif damage == "negative":
            leaf["shape"] = [-1, 3, 12, 12]
        elif damage == "not_a_number":
            leaf["mean"] = "abc"
        else:
            del data["probe"]
    _forged(path, forge)
    with torch.no_grad():
        eager = model(x)
        if damage in ("negative", "not_a_number"):
            with pytest.raises(ArtifactError, match="rewrites recorded in .* are malformed"):
                kforge.load(model, path, device="cpu")
            return
        with kforge.load(model, path, device="cpu") as dep:
            assert _rel(model(x), eager) == 0.0 and dep.rewrites == () and dep.rewritten == []
            why = dict(dep.skipped)[FOLD]
            assert "cannot be checked here" in why and ("GiB" in why) == (damage == "huge"), why


def test_a_probe_structure_of_an_unknown_type_is_a_malformed_artifact(tmp_path, monkeypatch):
    model = _randomised(ConvBnRelu())
    path = _exported(tmp_path, model, torch.randn(2, 3, 12, 12), monkeypatch)
    _forged(path, lambda data: data["probe"].__setitem__(
        "structure", [1, {"type": "os.system", "context": "null", "children_spec": []}]))
    with pytest.raises(ArtifactError, match="malformed .*NotImplementedError"):
        kforge.load(model, path, device="cpu")


def test_a_model_in_training_mode_gets_no_rewrite_and_keeps_its_statistics(tmp_path, monkeypatch):
    """A rewrite is for inference: a model left in training mode (modules start so) is not run to check one, at
    apply or at load, so its batch norms' running statistics stay as they were."""
    model = _randomised(ConvBnRelu())
    x = torch.randn(2, 3, 12, 12)
    path = _exported(tmp_path, model, x, monkeypatch)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dep = kforge.load(model, path, device="cpu")
    assert dep.rewrites == () and "training mode" in dict(dep.skipped)[FOLD] and "model.eval()" in dict(dep.skipped)[FOLD]
    dep.remove()
    session = kforge.Session(model, x, workdir=tmp_path / "train")
    with session.apply(rewrites=(FOLD,)) as dep:
        assert dep.rewrites == () and "training mode" in dict(dep.skipped)[FOLD]
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    session.close()


def test_a_fold_left_out_at_export_is_not_made_on_load(tmp_path, monkeypatch):
    model = _randomised(ConvBnRelu())
    x = torch.randn(2, 3, 12, 12)
    path = _exported(tmp_path, model, x, monkeypatch, faster=False)
    (entry,) = read_manifest(path)["rewrites"]
    assert not entry["kept"] and entry["comparison"]["outcome"] == "slower"
    with torch.no_grad(), kforge.load(model, path, device="cpu") as dep:
        model(x)
        assert dep.rewrites == () and dep.rewritten == []
        assert "left out when the artifact was exported" in dict(dep.skipped)[FOLD]


def test_an_artifact_from_before_rewrites_were_exported_still_loads(tmp_path):
    from test_deploy import _winner_session

    s, model, card = _winner_session(tmp_path)
    path = s.export(tmp_path / "artifact")   # no rewrites asked: the manifest is as it was before them
    manifest = read_manifest(path)
    assert "rewrites" not in manifest and "probe" not in manifest
    x = torch.randn(16, 300)
    expected = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dep = kforge.load(model, path, device="cpu")
    try:
        torch.testing.assert_close(model(x), expected)
        assert dep.kernels[0].calls == 1 and dep.rewrites == () and dep.rewrite_checks == []
    finally:
        dep.remove()
    with kforge.load(model, path, device="cpu", rewrites=(FOLD,)) as dep:   # one it does not carry: says so
        assert dep.rewrites == () and "carries no verdict" in dict(dep.skipped)[FOLD]
    s.close()


def _model_timer(faster: bool, arms: list):
    """A Compare for the end-to-end table: an arm that runs the fold takes 80 us (faster) or 120 us (slower) against
    100; every other pair of arms reads the same time."""
    def compare(with_arm, without_arm):
        rewrites = getattr(with_arm, "rewrites", ())
        arms.append((rewrites, getattr(without_arm, "rewrites", ())))
        with_us = (80.0 if faster else 120.0) if FOLD in rewrites else 100.0
        return Comparison(with_us, 100.0, 2.0, paired_us=100.0 - with_us)
    return compare


@pytest.mark.parametrize("faster", [True, False], ids=["faster", "slower"])
def test_end_to_end_times_the_fold_as_a_row_of_its_own_in_each_mode(tmp_path, faster):
    model = _randomised(ConvBnRelu())
    x = torch.randn(2, 3, 12, 12)
    arms: list = []
    session = kforge.Session(model, x, device="cpu", workdir=tmp_path / "wd")
    table = session.end_to_end(modes=("default",), compile_backend="eager", compare=_model_timer(faster, arms),
                               rewrites=(FOLD,), progress=False)
    assert arms.count(((FOLD,), ())) == 2   # eager and compile default, each against itself without the fold
    rows = {r.label: r for r in table.rows}
    # no kernel to keep: each fold row is against its mode's own row
    for label, baseline in (("eager + fold_batch_norm", "eager"),
                            ("compile default + fold_batch_norm", "compile default")):
        row = rows[label]
        assert row.baseline == baseline and row.rewrite.rewrite == FOLD and row.rewrite.kept == faster
        line = next(line for line in table.headline() if line.startswith(f"{baseline}:"))
        part = line.split("+ fold_batch_norm")[1]
        if faster:
            assert row.us == pytest.approx(80.0) and row.comparison.outcome is Outcome.FASTER
            assert len(row.rewrite.sites) == 2 and row.output_rel_diff < SINGLE_LAYER_RTOL
            assert "1.250x" in row.cell() and "faster" in part and baseline in part
        else:   # a slower fold keeps no time of its own and is never called faster
            assert row.us is None and row.comparison is None
            assert row.cell().startswith("not kept (") and "slower" in row.cell() and "faster" not in row.cell()
            assert "not kept" in part and "faster" not in part
    assert rows["eager + kforge"].no_kernel == "no winner to install"
    data = table.to_json()
    fold_rows = [r for r in data["rows"] if r["rewrite"]]
    assert [r["rewrite"]["kept"] for r in fold_rows] == [faster, faster]
    assert all((r["us"] is None) != faster for r in fold_rows)
    session.close()


def test_rewrite_rows_name_what_each_row_adds_and_what_it_is_against():
    """Compiled, each kept rewrite stays in the rows after it (they were checked with it); eagerly each is checked
    alone against the mode's row."""
    faster = Comparison(80.0, 100.0, 2.0, paired_us=20.0)
    verdicts = [RewriteVerdict("a", "default", True, ("s",), "kept", faster),
                RewriteVerdict("b", "default", False, (), "nothing matches it"),
                RewriteVerdict("c", "default", True, ("s",), "kept", faster)]
    rows = rewrite_rows(verdicts, "compile default + kforge", cumulative=True)
    assert [(r.label, r.baseline) for r in rows] == [
        ("compile default + kforge + a", "compile default + kforge"),
        ("compile default + kforge + a + b", "compile default + kforge + a"),
        ("compile default + kforge + a + c", "compile default + kforge + a")]
    assert [r.us for r in rows] == [80.0, None, 80.0]
    alone = rewrite_rows(verdicts, "eager", cumulative=False)
    assert [r.baseline for r in alone] == ["eager"] * 3


def test_the_command_line_takes_rewrites_for_the_table_and_the_export(tmp_path, monkeypatch, capsys):
    import kforge.deploy._fallback as fallback
    import kforge.deploy._report as report

    rc = cli.main(["optimize", "--device", "cpu", "--example", "tiny_cnn", "--rewrites", "fold_batchnorm"])
    err = capsys.readouterr().err
    assert rc == 2 and "--rewrites: kforge has no rewrite 'fold_batchnorm'; did you mean 'fold_batch_norm'?" in err

    (tmp_path / "cbr.py").write_text(textwrap.dedent("""
        import torch
        from test_rewrites import ConvBnRelu, _randomised
        def build():
            torch.manual_seed(0)
            return _randomised(ConvBnRelu()), torch.randn(2, 3, 12, 12)
    """))
    monkeypatch.chdir(tmp_path)
    arms: list = []
    monkeypatch.setattr(report, "interleaved", lambda device, **_: _model_timer(True, arms))
    monkeypatch.setattr(fallback, "interleaved", lambda device, **_: _model_timer(True, arms))
    rc = cli.main(["optimize", "--device", "cpu", "--model", "cbr:build", "--workdir", str(tmp_path / "wd"),
                   "--iterations", "1", "--ops", "relu", "--rewrites", FOLD, "--export", str(tmp_path / "artifact"),
                   "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    summary = json.loads(out)["summary"]
    (row,) = [r for r in summary["model"]["rows"] if r["rewrite"]]
    assert row["label"].endswith(" + fold_batch_norm") and row["rewrite"]["kept"] and row["us"] == 80.0
    assert any("+ fold_batch_norm (2 site(s)): 1.250x" in line for line in summary["model"]["headline"])
    (exported,) = summary["exported"]["rewrites"]
    assert exported["name"] == FOLD and exported["kept"]
    assert read_manifest(tmp_path / "artifact")["rewrites"][0]["kept"]
    # the export states the verdict the table showed: the fold was timed once, by the table, not again for the export
    assert arms.count(((FOLD,), ())) == 1
    assert exported["why"] == row["rewrite"]["why"] and exported["comparison"]["with_us"] == 80.0


def test_export_states_the_eager_verdicts_it_is_given_and_refuses_any_that_do_not_fit(tmp_path, monkeypatch):
    import kforge.deploy._fallback as fallback

    monkeypatch.setattr(fallback, "interleaved", _timer(True, arms := []))
    session = kforge.Session(_randomised(ConvBnRelu()), torch.randn(2, 3, 12, 12), device="cpu",
                             workdir=tmp_path / "wd")
    # as a table's eager row states it (here a slower fold), against a timer that would keep it
    stated = RewriteVerdict(FOLD, "eager", False, ("bn",), "the model ran 0.900x with it",
                            Comparison(111.0, 100.0, 2.0, paired_us=-11.0))
    compiled = RewriteVerdict(FOLD, "default", True, ("bn",), "the model ran 1.2x with it")
    path = session.export(tmp_path / "artifact", rewrites=(FOLD,), checked=[stated, compiled])
    (written,) = read_manifest(path)["rewrites"]
    assert arms == [] and written == stated.to_json()
    assert read_manifest(path)["probe"]["leaves"][0]["tensor"]["shape"] == [2, 3, 12, 12]   # the load checks on it
    for checked, what in (([compiled], f"none for {FOLD}"),
                          ([stated, stated], "two eager verdicts"),
                          ([stated, RewriteVerdict("channels_last", "eager", True, (), "")], "channels_last not exported"),
                          (["kept"], "is not a rewrite verdict")):
        with pytest.raises(ValueError, match=what):
            session.export(tmp_path / "other", rewrites=(FOLD,), checked=checked)
    session.close()
