"""How far card shares drift between two captures of the same model, on an idle and on a busy CPU.

    python benchmarks/share_stability.py [--pairs 20] [--busy 2] [--budget 20] [--conditions idle,busy]

For each built-in example and condition, ``--pairs`` pairs of back-to-back captures (``--busy``
processes spinning for the busy condition, started before and killed after); prints per condition
the drift of each pair (the largest difference in any card's share between its two captures, in
points of the forward), the median and worst drift, the largest sum of shares of one forward, how
many captures flagged a card noisy, the intra-op threads used and the seconds per capture.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kforge  # noqa: E402
from kforge.capture import capture_cards  # noqa: E402


def _spin(n: int) -> list[subprocess.Popen]:
    procs = [subprocess.Popen([sys.executable, "-c", "print('spinning', flush=True)\nwhile True: pass"],
                              stdout=subprocess.PIPE, text=True) for _ in range(n)]
    for p in procs:
        p.stdout.readline()
    return procs


def drift(a, b) -> float:
    """The largest difference in any card's share between two captures (a fraction of the forward)."""
    sa, sb = {c.key: c.share for c in a}, {c.key: c.share for c in b}
    return max(abs(sa.get(k, 0.0) - sb.get(k, 0.0)) for k in sa.keys() | sb.keys())


def pairs(name: str, n: int, budget_ms: float) -> dict:
    model, x = kforge.example(name)
    drifts, sums, noisy, threads, seconds = [], [], 0, set(), []
    for _ in range(n):
        two = []
        for _ in range(2):
            start = time.perf_counter()
            two.append(capture_cards(model, [x], device="cpu", store=None, timing_budget_ms=budget_ms))
            seconds.append(time.perf_counter() - start)
        drifts.append(drift(*two))
        sums += [sum(c.share for c in cards) for cards in two]
        noisy += sum(bool(cards.noisy) or cards.model_noisy for cards in two)
        threads |= {cards.threads for cards in two}
    return {"drifts": drifts, "sum": max(sums), "noisy": noisy, "threads": sorted(threads),
            "seconds": statistics.median(seconds)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="spinning processes for the busy condition")
    ap.add_argument("--budget", type=float, default=20.0, help="timing_budget_ms (the CPU session's default: 20)")
    ap.add_argument("--conditions", default="idle,busy")
    ap.add_argument("--examples", default="tiny_cnn,tiny_transformer")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print("| example | condition | pairs | median drift | worst drift (points) | largest sum of shares "
          "| captures flagged noisy | threads | s per capture |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    for condition in args.conditions.split(","):
        procs = _spin(args.busy) if condition == "busy" else []
        label = f"{args.busy} processes spinning" if procs else "no spinning processes"
        try:
            for name in args.examples.split(","):
                r = pairs(name, args.pairs, args.budget)
                d = [v * 100 for v in r["drifts"]]
                print(f"| {name} | {label} | {args.pairs} | {statistics.median(d):.1f} | {max(d):.1f} | "
                      f"{r['sum'] * 100:.1f}% | {r['noisy']} / {2 * args.pairs} | {r['threads']} | "
                      f"{r['seconds']:.1f} |", flush=True)
                print(f"  drifts: {' '.join(f'{v:.1f}' for v in sorted(d))}", file=sys.stderr, flush=True)
        finally:
            for p in procs:
                p.kill()
                p.wait()
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
