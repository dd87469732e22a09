"""``%kforge`` line and cell magics: capture a model and optimize it from a notebook cell.

Load with ``%load_ext kforge`` (or ``%load_ext kforge.magics``).
"""
from __future__ import annotations

import argparse
import importlib
import shlex
from typing import Any

try:
    from IPython.core.error import UsageError
    from IPython.core.magic import Magics, line_cell_magic, magics_class
except ImportError as exc:
    raise ImportError("the %kforge magics need IPython: install kforge[notebook] "
                      "(pip install 'kforge[notebook]')") from exc

USAGE = """\
%kforge capture <example | package.module:function> [--device cpu|cuda] [--workdir DIR] [--name VAR]
%kforge optimize [--iterations N] [--proposer P] [--policy S] [--ops a,b] [--cards KEY,KEY] [--max-cards N]
                 [--dollars D] [--background] [--session VAR]
%kforge dashboard [--session VAR]
%kforge help | %kforge <command> --help

capture   builds the model (a built-in example such as tiny_cnn / tiny_transformer, or a function
          returning (model, example_inputs)), captures its cards and stores the session in VAR
          (default: session).
optimize  searches the planned cards of the last session (or --session VAR); with --background
          it returns at once and shows a progress view with pause / resume / stop.
As a cell magic, %%kforge optimize takes one option per line:

    %%kforge optimize
    iterations 4
    ops softmax,layer_norm
    background
"""


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad input as a one-line UsageError (no traceback, no exit, no usage dump)."""

    def error(self, message: str) -> Any:
        command = self.prog.split()[-1]
        raise UsageError(f"%kforge {command}: {message} (see %kforge {command} --help)")

    def exit(self, status: int = 0, message: str | None = None) -> Any:
        raise UsageError((message or "").strip() or f"%kforge {self.prog.split()[-1]}: bad arguments")


def _parsers() -> dict[str, _Parser]:
    capture = _Parser(prog="%kforge capture", add_help=False,
                      description="Build a model, capture the operators it runs (its cards) and keep the session "
                                  "in a notebook variable.")
    capture.add_argument("model", help="a built-in example (tiny_cnn, tiny_transformer, ...) or "
                                       "package.module:function returning (model, example_inputs)")
    capture.add_argument("--device", default=None, help="cpu or cuda (default: cuda where there is a GPU)")
    capture.add_argument("--workdir", default=None, help="folder of the session's store (default: a new temp folder)")
    capture.add_argument("--name", default="session", help="notebook variable for the session (default: session)")
    optimize = _Parser(prog="%kforge optimize", add_help=False,
                       description="Search faster kernels for the planned cards of the last session. As a cell "
                                   "magic, %%kforge optimize takes one option per line (iterations 4).")
    optimize.add_argument("--iterations", type=int, default=50, help="candidates per card (default 50)")
    optimize.add_argument("--proposer", default="builtin",
                          help="builtin, anthropic[:model], openai[:model] or local:<url> (default builtin)")
    optimize.add_argument("--policy", "--strategy", dest="policy", default="mcts",
                          help="search policy: mcts, linear or best_of_n (default mcts; --strategy is its old name)")
    optimize.add_argument("--ops", default=None, help="only these operators, comma-separated (softmax,layer_norm)")
    optimize.add_argument("--cards", default=None, help="only these cards, by key or key prefix, comma-separated")
    optimize.add_argument("--max-cards", "--max_cards", dest="max_cards", type=int, default=None,
                          help="at most N cards, largest expected gain first")
    optimize.add_argument("--dollars", type=float, default=None, help="LLM spending cap for the run")
    optimize.add_argument("--background", action="store_true",
                          help="return at once with a live progress view (pause / resume / stop)")
    optimize.add_argument("--session", default=None, help="notebook variable of the session (default: the last)")
    dashboard = _Parser(prog="%kforge dashboard", add_help=False,
                        description="Show the session's views: progress, card table, search tree, sources.")
    dashboard.add_argument("--session", default=None, help="notebook variable of the session (default: the last)")
    return {"capture": capture, "optimize": optimize, "dashboard": dashboard}


def cell_options(cell: str) -> list[str]:
    """A cell's options, one per line (``iterations 4``, ``--ops=a,b``, ``background``), as argv."""
    argv: list[str] = []
    for raw in cell.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, value = line.lstrip("-").replace("=", " ", 1).partition(" ")
        argv.append(f"--{name.strip()}")
        if value.strip():
            argv.append(value.strip())
    return argv


