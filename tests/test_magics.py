"""The %kforge magics through IPython's InteractiveShell: capture, optimize, usage errors."""
from __future__ import annotations

import pytest

import extras

extras.module("IPython", "notebook")

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import kforge
from kforge.magics import cell_options


@pytest.fixture
def shell(tmp_path):
    sh = InteractiveShell.instance()
    sh.user_ns.clear()
    sh.run_line_magic("load_ext", "kforge.magics")
    yield sh
    session = sh.user_ns.get("session")
    if isinstance(session, kforge.Session):
        session.close()
    InteractiveShell.clear_instance()


def _fails(shell, line, cell=None):
    magic = shell.find_magic("kforge", "cell" if cell is not None else "line")
    with pytest.raises(UsageError) as info:
        magic(line, cell) if cell is not None else magic(line)
    return str(info.value)


def test_load_ext_kforge_registers_the_magic():
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "kforge")
    assert sh.find_magic("kforge") is not None
    InteractiveShell.clear_instance()


def test_capture_then_optimize_the_last_session(shell, tmp_path, capsys):
    cards = shell.run_line_magic("kforge", f"capture tiny_cnn --device cpu --workdir {tmp_path / 'wd'}")
    session = shell.user_ns["session"]
    assert isinstance(session, kforge.Session) and cards is session.cards and len(cards) > 3
    assert "cards captured on cpu" in capsys.readouterr().out
    results = shell.run_cell_magic("kforge", "optimize", "iterations 2\nops = relu   # the cheap ones\n")
    searched = [r for r in results if r.status != "not searched"]
    assert searched and {r.op for r in searched} == {"relu"}
    assert all(r.candidates >= 1 for r in searched)


def test_optimize_in_the_background_returns_a_live_progress_view(shell, tmp_path):
    extras.module("anywidget", "notebook")
    shell.run_line_magic("kforge", f"capture tiny_cnn --device cpu --workdir {tmp_path / 'wd'} --name s2")
    view = shell.run_line_magic("kforge", "optimize --iterations 1 --ops relu --background --session s2")
    run = shell.user_ns["s2"].run
    run.wait(120)
    assert type(view).__name__ == "RunProgress" and view.total == run.budget.iterations * len(run.planned)


@pytest.mark.parametrize("line, message", [
    ("capture nope", "neither a built-in example"),
    ("capture no_such_module_xyz:make", "cannot load"),
    ("capture", "the following arguments are required: model"),
    ("optimize", "no session yet"),
    ("optimize --iterations lots", "invalid int value"),
    ("optimize --session missing", "no variable 'missing'"),
    ("frobnicate", "unknown command 'frobnicate'"),
    ("capture tiny_cnn --device cuda:0 --bogus", "unrecognized arguments: --bogus"),
])
def test_bad_input_is_a_usage_error_not_a_traceback(shell, line, message):
    assert message in _fails(shell, line)


def test_optimize_errors_from_the_session_read_as_usage(shell, tmp_path):
    shell.run_line_magic("kforge", f"capture tiny_cnn --device cpu --workdir {tmp_path / 'wd'}")
    assert "the model runs no such operator (it runs: " in _fails(shell, "optimize --ops softmax")
    shell.user_ns["x"] = 3
    assert "not a kforge.Session" in _fails(shell, "optimize --session x")


@pytest.mark.parametrize("options, message", [
    ("--ops sofmax", "kforge has no operator 'sofmax'; did you mean 'softmax'?"),
    ("--proposer openai", "--proposer openai: "),
    ("--proposer nosuch", "--proposer nosuch: "),
    ("--proposer local:http://127.0.0.1:9/v1", "cannot reach the server at http://127.0.0.1:9/v1"),
    ("--dollars 0", "--dollars must be a positive amount"),
    ("--max-cards 0", "--max-cards must be at least 1"),
    ("--iterations 0", "--iterations must be at least 1"),
])
def test_optimize_mistakes_read_as_the_clis_one_line(shell, tmp_path, monkeypatch, capsys, options, message):
    """The CLI's checks, the CLI's words: one line naming the mistake, never a traceback."""
    from kforge import cli

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    shell.run_line_magic("kforge", f"capture tiny_cnn --device cpu --workdir {tmp_path / 'wd'}")
    said = _fails(shell, f"optimize {options}")
    assert message in said and "\n" not in said.strip(), said
    capsys.readouterr()
    assert cli.main(["optimize", "--device", "cpu", "--workdir", str(tmp_path / "cli"), *options.split()]) == 2
    assert said == "%kforge optimize: " + capsys.readouterr().err.strip().removeprefix("kforge: error: ")


def test_help_and_cell_options(shell, capsys):
    shell.run_line_magic("kforge", "help")
    assert "%kforge capture" in capsys.readouterr().out
    assert "%%kforge optimize" in shell.find_magic("kforge").__doc__
    assert cell_options("iterations 4\n--ops=a,b\n\n# note\nbackground\nmax_cards 2\n") == [
        "--iterations", "4", "--ops", "a,b", "--background", "--max_cards", "2"]


@pytest.mark.parametrize("command, option", [("capture", "--workdir"), ("optimize", "--max-cards"),
                                             ("dashboard", "--session")])
def test_each_command_has_its_own_help(shell, capsys, command, option):
    assert shell.run_line_magic("kforge", f"{command} --help") is None
    out = capsys.readouterr().out
    assert f"%kforge {command}" in out and option in out


def test_errors_are_one_line_and_the_usage_is_complete(shell, capsys):
    for line in ("capture", "optimize --iterations lots", "frobnicate", "capture tiny_cnn --bogus"):
        message = _fails(shell, line)
        assert "\n" not in message.strip() and "help" in message, message
    shell.run_line_magic("kforge", "help")
    usage = capsys.readouterr().out
    for option in ("--policy", "--cards", "--max-cards", "--dollars", "--background"):
        assert option in usage


def test_capture_on_cuda_without_a_gpu_gives_kforges_message(shell):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    message = _fails(shell, "capture tiny_cnn --device cuda")
    assert "no usable CUDA GPU" in message and "--device cpu" in message and "\n" not in message


def test_an_already_searched_card_says_why_nothing_new(shell, tmp_path, capsys):
    shell.run_line_magic("kforge", f"capture tiny_cnn --device cpu --workdir {tmp_path / 'wd'}")
    shell.run_line_magic("kforge", "optimize --iterations 2 --ops relu")
    capsys.readouterr()
    shell.run_line_magic("kforge", "optimize --iterations 2 --ops relu")
    out = capsys.readouterr().out
    assert "nothing new (already searched" in out and "larger iterations" in out
