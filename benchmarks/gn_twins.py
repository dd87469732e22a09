"""The channels-last twins of the SD3.5 VAE decoder's group_norm -> SiLU calls, each built-in CUDA design
against eager and against Inductor's kernel for the same call, in one run.

    python benchmarks/gn_twins.py                       # the four largest VAE shapes, bf16
    python benchmarks/gn_twins.py --shapes 1x512x256x256 --configs 4
    python benchmarks/gn_twins.py --op biased_group_norm_silu   # with the convolution's bias as a prologue

Under torch.compile Inductor lays the VAE out channels-last (regions._layout), so these twins are what
kforge's fused kernels must beat there. Per shape: eager (its own group_norm + silu on the channels-last
tensor, in the evaluator), every configuration tried of ``nhwc_tiles`` and the default of the older
per-group designs, Inductor's compiled call replayed from a CUDA graph (its best case), and the bandwidth
floor (each byte moved once at 4.25 TB/s). Prints a table; writes gn_twins.json to $OUT (or runs/).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kforge.evaluate import Evaluator  # noqa: E402
from kforge.kernels import device_info  # noqa: E402
from kforge.ops import Card, get_spec, has_prologue  # noqa: E402
from kforge.proposers.builtin._strategy import get_strategy  # noqa: E402
from kforge.regions._baseline import inductor_baseline_us  # noqa: E402
from kforge.regions._layout import channels_last_twin  # noqa: E402

VAE = ("1x512x256x256", "1x256x512x512", "1x128x1024x1024", "1x256x1024x1024")
FLOOR_GBS = 4250.0


def twin_card(shape: tuple[int, ...], groups: int, dtype: torch.dtype, op: str = "group_norm_silu") -> Card:
    spec = get_spec(op)
    x = torch.empty(shape, dtype=dtype, device="cuda")   # NB: never written, only its signature is read
    w = torch.empty(shape[1], dtype=dtype, device="cuda")
    pre = (w.clone(),) if has_prologue(op) else ()
    call = spec.bind(x, *pre, groups, w, w.clone(), 1e-6)
    variant = spec.variant(call, [x])
    twin = channels_last_twin(variant)
    if twin is None:
        raise SystemExit(f"no channels-last twin of {variant.signature}")
    return Card(twin, 1, 1.0, 1.0, spec.vendor)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(VAE))
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--op", default="group_norm_silu", choices=("group_norm_silu", "biased_group_norm_silu"),
                    help="biased_...: the convolution's bias added first (Inductor's baseline fuses that add too)")
    ap.add_argument("--configs", type=int, default=4, help="nhwc_tiles configurations per shape (default first)")
    ap.add_argument("--deadline", type=float, default=300.0, help="seconds; shapes not started by then are skipped")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gn_twins.py times CUDA kernels: run it on a machine with CUDA")
    t0 = time.perf_counter()
    dev = device_info("cuda")
    tiles = get_strategy(f"{args.op}.cuda.nhwc_tiles")
    others = [] if has_prologue(args.op) else [get_strategy(f"{args.op}.cuda.{n}") for n in ("block_group", "split")]
    # NB: after the default (registers bounded where the operator has the prologue), the best of 2026-12-03l (512 threads, 4 waves; no "bound": the
    # form timed before that knob), then with 4 positions' loads in flight
    extra = [{"threads": 512, "vec": None, "waves": 4, "unroll": 1}, {"threads": 512, "vec": None, "waves": 4, "unroll": 4},
             {"threads": 256, "vec": None, "waves": 8, "unroll": 4}, {"threads": 1024, "vec": None, "waves": 8, "unroll": 1},
             {"threads": 256, "vec": None, "waves": 16, "unroll": 1}]
    rows = []
    with Evaluator("cuda") as ev:
        for text in args.shapes.split(","):
            if time.perf_counter() - t0 > args.deadline:
                print(f"# deadline: {text} and later shapes skipped", flush=True)
                break
            shape = tuple(int(s) for s in text.split("x"))
            card = twin_card(shape, args.groups, getattr(torch, args.dtype), args.op)
            v = card.variant
            floor = v.io_bytes / (FLOOR_GBS * 1e9) * 1e6
            row: dict = {"signature": v.signature, "floor_us": floor, "kernels": []}
            default = tiles.default(v, dev)
            configs = [default] + [{**c, "vec": default["vec"]} for c in extra]
            # NB: compared as they render (a missing knob renders as its old value): the plain default (no bound)
            # and the first extra one are one kernel
            full = [{"unroll": 1, "bound": 0, **c} for c in configs]
            configs = [c for i, c in enumerate(configs) if full[i] not in full[:i] and tiles.valid(v, c, dev)][:args.configs]
            trials = [(tiles, c) for c in configs] + [(s, s.default(v, dev)) for s in others if s.applies(v, dev)]
            for strategy, config in trials:
                e = ev.evaluate(card, strategy.render(v, config, dev))
                row["eager_us"] = e.eager_us or row.get("eager_us")
                row["kernels"].append({"strategy": strategy.name, "config": config, "status": e.status.value,
                                       "correct": e.status.is_correct,
                                       "us": e.candidate_us, "eager_us": e.eager_us, "message": e.message[:200]})
                print(f"  {text:<16} {strategy.name.split('.')[-1]:<12} {json.dumps(config):<48} "
                      f"{e.summary()[:90]}", flush=True)
            try:
                row["inductor_us"] = inductor_baseline_us(v, "cuda")
            except Exception as exc:  # NB: the column, not the run
                row["inductor_us"] = None
                print(f"  {text}: Inductor baseline failed: {type(exc).__name__}: {exc}", flush=True)
            rows.append(row)
    print("\n| twin (bf16, channels-last) | eager us | Inductor us | best kforge us (design) | over eager | over "
          "Inductor | of the floor |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ok = [k for k in r["kernels"] if k["us"] and k["correct"]]
        best = min(ok, key=lambda k: k["us"]) if ok else None
        ind, eager = r.get("inductor_us"), r.get("eager_us")
        if best is None:
            print(f"| {r['signature'][:60]} | {eager or 0:.1f} | {ind or 0:.1f} | no correct kernel | | | |")
            continue
        name = best["strategy"].split(".")[-1]
        print(f"| {r['signature'][:60]} | {eager:.1f} | {ind or float('nan'):.1f} | {best['us']:.1f} ({name}) | "
              f"{eager / best['us']:.2f}x | {(ind / best['us']) if ind else float('nan'):.2f}x | "
              f"{r['floor_us'] / best['us']:.2f} |")
    out = Path(os.environ.get("OUT") or ROOT / "runs")
    out.mkdir(parents=True, exist_ok=True)
    name = "gn_twins.json" if args.op == "group_norm_silu" else f"gn_twins_{args.op}.json"
    (out / name).write_text(json.dumps({"torch": torch.__version__, "op": args.op, "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
