"""The seed workloads end to end on a GPU: capture, search the native cards with the built-in
proposer, apply, and compare with eager and torch.compile.

    python benchmarks/seed_workloads.py resnet50 sd35_vae_decoder --iterations 8
    python benchmarks/seed_workloads.py gemma4_e2b --attn eager --layers 35

Resumable: each finished card is appended to benchmarks/results/<model>.jsonl (and $OUT), and a
later call skips the cards already there, so the run can be completed over several device calls.
Prints a markdown table per model last.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kforge  # noqa: E402
from kforge.evaluate import bench  # noqa: E402
from kforge.kernels import device_info  # noqa: E402
from kforge.models import build  # noqa: E402
from kforge.ops import get_spec  # noqa: E402

DEVICE = "cuda"
DEFAULTS = {
    "resnet50": dict(dtype="float32"),
    "sd35_vae_decoder": dict(dtype="bfloat16"),
    "sd35_transformer": dict(dtype="bfloat16"),
    "gemma4_e2b": dict(dtype="bfloat16"),
    "qwen35_moe": dict(dtype="bfloat16", layers=4),
}


RESULTS = ROOT / "benchmarks" / "results"


def _results_path(model: str) -> Path:
    return RESULTS / f"{model}.jsonl"


def _load_done(model: str) -> dict[str, dict]:
    path = _results_path(model)
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("kind") == "card":
                done[row["key"]] = row
    return done


def _append(model: str, row: dict) -> None:
    path = _results_path(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row, default=str) + "\n")
    if os.environ.get("OUT"):
        shutil.copyfile(path, Path(os.environ["OUT"]) / path.name)


def _compiled_op_us(card, device: str) -> float | None:
    """GPU time of the same single op compiled by torch.compile, replayed from a CUDA graph so that
    its ~30 us of guard overhead per call does not count against it (its best case)."""
    spec = get_spec(card.op)
    inputs = spec.random_inputs(card.variant, seed=0)
    params = card.variant.param_dict
    try:
        torch._dynamo.reset()
        fn = torch.compile(lambda *xs: spec.reference(list(xs), params), dynamic=False)
        with torch.no_grad():
            for _ in range(3):
                fn(*inputs)
            if not device.startswith("cuda"):
                return bench(lambda: fn(*inputs), device=device, budget_ms=100).median_us
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn(*inputs)
            return bench(graph.replay, device=device, budget_ms=100).median_us
    except Exception as exc:  # an op inductor cannot compile: report, do not stop the run
        print(f"torch.compile failed for {card.signature}: {exc}", file=sys.stderr)
        return None


LANGUAGE = ("gemma4_e2b", "qwen35_moe")


def seed_model(name: str, device: str, *, layers: int | None = None, attn: str | None = None,
               dtype: str | None = None, **opts):
    """A seed workload as the benchmarks run it: (model, inputs), with DEFAULTS' dtype and options,
    ``layers`` where given, the language models' attention implementation, and Qwen's routed experts
    as F.linear calls kforge can see. Other ``opts`` (resolution, tokens, ...) go to ``build``."""
    base = dict(DEFAULTS.get(name, {}))
    torch_dtype = getattr(torch, dtype or base.pop("dtype", "float32"))
    base.pop("dtype", None)
    base.update({k: v for k, v in opts.items() if v})
    if layers:
        base["layers"] = layers
    if attn and name in LANGUAGE:
        base["attn_implementation"] = attn
    model, inputs = build(name, device=device, dtype=torch_dtype, **base)
    if name == "qwen35_moe" and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    return model, inputs


def run_model(name: str, args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    model, inputs = seed_model(name, DEVICE, layers=args.layers, attn=args.attn, dtype=args.dtype,
                               resolution=args.resolution, tokens=args.tokens)
    build_s = time.perf_counter() - t0
    # NB: the session's store is the unit of resumption: unpacked from the previous call's archive
    # when there is one, so trees, verdicts and winners carry over between device calls.
    workdir = RESULTS / "stores" / name
    archive = RESULTS / f"{name}_store.tgz"
    if archive.exists() and not (workdir / "kforge.db").exists():
        workdir.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            tar.extractall(workdir, filter="data")
    limits = kforge.CaptureLimits(examples_per_variant=1, max_example_bytes=12 << 20, max_tensor_bytes=4 << 20)
    session = kforge.Session(model, inputs, device=DEVICE, workdir=workdir, limits=limits)
    t1 = time.perf_counter()
    cards = session._cards if session._cards is not None and len(session._cards) else session.capture()
    capture_s = time.perf_counter() - t1
    print(f"\n## {name}: {len(cards)} variants captured in {capture_s:.1f} s (build {build_s:.1f} s)", flush=True)
    done = _load_done(name)
    native = [c for c in cards if not c.vendor]
    ops = set(args.ops.split(",")) if args.ops else None
    # NB: a card searched before with fewer iterations is deepened, not restarted: its stored tree
    # counts towards the new budget.
    todo = [c.key for c in native if (ops is None or c.op in ops)
            and (c.key not in done or (args.deepen and (done[c.key].get("iterations") or 0) < args.iterations))]
    todo = todo[: args.max_cards]
    t2 = time.perf_counter()
    if todo:
        def on_event(e):
            if e.kind.value == "card_finished":
                card = cards[e.card_key]
                ev = e.data
                row = {"kind": "card", "key": card.key, "op": card.op, "signature": card.signature,
                       "share": card.share, "calls": card.calls, "eager_us": ev.get("eager_us") or card.eager_us,
                       "capture_eager_us": card.eager_us, "best_us": ev.get("kernel_us"),
                       "speedup": ev.get("speedup", 1.0), "status": ev.get("status"), "reason": ev.get("reason"),
                       "candidates": ev.get("candidates"), "roofline_fraction": ev.get("roofline_fraction"),
                       "floor_us": card.roofline_us(device_info(DEVICE).bandwidth_gbs),
                       "compile_us": None if args.skip_compile or args.skip_op_compile
                       else _compiled_op_us(card, DEVICE),
                       "iterations": args.iterations}
                _append(name, row)
                print(f"  {row['status']:<6} {row['speedup']:.2f}x  {card.signature}", flush=True)
        session.optimize(cards=todo, iterations=args.iterations, policy=args.strategy, parallel=args.parallel,
                         on_event=on_event)
    search_s = time.perf_counter() - t2
    # end to end
    t3 = time.perf_counter()
    if args.no_e2e:
        session.close()
        _archive(name, workdir, archive)
        print(markdown(name))
        return
    e2e = session.end_to_end(compile=not args.skip_compile)
    apply_s = time.perf_counter() - t3
    summary = {"kind": "model", "model": name, "dtype": "torch." + (args.dtype or DEFAULTS.get(name, {}).get("dtype", "float32")), "variants": len(cards),
               "native_variants": len(native), "winners": len(session.results.winners),
               "kernels_installed": e2e.kernels_installed, "kernels_skipped": e2e.skipped, "dispatch": e2e.dispatch,
               "forward_eager_us": e2e.eager_us, "forward_kforge_us": e2e.kforge_us,
               "forward_compile_us": e2e.compile_us, "forward_compile_kforge_us": e2e.compile_kforge_us,
               "output_rel_diff": e2e.output_rel_diff, "build_s": build_s, "capture_s": capture_s,
               "search_s": search_s, "e2e_s": apply_s, "pipeline_s": time.perf_counter() - t0,
               "iterations": args.iterations, "strategy": args.strategy, "coverage": cards.coverage}
    _append(name, summary)
    print(json.dumps(summary, indent=1, default=str))
    session.close()
    _archive(name, workdir, archive)
    print(markdown(name))


def _archive(name: str, workdir: Path, archive: Path) -> None:
    with tarfile.open(archive, "w:gz") as tar:
        for item in sorted(workdir.iterdir()):
            tar.add(item, arcname=item.name)
    if os.environ.get("OUT"):
        shutil.copyfile(archive, Path(os.environ["OUT"]) / archive.name)


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1e3:.2f} ms"


def markdown(name: str) -> str:
    rows = [json.loads(line) for line in _results_path(name).read_text().splitlines()]
    # a card searched again (--deepen) has a row per run: the latest one stands
    latest = {r["key"]: r for r in rows if r["kind"] == "card"}
    cards = sorted(latest.values(), key=lambda r: -r["share"])
    lines = [f"### {name}", "", "| op | signature | share | eager us | best us | speedup | vs compile | floor us | "
             "roofline | status |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in cards:
        best = r["best_us"] or r["eager_us"]
        vs_c = f"{r['compile_us'] / best:.2f}x" if r.get("compile_us") else "-"
        roof = f"{r['roofline_fraction'] * 100:.0f}%" if r.get("roofline_fraction") else "-"
        lines.append(f"| {r['op']} | `{r['signature']}` | {r['share'] * 100:.1f}% | {r['eager_us']:.2f} | "
                     f"{best:.2f} | {r['speedup']:.2f}x | {vs_c} | {r['floor_us']:.2f} | {roof} | {r['status']} |")
    models = [r for r in rows if r["kind"] == "model"]
    last_card = max((i for i, r in enumerate(rows) if r["kind"] == "card"), default=-1)
    if models and rows.index(models[-1]) < last_card:
        # NB: an end-to-end row older than the latest searches measured other kernels: not theirs
        lines += ["", f"{sum(r['status'] == 'winner' for r in cards)} of {len(cards)} native variants beat eager. "
                  "No end-to-end run since the latest searches (--no-e2e)."]
    elif models:
        m = models[-1]
        lines += ["", f"{sum(r['status'] == 'winner' for r in cards)} of {len(cards)} native variants beat eager. "
                  f"Forward: eager {m['forward_eager_us'] / 1e3:.2f} ms, eager+kforge {m['forward_kforge_us'] / 1e3:.2f} ms "
                  f"({m['forward_eager_us'] / m['forward_kforge_us']:.3f}x), torch.compile "
                  f"{_ms(m['forward_compile_us'])}, compile+kforge {_ms(m['forward_compile_kforge_us'])}; "
                  f"output rel. diff {m['output_rel_diff']:.2e}. Pipeline {m['pipeline_s']:.0f} s (capture "
                  f"{m['capture_s']:.0f} s, search {m['search_s']:.0f} s, end-to-end {m['e2e_s']:.0f} s)."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+", choices=sorted(DEFAULTS))
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--strategy", default="mcts")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--dtype", default=None, help="override the model's dtype (float32, bfloat16)")
    ap.add_argument("--resolution", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a quick smoke test at small sizes")
    ap.add_argument("--attn", default=None, help="attn_implementation for the language models (eager/sdpa)")
    ap.add_argument("--max-cards", type=int, default=None)
    ap.add_argument("--ops", default="", help="comma-separated operators to search (default: every native card)")
    ap.add_argument("--deepen", action="store_true",
                    help="search again the cards recorded with fewer than --iterations, continuing their trees")
    ap.add_argument("--no-e2e", action="store_true", help="skip the end-to-end comparison (a later call does it)")
    ap.add_argument("--skip-compile", action="store_true", help="no torch.compile comparisons (slow on a CPU)")
    ap.add_argument("--skip-op-compile", action="store_true",
                    help="no per-card torch.compile timing (each costs an inductor compile); the model still is")
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"), help="where the per-model .jsonl files go")
    args = ap.parse_args()
    global DEVICE, RESULTS
    DEVICE = args.device
    RESULTS = Path(args.results)
    os.environ.setdefault("KFORGE_CACHE", str(Path(tempfile.gettempdir()) / "kforge-cache"))
    for name in args.models:
        run_model(name, args)


if __name__ == "__main__":
    main()
