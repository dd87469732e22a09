"""The hand-written reference kernels (tests/kernels/) through the evaluator, on both backends.

    python benchmarks/hand_written.py --device cuda
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kforge.capture import Card  # noqa: E402
from kforge.evaluate import Evaluator  # noqa: E402




def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    device = ap.parse_args().device
    backend = "cuda" if device.startswith("cuda") else "cpu"
    ext = "cu" if backend == "cuda" else "c"
    dt = torch.bfloat16 if backend == "cuda" else torch.float32
    big = backend == "cuda"
    r = lambda *s, dtype=torch.float32: torch.randn(*s, dtype=dtype, device=device)  # noqa: E731
    cases = [
        ("softmax_rows", Card.for_call("softmax", r(8, 262144) if big else r(64, 4096), -1)),
        ("softmax_rows", Card.for_call("softmax", r(512, 256), -1)),
        ("group_norm", Card.for_call("group_norm", r(1, 512, 128, 128, dtype=dt) if big else r(1, 64, 32, 32), 32,
                             r(512 if big else 64, dtype=dt if big else torch.float32),
                             r(512 if big else 64, dtype=dt if big else torch.float32), 1e-6)),
    ]
    with Evaluator(device) as ev:
        print("\n| kernel | variant | status | eager us | kernel us | speedup | roofline |")
        print("|---|---|---|---:|---:|---:|---:|")
        for name, card in cases:
            e = ev.evaluate(card, (ROOT / "tests" / "kernels" / backend / f"{name}.{ext}").read_text())
            roof = f"{e.roofline_fraction * 100:.0f}%" if e.roofline_fraction else "-"
            print(f"| {name}.{ext} | `{card.signature}` | {e.status.value} | {e.eager_us or 0:.2f} | "
                  f"{e.candidate_us or 0:.2f} | {e.speedup:.2f}x | {roof} |")


if __name__ == "__main__":
    main()
