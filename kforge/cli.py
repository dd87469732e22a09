"""The kforge command line, for headless GPU boxes and scripts."""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any, Sequence

from . import __version__


def _load_model(args: argparse.Namespace) -> tuple[Any, Any]:
    from .examples import example

    if args.model:
        module, _, attr = args.model.partition(":")
        if not attr:
            raise SystemExit(f"--model takes 'package.module:function' returning (model, inputs), got {args.model!r}")
        fn = getattr(importlib.import_module(module), attr)
        model, inputs = fn()
        return model, inputs
    return example(args.example, device=args.device or "cpu")


def _session(args: argparse.Namespace):
    from .session import Session, resolve_device

    if getattr(args, "resume", False):
        return Session.open(args.workdir)
    args.device = resolve_device(args.device)
    model, inputs = _load_model(args)
    return Session(model, inputs, device=args.device, workdir=args.workdir)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    from .examples import EXAMPLES

    p.add_argument("--example", default="tiny_cnn", choices=EXAMPLES, help="built-in example model (default tiny_cnn)")
    p.add_argument("--model", help="'package.module:function' returning (model, example_inputs)")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
    p.add_argument("--workdir", default=None, help="where the session's store lives (default: a new temp dir)")


def cmd_capture(args: argparse.Namespace) -> int:
    session = _session(args)
    cards = session.capture()
    if args.json:
        print(json.dumps({"workdir": str(session.workdir), "device": session.device, "model_us": cards.model_us,
                          "coverage": cards.coverage, "cards": [c.to_json() | {"key": c.key, "signature": c.signature}
                                                                for c in cards]}, indent=2, default=str))
    else:
        print(f"kforge {__version__}: {len(cards)} operator variants captured on {session.device}; "
              f"store in {session.workdir}")
        print(cards.table(args.limit))
    return 0


def cmd_optimize(args: argparse.Namespace) -> int:
    from .search import print_progress

    session = _session(args)
    if not getattr(args, "resume", False) or session._cards is None:
        session.capture()
        print(session.cards.table(args.limit))
    ops = args.ops.split(",") if args.ops else None
    run = session.optimize(proposer=args.proposer, policy=args.strategy, iterations=args.iterations,
                           dollars=args.dollars, ops=ops, include_vendor=args.include_vendor,
                           max_cards=args.max_cards, background=False,
                           on_event=None if args.json else print_progress)
    results = session.results
    if args.json:
        print(json.dumps({"workdir": str(session.workdir), "results": results.to_records()}, indent=2, default=str))
    else:
        print(results.table())
        print(f"store: {session.workdir}  (resume with: kforge optimize --resume --workdir {session.workdir})")
    if args.export:
        path = session.export(args.export)
        print(f"exported {len(session.winners())} kernels to {path}")
    return 0 if run.error is None else 1


def cmd_doctor(args: argparse.Namespace) -> int:
    from . import doctor

    results = doctor.checks()
    if args.json:
        print(json.dumps({"healthy": doctor.healthy(results), "checks": doctor.as_json(results)}, indent=2))
    else:
        print(f"kforge {__version__}")
        print(doctor.report(results))
    return 0 if doctor.healthy(results) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kforge", description="Capture the operators a PyTorch model runs and search for faster kernels.")
    parser.add_argument("--version", action="version", version=f"kforge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("capture", help="run a model, record its operators, print the card table")
    _add_model_args(p)
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    p.add_argument("--limit", type=int, default=None, help="print at most this many cards")
    p.set_defaults(func=cmd_capture)

    p = sub.add_parser("optimize", help="capture, then search for faster kernels for the cards")
    _add_model_args(p)
    p.add_argument("--resume", action="store_true", help="continue the session in --workdir")
    p.add_argument("--proposer", default="builtin", help="builtin (default), anthropic, openai, local:URL")
    p.add_argument("--strategy", default="mcts", choices=("mcts", "linear", "best_of_n"))
    p.add_argument("--iterations", type=int, default=50, help="candidates per card (default 50)")
    p.add_argument("--dollars", type=float, default=None, help="stop when LLM spending reaches this")
    p.add_argument("--ops", default=None, help="comma-separated operators to optimize (default: all native)")
    p.add_argument("--include-vendor", action="store_true", help="also search cuBLAS/cuDNN/flash-backed operators")
    p.add_argument("--max-cards", type=int, default=None, help="optimize at most this many cards")
    p.add_argument("--export", default=None, help="write the winners to this artifact directory")
    p.add_argument("--json", action="store_true")
    p.add_argument("--limit", type=int, default=None)
    p.set_defaults(func=cmd_optimize)

    p = sub.add_parser("doctor", help="what this machine can do with kforge, and what to install for the rest")
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    p.set_defaults(func=cmd_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "resume", False) and not args.workdir:
        raise SystemExit("--resume needs --workdir")
    from .capture import CaptureError
    from .store import WorkdirError

    try:
        return args.func(args)
    except (CaptureError, WorkdirError) as exc:
        print(f"kforge: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
