"""MCTS vs linear refinement vs best-of-N at equal budgets, on the seed workloads' native variants,
with the built-in proposer.

    python benchmarks/search_strategies.py --iterations 6

Each strategy searches the same cards with its own store; the table gives the best confirmed
speedup per card per strategy. Writes $OUT/search_strategies.json when OUT is set.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from builtin_kernels import seeds  # noqa: E402
from kforge.capture import Card, Cards  # noqa: E402
from kforge.evaluate import Evaluator  # noqa: E402
from kforge.kernels import device_info  # noqa: E402
from kforge.proposers import make_proposer  # noqa: E402
from kforge.search import Budget, OptimizationRun, Results, make_policy, plan  # noqa: E402
from kforge.store import Store  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--strategies", default="mcts,linear,best_of_n")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", default=None, help="comma-separated substrings of seed labels")
    args = ap.parse_args()
    os.environ.setdefault("KFORGE_CACHE", str(Path(tempfile.gettempdir()) / "kforge-cache"))
    variants = seeds()
    if args.only:
        variants = {k: v for k, v in variants.items() if any(s in k for s in args.only.split(","))}
    cards = Cards(tuple(Card(v, 1, 1.0, 1.0 / len(variants), None) for v in variants.values()))
    labels = {v.key: label for label, v in variants.items()}
    info = device_info(args.device)
    table: dict[str, dict[str, float]] = {}
    walls = {}
    with Evaluator(args.device, budget_ms=100) as evaluator:
        for name in args.strategies.split(","):
            store = Store(tempfile.mkdtemp(prefix=f"kforge-{name}-"))
            store.save_cards(cards)
            chosen, _ = plan(cards, info)
            run = OptimizationRun(store=store, evaluator=evaluator, proposer=make_proposer("builtin"),
                                  policy=make_policy(name), planned=chosen, device=info,
                                  budget=Budget(iterations=args.iterations, parallel=4))
            start = time.perf_counter()
            run.start(background=False)
            walls[name] = time.perf_counter() - start
            for r in Results(cards, store):
                table.setdefault(labels[r.key], {})[name] = r.speedup
            print(f"{name}: {walls[name]:.0f} s", flush=True)
    names = args.strategies.split(",")
    print(f"\nbest confirmed speedup per card, {args.iterations} candidates per card, built-in proposer\n")
    print("| variant | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for label, row in table.items():
        print(f"| {label} | " + " | ".join(f"{row.get(n, 1.0):.2f}x" for n in names) + " |")
    geo = {n: float(torch.tensor([max(row.get(n, 1.0), 1e-9) for row in table.values()]).log().mean().exp())
           for n in names}
    print("| geometric mean | " + " | ".join(f"{geo[n]:.2f}x" for n in names) + " |")
    print("| wall time | " + " | ".join(f"{walls[n]:.0f} s" for n in names) + " |")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "search_strategies.json").write_text(
            json.dumps({"iterations": args.iterations, "table": table, "geomean": geo, "wall_s": walls}, indent=2))


if __name__ == "__main__":
    main()
