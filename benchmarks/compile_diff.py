"""How far plain torch.compile's output is from eager's, per backend, dtype and depth (issue 14).

On the H200 (2026-12-03) compiled Gemma 4 E2B (35 layers, bf16, 512-token prefill) gave an output
with a relative difference of 1.0 from eager's, and its compiled decode parted from eager's at the
second token; a 1-layer float32 Gemma agrees to 1e-6. This locates it: dynamo alone ("eager"),
AOTAutograd ("aot_eager") or Inductor ("inductor"), per dtype and depth.

    python3 benchmarks/compile_diff.py gemma4_e2b --layers 35,15 --backends aot_eager,inductor --dtypes bfloat16

With ``--float64`` every line also gives the distance from the same model computed in float64 (the
truth the rounding of either side departs from): which of eager and compile is nearer to it.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kforge import models  # noqa: E402
from kforge.deploy._report import first_tensor, float64_output, relative_difference  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=["gemma4_e2b", "qwen35_moe"])
    ap.add_argument("--layers", default="35")
    ap.add_argument("--backends", default="eager,aot_eager,inductor")
    ap.add_argument("--dtypes", default="bfloat16")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--attn", default="eager")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--float64", action="store_true", help="also the distance from the model computed in float64")
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds: start no case after this")
    args = ap.parse_args()
    t0 = time.perf_counter()
    build = getattr(models, args.model)
    for dtype in args.dtypes.split(","):
        for layers in (int(x) for x in args.layers.split(",")):
            model, ids = build(device=args.device, dtype=getattr(torch, dtype), layers=layers, tokens=args.tokens,
                               attn_implementation=args.attn)
            with torch.no_grad():
                ref = model(ids)
                again = model(ids)
            r = first_tensor(ref).float()
            ref64 = float64_output(model, (ids,), {}) if args.float64 else None
            from64 = lambda out: "" if ref64 is None else f", from float64 {relative_difference(ref64, out):.1e}"  # noqa: E731
            agree64 = lambda out: "" if ref64 is None else (  # noqa: E731
                f", argmax as float64's at {(first_tensor(out).float().argmax(-1) == ref64.argmax(-1)).float().mean().item():.1%}")
            print(f"{args.model} {dtype} layers={layers}: eager twice {relative_difference(ref, again):.1e}"
                  f"{from64(ref)}{agree64(ref)}", flush=True)
            for backend in args.backends.split(","):
                if time.perf_counter() - t0 > args.deadline:
                    print("deadline: stop", flush=True)
                    return
                torch._dynamo.reset()
                t = time.perf_counter()
                try:
                    with torch.no_grad():
                        out = torch.compile(model, backend=backend, dynamic=False)(ids)
                    o = first_tensor(out).float()
                    same = (o.argmax(-1) == r.argmax(-1)).float().mean().item()
                    print(f"  {backend:10s} rel diff {relative_difference(ref, out):.1e}, argmax agrees at {same:.1%} "
                          f"of positions{from64(out)}{agree64(out)}, finite {bool(torch.isfinite(o).all())} "
                          f"({time.perf_counter() - t:.0f} s)",
                          flush=True)
                except Exception as exc:
                    print(f"  {backend:10s} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            del model
            torch._dynamo.reset()


if __name__ == "__main__":
    main()
