"""How far card shares drift between captures of the same model, on an idle and on a busy CPU.

    python benchmarks/share_stability.py [--captures 5] [--busy 2]

For each built-in example, ``--captures`` captures with the cores idle, then as many with ``--busy``
processes spinning; prints, per condition, the largest difference in any card's share between two
captures (percentage points of the forward) and the largest sum of shares seen.
"""
from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
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


def drift(name: str, captures: int) -> tuple[float, float]:
    model, x = kforge.example(name)
    runs = [{c.key: c.share for c in capture_cards(model, [x], device="cpu", store=None, timing_budget_ms=5.0)}
            for _ in range(captures)]
    worst = max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for a, b in itertools.combinations(runs, 2) for k in a.keys() | b.keys())
    return worst, max(sum(r.values()) for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--captures", type=int, default=5)
    ap.add_argument("--busy", type=int, default=2, help="spinning processes for the busy condition")
    args = ap.parse_args()
    print("| example | condition | captures | worst share drift (points) | largest sum of shares |")
    print("|---|---|---:|---:|---:|")
    for condition in ("idle", f"{args.busy} cores busy"):
        procs = _spin(args.busy) if condition != "idle" else []
        try:
            for name in ("tiny_cnn", "tiny_transformer"):
                worst, top = drift(name, args.captures)
                print(f"| {name} | {condition} | {args.captures} | {worst * 100:.1f} | {top * 100:.1f}% |", flush=True)
        finally:
            for p in procs:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
