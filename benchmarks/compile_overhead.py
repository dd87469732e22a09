"""How much longer kforge's graph-mode compile takes than plain torch.compile, and where the difference goes.

Gemma 4 E2B (as transformers builds it, bf16, 32 tokens) captured with regions on the CPU, its `rms_norm_rope` cards
searched with the built-in generator (one iteration), then compiled (Inductor's CPU backend) three times in one process, Inductor's caches
off: plain, through kforge with the cards' kernels, plain again (the second plain compile is the fair comparison: the
first pays one-time imports). With --profile, kforge's compile runs under cProfile and the time of each stage of its
backend is printed: its own AOTAutograd pass, its ATen passes, and Inductor's (second) AOTAutograd pass and codegen.

    python benchmarks/compile_overhead.py --layers 8 --profile
    python benchmarks/compile_overhead.py --layers 8 --warm   # caches on: a cold process, then a warm one

With --warm, Inductor's caches are on (a fresh cache directory) and the three compiles run in two processes one
after the other: the first fills the caches, the second is what a user's next process pays (``kforge.load`` and
``.compile`` on a server's start, say).

On the H200 (2026-12-04t) a 35-layer reduce-overhead compile took 145.3 s through kforge against 70.6 s plain.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import kforge  # noqa: E402
from kforge import models  # noqa: E402
from kforge.deploy import DeployedKernel, Deployment  # noqa: E402
from kforge.kernels import Kernel, compile_source  # noqa: E402

# the stages of kforge's backend, as cProfile names them (file suffix, function)
STAGES = {
    "kforge backend (all of it)": ("kforge/deploy/_graph.py", "__call__"),
    "after kforge's AOTAutograd: ATen passes and Inductor": ("kforge/deploy/_graph.py", "compile_aten"),
    "Inductor (its AOTAutograd and codegen)": ("torch/_inductor/compile_fx.py", "compile_fx"),
    "Inductor's codegen": ("torch/_inductor/compile_fx.py", "compile_fx_inner"),
}


def _kernels(model, ids) -> list[DeployedKernel]:
    s = kforge.Session(model, ids, device="cpu", workdir=Path(tempfile.mkdtemp(prefix="kforge-compile-overhead-")))
    s.capture(timing_budget_ms=2)
    cards = s.cards.by_op("rms_norm_rope")
    s.optimize(proposer="builtin", iterations=1, cards=[c.key for c in cards], confirm=False)
    out = []
    for c in cards:
        for cand in s.store.candidates(c.key):
            if cand.status is not None and cand.status.is_correct:
                out.append(DeployedKernel(c.variant, Kernel(compile_source(cand.source, "cpu", "native").path)))
                break
    return out


def _stages(profile: cProfile.Profile) -> dict[str, float]:
    stats = pstats.Stats(profile).stats   # {(file, line, name): (cc, nc, tt, ct, callers)}
    found: dict[str, float] = {}
    for label, (suffix, name) in STAGES.items():
        times = [v[3] for (f, _, n), v in stats.items() if f.endswith(suffix) and n == name]
        if times:
            found[label] = round(max(times), 2)
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--profile", action="store_true", help="kforge's compile under cProfile, its stages timed")
    ap.add_argument("--warm", action="store_true",
                    help="Inductor's caches on, in a fresh directory: the compiles in a cold process, then a warm one")
    ap.add_argument("--caches-on", action="store_true", help=argparse.SUPPRESS)   # a --warm child
    args = ap.parse_args()
    if args.warm:
        cache = tempfile.mkdtemp(prefix="kforge-compile-overhead-cache-")
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        runs = []
        for label in ("cold", "warm"):
            child = subprocess.run([sys.executable, __file__, "--layers", str(args.layers), "--caches-on"],
                                   env=env, capture_output=True, text=True, check=True)
            out = child.stdout   # NB: the result is the last object printed at a line's start (logs come before)
            runs.append({"process": label, **json.loads(out[out.rfind("\n{") + 1:])})
        print(json.dumps(runs, indent=1))
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], f"compile_overhead_warm_{args.layers}.json").write_text(json.dumps(runs, indent=1))
        return
    if not args.caches_on:
        torch._inductor.config.force_disable_caches = True
    model, ids = models.gemma4_e2b(dtype=torch.bfloat16, layers=args.layers, tokens=32)
    model.eval()
    kernels = _kernels(model, ids)
    result: dict = {"layers": args.layers, "kernels": len(kernels)}

    def plain() -> float:
        torch._dynamo.reset()
        start = time.perf_counter()
        torch.compile(model, dynamic=False)(ids)
        return time.perf_counter() - start

    with torch.no_grad():
        result["plain_first_s"] = round(plain(), 2)
        torch._dynamo.reset()
        profile = cProfile.Profile() if args.profile else None
        with Deployment(kernels, None) as dep:
            start = time.perf_counter()
            if profile is not None:
                profile.enable()
            compiled = dep.compile(model, dynamic=False)
            compiled(ids)
            if profile is not None:
                profile.disable()
            result["kforge_s"] = round(time.perf_counter() - start, 2)
            result["replaced"] = len(compiled.kforge_backend.replaced)
        result["plain_s"] = round(plain(), 2)
    if profile is not None:
        result["kforge_stages_s"] = _stages(profile)
    if args.caches_on:   # which caches the compiles hit (AOTAutograd's: the trace skipped; Inductor's: the codegen)
        from torch._dynamo.utils import counters

        result["cache_counters"] = {k: dict(counters[k]) for k in ("aot_autograd", "inductor") if counters[k]}
    print(json.dumps(result, indent=1))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"compile_overhead_{args.layers}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
