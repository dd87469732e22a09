#!/usr/bin/env bash
# One device call: the GPU tests that failed or were not reached in the last `device_session.sh tests`
# call (short tracebacks to $OUT/gpu_tests2.txt), then the region benchmark.
#   device run: bash benchmarks/device_followup.sh
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 KFORGE_CACHE=/tmp/kfc TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 230 python3 -m pytest -q -rfEs -p no:cacheprovider -o addopts="" --timeout=90 --tb=short \
    "tests/test_gpu.py::test_cuda_runner_sandbox_holds" "tests/test_gpu.py::test_cuda_forged_frame_is_a_status" \
    "tests/test_gpu.py::test_cuda_timed_calls_are_checked" "tests/test_gpu.py::test_deploy_under_cuda_graph_and_torch_compile" \
    tests/test_regions_gpu.py tests/test_compile.py "tests/test_deploy.py::test_works_under_torch_compile" \
    > "$OUT/gpu_tests2.txt" 2>&1
grep -v "^DEBUG" "$OUT/gpu_tests2.txt" | grep -E "^(E |FAILED|ERROR|SKIPPED|[0-9]+ (passed|failed))|Error|passed|failed" | cut -c1-300 | head -60
timeout 330 python3 benchmarks/regions.py --iterations 4 --layers 2 --deadline 240 > "$OUT/regions.txt" 2>&1
grep -v "^DEBUG" "$OUT/regions.txt" | tail -45
