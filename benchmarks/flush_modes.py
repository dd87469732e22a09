"""Does the way the L2 is flushed change what a small kernel measures? (run on a GPU machine)

kforge's timing flushes the L2 before every repetition by writing a buffer twice its size
(kforge.evaluate.timing, as triton's do_bench does). That leaves the L2 full of dirty lines, which
the timed kernel must write back as it evicts them: for kernels that move a few MB this can add
the cost of writing back as many bytes as they touch. This script times the same operators
four ways, interleaved, to size that effect:

  write   the harness's flush: buf.zero_() on 2x L2, then the timed call
  read    a read-only flush: buf.sum() on 2x L2 (the L2 ends full of clean lines)
  rotate  no flush; inputs rotate over enough copies that none is in the L2 when used again
  warm    no flush, the same inputs every time (data in the L2: a lower bound)

    python benchmarks/flush_modes.py
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BF = torch.bfloat16
CASES = {
    "silu bf16[1,512,128,128]": (lambda: [torch.randn(1, 512, 128, 128, device="cuda", dtype=BF)], F.silu),
    "relu f32[8,64,112,112]": (lambda: [torch.randn(8, 64, 112, 112, device="cuda")], torch.relu),
    "softmax bf16[1,8,512,512] -> f32": (lambda: [torch.randn(1, 8, 512, 512, device="cuda", dtype=BF)],
                                         lambda x: torch.softmax(x, -1, dtype=torch.float32)),
    "group_norm bf16[1,512,128,128]": (lambda: [torch.randn(1, 512, 128, 128, device="cuda", dtype=BF),
                                                torch.randn(512, device="cuda", dtype=BF),
                                                torch.randn(512, device="cuda", dtype=BF)],
                                       lambda x, w, b: F.group_norm(x, 32, w, b)),
    "add f32[8,256,56,56]": (lambda: [torch.randn(8, 256, 56, 56, device="cuda"),
                                      torch.randn(8, 256, 56, 56, device="cuda")], torch.add),
}


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("this benchmark needs a CUDA GPU")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    buf = torch.empty(2 * l2 // 4, dtype=torch.int32, device="cuda")
    reps = 200
    print(f"L2 {l2 >> 20} MB; median of {reps} interleaved repetitions, CUDA events around the call only")
    print(f"{'operator':36} {'write':>8} {'read':>8} {'rotate':>8} {'warm':>8}   write/rotate")
    for label, (make, fn) in CASES.items():
        first = make()
        nbytes = sum(t.numel() * t.element_size() for t in first)
        copies = [first] + [make() for _ in range(max(1, (3 * l2) // max(1, nbytes)))]
        times = {m: [] for m in ("write", "read", "rotate", "warm")}
        for r in range(reps + 5):
            for mode in times:
                if mode == "write":
                    buf.zero_()
                elif mode == "read":
                    buf.sum()
                args = copies[r % len(copies)] if mode == "rotate" else first
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn(*args)
                end.record()
                times[mode].append((start, end))
        torch.cuda.synchronize()
        med = {m: statistics.median(s.elapsed_time(e) * 1e3 for s, e in v[5:]) for m, v in times.items()}
        print(f"{label:36} {med['write']:8.2f} {med['read']:8.2f} {med['rotate']:8.2f} {med['warm']:8.2f}   "
              f"{med['write'] / med['rotate']:.2f}x")


if __name__ == "__main__":
    main()
