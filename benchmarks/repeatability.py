"""Do verdicts repeat? The same session run several times, each in a fresh process and workdir.

    python benchmarks/repeatability.py [--device cpu|cuda] [--runs 5] [--iterations 3] [--cards 6]
                                       [--example block|tiny_chains|tiny_cnn|tiny_transformer] [--json]
                                       [--model gemma4_e2b --layers 2 --tokens 128]   # a seed model instead
    python benchmarks/repeatability.py --merge a.json b.json ...   # the table of earlier --json runs

Each run captures the model, searches its cards with the built-in proposer at a fixed number of
iterations, and reports per card its status and the speedup its verdict states. The card set is
pinned by key: the first run searches all cards (or the ``--cards`` largest by share), and every
later run searches exactly the cards the first one did, so that a share measured differently
cannot change what is compared. Printed per run: the winners with their speedups; then the table:
the pairwise overlap of the runs' winner sets over the cards every run searched
(|A & B| / |A | B|; two empty sets agree), min and median; per card the speedups stated across the
runs where it won, their spread (max / min), how many runs called it noisy, and its best candidate
(an unconfirmed single timing) where it stayed on eager.

``--example block`` (the default) is a hand-written block: an RMSNorm and a tanh-GELU written as
formulas, a softmax, a GroupNorm and a SiLU, which the capture turns into operator and region cards.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _block(device: str):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from kforge.examples import HandRMSNorm, gelu_tanh_formula

    class HandWrittenBlock(nn.Module):
        """RMSNorm and tanh-GELU as formulas, a softmax, GroupNorm + SiLU."""

        def __init__(self, dim: int = 512, channels: int = 64, groups: int = 8):
            super().__init__()
            self.norm = HandRMSNorm(dim)
            self.gn = nn.GroupNorm(groups, channels)

        def forward(self, x: torch.Tensor, img: torch.Tensor):
            h = gelu_tanh_formula(self.norm(x))
            return h.softmax(-1), F.silu(self.gn(img))

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    big = device.startswith("cuda")
    x = torch.randn(2048 if big else 256, 512, generator=g)
    img = torch.randn(8 if big else 2, 64, 64 if big else 32, 64 if big else 32, generator=g)
    return HandWrittenBlock().to(device).eval(), (x.to(device), img.to(device))


def _model(example: str, device: str, seed_model: str | None = None, layers: int | None = None,
           tokens: int | None = None):
    if seed_model:
        import torch

        from kforge.models import build

        torch.manual_seed(0)
        options = {k: v for k, v in dict(layers=layers, tokens=tokens).items() if v is not None}
        return build(seed_model, device=device, dtype=torch.bfloat16, **options)
    if example == "block":
        return _block(device)
    import kforge

    return kforge.example(example, device=device)


def child(args: argparse.Namespace) -> dict:
    """One run, in this (fresh) process: capture, search, and what each card's verdict states."""
    import kforge
    from kforge.views._data import short_label

    if args.threads:   # NB: a user whose process runs torch at this count (kforge judges CPU kernels at it)
        import torch

        torch.set_num_threads(args.threads)
    model, inputs = _model(args.example, args.device, args.model, args.layers, args.tokens)
    started = time.monotonic()
    with kforge.Session(model, inputs, device=args.device, workdir=args.workdir) as session:
        session.capture()
        keys = args.keys.split(",") if args.keys else None
        session.optimize(proposer="builtin", iterations=args.iterations, max_cards=None if keys else args.cards,
                         cards=keys, parallel=1, seed=0).wait()
        cards = []
        for r in session.results:
            if not r.status.is_searched:
                continue
            figure = getattr(r, "winner_speedup", None)
            if figure is None and r.status.has_winner:   # NB: code from before the verdict had one named figure
                figure = r.speedup
            cards.append({"key": r.key, "label": short_label(session.cards[r.key]), "status": r.status.value,
                          "speedup": figure, "low": getattr(r, "speedup_low", None),
                          "high": getattr(r, "speedup_high", None),
                          "best_candidate": getattr(r, "best_candidate_speedup", None),
                          "eager_us": r.eager_us, "kernel_us": r.kernel_us, "reason": getattr(r, "reason", "")})
        threads = session.evaluator.cpu_threads if args.device == "cpu" else None
    return {"seconds": round(time.monotonic() - started, 1), "cards": cards, "threads": threads}


