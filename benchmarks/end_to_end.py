"""The end-to-end table of issue 14 from the seed stores: eager, torch.compile in each mode, and each
with kforge (the model-level check per mode), outputs against eager; language models also decode.

    python benchmarks/end_to_end.py resnet50 sd35_vae_decoder
    python benchmarks/end_to_end.py gemma4_e2b qwen35_moe --layers 4 --decode 32
    python benchmarks/end_to_end.py resnet50 --modes default --diagnose

The winners come from benchmarks/results/<model>_store.tgz (made by seed_workloads.py). Prints the
table per model and writes end_to_end_<model>.json to $OUT (or benchmarks/results/).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from seed_workloads import DEFAULTS, LANGUAGE, seed_model  # noqa: E402

import kforge  # noqa: E402
from kforge.models import compare_decode, decode_steps, forward_as  # noqa: E402


def _session(name: str, args) -> tuple[kforge.Session, torch.nn.Module, object, float]:
    model, inputs = seed_model(name, args.device, attn=args.attn,
                               layers=args.layers if name in LANGUAGE + ("sd35_transformer",) else None)
    if args.experts and hasattr(model, "set_experts_implementation"):
        # NB: the seed searched Qwen's experts as F.linear calls ("eager"); under torch.compile with
        # dynamic=False those recompile for every expert's token count (H200, 2026-12-02)
        model.set_experts_implementation(args.experts)
    archive = ROOT / "benchmarks" / "results" / f"{name}_store.tgz"
    workdir = Path(tempfile.mkdtemp(prefix=f"e2e-{name}-"))
    pipeline_s = None
    if archive.exists() and not args.fresh:
        with tarfile.open(archive) as tar:
            tar.extractall(workdir, filter="data")
        rows = [json.loads(x) for x in (ROOT / "benchmarks" / "results" / f"{name}.jsonl").read_text().splitlines()]
        models = [r for r in rows if r.get("kind") == "model"]
        pipeline_s = models[-1].get("pipeline_s") if models else None
    try:
        s = kforge.Session(model, inputs, device=args.device, workdir=workdir)
    except kforge.store.WorkdirError as exc:
        raise SystemExit(f"{archive.name} was made from a different model than this one ({exc}); run at the seed "
                         "store's depth (--layers as in its .jsonl), or pass --fresh to capture without its winners")
    if s._cards is None:
        s.capture()  # no store: no winners either, the table still shows eager against compile
    return s, model, inputs, pipeline_s


def _diagnose(s: kforge.Session, model, inputs, device: str) -> dict:
    """Where the kforge forward's time goes: GPU time per kernel name in the model (eager with and
    without kforge), dynamo graphs/recompiles of the kforge-compiled model, host time per forward."""
    from torch._dynamo.utils import counters
    from torch.profiler import ProfilerActivity, profile

    out: dict = {}
    call = (lambda m: m(inputs))  # noqa: E731

    def gpu_by_kernel(fn) -> dict[str, float]:
        with torch.no_grad():
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    fn()
                torch.cuda.synchronize()
        rows = {e.key: e.device_time_total / 5 for e in prof.key_averages() if e.device_time_total > 0}
        return dict(sorted(rows.items(), key=lambda kv: -kv[1])[:12])

    if device.startswith("cuda"):
        out["eager_gpu_us_by_kernel"] = gpu_by_kernel(lambda: call(model))
        with s.apply(all_winners=True):
            out["kforge_gpu_us_by_kernel"] = gpu_by_kernel(lambda: call(model))
    torch._dynamo.reset()
    counters.clear()
    compiled = s.compile(guard=False)
    with torch.no_grad():
        for _ in range(5):
            call(compiled)
        host = []
        for _ in range(20):
            t = time.perf_counter()
            call(compiled)
            host.append((time.perf_counter() - t) * 1e6)   # no sync: host time, when not queue-bound
    out["compile_kforge"] = {"graphs": len(compiled.kforge_backend.graphs), "replaced": compiled.kforge_backend.replaced,
                             "kernel_calls_after_25_forwards": [dk.calls for dk in compiled.kforge_backend.kernels],
                             "dynamo_stats": dict(counters["stats"]), "graph_breaks": dict(counters["graph_break"]),
                             "host_us_median": sorted(host)[len(host) // 2]}
    torch._dynamo.reset()
    return out


def _decode(s: kforge.Session, model, prompt, args, modes, e2e, save) -> dict:
    """Greedy decode at batch 1 under eager, each compile mode, and each with the kernels the
    model-level check kept in that mode: one interleaved run (compare_decode) a compile mode, eager
    its reference, ``save(results so far)`` after each; an arm whose mode kept no kernel is the
    plain arm itself and is not decoded twice."""
    import contextlib

    from kforge.deploy import Deployment
    from kforge.deploy._graph import compile_with, no_recompile_limit
    from kforge.deploy._select import _patched_eagerly

    kernels = list(s._deployable(not args.no_guard).kernels)   # the set end_to_end started from
    kept = {r.mode: set(r.kept) for r in e2e.fallback}

    def kept_in(mode: str) -> list | None:
        """The kernels to decode with in ``mode``; None where the check did not run (the mode failed)."""
        if args.no_guard:
            return kernels
        if mode not in kept:
            return None if kernels else []
        return [dk for dk in kernels if dk.variant.signature in kept[mode]]

    def why_same(mode: str) -> str:
        if not kernels:
            return "the session has no kernel to deploy"
        return "the model-level check kept no kernel in this mode"

    @contextlib.contextmanager
    def installed(dep):
        dep.install()
        try:
            yield
        finally:
            dep.remove()

    out: dict = {}
    eager_arms = {"eager": contextlib.nullcontext}
    eager_ks = [dk for dk in kept_in("eager") or [] if _patched_eagerly(dk.variant.op)]   # regions: graph mode only
    if eager_ks:
        dep = Deployment(eager_ks, model)
        eager_arms["eager + kforge"] = lambda: installed(dep)
    else:
        out["eager + kforge"] = _same("eager + kforge", "eager", why_same("eager"))
    # NB: one compare_decode a compile mode (eager the reference in each), the result saved after each:
    # a mode that kills the process (reduce-overhead decode segfaulted on the H200) leaves the others
    groups = [(None, dict(eager_arms))] if not modes else []
    for i, mode in enumerate(modes):
        arms = dict(eager_arms) if i == 0 else {"eager": contextlib.nullcontext}
        groups.append((mode, arms))
    for mode, arms in groups:
        torch._dynamo.reset()
        forwards = {}
        for label, ks in (((f"compile {mode}", []), (f"compile {mode} + kforge", kept_in(mode))) if mode else ()):
            if ks is None:
                print(f"decode {label}: not decoded (the model-level check did not run in this mode: see the table)")
                out[label] = {"error": "the model-level check did not run in this mode"}
                continue
            if label.endswith("+ kforge") and not ks:
                out[label] = _same(label, f"compile {mode}", why_same(mode))
                continue
            # NB: compiled as transformers' generate compiles (its CompileConfig): the decode steps only,
            # dynamic=None. With dynamic=False Gemma's sliding-window cache length (a Python int)
            # recompiled at every step until dynamo's limit, then ran eagerly (H200, 2026-12-03)
            try:
                forwards[label] = compile_with(model.forward, ks, mode=mode, dynamic=None)
            except Exception as exc:
                forwards[label] = exc
            fwd = forwards[label]
            arms[label] = (lambda fwd=fwd: forward_as(model, decode_steps(model, fwd))) \
                if not isinstance(fwd, Exception) else (lambda fwd=fwd: (_ for _ in ()).throw(fwd))
        # NB: every compiled arm is one more cache entry on the model's forward (two shapes each)
        with no_recompile_limit():
            results = compare_decode(model, prompt, args.decode, arms, rounds=args.rounds)
        print(f"decode, one interleaved run{f' with compile {mode}' if mode else ''}:")
        for label, arm in results.items():
            print("  " + arm.line("eager"), flush=True)
            key = label if label not in out else f"{label} (with compile {mode})"
            out[key] = {"tokens_per_s": arm.decode.tokens_per_s if arm.decode else None, "over_eager": arm.ratio,
                        "same_tokens": arm.same_tokens, "agreed": arm.agreed, "logit_rel_diff": arm.logit_rel_diff, "error": arm.error,
                        "cache": arm.decode.cache if arm.decode else None}
            fwd = forwards.get(label)
            if fwd is not None and not isinstance(fwd, Exception):
                out[key]["replaced"] = fwd.kforge_backend.replaced
        save(out)
    torch._dynamo.reset()
    return out


def _same(label: str, plain: str, why: str) -> dict:
    print(f"decode {label}: the same as {plain} ({why})")
    return {"same_as": plain, "why": why}


def run(name: str, args) -> dict:
    t0 = time.perf_counter()
    s, model, inputs, pipeline_s = _session(name, args)
    modes = tuple(m for m in args.modes.split(",") if m)
    e2e = s.end_to_end(modes=modes, guard=not args.no_guard)
    result = {"model": name, "device": args.device, "pipeline_s": pipeline_s, **e2e.to_json()}
    print(f"\n## {name} (forward{' = prefill of ' + str(inputs.shape[1]) + ' tokens' if name in LANGUAGE else ''})")
    print(e2e.table(), flush=True)
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"end_to_end_{name}.json").write_text(json.dumps(result, indent=1, default=str))  # kept if decode dies
    if name in LANGUAGE and args.decode:
        def save(decode: dict) -> None:
            result["decode"] = decode
            (out / f"end_to_end_{name}.json").write_text(json.dumps(result, indent=1, default=str))

        result["decode"] = _decode(s, model, inputs[:, : args.prompt], args, modes, e2e, save)
    if args.diagnose:
        result["diagnose"] = _diagnose(s, model, inputs, args.device)
        print(json.dumps(result["diagnose"], indent=1, default=str))
    result["e2e_s"] = time.perf_counter() - t0
    (out / f"end_to_end_{name}.json").write_text(json.dumps(result, indent=1, default=str))
    s.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+", choices=sorted(DEFAULTS))
    ap.add_argument("--modes", default="default,max-autotune,reduce-overhead")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--attn", default=None, help="attn_implementation for the language models (eager/sdpa)")
    ap.add_argument("--decode", type=int, default=0, help="language models: greedy-decode this many tokens")
    ap.add_argument("--experts", default=None, help="MoE models: the experts implementation for every row "
                    "(e.g. grouped_mm, transformers' default; the seed store searched them as eager F.linear calls)")
    ap.add_argument("--rounds", type=int, default=5, help="decode: interleaved rounds (each arm once a round)")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens before decoding")
    ap.add_argument("--no-guard", action="store_true", help="keep every winner (no model-level check)")
    ap.add_argument("--fresh", action="store_true", help="ignore the seed store: capture anew (no winners)")
    ap.add_argument("--diagnose", action="store_true", help="profile where the kforge forward's time goes")
    args = ap.parse_args()
    os.environ.setdefault("KFORGE_CACHE", str(Path(tempfile.gettempdir()) / "kforge-cache"))
    for name in args.models:
        run(name, args)


if __name__ == "__main__":
    main()
