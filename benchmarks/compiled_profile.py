"""Where a compiled seed model's GPU time goes, by kernel and by kind of kernel: the room kforge has.

    python benchmarks/compiled_profile.py sd35_vae_decoder --modes default
    python benchmarks/compiled_profile.py resnet50 --modes default,max-autotune-no-cudagraphs
    python benchmarks/compiled_profile.py qwen35_moe --layers 4 --experts grouped_mm --modes default,reduce-overhead

For each mode (and eager), the model is compiled with plain torch.compile, warmed, and five forwards
are profiled (CUDA activity only). Every kernel's GPU time a forward is summed by name and by kind:
"conv/gemm" (vendor and template convolutions and matrix products), "layout" (NCHW <-> NHWC
transposes), "norm" (Inductor reductions over a group_norm/layer_norm/softmax/mean, eager's norm
kernels), "pointwise", "other". A kind's share of the forward is the ceiling of what replacing its
kernels can save. Each kernel's row gives its launches a forward, its time a launch and its launch shape
(grid, block, from the profiler's trace), so a kernel's bytes (from the model's shapes) give its distance from
the bandwidth floor. ``--sources N`` also writes
the Triton source Inductor generated for the N largest of its kernels in each compiled mode
(compiled_profile_<model>_sources.txt: what a faster kernel has to beat, read off the compile's cache).
``--decode N`` (language models) profiles the N - 1 steps of a greedy decode of N tokens with a static KV cache
(a decode of N tokens less a decode of one) instead of the forward, the decode steps compiled as transformers'
generate compiles them (``decode_steps``), figures a step; it adds the wall time a step and, per mode, the
host's top operators by self CPU time: where a host-bound decode's time goes (eager Qwen 3.5 decodes at 65
tokens/s on the H200, its GPU mostly idle).
Prints a table per mode and writes compiled_profile_<model>.json to $OUT (or runs/).

    python benchmarks/compiled_profile.py qwen35_moe --layers 4 --experts grouped_mm --decode 16 --modes reduce-overhead
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from seed_workloads import seed_model  # noqa: E402

KINDS = (
    ("layout", re.compile(r"nchwToNhwc|nhwcToNchw|convertTensor|transpose", re.I)),
    # NB: before conv/gemm: Inductor names a norm kernel after every node it fused, a convolution's bias too
    ("norm", re.compile(r"group_norm|layer_norm|batch_norm|bn_fw|rms|softmax|welford|RowwiseMoments|_red_|reduce", re.I)),
    ("conv/gemm", re.compile(r"conv|cudnn|implicit|xmma|cutlass|gemm|sm\d\d_|wgmma|mm_|cublas|triton_tem|fmha|attention", re.I)),
    ("pointwise", re.compile(r"triton_poi|elementwise|vectorized|unrolled|silu|add|mul|copy", re.I)),
)


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "other"


def launch_shapes(trace: dict) -> dict[str, dict]:
    """Per kernel name, the launch shape of its first launch in a chrome trace the profiler exported: grid and block
    (how many threads a launch runs: whether a kernel is starved of parallelism), registers a thread and shared
    memory a block."""
    out: dict[str, dict] = {}
    for ev in trace.get("traceEvents", []):
        if ev.get("cat") != "kernel" or ev.get("name") in out:
            continue
        args = ev.get("args") or {}
        if "grid" in args and "block" in args:
            out[ev["name"]] = {"grid": args["grid"], "block": args["block"],
                               "registers": args.get("registers per thread"),
                               "shared_bytes": args.get("shared memory")}
    return out


def profile_forward(fn, forwards: int = 5, launches: dict[str, float] | None = None,
                    shapes: dict[str, dict] | None = None, host: dict[str, float] | None = None,
                    warm: int = 3) -> dict[str, float]:
    """GPU microseconds a forward per kernel name; ``launches`` (when given) gets each name's launches a forward,
    ``shapes`` each name's launch shape (``launch_shapes``), ``host`` each operator's self CPU microseconds a
    forward (the host's side profiled too)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        for _ in range(warm):
            fn()
        torch.cuda.synchronize()
        activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if host is not None else [])
        with profile(activities=activities) as prof:
            for _ in range(forwards):
                fn()
            torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_time_total > 0 and e.device_type.name == "CUDA"] \
        if host is not None else [e for e in prof.key_averages() if e.device_time_total > 0]
    if host is not None:
        host.update({e.key: e.self_cpu_time_total / forwards for e in prof.key_averages()
                     if e.self_cpu_time_total > 0})
    if shapes is not None:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            try:
                shapes.update(launch_shapes(json.loads(path.read_text())))
            except ValueError:   # NB: a trace that does not parse costs the shapes, not the profile
                pass
    if launches is not None:
        launches.update({e.key: e.count / forwards for e in rows})
    return {e.key: e.device_time_total / forwards for e in rows}


