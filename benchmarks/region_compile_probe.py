"""Why a region winner can make a compiled model slower: one model under torch.compile, in each of
``--modes`` (default and reduce-overhead), several ways in one run, timed interleaved against plain
compile; in default mode with a profile of each. Each line says how many times the kernel ran.

  plain        torch.compile through kforge's backend with no kernels (as plain torch.compile)
  aten path    the same, but through the ATen path region winners take (AOTAutograd run by kforge's
               backend, a pass that changes nothing, then Inductor): what that path alone costs
  region       the largest region card's winner (a short built-in search) in the graph
  region eager the same graph, the kernel released (the run op falls back to the region's reference;
               default mode only: a CUDA graph replays the launch it captured)

    python benchmarks/region_compile_probe.py gemma4_e2b --layers 2
    python benchmarks/region_compile_probe.py tiny_transformer --device cpu   # a smoke test

Prints a table and the top kernels of each arm's profile; writes region_compile_probe_<model>.txt to $OUT.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import kforge  # noqa: E402
from kforge.deploy._fallback import Arm, interleaved  # noqa: E402
from kforge.deploy._graph import KforgeBackend, compile_with  # noqa: E402
from kforge.deploy._runop import RUN_TABLE  # noqa: E402
from region_e2e import _model  # noqa: E402


def _compiled(model, kernels, force_aten: bool = False, mode: str | None = None):
    if not force_aten:
        return compile_with(model, kernels, dynamic=False, mode=None if mode == "default" else mode)
    kb = KforgeBackend(list(kernels), None if mode == "default" else mode, None, False)
    kb.aten_passes = [lambda gm: []]
    compiled = torch.compile(model, backend=kb, dynamic=False)
    object.__setattr__(compiled, "kforge_backend", kb)
    return compiled


def _profile(arms: dict, forward, device: str, log) -> None:
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    sort = "cuda_time_total" if device.startswith("cuda") else "cpu_time_total"
    for name, m in arms.items():
        with torch.no_grad():
            for _ in range(3):
                forward(m)
            with profile(activities=acts) as prof:
                for _ in range(5):
                    forward(m)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by=sort, row_limit=14, max_name_column_width=70)
        print(f"\n== {name} (5 forwards)\n{table}", file=log, flush=True)
        lines = table.splitlines()
        print(f"\n== {name}: top by {sort} (5 forwards)\n" + "\n".join(lines[:8] + lines[-3:]), flush=True)


_CUDAGRAPHS: list[tuple[int, int]] = []   # (inputs, static inputs) of each CUDA graph tree entry made


def _watch_cudagraphs() -> None:
    """Record how many of each CUDA-graphed function's inputs Inductor treats as static (kept in place;
    the others are copied into the graph's memory on every replay)."""
    try:
        from torch._inductor import cudagraph_trees
    except ImportError:
        return
    made = cudagraph_trees.cudagraphify_impl

    def watched(model, inputs, static_input_idxs, *a, **k):
        _CUDAGRAPHS.append((len(inputs), len(static_input_idxs)))
        return made(model, inputs, static_input_idxs, *a, **k)

    cudagraph_trees.cudagraphify_impl = watched


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--attn", default="eager")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--modes", default="default,reduce-overhead")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results")
    log = open(out / f"region_compile_probe_{args.model}.txt", "w")

    def say(*a):
        print(*a, flush=True)
        print(*a, file=log, flush=True)

    _watch_cudagraphs()
    model, inputs = _model(args.model, args)
    s = kforge.Session(model, inputs, device=args.device, workdir=tempfile.mkdtemp(prefix="kforge-probe-"))
    cards = s.capture(inductor_baseline=False)
    regions = sorted((c for c in cards if c.op == "region"), key=lambda c: -c.share)
    if not regions:
        raise SystemExit("no region cards")
    s.optimize(cards=[regions[0].key], iterations=args.iterations, confirm=False)
    ready = s._deployable(True)
    kernels, skipped = list(ready.kernels), ready.skipped
    say(f"# region {regions[0].signature[:100]} share {regions[0].share:.3f} calls {regions[0].calls}; "
        f"{len(kernels)} kernel(s) {skipped}")
    if not kernels:
        raise SystemExit("the search found no winner")
    batch_args, batch_kwargs = s._inputs()
    forward = lambda m: m(*batch_args, **batch_kwargs)  # noqa: E731
    compare = interleaved(args.device)
    dk = kernels[0]
    for mode in args.modes.split(","):
        torch._dynamo.reset()
        made = {"plain": _compiled(model, [], mode=mode), "region": _compiled(model, kernels, mode=mode)}
        made["aten path"] = _compiled(model, [], True, mode)
        with torch.no_grad():
            for name, m in made.items():
                t0 = time.perf_counter()
                del _CUDAGRAPHS[:]
                for _ in range(3 if mode == "reduce-overhead" else 1):   # CUDA graphs record on the 2nd or 3rd
                    forward(m)
                kb = m.kforge_backend
                say(f"# {mode} {name}: first calls {time.perf_counter() - t0:.1f} s, {len(kb.graphs)} graph(s) "
                    f"{[g.nodes for g in kb.graphs]}, replaced {len(kb.replaced)}"
                    + (f"; CUDA graphs (inputs, static) {_CUDAGRAPHS}" if _CUDAGRAPHS else ""))
        plain = Arm(lambda: forward(made["plain"]))
        for name in [n for n in made if n != "plain"]:
            before = dk.calls
            cmp = compare(Arm(lambda n=name: forward(made[n])), plain)
            say(f"{mode:<16} {name:<12} {cmp.with_us:9.1f} us against plain {cmp.without_us:9.1f} us: "
                f"{cmp.speedup:.3f}x (paired); kernel launches {dk.calls - before}")
        if mode == "default":
            RUN_TABLE.release(dk)
            gc.collect()   # kernels of the same binary that only garbage still holds drop out of the table
            if RUN_TABLE.entry(dk.run_name)[0] is not None:
                raise SystemExit("another holder still runs the region kernel: the released arm would time it")
            before = dk.calls
            cmp = compare(Arm(lambda: forward(made["region"])), plain)
            say(f"{mode:<16} {'region eager':<12} {cmp.with_us:9.1f} us against plain {cmp.without_us:9.1f} us: "
                f"{cmp.speedup:.3f}x (paired); kernel launches {dk.calls - before}")
            RUN_TABLE.register(dk)
        if mode == "default":
            _profile(made, forward, args.device, log)

    s.close()


if __name__ == "__main__":
    main()
