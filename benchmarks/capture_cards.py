"""Capture a seed workload on the GPU and print its card table (markdown) with CUDA-event latencies.

    python benchmarks/capture_cards.py resnet50 --dtype float32 --batch 8

Writes the table to $OUT/cards_<model>.md when OUT is set.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kforge  # noqa: E402
from kforge.models import build  # noqa: E402


def markdown(cards, device: str) -> str:
    bw = kforge.kernels.device_info(device).bandwidth_gbs
    lines = ["| share | calls | eager us | floor us | vendor | signature |", "|---:|---:|---:|---:|---|---|"]
    for c in cards:
        lines.append(f"| {c.share * 100:.1f}% | {c.calls} | {c.eager_us:.2f} | {c.roofline_us(bw):.2f} | "
                     f"{c.vendor or '-'} | `{c.signature}` |")
    lines.append(f"\ncaptured operators: {cards.captured_us:.0f} us; the model's forward: {cards.model_us:.0f} us "
                 f"(operators measured in isolation with L2 flushed, the model warm, so the ratio can pass 100%)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    kw = {"batch": args.batch} if args.batch else {}
    if args.layers:
        kw["layers"] = args.layers
    model, inputs = build(args.model, device=args.device, dtype=getattr(torch, args.dtype), **kw)
    session = kforge.Session(model, inputs, device=args.device, workdir=tempfile.mkdtemp(prefix="kforge-cap-"))
    start = time.perf_counter()
    cards = session.capture()
    took = time.perf_counter() - start
    table = markdown(cards, args.device)
    header = (f"{args.model} ({args.dtype}, {kw}) on {kforge.kernels.device_info(args.device).name}: "
              f"{len(cards)} variants, capture took {took:.1f} s\n\n")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"cards_{args.model}.md").write_text(header + table)
    print(header + table)


if __name__ == "__main__":
    main()
