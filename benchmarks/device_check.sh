#!/usr/bin/env bash
# One device call (at most 530 s of timeouts): the GPU tests, the elementwise strategies swept,
# the dispatch overhead and the L2-flush comparison.
#   device run: bash benchmarks/device_check.sh
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 KFORGE_CACHE=/tmp/kfc
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 30 python3 -m kforge.cli doctor 2>&1 | tee "$OUT/doctor.txt"
timeout 180 python3 -m pytest -q -rs tests/test_gpu.py -p no:cacheprovider -o addopts="" 2>&1 | tee "$OUT/test_gpu.txt" | tail -25
timeout 200 python3 benchmarks/builtin_kernels.py --only silu,add,relu,gelu --strategies vectorized,tiled --extra 6 \
    2>&1 | tee "$OUT/builtin_elementwise.txt" | grep -v "^    " | tail -80
timeout 60 python3 benchmarks/deploy_overhead.py --device cuda 2>&1 | tee "$OUT/deploy_overhead.txt" | tail -14
timeout 60 python3 benchmarks/flush_modes.py 2>&1 | tee "$OUT/flush_modes.txt"
