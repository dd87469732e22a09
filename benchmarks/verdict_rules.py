"""Would another verdict rule repeat better? The timings of kept repeatability runs, decided again offline.

    python benchmarks/repeatability.py --device cpu --runs 5 --threads 1 --keep DIR ...   # timings kept
    python benchmarks/verdict_rules.py DIR [DIR ...]        # each rule over the same timings

Every run's store keeps each candidate's search timing and its confirmations (two judge processes). A verdict
rule reads only those, so the same stored timings can be decided by each rule in turn, with no new timing: what
differs between the rules' tables is the rule, not the machine's load. For each rule: the winners of every run,
the pairwise overlap of the runs' winner sets (as repeatability.py reports it) and each card's stated speedups.

The rules (``RULES``): ``current`` is kforge's (``kforge.search._decide``); the others replace its one rule
that reads a range of eager times (``unresolved``) and nothing else, as candidates for issue 41's next step.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclass
class _Budget:
    confirm: bool = False     # NB: offline: no new timing, only what the run stored


class _Ledger:
    stopping = False


class _Elsewhere:
    """Stands for the run's evaluator: the CPU runs had a second judge process (``elsewhere`` reads only this)."""

    def evaluate_elsewhere(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("offline: no new timing")


class _ReadOnly:
    """The run's store, read; a verdict saved is kept here instead of written."""

    def __init__(self, store: Any):
        self._store = store
        self.saved: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def result(self, key: str) -> Any:
        return None

    def save_result(self, key: str, verdict: Any) -> None:
        self.saved[key] = verdict


@dataclass
class _Search:
    card: Any
    store: Any
    tree: Any
    budget: Any
    ledger: Any
    evaluator: Any
    examples: Any = None
    evaluated: int = 1
    reason: str = "iteration budget used"


def _log_movements(store: Any, keys: list[str]) -> list[float]:
    """|log| of each confirmed candidate's movement between its two judge processes, over the run's cards."""
    from kforge.search import _decide

    out = []
    for key in keys:
        for cand in store.candidates(key):
            if not cand.confirmations:
                continue
            pair = _decide._process_pair(cand)
            if all(e is not None and e.status.is_correct and e.speedup > 0 for e in pair):
                out.append(abs(math.log(pair[0].speedup / pair[1].speedup)))
    return out


def _no_range(cand, est, moved):
    return None


def _pooled(factor: float) -> Callable[[dict], Callable]:
    """A gain must clear the run's pooled movement between processes ``factor`` times (on the log scale), read
    from the lower end of the candidate's interval: replaces the range of eager times."""
    def make(ctx: dict) -> Callable:
        pooled = math.exp(factor * ctx["median_log_movement"]) if ctx["median_log_movement"] else 1.0

        def rule(cand, est, moved):
            if est.low / pooled >= 1.02:
                return None
            return f"candidate {cand.id}: low {est.low:.2f} within the run's pooled movement {pooled:.2f}"
        return rule
    return make


def _robust_eager(k: float) -> Callable[[dict], Callable]:
    """A gain a call must exceed ``k`` median absolute deviations of the card's eager times (robust to the one worst
    timing a range is set by)."""
    def make(ctx: dict) -> Callable:
        from kforge.search import _decide

        def rule(cand, est, moved):
            eager = _decide._pooled_eager(cand)
            times = ctx["eager_times"].get(ctx["key"], [])
            if eager is None or len(times) < 2:
                return None
            med = statistics.median(times)
            mad = statistics.median(abs(t - med) for t in times) * 1.4826
            gain = min(times) - eager / est.speedup
            return None if gain > k * mad else f"candidate {cand.id}: saves {gain:.1f} us, within {k:g} MADs"
        return rule
    return make


def _least_low(bar: float) -> Callable[[dict], Callable]:
    """The interval's lower end (after the two processes' movement widened it) must clear ``bar``: a fixed least
    gain in place of the range of eager times."""
    def make(ctx: dict) -> Callable:
        def rule(cand, est, moved):
            return None if est.low >= bar else f"candidate {cand.id}: low {est.low:.2f} below {bar:.2f}"
        return rule
    return make


def _eager_iqr(ctx: dict) -> Callable:
    """A call's gain must exceed the interquartile range of the card's eager times (not set by one worst timing)."""
    from kforge.search import _decide

    def rule(cand, est, moved):
        eager = _decide._pooled_eager(cand)
        times = sorted(ctx["eager_times"].get(ctx["key"], []))
        if eager is None or len(times) < 4:
            return None
        q = statistics.quantiles(times, n=4)
        gain = times[0] - eager / est.speedup
        return None if gain > q[2] - q[0] else f"candidate {cand.id}: saves {gain:.1f} us, within the IQR"
    return rule


RULES: dict[str, Callable[[dict], Callable] | None] = {
    "current": None,
    "no range rule": lambda ctx: _no_range,
    "pooled movement x1": _pooled(1.0),
    "pooled movement x2": _pooled(2.0),
    "eager 2 MAD": _robust_eager(2.0),
    "eager 3 MAD": _robust_eager(3.0),
    "eager IQR": lambda ctx: _eager_iqr(ctx),
    "low >= 1.05": _least_low(1.05),
    "low >= 1.10": _least_low(1.10),
    "low >= 1.15": _least_low(1.15),
}


def decide_run(workdir: Path, rule: str) -> dict[str, dict]:
    """Each searched card of the run kept in ``workdir`` decided again by ``rule``: key -> status and figure."""
    from kforge.search import _decide
    from kforge.search._tree import Tree
    from kforge.store import Store

    store = Store(workdir)
    try:
        cards = {c.key: c for c in store.load_cards()}
        verdicts = store.results()
        keys = sorted(verdicts)
        ctx = {"median_log_movement": statistics.median(_log_movements(store, keys) or [0.0]), "eager_times": {}}
        for key in keys:
            ctx["eager_times"][key] = [e.eager_us for c in store.candidates(key) for e in c.timings if e.eager_us]
        out = {}
        for key in keys:
            card = cards[key]
            ro = _ReadOnly(store)
            search = _Search(card, ro, Tree(store.candidates(key)), _Budget(), _Ledger(), _Elsewhere())
            ctx["key"] = key
            make = RULES[rule]
            patch = (contextlib.nullcontext() if make is None
                     else _patched(_decide, "unresolved", make(ctx)))
            with patch:
                v = _decide.decide(search)
            out[key] = {"status": v.status.value, "speedup": v.winner_speedup, "why": v.reason}
        return out
    finally:
        store.close()


@contextlib.contextmanager
def _patched(module: Any, name: str, value: Any):
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def overlap(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("keep", nargs="+", help="folders given to repeatability.py --keep (each holds run0, run1, ...)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    runs = sorted(p for root in args.keep for p in Path(root).iterdir() if p.is_dir() and p.name.startswith("run"))
    report = {}
    for rule in RULES:
        decided = [decide_run(p, rule) for p in runs]
        compared = set.intersection(*(set(d) for d in decided))
        sets = [{k for k in compared if d[k]["status"] == "winner"} for d in decided]
        pairs = [overlap(a, b) for a, b in itertools.combinations(sets, 2)]
        per_card: dict[str, list[float]] = {}
        for d in decided:
            for k, v in d.items():
                if v["status"] == "winner":
                    per_card.setdefault(k, []).append(v["speedup"])
        spreads = {k: max(s) / min(s) for k, s in per_card.items() if len(s) >= 2}
        report[rule] = {"winners": [len(s) for s in sets], "overlap_min": min(pairs) if pairs else None,
                        "overlap_median": statistics.median(pairs) if pairs else None,
                        "spread_max": max(spreads.values()) if spreads else None, "cards": per_card}
        print(f"{rule:<22} winners {report[rule]['winners']}  overlap min {report[rule]['overlap_min']:.2f} "
              f"median {report[rule]['overlap_median']:.2f}  largest spread "
              + (f"{report[rule]['spread_max']:.2f}" if spreads else "-"))
        for k, s in sorted(per_card.items(), key=lambda kv: -len(kv[1])):
            print(f"    {len(s)}/{len(runs)}  {', '.join(f'{x:.2f}' for x in s):<40} {k[:90]}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
