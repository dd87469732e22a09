"""Region cards on the GPU: eager vs Inductor vs kforge's fused region kernel (run on the H200).

Regions come from hand-written chains at the seed shapes (RMSNorm, residual + RMSNorm, tanh-GELU
formula, logit soft-capping, gated MLP, adaLN modulation, attention scale + mask + softmax) and
from the seed workloads' graphs (ResNet-50, Gemma 4 E2B and Qwen 3.5 MoE at reduced depth, the
SD3.5 transformer when diffusers is installed; skipped with the reason otherwise).

Per region: eager (the chain op by op) and kforge's kernel are timed by kforge's evaluator
(worker process, validation first, interleaved, L2 flushed); Inductor's kernel for the same
region compiled alone is replayed from a CUDA graph and timed by the same timing function. kforge
tries the generator's default choices, the same with eager's numerics (its time is the "exact"
column where the math knobs apply), the default's neighbours (one choice changed) and sampled
others, ``--iterations`` in all (compiled in parallel), and keeps the fastest correct one. Floor = bytes moved once at 4.25 TB/s (H200 copy).
Launch floor: the same two timings (kforge's evaluator, Inductor's graph replay) of a chain on 32
floats, whose bytes take no time: the least any one kernel reads in these timings (an event pair
around one launch after an L2 flush). The summary gives kforge's median over the bandwidth floor (the
issue's goal), over the larger of the two floors, over their sum (a kernel pays the launch, then
moves its bytes), and over the regions whose bandwidth floor is >= 5 us (where the launch does not
decide).
Prints a table; writes $OUT/regions.json (or ./regions.json).

    python benchmarks/regions.py [--iterations 4] [--models resnet50,gemma4_e2b,qwen35_moe,sd35_transformer]
                                 [--layers 2] [--deadline 420]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from kforge.capture import Card  # noqa: E402
from kforge.evaluate import Evaluator  # noqa: E402
from kforge.examples import HandRMSNorm, gelu_tanh_formula  # noqa: E402
from kforge.kernels import compile_source, device_info  # noqa: E402
from kforge.proposers.builtin import strategies_for  # noqa: E402
from kforge.regions import capture_regions, inductor_baseline_us, region_ir  # noqa: E402

COPY_BANDWIDTH = 4.25e12  # H200 measured device-to-device copy, bytes/s
BF = torch.bfloat16


def hand_written(device: str) -> dict[str, tuple]:
    """name -> (callable, inputs): the chains of the issue at the seed workloads' shapes."""
    g = torch.Generator(device="cpu").manual_seed(0)
    r = lambda *s, dtype=BF: torch.randn(*s, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    rms_bf = HandRMSNorm(1536).to(device=device, dtype=BF)
    rms_f32 = HandRMSNorm(1536).to(device=device)

    def residual_rms(x, h):
        s = x + h
        return s, rms_bf(s)

    def softcap(x):
        return torch.tanh(x / 30.0) * 30.0

    def gated(a, b):
        return F.silu(a) * b

    def adaln(x, scale, shift):
        return F.layer_norm(x, (x.shape[-1],), eps=1e-6) * (1 + scale[:, None]) + shift[:, None]

    def attention_softmax(s, mask):
        return torch.softmax(s * 0.0625 + mask, dim=-1, dtype=torch.float32).to(s.dtype)

    return {
        "rmsnorm bf16[1,512,1536]": (rms_bf, (r(1, 512, 1536),)),
        "rmsnorm f32[1,4096,1536]": (rms_f32, (r(1, 4096, 1536, dtype=torch.float32),)),
        "residual+rmsnorm bf16[1,512,1536]": (residual_rms, (r(1, 512, 1536), r(1, 512, 1536))),
        "gelu-tanh bf16[1,4096,6144]": (gelu_tanh_formula, (r(1, 4096, 6144),)),
        "gelu-tanh f32[4096,6144]": (gelu_tanh_formula, (r(4096, 6144, dtype=torch.float32),)),
        "softcap bf16[1,512,262144]": (softcap, (r(1, 512, 262144),)),
        "gated-mlp bf16[1,512,6144]": (gated, (r(1, 512, 6144), r(1, 512, 6144))),
        "adaln bf16[1,4096,1536]": (adaln, (r(1, 4096, 1536), r(1, 1536), r(1, 1536))),
        "scale+mask+softmax bf16[1,8,512,512]": (attention_softmax, (r(1, 8, 512, 512), r(1, 1, 512, 512))),
    }


def model_regions(names: list[str], layers: int, device: str) -> tuple[list[tuple[str, object, int]], dict]:
    """(label, variant, calls) for every region of each seed workload, and why any was skipped."""
    from kforge.models import MissingDependency, build

    out, skipped = [], {}
    for name in names:
        t0 = time.time()
        try:
            opts, dtype = {"layers": layers}, BF
            if name in ("gemma4_e2b", "qwen35_moe"):
                opts["tokens"] = 512
            if name == "resnet50":  # the seed workload: float32, batch 8, no layer option
                opts, dtype = {"batch": 8}, torch.float32
            model, inputs = build(name, device=device, dtype=dtype, **opts)
        except MissingDependency as exc:
            skipped[name] = f"missing dependency: {exc}"
            print(f"# {name}: skipped ({exc})", flush=True)
            continue
        except Exception as exc:
            skipped[name] = f"{type(exc).__name__}: {exc}"
            print(f"# {name}: could not be built: {exc}", flush=True)
            continue
        found = capture_regions(model, [inputs], examples_per_variant=0)
        print(f"# {name}: {len(found.records)} region variants, {found.graphs} graphs, "
              f"{time.time() - t0:.0f} s" + (f", error: {found.error}" if found.error else ""), flush=True)
        if found.error:
            skipped[name] = found.error
        for rec in found.records:
            out.append((f"{name}: {','.join(region_ir(rec.variant).ops)}", rec.variant, rec.calls))
        del model
        torch.cuda.empty_cache()
    return out, skipped


def _neighbours(strategy, variant, info, base: dict) -> list[dict]:
    """Valid configs one choice away from ``base``, the likeliest first: for a row reduction the
    threads per row (a warp per row and several rows per block, or a row per block), then whether
    the row stays in registers, the vector width and the split; for a pointwise chain the vector
    width, threads and waves."""
    order = ("tpr", "cache", "vec", "split", "threads", "waves", "fast", "round")
    out = []
    for knob in order:
        for value in strategy.space.get(knob, ()):
            c = {**base, knob: value}
            if knob == "tpr":   # a row per block above a warp, several rows per block below
                c["threads"] = value if value > 32 else max(128, base.get("threads", 128))
                c["cache"] = base.get("cache", 0)
            if c != base and c not in out and strategy.valid(variant, c, info):
                out.append(c)
    return out


def candidates(variant, info, iterations: int, seed: int = 0) -> list[tuple[str, dict, str]]:
    """(strategy, config, source): the default choices, the same with eager's numerics (``fast=0,
    round=1``, so that the table shows what the math knobs buy), then the default's neighbours
    (one choice changed, the likeliest first) and sampled others."""
    out = []
    for strategy in strategies_for("region", "cuda"):
        if not strategy.applies(variant, info):
            continue
        configs = list(strategy.configs(variant, info))
        exact = {**configs[0], "fast": 0, "round": 1}
        near = [c for c in _neighbours(strategy, variant, info, configs[0]) if c != exact]
        rest = [c for c in configs[1:] if c != exact and c not in near]
        random.Random(seed).shuffle(rest)
        picks = [configs[0]] + ([exact] if exact != configs[0] else []) + near + rest
        for c in picks[:max(iterations, 1)]:
            out.append((strategy.name, c, strategy.render(variant, c, info)))
    return out


LAUNCH_PROBE = "launch probe: tanh,mul,add f32[32]"


def _probe(x):
    return torch.tanh(x) * 2.0 + 1.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--models", default="resnet50,gemma4_e2b,qwen35_moe,sd35_transformer")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--deadline", type=float, default=420.0, help="seconds; regions left then are not timed")
    ap.add_argument("--max-model-regions", type=int, default=12, help="per model, the largest by bytes x calls")
    args = ap.parse_args()
    start = time.time()
    device = f"cuda:{torch.cuda.current_device()}"
    info = device_info(device)
    out_dir = os.environ.get("OUT", ".")

    work: list[tuple[str, object, int]] = []
    probe_inputs = (torch.randn(32, device=device),)
    for label, (fn, inputs) in [(LAUNCH_PROBE, (_probe, probe_inputs)), *hand_written(device).items()]:
        found = capture_regions(fn, [inputs], examples_per_variant=0)
        if found.error or not found.records:
            print(f"# {label}: no region ({found.error})", flush=True)
            continue
        for rec in found.records:
            work.append((label + ("" if len(found.records) == 1 else f" [{','.join(region_ir(rec.variant).ops)}]"),
                         rec.variant, rec.calls))
    names = [n for n in args.models.split(",") if n]
    found_models, skipped = model_regions(names, args.layers, device)
    by_model: dict[str, list] = {}
    for label, v, calls in found_models:
        by_model.setdefault(label.split(":")[0], []).append((label, v, calls))
    for lst in by_model.values():
        lst.sort(key=lambda t: -t[1].io_bytes * t[2])
    # NB: round-robin over the models, so that a deadline cuts every model's smallest regions, not a whole model
    queues = [lst[:args.max_model_regions] for lst in by_model.values()]
    while any(queues):
        for q in queues:
            if q:
                work.append(q.pop(0))
    print(f"# {len(work)} regions to time; {time.time() - start:.0f} s so far", flush=True)

    rows = []
    evaluator = Evaluator(device)
    pool = ThreadPoolExecutor(max(os.cpu_count() or 4, 4))
    try:
        for label, variant, calls in work:
            if time.time() - start > args.deadline:
                rows.append({"region": label, "skipped": "deadline"})
                continue
            row = {"region": label, "signature": variant.signature, "calls": calls, "ops": list(region_ir(variant).ops)}
            try:
                cands = candidates(variant, info, args.iterations)
                list(pool.map(lambda c: _try_compile(c[2], info.arch), cands))
                card = Card(variant, calls, 1.0, 1.0, None)
                best = None
                for name, config, source in cands:
                    ev = evaluator.evaluate(card, source)
                    row.setdefault("tried", []).append({"strategy": name, "config": config, "status": ev.status.value,
                                                        "us": ev.candidate_us, "message": ev.message[:200]})
                    if ev.status.is_correct and (best is None or ev.candidate_us < best.candidate_us):
                        best = ev
                    if ev.status.is_correct and config.get("fast") == 0 and config.get("round") == 1:
                        row["exact_us"] = ev.candidate_us
                    if ev.eager_us:
                        row["eager_us"] = min(row.get("eager_us", math.inf), ev.eager_us)
                row["kforge_us"] = best.candidate_us if best else None
                try:
                    row["inductor_us"] = inductor_baseline_us(variant, device)
                except Exception as exc:
                    row["inductor_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                row["floor_us"] = variant.io_bytes / COPY_BANDWIDTH * 1e6
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
            rows.append(row)
            _print_row(row)
    finally:
        evaluator.close()
        pool.shutdown()
    rows, probe, launch = _apply_launch_floor(rows)
    print(f"# launch floor: {launch} us (kforge's timing; Inductor's {probe.get('inductor_us')})")
    summary = {**_summary(rows), "launch_floor_us": launch, "launch_probe": probe}
    print(json.dumps(summary, indent=1))
    with open(os.path.join(out_dir, "regions.json"), "w") as f:
        json.dump({"device": info.to_json(), "torch": torch.__version__, "iterations": args.iterations,
                   "skipped_models": skipped, "summary": summary, "rows": rows}, f, indent=1)


def _try_compile(source: str, arch: str):
    try:
        return compile_source(source, "cuda", arch)
    except Exception as exc:  # the evaluator reports it as compile_error
        return exc


def _print_row(row: dict) -> None:
    e, k, i, f, x = (row.get(n) for n in ("eager_us", "kforge_us", "inductor_us", "floor_us", "exact_us"))
    fmt = lambda v: f"{v:9.2f}" if isinstance(v, (int, float)) else f"{'-':>9}"  # noqa: E731
    ratio = lambda a, b: f"{a / b:6.2f}x" if a and b else f"{'-':>7}"  # noqa: E731
    print(f"{row['region'][:60]:<60} eager {fmt(e)} ind {fmt(i)} kf {fmt(k)} exact {fmt(x)} floor {fmt(f)}  "
          f"vs eager {ratio(e, k)} vs ind {ratio(i, k)} floor/kf {ratio(f, k)}"
          + (f"  ERROR {row['error'][:80]}" if "error" in row else ""), flush=True)


def _summary(rows: list[dict]) -> dict:
    timed = [r for r in rows if r.get("kforge_us") and r.get("inductor_us")]
    beat = [r for r in timed if r["kforge_us"] <= r["inductor_us"]]
    floor = sorted(r["kforge_us"] / r["floor_us"] for r in timed if r.get("floor_us"))
    aware = sorted(r["kforge_us"] / r["launch_aware_floor_us"] for r in timed if r.get("launch_aware_floor_us"))
    plus = sorted(r["kforge_us"] / r["launch_plus_floor_us"] for r in timed if r.get("launch_plus_floor_us"))
    large = sorted(r["kforge_us"] / r["floor_us"] for r in timed if (r.get("floor_us") or 0) >= 5.0)
    ind_floor = sorted(r["inductor_us"] / r["floor_us"] for r in timed if r.get("floor_us"))
    return {"regions": len(rows), "timed": len(timed), "kforge_at_least_inductor": len(beat),
            "fraction_at_least_inductor": len(beat) / len(timed) if timed else None,
            "median_kforge_over_floor": _median(floor),
            "median_inductor_over_floor": _median(ind_floor),
            "median_kforge_over_launch_aware_floor": _median(aware),
            "median_kforge_over_launch_plus_floor": _median(plus),
            "median_kforge_over_floor_where_floor_ge_5us": _median(large), "regions_floor_ge_5us": len(large),
            "no_correct_kernel": [r["region"] for r in rows if "kforge_us" in r and r["kforge_us"] is None]}


def _apply_launch_floor(rows: list[dict]) -> tuple[list[dict], dict, float | None]:
    """The rows without the launch probe, each with its launch-aware floors; the probe's row; the launch
    floor: the probe's time in kforge's own timing (the evaluator's event pair), against which kforge's
    kernels are judged (Inductor's graph replay may launch cheaper: it is kept apart, in the probe)."""
    probe = next((r for r in rows if r["region"].startswith(LAUNCH_PROBE)), {})
    launch = probe.get("kforge_us") or None
    rows = [r for r in rows if not r["region"].startswith(LAUNCH_PROBE)]
    for r in rows:
        if launch and r.get("floor_us"):
            r["launch_aware_floor_us"] = max(r["floor_us"], launch)
            r["launch_plus_floor_us"] = launch + r["floor_us"]
    return rows, probe, launch


def _median(xs: list[float]) -> float | None:
    """The middle value (the mean of the two middle ones for an even count)."""
    if not xs:
        return None
    xs, n = sorted(xs), len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


if __name__ == "__main__":
    main()
