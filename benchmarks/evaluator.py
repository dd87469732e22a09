"""How fast and how steady the evaluator is: compile time per candidate, evaluations per minute,
the run-to-run spread of one kernel timed twice, and where an evaluation's time goes.

    python benchmarks/evaluator.py --device cuda     # on the H200 (device tool)
    python benchmarks/evaluator.py --device cpu

Writes JSON to $OUT/evaluator_<device>.json when OUT is set (or to --json) and prints the
per-phase table last: the judge's wall time in each phase of an evaluation, median over the
rated evaluations (an evaluator without phases, e.g. an older checkout, prints none).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kforge.capture import Card  # noqa: E402
from kforge.evaluate import Evaluator  # noqa: E402
from kforge.kernels import compile_source, device_info  # noqa: E402

KERNELS = Path(__file__).resolve().parents[1] / "tests" / "kernels"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--compiles", type=int, default=6)
    ap.add_argument("--evaluations", type=int, default=10)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    device = args.device
    backend = "cuda" if device.startswith("cuda") else "cpu"
    os.environ.setdefault("KFORGE_CACHE", tempfile.mkdtemp(prefix="kforge-bench-cache-"))
    ext = "cu" if backend == "cuda" else "c"
    base = (KERNELS / backend / f"softmax_rows.{ext}").read_text()
    arch = device_info(device).arch if backend == "cuda" else "native"

    compile_s = []
    for i in range(args.compiles):  # distinct sources: every one is a cold compile
        compile_s.append(compile_source(base + f"\n// compile benchmark {time.time_ns()} {i}\n", backend, arch).seconds)

    shape = (8, 262144) if backend == "cuda" else (64, 4096)
    card = Card.for_call("softmax", torch.randn(shape, device=device), -1)
    results = {"device": device_info(device).describe(), "compile_s": compile_s,
               "compile_median_s": statistics.median(compile_s)}
    with Evaluator(device) as ev:
        ev.evaluate(card, base)  # worker start-up and first compile stay out of the rate
        start = time.perf_counter()
        evals = [ev.evaluate(card, base + f"\n// eval {i}\n") for i in range(args.evaluations)]
        wall = time.perf_counter() - start
        twice = [ev.evaluate(card, base) for _ in range(2)]
    results.update({
        "evaluations": len(evals), "evaluations_wall_s": wall, "evaluations_per_minute": 60 * len(evals) / wall,
        "statuses": [e.status.value for e in evals], "sandbox": evals[-1].sandbox,
        "checks": list(evals[-1].checks),
        "kernel_us_all": [e.candidate_us for e in evals], "eager_us_all": [e.eager_us for e in evals],
        "speedup_all": [e.speedup for e in evals], "threads_all": [e.threads for e in evals],
        "timed_twice": [{"kernel_us": e.candidate_us, "eager_us": e.eager_us, "speedup": e.speedup,
                         "kernel_cv": e.candidate_spread, "eager_cv": e.eager_spread} for e in twice],
    })
    sp = results["speedup_all"]
    if not all(e.status.is_correct for e in evals + twice):
        bad = next(e for e in evals + twice if not e.status.is_correct)
        raise SystemExit(f"the reference kernel was not judged correct ({bad.summary()}): no rate to report")
    results["speedup_spread_pct"] = 100 * (max(sp) - min(sp)) / statistics.median(sp)
    k = [t["kernel_us"] for t in results["timed_twice"]]
    results["twice_kernel_diff_pct"] = 100 * abs(k[0] - k[1]) / min(k)
    results["phases_s"] = phase_medians([getattr(e, "phases", ()) for e in evals])
    results["wall_s_all"] = [e.wall_s for e in evals]
    results["loadavg"] = os.getloadavg()
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"evaluator_{backend}.json").write_text(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"\n== evaluator benchmark on {results['device']}")
    print(f"compile per candidate (cold, median of {len(compile_s)}): {results['compile_median_s']:.2f} s "
          f"(min {min(compile_s):.2f}, max {max(compile_s):.2f})")
    print(f"evaluations per minute (compile + validate + time, {shape} softmax): "
          f"{results['evaluations_per_minute']:.1f}")
    print(f"statuses: {sorted(set(results['statuses']))}")
    print(f"speedup over {len(sp)} evaluations of the same kernel: median {statistics.median(sp):.3f}x, "
          f"spread (max-min)/median {results['speedup_spread_pct']:.1f}%")
    print(f"one kernel timed twice: {k[0]:.2f} us and {k[1]:.2f} us ({results['twice_kernel_diff_pct']:.1f}% apart); "
          f"per-evaluation CV {twice[0].candidate_spread:.3f} / {twice[1].candidate_spread:.3f}")
    print(f"eager (timed in the judge, a user's normal threads): {statistics.median(results['eager_us_all']):.2f} us")
    if backend == "cpu":
        print(f"threads each side ran with, per evaluation: {results['threads_all']}")
    print(f"runner sandbox: {results['sandbox'] or 'n/a'}")
    print(f"checks: {results['checks']}")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in results['loadavg'])}")
    phases = results["phases_s"]
    if phases:
        wall = statistics.median(results["wall_s_all"])
        print(f"\n== where an evaluation's time goes (judge's wall clock, median of {len(evals)}; "
              f"evaluation median {wall * 1e3:.1f} ms)")
        print(f"{'phase':<22}{'ms':>9}{'share':>8}")
        for name, sec in phases.items():
            print(f"{name:<22}{sec * 1e3:>9.1f}{100 * sec / wall:>7.1f}%")


def phase_medians(per_eval: list) -> dict[str, float]:
    """{phase: median seconds over the evaluations} in the order the phases first ran (0 where one skipped it)."""
    names: list[str] = []
    for phases in per_eval:
        names += [n for n, _ in phases if n not in names]
    return {n: statistics.median(dict(p).get(n, 0.0) for p in per_eval) for n in names}


if __name__ == "__main__":
    main()
