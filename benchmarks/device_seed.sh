#!/usr/bin/env bash
# The seed-workload runs still owed to issue 8, resumable, each inside one 10-minute device call:
#   device run: bash benchmarks/device_seed.sh gemma      (then: qwen)
# Results append to benchmarks/results/<model>.jsonl and the store archives; copies land in $OUT.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 KFORGE_CACHE=/tmp/kfc
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S="python3 benchmarks/seed_workloads.py"
case "${1:-}" in
  gemma)  # the attention softmax at the paper's 50 iterations, then every other card, then end to end
    timeout 200 $S gemma4_e2b --attn eager --ops softmax --iterations 50 --deepen --no-e2e --skip-compile
    timeout 330 $S gemma4_e2b --attn eager --iterations 6 --skip-op-compile ;;
  qwen)   # the router softmax first, then the rest of the 4-layer model's cards, then end to end
    timeout 200 $S qwen35_moe --layers 4 --ops softmax --iterations 50 --deepen --no-e2e --skip-compile
    timeout 330 $S qwen35_moe --layers 4 --iterations 4 --skip-op-compile ;;
  *) echo "usage: bash benchmarks/device_seed.sh gemma|qwen" >&2; exit 2 ;;
esac