def summarize(rows: dict[str, float], top: int, launches: dict[str, float] | None = None,
              shapes: dict[str, dict] | None = None) -> dict:
    total = sum(rows.values())
    launches, shapes = launches or {}, shapes or {}
    kinds: dict[str, float] = {}
    for name, us in rows.items():
        kinds[kind_of(name)] = kinds.get(kind_of(name), 0.0) + us
    ordered = sorted(rows.items(), key=lambda kv: -kv[1])
    return {"gpu_us": total,
            "kinds": {k: {"us": v, "share": v / total if total else 0.0} for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            "top": [{"kernel": n[:160], "kind": kind_of(n), "us": us, "share": us / total if total else 0.0,
                     "launches": launches.get(n), "us_a_launch": us / launches[n] if launches.get(n) else None,
                     "launch_shape": _shape_of(n, shapes)}
                    for n, us in ordered[:top]]}


def _shape_of(name: str, shapes: dict[str, dict]) -> dict | None:
    """``name``'s launch shape: the profiler's key may be cut short of the trace's full kernel name."""
    if name in shapes:
        return shapes[name]
    return next((v for k, v in shapes.items() if k.startswith(name)), None)


def inductor_sources(names: list[str], root: Path, limit: int = 12000) -> dict[str, str]:
    """The Triton source of each kernel named (Inductor's own names, e.g. ``triton_per_fused_..._11``) from the
    compile cache under ``root``: the smallest cached file that defines it (a kernel's own file before the
    module that embeds it), cut at ``limit`` characters. A name found nowhere is left out.

    The profiler may cut a long kernel name short (``triton_per_fused__scaled_dot_product_..._bm``): a name is
    matched as the start of a definition's name where no definition has it whole, and the source then begins
    with the full name found."""
    wanted = {n: re.compile(r"def (" + re.escape(n) + r"\w*)\(") for n in names if n.startswith("triton_")}
    found: dict[str, tuple[int, int, str]] = {}   # name: (0 whole name / 1 its start, file length, source)
    if not wanted or not root.is_dir():
        return {}
    for path in root.rglob("*.py"):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for name, pattern in wanted.items():
            defs = {m.group(1) for m in pattern.finditer(text)}
            if not defs:
                continue
            rank = (0 if name in defs else 1, len(text))
            if name not in found or rank < found[name][:2]:
                full = "" if rank[0] == 0 else f"# full name: {min(defs)}\n"
                found[name] = (*rank, full + text[:limit])
    return {n: text for n, (_, _, text) in found.items()}


def inductor_cache_dir() -> Path:
    """Where Inductor caches what it compiles (TORCHINDUCTOR_CACHE_DIR, else its default)."""
    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if env:
        return Path(env)
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return Path(default_cache_dir())


def profile_diff(plain: dict[str, float], other: dict[str, float], top: int = 12) -> list[str]:
    """Lines naming the kernels whose GPU time a forward differs most between two profiles (a kernel
    only one of them runs counts whole), after a line with both totals."""
    names = set(plain) | set(other)
    rows = sorted(((other.get(n, 0.0) - plain.get(n, 0.0), n) for n in names), key=lambda r: -abs(r[0]))
    out = [f"GPU kernels a forward: {sum(plain.values()):.1f} us plain, {sum(other.values()):.1f} us with kforge "
           f"({sum(other.values()) - sum(plain.values()):+.1f} us)"]
    for delta, n in rows[:top]:
        if abs(delta) < 0.05:
            break
        where = "only with kforge" if n not in plain else "only plain" if n not in other else ""
        out.append(f"  {delta:+9.1f} us  [{kind_of(n)}] {n[:100]} {where}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--modes", default="default", help="comma-separated torch.compile modes ('eager' for none)")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--sources", type=int, default=0, metavar="N",
                    help="write the Triton source of the N largest Inductor kernels of each compiled mode")
    ap.add_argument("--decode", type=int, default=0, metavar="N",
                    help="language models: profile a greedy decode of N tokens (static cache) instead of the forward")
    ap.add_argument("--experts", default=None, help="MoE models: the experts implementation (e.g. grouped_mm, what "
                    "the end-to-end rows of Qwen 3.5 run; the seed's default is per-expert F.linear calls)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("compiled_profile.py profiles GPU kernels: run it on a machine with CUDA")
    if args.sources:
        # NB: a cache of its own: a cache kept between runs (device_session.sh's) holds other models' kernels under
        # the same names (Inductor numbers them per graph)
        import tempfile

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="kforge-profile-inductor-")
    model, inputs = seed_model(args.model, "cuda", layers=args.layers)
    if args.experts and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(args.experts)
    from kforge.capture import split_batch

    args_, kwargs_ = split_batch(inputs)
    call = lambda m: m(*args_, **kwargs_)  # noqa: E731
    result: dict = {"model": args.model, "torch": torch.__version__, "modes": {}}
    sources: dict[str, str] = {}
    try:
        import transformers

        result["transformers"] = transformers.__version__
        print("transformers", transformers.__version__)
    except ImportError:
        pass
    unit = "a token" if args.decode else "a forward"
    for mode in ["eager"] + [m for m in args.modes.split(",") if m and m != "eager"]:
        torch._dynamo.reset()
        launches: dict[str, float] = {}
        shapes: dict[str, dict] = {}
        host: dict[str, float] | None = {} if args.decode else None
        if args.decode:
            # NB: a decode of N tokens less a decode of one (the prompt's prefill and the first token): the N - 1
            # steps alone, as compare_decode times them (the prompt's large GEMMs were most of a first profile)
            long, short = (_decoder(model, args_, kwargs_, n, mode) for n in (args.decode, 1))
            figures = []
            for run in (long, short):
                l_, s_, h_ = {}, {}, {}
                g_ = profile_forward(run, forwards=2, launches=l_, shapes=s_, host=h_, warm=2)
                start = time.perf_counter()
                with torch.no_grad():
                    run()
                torch.cuda.synchronize()
                figures.append((g_, l_, s_, h_, time.perf_counter() - start))
                shapes.update(s_)
            (g1, l1, _, h1, w1), (g0, l0, _, h0, w0) = figures
            steps = args.decode - 1
            less = lambda a, b: {k: (a.get(k, 0.0) - b.get(k, 0.0)) / steps for k in a}  # noqa: E731
            gpu = {k: v for k, v in less(g1, g0).items() if v > 0}
            launches, host = less(l1, l0), {k: v for k, v in less(h1, h0).items() if v > 0}
            wall_us = (w1 - w0) * 1e6 / steps
        else:
            target = model if mode == "eager" else torch.compile(model, mode=None if mode == "default" else mode)
            gpu = profile_forward(lambda: call(target), launches=launches, shapes=shapes)
        summary = summarize(gpu, args.top, launches, shapes)
        result["modes"][mode] = summary
        print(f"\n## {args.model}, {mode}: {summary['gpu_us']:.1f} us of GPU kernels {unit}")
        if args.decode:
            # NB: the wall time a step, unprofiled (one decode of each length, after the profiled ones), to set the
            # GPU's busy time against: a host-bound decode's GPU time is a small part of it
            summary["wall_us_a_step"] = wall_us
            summary["host_top"] = [{"op": k[:120], "self_cpu_us": v}
                                   for k, v in sorted(host.items(), key=lambda kv: -kv[1])[:args.top]]
            print(f"  wall {wall_us:.1f} us a step (unprofiled); the host's top operators by self CPU time a step "
                  f"(profiled):")
            for row in summary["host_top"][:15]:
                print(f"    {row['self_cpu_us']:>9.1f} us  {row['op'][:100]}")
        for kind, v in summary["kinds"].items():
            print(f"  {kind:<10} {v['us']:>10.1f} us  {100 * v['share']:5.1f}%")
        for row in summary["top"]:
            per = f"{row['launches']:>5.0f} x {row['us_a_launch']:8.2f}" if row.get("launches") else " " * 16
            shape = row.get("launch_shape")
            grid = (f" grid {'x'.join(map(str, shape['grid']))} block {'x'.join(map(str, shape['block']))}"
                    if shape else "")
            print(f"  {row['us']:>10.1f} us {100 * row['share']:5.1f}% {per}  [{row['kind']}] {row['kernel'][:100]}{grid}")
        if args.sources and mode != "eager":
            names = [r["kernel"] for r in summary["top"] if r["kernel"].startswith("triton_")][:args.sources]
            sources.update(inductor_sources(names, inductor_cache_dir()))
    out = Path(os.environ.get("OUT") or ROOT / "runs")
    out.mkdir(parents=True, exist_ok=True)
    if args.sources:
        text = "".join(f"# ===== {name}\n{src}\n" for name, src in sources.items())
        (out / f"compiled_profile_{args.model}_sources.txt").write_text(text or "# no Inductor kernel source found\n")
        print(f"# Triton sources of {len(sources)} kernel(s): compiled_profile_{args.model}_sources.txt")
    (out / f"compiled_profile_{args.model}.json").write_text(json.dumps(result, indent=1))


def _decoder(model, args_: tuple, kwargs_: dict, tokens: int, mode: str):
    """A function that greedy-decodes ``tokens`` tokens from the seed's prompt with a static KV cache: eagerly, or
    with the decode steps compiled in ``mode`` (``dynamic=None``, as transformers' generate compiles them)."""
    import contextlib

    from kforge.models import decode_steps, forward_as
    from kforge.models._generate import _generate

    ids = args_[0] if args_ else kwargs_.get("input_ids")
    if not isinstance(ids, torch.Tensor):
        raise SystemExit("--decode needs a language model whose seed input is its prompt's token ids")
    if mode == "eager":
        ctx = contextlib.nullcontext
    else:
        fwd = torch.compile(model.forward, mode=None if mode == "default" else mode, dynamic=None)
        ctx = lambda: forward_as(model, decode_steps(model, fwd))  # noqa: E731

    def run() -> None:
        with ctx():
            _generate(model, ids, tokens, "static")
    return run


if __name__ == "__main__":
    main()
