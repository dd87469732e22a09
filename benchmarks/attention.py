"""Attention cards (issue 45): kforge's attention kernels against the attention eager runs, torch.compile (default)
and, optionally, max-autotune, in one run, with correctness on fresh inputs.

Cases, each one attention card's exact signature (``kforge.ops.families.attention``):

- on a GPU, the seed shapes (bf16): Gemma 4 E2B at 512 tokens, a sliding layer (8 query heads of 256 reading one
  key head expanded, the window's boolean mask) and a full layer (heads of 512, causal); the SD3.5 transformer's
  joint attention at 1024 px (24 heads of 64, 4096 + 333 tokens, laid out [batch, tokens, heads, width]); a
  written-out, soft-capped chain (Gemma 2's eager attention: scores, x scale, 50 tanh(s / 50), + mask, softmax,
  x values);
- on a CPU, the same kinds at small sizes (float32), so the script itself is checked where there is no GPU.

For each case: every configuration of each of kforge's strategies that applies on that device is rendered and built
(CUDA: the flash-style tiles, and on Hopper for 16-bit SDPA the tensor-core tiles, ``wgmma_tiles``, in parallel with
nvcc; CPU: the C/OpenMP rows kernel), run on fresh inputs (three seeds, outputs poisoned with NaN) and held to the
card's tolerance against eager's output; then eager (for SDPA: the backend
torch chose for these inputs), each compile mode and every correct configuration are timed interleaved, repetition
by repetition (``kforge.timing.bench_many``: CUDA events or the host clock, L2 flushed, rounds until two agree;
a timing whose rounds never agreed is marked noisy).

    python benchmarks/attention.py --device cpu --json-out /tmp/attention.json
    python benchmarks/attention.py --device cuda --modes default,max-autotune --json-out $OUT/attention.json
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kforge.evaluate._checks import compare  # noqa: E402
from kforge.ops import TensorSig  # noqa: E402
from kforge.ops import Variant, get_spec  # noqa: E402
from kforge.timing import bench_many  # noqa: E402

SDPA, CHAIN = "scaled_dot_product_attention", "softmax_attention"


def _sig(shape, stride, dtype: str, device: str) -> TensorSig:
    return TensorSig(tuple(shape), dtype, tuple(stride), device)


def _contiguous(shape) -> tuple[int, ...]:
    stride, n = [], 1
    for d in reversed(shape):
        stride.append(n)
        n *= d
    return tuple(reversed(stride))


def cases(device: str) -> dict[str, Variant]:
    """The cases of ``device``: the seed shapes on a GPU, small ones of the same kinds on a CPU."""
    cuda = device.startswith("cuda")
    dt = "bfloat16" if cuda else "float32"
    dev = "cuda:0" if cuda else "cpu"
    L = 512 if cuda else 64           # Gemma's tokens
    heads, kv_width = (8, (256, 512)) if cuda else (4, (32, 64))
    n = 4096 + 333 if cuda else 96 + 17   # SD3.5's joint tokens
    jh, je = (24, 64) if cuda else (4, 32)
    out: dict[str, Variant] = {}
    for e, causal in zip(kv_width, (False, True)):
        q = _sig((1, heads, L, e), (L * heads * e, e, heads * e, 1), dt, dev)
        kv = _sig((1, heads, L, e), (L * e, 0, e, 1), dt, dev)   # one key head expanded over the query heads
        mask = None if causal else _sig((1, 1, L, L), (L * L, L * L, L, 1), "bool", dev)
        o = _sig((1, heads, L, e), _contiguous((1, heads, L, e)), dt, dev)
        name = f"gemma4_{'full_causal' if causal else 'sliding_window'}_{e}"
        out[name] = Variant(SDPA, (q, kv, kv, mask), (("is_causal", causal), ("scale", 1.0), ("enable_gqa", False)),
                            (o,))
    q = _sig((1, jh, n, je), (n * jh * je, je, jh * je, 1), dt, dev)
    out["sd35_joint"] = Variant(SDPA, (q, q, q, None), (("is_causal", False), ("scale", None),
                                                         ("enable_gqa", False)),
                                (_sig((1, jh, n, je), _contiguous((1, jh, n, je)), dt, dev),))
    e = kv_width[0]
    q = _sig((1, heads, L, e), _contiguous((1, heads, L, e)), dt, dev)
    out["chain_softcap_added"] = Variant(CHAIN, (q, q, q, _sig((1, 1, L, L), _contiguous((1, 1, L, L)), dt, dev)),
                                         (("scale", e ** -0.5), ("softcap", 50.0), ("fill", None)), (q,))
    return out


def _build(strategy, variant: Variant, config: dict, info) -> Any:
    from kforge.deploy import DeployedKernel
    from kforge.kernels import Kernel, compile_source

    built = compile_source(strategy.render(variant, config, info), "cuda" if info.backend == "cuda" else "cpu",
                           info.arch)
    return DeployedKernel(variant, Kernel(built.path)), built


def configurations(variant: Variant, info) -> list[tuple[Any, dict]]:
    """(strategy, configuration) for every configuration of every built-in strategy that applies to ``variant`` on
    the device ``info`` describes: what a case builds, checks and times."""
    from kforge.proposers.builtin import strategies_for

    return [(s, c) for s in strategies_for(variant.op, info.backend) if s.applies(variant, info)
            for c in s.configs(variant, info)]


def run_case(name: str, variant: Variant, device: str, modes: list[str], seeds: int, budget_ms: float,
             jobs: int) -> dict:
    from kforge.kernels import device_info

    spec = get_spec(variant.op)
    info = device_info(device)
    row: dict = {"case": name, "signature": variant.signature}
    params = variant.param_dict
    candidates = configurations(variant, info)
    if not candidates:
        row["error"] = f"no {info.backend} strategy of {variant.op} applies to this signature on {info.name}"
        return row
    strategies = {s.name for s, _ in candidates}
    start = time.perf_counter()
    with futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        built = list(pool.map(lambda sc: _try(lambda: _build(sc[0], variant, sc[1], info)), candidates))
    row["build_s"] = round(time.perf_counter() - start, 1)
    kernels: list[tuple[str, Any]] = []
    row["configs"] = []
    for (strategy, config), result in zip(candidates, built):
        label = ",".join(f"{k}={v}" for k, v in sorted(config.items())) or "default"
        if len(strategies) > 1:   # NB: the design's name only where there is more than one
            label = f"{strategy.name.rsplit('.', 1)[-1]}:{label}"
        entry: dict = {"config": label, "strategy": strategy.name}
        row["configs"].append(entry)
        if isinstance(result, str):
            entry["error"] = result
            continue
        kernel, _ = result
        checks = []
        for seed in range(1, seeds + 1):
            ins = [None if t is None else t.to(device) for t in spec.random_inputs(variant, seed=seed)]
            ref = spec.reference(ins, params)
            try:
                (got,) = kernel(tuple(ins))
            except Exception as exc:  # noqa: BLE001 - a configuration that fails to run is reported, not fatal
                entry["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                break
            checks.append(compare(spec, got, ref, "output"))   # the judge's own rule, eager's NaN rows included
        if "error" in entry:
            continue
        entry["correct"] = all(m.ok for m in checks)
        entry["max_rel_error"] = max(m.max_rel for m in checks)
        if not entry["correct"]:
            entry["why"] = next(m.message for m in checks if not m.ok)
        if entry["correct"]:
            kernels.append((label, kernel))
    ins = [None if t is None else t.to(device) for t in spec.random_inputs(variant, seed=0)]

    def eager():
        with torch.no_grad():
            return spec.reference(ins, params)
    fns: list[Callable[[], Any]] = [eager]
    names = ["eager"]
    for mode in modes:
        try:
            compiled = torch.compile(lambda *x: spec.reference(list(x), params),
                                     mode=None if mode == "default" else mode, dynamic=False)
            with torch.no_grad():
                compiled(*ins)
            fns.append(lambda c=compiled: c(*ins))
            names.append(f"compile_{mode}")
        except Exception as exc:  # noqa: BLE001 - a mode that does not compile is reported
            row[f"compile_{mode}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    for label, kernel in kernels:
        fns.append(lambda k=kernel: k(tuple(ins)))
        names.append(f"kforge[{label}]")
    with torch.no_grad():
        timings = bench_many(fns, device=device, budget_ms=budget_ms, max_rounds=3)
    row["us"] = {n: round(t.median_us, 2) for n, t in zip(names, timings)}
    row["noisy"] = [n for n, t in zip(names, timings) if t.noisy]
    ours = {n: us for n, us in row["us"].items() if n.startswith("kforge")}
    if ours:
        best = min(ours, key=ours.get)
        row["kforge_best"] = best
        row["speedup_vs_eager"] = row["us"]["eager"] / ours[best]
        compiled = [us for n, us in row["us"].items() if n.startswith("compile_")]
        if compiled:
            row["speedup_vs_best_compile"] = min(compiled) / ours[best]
    torch._dynamo.reset()
    return row


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a build that fails is that configuration's row
        log = getattr(exc, "log", "") or ""
        return f"{type(exc).__name__}: {str(exc)[:200]}" + (f" | {log[-400:]}" if log else "")


def table(rows: list[dict], modes: list[str]) -> str:
    head = (f"{'case':<30} {'eager us':>10} " + " ".join(f"{'compile ' + m:>22}" for m in modes)
            + f" {'kforge us':>10} {'x eager':>8} {'x best compile':>15}  correct configs")
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['case']:<30} {r['error']}")
            continue
        us = r["us"]
        best = r.get("kforge_best")
        ok = sum(1 for c in r["configs"] if c.get("correct"))
        lines.append(f"{r['case']:<30} {us['eager']:>10.2f} "
                     + " ".join(f"{us.get('compile_' + m, float('nan')):>22.2f}" for m in modes)
                     + (f" {us[best]:>10.2f} {r['speedup_vs_eager']:>7.2f}x "
                        f"{r.get('speedup_vs_best_compile', float('nan')):>14.2f}x" if best else f" {'-':>10} {'-':>8} {'-':>15}")
                     + f"  {ok}/{len(r['configs'])}" + (f"  noisy: {', '.join(r['noisy'])}" if r["noisy"] else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--cases", default="", help="comma-separated substrings of case names to run")
    ap.add_argument("--modes", default="default", help="torch.compile modes to time (comma-separated; none: '')")
    ap.add_argument("--seeds", type=int, default=3, help="fresh inputs each configuration is checked on")
    ap.add_argument("--time-ms", type=float, default=200.0, help="timing budget per round of one case")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2), help="parallel builds")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    device = "cuda:0" if args.device == "cuda" else args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda needs a CUDA GPU; --device cpu runs the small cases")
    modes = [m for m in args.modes.split(",") if m]
    wanted = [w for w in args.cases.split(",") if w]
    chosen = {n: v for n, v in cases(device).items() if not wanted or any(w in n for w in wanted)}
    if not chosen:
        ap.error(f"no case matches --cases {args.cases!r}; the cases: {', '.join(cases(device))}")
    report = {"device": torch.cuda.get_device_name(0) if device.startswith("cuda") else platform.processor() or "cpu",
              "torch": torch.__version__, "modes": modes, "rows": []}
    for name, variant in chosen.items():
        t0 = time.perf_counter()
        row = run_case(name, variant, device, modes, args.seeds, args.time_ms, args.jobs)
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        report["rows"].append(row)
        print(f"{name}: {row.get('error') or row['us']} ({row['wall_s']} s)", flush=True)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(report, indent=2))
    print()
    print(table(report["rows"], modes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
