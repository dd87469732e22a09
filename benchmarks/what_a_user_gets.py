"""What a user gets, in one run: a built-in example captured and searched, then what ``apply()`` installs in eager
mode (and what it leaves out, and why), and the model's forward timed eager, eager + kforge, torch.compile and
torch.compile + kforge, each ratio with its noise (``Session.end_to_end``).

    python benchmarks/what_a_user_gets.py --device cpu --example tiny_chains --iterations 4
    python benchmarks/what_a_user_gets.py --device cuda --example tiny_chains --modes default,reduce-overhead
    python benchmarks/what_a_user_gets.py --device cuda --model gemma4_e2b --layers 2 --cards 4   # a seed model

The card speedups printed first are the judge's (one card's kernel against eager's call, in the sandbox); the
model-level lines after them are what the model got in this process. ``--json PATH`` writes both.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kforge  # noqa: E402
from kforge.examples import EXAMPLES  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--example", default="tiny_chains", choices=EXAMPLES)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--modes", default="default", help="torch.compile modes, comma-separated ('' for none)")
    ap.add_argument("--model", default=None, help="a seed model of kforge.models instead of --example (random weights, "
                    "bfloat16)")
    ap.add_argument("--layers", type=int, default=None, help="the seed model's layers")
    ap.add_argument("--cards", type=int, default=None, help="search at most this many cards, largest share first")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    started = time.perf_counter()
    if args.model:
        from kforge.models import build

        torch.manual_seed(0)
        model, inputs = build(args.model, device=args.device, dtype=torch.bfloat16,
                              **({"layers": args.layers} if args.layers is not None else {}))
    else:
        model, inputs = kforge.example(args.example, device=args.device)
    modes = tuple(m for m in args.modes.split(",") if m)
    with tempfile.TemporaryDirectory(prefix="kforge-user-") as workdir, \
            kforge.Session(model, inputs, device=args.device, workdir=workdir) as session:
        session.capture()
        run = session.optimize(proposer="builtin", iterations=args.iterations, max_cards=args.cards)
        print(f"search: {run!r}")
        cards = []
        for r in session.results:
            if r.status.value in ("winner", "noisy"):
                cards.append({"card": r.signature, "status": r.status.value, "winner_speedup": r.winner_speedup})
                figure = f"{r.winner_speedup:.2f}x" if r.winner_speedup else "-"
                print(f"  card {r.status.value:7s} {figure:>7s}  {r.signature[:90]}")
        with session.apply() as dep, torch.no_grad():
            model(*inputs) if isinstance(inputs, tuple) else model(inputs)
            print(f"apply(): {dep!r}")
            for sig, why in dep.skipped:
                print(f"  left out: {sig[:70]}: {why}")
            calls = dict(dep.calls)
        table = session.end_to_end(compile=bool(modes), modes=modes, progress=False)
        print(table.table())
        print("\n".join(table.headline()))
        print(f"({time.perf_counter() - started:.0f} s in all, {args.device}, torch {torch.__version__})")
        if args.json:
            Path(args.json).write_text(json.dumps({"cards": cards, "apply_calls": calls,
                                                   "end_to_end": table.to_json()}, indent=1, default=str))


if __name__ == "__main__":
    main()
