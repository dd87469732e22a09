#!/usr/bin/env bash
# The seed-workload runs still owed to issue 8, resumable, each inside one 10-minute device call:
#   device run: bash benchmarks/device_seed.sh gemma      (then: qwen; again until no card is left)
# Each step appends finished cards to benchmarks/results/<model>.jsonl and archives the store
# (<model>_store.tgz); copies land in $OUT. Copy both back into benchmarks/results/ and commit
# before the next call, or it starts from the archive in the repo again.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 KFORGE_CACHE=/tmp/kfc
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S="python3 benchmarks/seed_workloads.py"
case "${1:-}" in
  gemma)  # the attention softmax at the paper's 50 iterations, then every other card, then end to end
    timeout 150 $S gemma4_e2b --attn eager --ops softmax --iterations 50 --deepen --no-e2e --skip-compile
    timeout 240 $S gemma4_e2b --attn eager --iterations 6 --deepen --max-cards 24 --no-e2e --skip-op-compile
    timeout 160 $S gemma4_e2b --attn eager --iterations 6 --max-cards 0 ;;  # end to end, compile included
  qwen)   # the router softmax first, then the rest of the 4-layer model's cards, then end to end
    timeout 150 $S qwen35_moe --layers 4 --ops softmax --iterations 50 --deepen --no-e2e --skip-compile
    timeout 240 $S qwen35_moe --layers 4 --iterations 6 --deepen --max-cards 40 --no-e2e --skip-op-compile
    timeout 160 $S qwen35_moe --layers 4 --iterations 6 --max-cards 0 ;;  # end to end, compile included
  *) echo "usage: bash benchmarks/device_seed.sh gemma|qwen" >&2; exit 2 ;;
esac