def _run_once(args: argparse.Namespace, i: int, root: Path, keys: list[str] | None = None) -> dict:
    workdir = root / f"run{i}"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--workdir", str(workdir),
           "--device", args.device, "--example", args.example, "--iterations", str(args.iterations)]
    for flag, value in (("--model", args.model), ("--layers", args.layers), ("--tokens", args.tokens),
                        ("--threads", args.threads)):
        if value is not None:
            cmd += [flag, str(value)]
    if keys:
        cmd += ["--keys", ",".join(keys)]
    elif args.cards:
        cmd += ["--cards", str(args.cards)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"run {i} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


def overlap(a: set[str], b: set[str]) -> float:
    """|A & B| / |A | B|; 1.0 when both are empty."""
    return len(a & b) / len(a | b) if a | b else 1.0


def summarise(runs: list[dict]) -> dict:
    # NB: over the cards every run searched: a card one run did not search is no disagreement
    compared = set.intersection(*({c["key"] for c in r["cards"]} for r in runs)) if runs else set()
    sets = [{c["key"] for c in r["cards"] if c["status"] == "winner" and c["key"] in compared} for r in runs]
    pairs = [overlap(a, b) for a, b in itertools.combinations(sets, 2)]
    labels: dict[str, str] = {}
    per_card: dict[str, dict] = {}
    for r in runs:
        for c in r["cards"]:
            labels[c["key"]] = c["label"]
            d = per_card.setdefault(c["key"], {"won": [], "noisy": 0, "eager": 0, "best_candidate": []})
            if c["status"] == "winner" and c["speedup"]:
                d["won"].append(c["speedup"])
            elif c["status"] == "noisy":
                d["noisy"] += 1
            else:
                d["eager"] += 1
            if c["status"] != "winner" and c.get("best_candidate"):
                d["best_candidate"].append(c["best_candidate"])
    cards = []
    for key, d in per_card.items():
        spread = max(d["won"]) / min(d["won"]) if len(d["won"]) >= 2 else None
        cards.append({"key": key, "label": labels[key], "won": len(d["won"]), "speedups": d["won"],
                      "spread": spread, "noisy": d["noisy"], "eager": d["eager"],
                      "best_candidate": d["best_candidate"]})
    cards.sort(key=lambda c: (-c["won"], c["label"]))
    return {"runs": len(runs), "cards_compared": len(compared), "overlap_min": min(pairs) if pairs else None,
            "overlap_median": statistics.median(pairs) if pairs else None, "overlaps": pairs, "cards": cards,
            "seconds": [r["seconds"] for r in runs]}


def _x(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}x"


def print_report(runs: list[dict], table: dict) -> None:
    for i, r in enumerate(runs):
        won = [c for c in r["cards"] if c["status"] == "winner"]
        threads = f", judged at {r['threads']} thread(s)" if r.get("threads") else ""
        contended = sum(1 for c in r["cards"] if "other processes left" in (c.get("reason") or ""))
        print(f"run {i}: {len(won)} winner(s) of {len(r['cards'])} searched cards, {r['seconds']:.0f} s{threads}"
              + (f"; {contended} card(s) noisy because other processes held the threads' cores" if contended else ""))
        for c in r["cards"]:
            interval = f" [{c['low']:.2f}-{c['high']:.2f}]" if c.get("low") and c.get("high") else ""
            cand = f"  best candidate (unconfirmed) {_x(c['best_candidate'])}" if c.get("best_candidate") else ""
            print(f"  {c['status']:<7} {_x(c['speedup']) if c['status'] == 'winner' else '-':>7}{interval:<14} "
                  f"{c['label']}{cand}")
    print()
    print(f"winner-set overlap over {table['runs']} runs ({len(table['overlaps'])} pairs, "
          f"{table.get('cards_compared', '?')} cards searched in every run): "
          f"min {table['overlap_min']:.2f}, median {table['overlap_median']:.2f}"
          if table["overlaps"] else "winner-set overlap: one run only")
    print()
    print("| card | won | speedups stated | spread (max/min) | noisy | eager |")
    print("|---|---:|---|---:|---:|---:|")
    for c in table["cards"]:
        speeds = ", ".join(f"{s:.2f}" for s in c["speedups"]) or "-"
        spread = f"{c['spread']:.2f}" if c["spread"] else "-"
        print(f"| `{c['label']}` | {c['won']}/{table['runs']} | {speeds} | {spread} | {c['noisy']} | {c['eager']} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=3, help="candidates per card, fixed")
    ap.add_argument("--cards", type=int, default=None, help="search at most this many cards (largest share first)")
    ap.add_argument("--example", default="block", help="block (default), tiny_chains, tiny_cnn or tiny_transformer")
    ap.add_argument("--model", default=None, help="a seed model of kforge.models (e.g. gemma4_e2b) instead of --example, "
                    "random weights, bfloat16")
    ap.add_argument("--layers", type=int, default=None, help="the seed model's layers (its builder's option)")
    ap.add_argument("--tokens", type=int, default=None, help="the seed model's tokens (its builder's option)")
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU: each run's process runs torch at this many threads (the user's count; default torch's)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    ap.add_argument("--json-out", default=None, metavar="PATH", help="also write the JSON object to PATH (the tables still print)")
    ap.add_argument("--keep", default=None, help="keep each run's workdir under this folder (default: deleted)")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="summarise the runs of earlier --json outputs (e.g. runs alternated with another checkout's, "
                    "so that both saw the same load) instead of running")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--keys", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return
    if args.merge:
        runs = [r for path in args.merge for r in json.loads(Path(path).read_text())["runs"]]
        table = summarise(runs)
        if args.json:
            print(json.dumps({"merged": args.merge, "runs": runs, "table": table}, indent=2))
        else:
            print_report(runs, table)
        return
    def record_of(runs: list[dict]) -> dict:
        return {"device": args.device, "example": args.model or args.example, "layers": args.layers,
                "tokens": args.tokens, "iterations": args.iterations, "cards": args.cards, "runs": runs,
                "table": summarise(runs)}

    with tempfile.TemporaryDirectory(prefix="kforge-repeat-") as tmp:
        runs = []
        for i in range(args.runs):
            keys = [c["key"] for c in runs[0]["cards"]] if runs else None   # the first run's cards, pinned
            runs.append(_run_once(args, i, Path(args.keep or tmp), keys))
            if not args.json:
                print(f"run {i} done in {runs[-1]['seconds']:.0f} s", file=sys.stderr, flush=True)
            if args.json_out:   # NB: after each run, so a run cut by a time limit keeps the runs it finished
                Path(args.json_out).write_text(json.dumps(record_of(runs), indent=2))
    record = record_of(runs)
    table = record["table"]
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        print_report(runs, table)


if __name__ == "__main__":
    main()