@magics_class
class KforgeMagics(Magics):
    """%kforge capture / optimize / dashboard; the last session is the default target."""

    def __init__(self, shell: Any):
        super().__init__(shell)
        self.last_session: Any = None

    @line_cell_magic
    def kforge(self, line: str, cell: str | None = None) -> Any:
        """Capture a model and search faster kernels for its operators from a notebook.

        %kforge capture <example | package.module:function> [--device cpu|cuda] [--workdir DIR] [--name VAR]
        %kforge optimize [--iterations N] [--proposer P] [--policy S] [--ops a,b] [--cards KEY,KEY]
                         [--max-cards N] [--dollars D] [--background] [--session VAR]
        %kforge dashboard [--session VAR]

        ``%kforge <command> --help`` explains each command's options. As a cell magic, ``%%kforge optimize`` takes its options one per line (``iterations 4``,
        ``ops softmax,layer_norm``, ``background``). ``%kforge help`` prints the full usage.
        """
        try:
            words = shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"%kforge: {exc}") from None
        if not words or words[0] in ("help", "-h", "--help"):
            print(USAGE)
            return None
        command, argv = words[0], words[1:]
        parsers = _parsers()
        if command not in parsers:
            raise UsageError(f"%kforge: unknown command {command!r}: capture, optimize or dashboard "
                             "(see %kforge help)")
        if cell is not None:
            argv += cell_options(cell)
        if "-h" in argv or "--help" in argv:
            print(parsers[command].format_help())
            return None
        args = parsers[command].parse_args(argv)
        return getattr(self, f"_{command}")(args)

    # ------------------------------------------------------------------ commands

    def _capture(self, args: argparse.Namespace) -> Any:
        from .capture import CaptureError
        from .session import Session
        from .store import WorkdirError

        from .session import as_flags, resolve_device

        if not args.name.isidentifier():
            raise UsageError(f"%kforge capture: --name must be a Python identifier, got {args.name!r}")
        try:
            resolve_device(args.device)  # before building: a model on a missing GPU fails less clearly
        except CaptureError as exc:
            raise UsageError(f"%kforge capture: {as_flags(str(exc))}") from None
        model, inputs = self._build(args.model, args.device)
        try:
            session = Session(model, inputs, device=args.device, workdir=args.workdir)
            cards = session.capture()
        except (CaptureError, WorkdirError) as exc:
            raise UsageError(f"%kforge capture: {exc}") from None
        self.shell.user_ns[args.name] = session
        self.last_session = session
        print(f"{len(cards)} cards captured on {session.device}; the session is in `{args.name}` "
              f"(store: {session.workdir})")
        return cards

    def _optimize(self, args: argparse.Namespace) -> Any:
        from . import cli

        session = self._session(args.session)
        split = (lambda s: [p.strip() for p in s.split(",") if p.strip()] if s else None)
        try:  # NB: the CLI's own checks, so that a mistake reads the same in both (one line, with the fix)
            ops = cli.check_optimize_args(args)
            proposer = cli.checked_proposer(args.proposer)
        except cli.UsageError as exc:
            raise UsageError(f"%kforge optimize: {' '.join(str(exc).split())}") from None
        present = sorted({c.op for c in session.cards})
        if ops and not set(ops) & set(present):
            raise UsageError(f"%kforge optimize: --ops {args.ops}: the model runs no such operator "
                             f"(it runs: {', '.join(present)})")
        try:
            run = session.optimize(proposer=proposer, policy=args.policy, iterations=args.iterations,
                                   dollars=args.dollars, ops=ops, cards=split(args.cards),
                                   max_cards=args.max_cards, background=args.background)
        except ValueError as exc:
            raise UsageError(f"%kforge optimize: {' '.join(str(exc).split())}") from None
        if args.background:
            return _progress_or_run(run)
        if getattr(run, "shown_live", False):   # the live progress view above is the answer, as for optimize()
            return run
        from .views._data import run_notes, short_label

        for note in run_notes(run, {p.card.key: short_label(p.card) for p in run.planned}):
            print(note)
        return session.results

    def _dashboard(self, args: argparse.Namespace) -> Any:
        from .views import dashboard

        return dashboard(self._session(args.session))

    # ------------------------------------------------------------------ helpers

    def _session(self, name: str | None) -> Any:
        from .session import Session

        if name is not None:
            if name not in self.shell.user_ns:
                raise UsageError(f"%kforge: no variable {name!r} in the notebook")
            session = self.shell.user_ns[name]
            if not isinstance(session, Session):
                raise UsageError(f"%kforge: {name!r} is a {type(session).__name__}, not a kforge.Session")
            return session
        if self.last_session is None:
            raise UsageError("%kforge: no session yet: run `%kforge capture <model>` first, or pass --session VAR")
        return self.last_session

    @staticmethod
    def _build(spec: str, device: str | None) -> tuple[Any, Any]:
        from .examples import EXAMPLES, example

        if ":" not in spec:
            if spec not in EXAMPLES:
                raise UsageError(f"%kforge capture: {spec!r} is neither a built-in example "
                                 f"({', '.join(EXAMPLES)}) nor 'package.module:function'")
            return example(spec, device=device or "cpu")
        module, _, attr = spec.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise UsageError(f"%kforge capture: cannot load {spec!r}: {exc}") from None
        built = fn()
        if not (isinstance(built, tuple) and len(built) == 2):
            raise UsageError(f"%kforge capture: {spec} must return (model, example_inputs), "
                             f"got {type(built).__name__}")
        return built


def _progress_or_run(run: Any) -> Any:
    try:
        from .views import progress

        return progress(run)
    except ImportError:
        return run


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext kforge``: register the ``%kforge`` magics."""
    ipython.register_magics(KforgeMagics)
