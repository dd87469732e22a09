"""``%kforge`` line and cell magics: capture a model and optimize it from a notebook cell.

Load with ``%load_ext kforge`` (or ``%load_ext kforge.magics``).
"""
from __future__ import annotations

import argparse
import importlib
import shlex
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

USAGE = """\
%kforge capture <example | package.module:function> [--device cpu|cuda] [--workdir DIR] [--name VAR]
%kforge optimize [--iterations N] [--proposer P] [--ops a,b] [--dollars D] [--background] [--session VAR]
%kforge dashboard [--session VAR]
%kforge help

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
    """argparse that reports bad input as a UsageError (a message, not a traceback or an exit)."""

    def error(self, message: str) -> Any:
        raise UsageError(f"%kforge {self.prog.split()[-1]}: {message}\n\n{USAGE}")

    def exit(self, status: int = 0, message: str | None = None) -> Any:
        raise UsageError(message or USAGE)


def _parsers() -> dict[str, _Parser]:
    capture = _Parser(prog="kforge capture", add_help=False)
    capture.add_argument("model")
    capture.add_argument("--device", default=None)
    capture.add_argument("--workdir", default=None)
    capture.add_argument("--name", default="session")
    optimize = _Parser(prog="kforge optimize", add_help=False)
    optimize.add_argument("--iterations", type=int, default=50)
    optimize.add_argument("--proposer", default="builtin")
    optimize.add_argument("--strategy", default="mcts")
    optimize.add_argument("--ops", default=None)
    optimize.add_argument("--cards", default=None)
    optimize.add_argument("--dollars", type=float, default=None)
    optimize.add_argument("--max-cards", "--max_cards", dest="max_cards", type=int, default=None)
    optimize.add_argument("--background", action="store_true")
    optimize.add_argument("--session", default=None)
    dashboard = _Parser(prog="kforge dashboard", add_help=False)
    dashboard.add_argument("--session", default=None)
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
        %kforge optimize [--iterations N] [--proposer P] [--ops a,b] [--dollars D] [--background] [--session VAR]
        %kforge dashboard [--session VAR]

        As a cell magic, ``%%kforge optimize`` takes its options one per line (``iterations 4``,
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
            raise UsageError(f"%kforge: unknown command {command!r}\n\n{USAGE}")
        if cell is not None:
            argv += cell_options(cell)
        args = parsers[command].parse_args(argv)
        return getattr(self, f"_{command}")(args)

    # ------------------------------------------------------------------ commands

    def _capture(self, args: argparse.Namespace) -> Any:
        from .capture import CaptureError
        from .session import Session
        from .store import WorkdirError

        if not args.name.isidentifier():
            raise UsageError(f"%kforge capture: --name must be a Python identifier, got {args.name!r}")
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
        session = self._session(args.session)
        if args.iterations < 1:
            raise UsageError("%kforge optimize: --iterations must be at least 1")
        split = (lambda s: [p.strip() for p in s.split(",") if p.strip()] if s else None)
        try:
            run = session.optimize(proposer=args.proposer, policy=args.strategy, iterations=args.iterations,
                                   dollars=args.dollars, ops=split(args.ops), cards=split(args.cards),
                                   max_cards=args.max_cards, background=args.background)
        except ValueError as exc:
            raise UsageError(f"%kforge optimize: {exc}") from None
        if args.background:
            return _progress_or_run(run)
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
