"""Evaluations per minute of one search against the number of evaluators: local, and on Ray.

    python benchmarks/cluster_throughput.py                       # CPU: local 1, Ray 1 and 2 workers
    python benchmarks/cluster_throughput.py --configs local:1,local:2 --device cuda  # the local
                                                                  # multi-device path on a GPU machine

Each configuration runs in its own process with a fresh compile cache (and, for Ray, its own local
cluster of as many CPUs as workers), searching the same cards of the built-in tiny_transformer
with the built-in proposer. Two rates per run: over the whole optimize call (judges and actors
starting included) and after the first verdict (steady state). JSON to $OUT/cluster_<device>.json
when OUT is set; a table last.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPS = ["gelu", "silu", "mul", "add"]     # four built-in candidates each on the CPU


def one(config: str, device: str, iterations: int) -> dict:
    """Run one configuration in this process: ``local:N`` or ``ray:N`` evaluators."""
    sys.path.insert(0, str(ROOT))
    import kforge
    from kforge.search import EventKind

    kind, n = config.split(":")
    n = int(n)
    model, ids = kforge.example("tiny_transformer", device=device)
    s = kforge.Session(model, ids, device=device, workdir=tempfile.mkdtemp(prefix="kforge-bench-"))
    s.capture(regions=False)
    stamps: list[float] = []
    on_event = lambda e: stamps.append(time.monotonic()) if e.kind is EventKind.EVALUATED else None  # noqa: E731
    options = dict(iterations=iterations, ops=OPS, confirm=False, on_event=on_event)
    cluster = None
    if kind == "ray":
        import ray

        from kforge.cluster import RayCluster

        ray.init(num_cpus=n if device == "cpu" else None, include_dashboard=False, log_to_driver=False)
        cluster = RayCluster(workers=n)
        options["cluster"] = cluster
    elif n > 1:
        options["devices"] = [device] * n if device == "cpu" else [f"cuda:{i}" for i in range(n)]
    started = time.monotonic()
    s.optimize(**options)
    wall = time.monotonic() - started
    evaluations = len(stamps)
    steady = (evaluations - 1) / (stamps[-1] - stamps[0]) * 60 if evaluations > 1 and stamps[-1] > stamps[0] else None
    if cluster is not None:
        cluster.close()
    s.close()
    return {"config": config, "device": device, "evaluations": evaluations, "wall_s": round(wall, 2),
            "per_minute": round(evaluations / wall * 60, 1), "per_minute_after_first": steady and round(steady, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="local:1,ray:1,ray:2", help="comma-separated local:N / ray:N")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--iterations", type=int, default=4, help="candidates per card")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.device, args.iterations)))
        return
    rows = []
    for config in args.configs.split(","):
        env = {**os.environ, "KFORGE_CACHE": tempfile.mkdtemp(prefix="kforge-bench-cache-")}
        out = subprocess.run([sys.executable, __file__, "--one", config, "--device", args.device,
                              "--iterations", str(args.iterations)], env=env, capture_output=True, text=True,
                             cwd=ROOT)
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{config} failed")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], file=sys.stderr, flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"cluster_{args.device.split(':')[0]}.json").write_text(json.dumps(rows, indent=2))
    print("| evaluators | evaluations | wall s | per minute | per minute after the first verdict |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['config']} | {r['evaluations']} | {r['wall_s']} | {r['per_minute']} | "
              f"{r['per_minute_after_first']} |")


if __name__ == "__main__":
    main()
