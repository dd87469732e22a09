#!/usr/bin/env bash
# One device call each (every step under its own timeout, the whole call well inside 10 minutes).
#   device run: bash benchmarks/device_session.sh gpu44     issue 44: the GPU suite on the refactored code, the dispatch cost
#   device run: bash benchmarks/device_session.sh s29a      the dispatch cost's reason, the GPU tests session 28 did not reach, attention45
#   device run: bash benchmarks/device_session.sh s28a      session 28: the GPU suite, the CUDA attacks and replay, attention45
#   device run: bash benchmarks/device_session.sh s28b      session 28: every vendor-headed chain (carry [".carry"])
#   device run: bash benchmarks/device_session.sh s28c      session 28: the dispatch cost's warning, wgmma_tiles' GPU test, two CUTLASS chains
#   device run: bash benchmarks/device_session.sh vendor41  issues 45/41: vendor chains (carry build/cutlass), a seed model's repeatability
#   device run: bash benchmarks/device_session.sh rewrites45  issue 45: batch-norm folding on ResNet-50, eager and compile
#   device run: bash benchmarks/device_session.sh attention45  issue 45: the attention cards at the seed shapes against SDPA
#   device run: bash benchmarks/device_session.sh owed0607  the dispatch cost through a replayed plan and in process,
#                                                            what a user gets with replayed kernels (model-level figure)
#   device run: bash benchmarks/device_session.sh vendor    benchmarks/vendor_chains.py, KF_VENDOR_CASES (CUTLASS headers
#                                                            carried: cp -r <cutlass_library>/source/{include,tools}
#                                                            build/cutlass inside the carried tree)
#   device run: bash benchmarks/device_session.sh replay42  issue 42: CUDA replay's GPU tests and its attack corpus, the
#                                                            judge's CUDA attacks, eager regions, what a user gets
#   device run: bash benchmarks/device_session.sh eve41     issue 41: eager regions on torch 2.11 past dynamo's limit,
#                                                            what a user gets, a seed model's repeatability
#   device run: bash benchmarks/device_session.sh walls     the judge's GPU tests and CUDA attacks, the binary wall on nvcc
#                                                            builds, eager region deployment's GPU tests, then the
#                                                            evaluator's throughput before (.base/, carry [".base"]) and after
#   device run: bash benchmarks/device_session.sh repeat    benchmarks/repeatability.py --device cuda (KF_RUNS runs,
#                                                            KF_REPEAT_ARGS), then the experts' and recurrent GPU tests
#   device run: bash benchmarks/device_session.sh tests     GPU tests (kernels, judge attacks, regions, compile,
#                                                            deploy), the evaluator benchmark, a CLI capture
#   device run: bash benchmarks/device_session.sh judge     GPU tests of the evaluator and the region kernels,
#                                                            its throughput with the phase table, the
#                                                            hand-written regions
#   device run: bash benchmarks/device_session.sh final     graph-mode tests, the measured dispatch cost, ResNet-50
#                                                            and the SD3.5 VAE end to end (carry [".whl"])
#   device run: bash benchmarks/device_session.sh regions   benchmarks/regions.py: region kernels against eager
#                                                            and Inductor, in one run
#   device run: bash benchmarks/device_session.sh vision    benchmarks/device_e2e.sh vision (carry [".whl"])
#   device run: bash benchmarks/device_session.sh maxautotune  ResNet-50 end to end under max-autotune (a call of its own)
#   device run: bash benchmarks/device_session.sh sd35t     the SD3.5 transformer end to end (carry [".whl"])
#   device run: bash benchmarks/device_session.sh decode    tests/test_models_gpu.py, every case (which compiled
#                                                            decode arm segfaulted on 2026-12-02), -v
#   device run: bash benchmarks/device_session.sh control   the SD3.5 VAE end to end (its compile-mode check with the A/A
#                                                            control), graph-mode and decode GPU tests (carry [".whl"])
#   device run: bash benchmarks/device_session.sh fused     the SD3.5 VAE's group_norm -> SiLU pairs as fused cards,
#                                                            searched and end to end under compile (carry [".whl"])
#   device run: bash benchmarks/device_session.sh resnet    ResNet-50's region cards (channels-last twins where Inductor
#                                                            lays the graph out so) searched, then end to end under compile
#   device run: bash benchmarks/device_session.sh gdn       Qwen 3.5's gated delta rule as one kforge kernel: the operator
#                                                            against transformers' fallback, then the model end to end
#   device run: bash benchmarks/device_session.sh gdn_e2e   the same through kforge itself: the GPU tests of the strategy
#                                                            and of function capture, then Qwen 3.5 (4 layers) captured,
#                                                            its gated_delta_rule card searched, and end to end under
#                                                            KF_MODES with the model-level check (region_e2e.py)
#   device run: bash benchmarks/device_session.sh gdn_decode  Qwen 3.5 (4 layers) decoding through kforge: capture of
#                                                            Generate(model, 16) (the prompt and every one-token step),
#                                                            both gated_delta_rule cards searched, the model-level check
#                                                            over the whole decode, then decode tokens/s (eager, KF_MODES)
#   device run: bash benchmarks/device_session.sh gelu      the SD3.5 transformer's feed-forward GEMM + tanh GELU as one
#                                                            cuBLASLt call (linear_gelu): its GPU tests, then the model's
#                                                            linear_gelu cards searched and end to end (carry [".whl"])
#   device run: bash benchmarks/device_session.sh rope      Gemma 4's q/k RMSNorm + rotary embedding as one kernel
#                                                            (rms_norm_rope): its GPU tests, then Gemma 4 E2B's
#                                                            rms_norm_rope cards searched and end to end under KF_MODES
#   device run: bash benchmarks/device_session.sh sd35t_regions  the SD3.5 transformer's region and linear_gelu cards
#                                                            searched, then end to end under KF_MODES (carry [".whl"])
#   device run: bash benchmarks/device_session.sh profile   where compiled ResNet-50's and the SD3.5 VAE decoder's GPU time
#                                                            goes, by kernel and kind, with launches a forward
#                                                            (benchmarks/compiled_profile.py; carry [".whl"]; KF_PROFILE_MODELS
#                                                            picks models, KF_PROFILE_SOURCES=N the Inductor sources of the top N)
#   device run: bash benchmarks/device_session.sh moe       Qwen 3.5's experts as one kernel for decode steps (moe_experts):
#                                                            its GPU tests, then Qwen 3.5 (4 layers) decoding through kforge
#                                                            with gated_delta_rule and moe_experts, decode tokens/s
#   device run: bash benchmarks/device_session.sh moe_designs  moe_experts' two CUDA designs timed in one run at Qwen 3.5's
#                                                            decode step against batched_mm, then the moe GPU tests
#   device run: bash benchmarks/device_session.sh decode_profile  where Qwen 3.5's decode time goes, eager and compiled:
#                                                            GPU kernels and the host's operators a token
#   device run: bash benchmarks/device_session.sh twins     the GPU tests of the channels-last twins (test_fused.py -k gpu),
#                                                            then benchmarks/gn_twins.py: the VAE's group_norm -> SiLU twins,
#                                                            each CUDA design against eager and Inductor (KF_TWINS_OPS=
#                                                            "group_norm_silu biased_group_norm_silu": both forms)
#   device run: bash benchmarks/device_session.sh owed      the Gemma attention and Qwen router softmax searched at 50
#                                                            iterations, then graph-mode and decode GPU tests
#   device run: bash benchmarks/device_session.sh accuracy  the decode GPU test, then eager's and compile's distance from
#                                                            the float64 model (Gemma 4 E2B, 35 layers)
#   device run: bash benchmarks/device_session.sh region_e2e  region winners end to end (Gemma 4 E2B, 2 layers):
#                                                            capture with regions, search 4 region cards, the
#                                                            model under eager / compile default / reduce-overhead
#   device run: bash benchmarks/device_session.sh cluster   the local evaluator path's rate on this GPU (local:1)
#   device run: bash benchmarks/device_session.sh probe     benchmarks/region_compile_probe.py (a region winner under
#                                                            compile, four ways, profiled), the newest CUDA attacks,
#                                                            the hand-written regions with the launch probe
# Logs and JSON land in $OUT; figures go to docs/benchmarks.md with the command that made them.
set -uo pipefail
# NB: the caches live in the working tree's ignored /.device-cache/, which the device keeps between calls on a warm
# machine: a step too long for one call (max-autotune's first compile of Qwen 3.5 ran past 420 s, 2026-12-04c)
# fills Inductor's caches in a first call and finishes in a second call made at once (same command)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 KFORGE_CACHE=${KFORGE_CACHE:-$PWD/.device-cache/kernels} \
       TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$PWD/.device-cache/inductor}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# Inductor's autotuning choices carried between calls: the machine is handed back 30 s after a call, and a
# max-autotune first compile outruns one call. Its choices (select_algorithm's timings of every GEMM and convolution
# choice, cache/<system hash>; Triton's *.best_config) are small JSON files, written as each is tuned. A call finds
# them in .device-cache/autotune.tgz (carry [".device-cache/autotune.tgz"]) and leaves them, with what it tuned, in
# $OUT/autotune.tgz, also when a step's timeout cut it. With every timing found, Inductor neither precompiles nor
# benchmarks a GEMM's choices; it chooses as a fresh tune would, so the forwards' times are unchanged.
if [ -f .device-cache/autotune.tgz ]; then
  mkdir -p "$TORCHINDUCTOR_CACHE_DIR" && tar xzf .device-cache/autotune.tgz -C "$TORCHINDUCTOR_CACHE_DIR" \
    && echo "autotune choices restored: $(tar tzf .device-cache/autotune.tgz | wc -l) files"
fi
save_autotune() {
  [ -d "$TORCHINDUCTOR_CACHE_DIR" ] || return 0
  local files
  files=$(cd "$TORCHINDUCTOR_CACHE_DIR" && { [ -d cache ] && echo cache; find . -name "*.best_config" -not -path "./cache/*"; })
  [ -n "$files" ] || return 0   # nothing tuned (a step without max-autotune): no archive
  (cd "$TORCHINDUCTOR_CACHE_DIR" && echo "$files" | tar czf "$OUT/autotune.tgz" -T - 2>/dev/null) \
     && echo "autotune choices saved: $(tar tzf "$OUT/autotune.tgz" | wc -l) files in \$OUT/autotune.tgz"
}
trap save_autotune EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__)"
install_wheels() {   # diffusers for the SD3.5 models: carry [".whl"]
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-deps --root-user-action=ignore .whl/*.whl 2>&1 | tail -2
  else
    echo "NB: no .whl/ in this call: the SD3.5 models need diffusers (here: pip download diffusers importlib_metadata --no-deps -d .whl; then carry [\".whl\"])"
  fi
}
gpu_tests() {   # gpu_tests SECONDS "FILE..." NAME LINES: the test files' cases (-v), the log in $OUT/NAME.txt, its last LINES
  timeout "$1" python3 -m pytest -v -rfEs --tb=short -p no:cacheprovider -p no:logging -o addopts="" $2 2>&1 \
      | grep --line-buffered -v "^DEBUG" | tee "$OUT/$3.txt" \
      | grep -E "PASSED|SKIPPED|passed|failed|^E |FAILED|Error" | cut -c1-300 | tail -"$4"
}
e2e_step() {    # e2e_step SECONDS NAME ARGS...: benchmarks/region_e2e.py ARGS, the log in $OUT/NAME.txt
  local limit=$1 name=$2
  shift 2
  timeout "$limit" python3 benchmarks/region_e2e.py "$@" 2>&1 | grep --line-buffered -v "^DEBUG" | tee "$OUT/$name.txt" \
      | grep -v "Warning\|warn\|^$\|This call\|originates from\|File \"\|^    \|^E1\|AUTOTUNE" | tail -45
}
case "${1:-}" in
  tests)
    # NB: -v names each test as it ends, so a run cut off by the timeout still says what failed
    timeout 360 python3 -m pytest -v -rfEs --tb=short -p no:cacheprovider -p no:logging -o addopts="" --timeout=120 \
        tests/test_gpu.py tests/test_gpu_attacks.py tests/test_regions_gpu.py \
        "tests/test_compile.py" "tests/test_deploy.py::test_works_under_torch_compile" 2>&1 \
        | grep --line-buffered -v "^DEBUG" | tee "$OUT/gpu_tests.txt" | grep -E "FAILED|ERROR|passed|failed|^E " | cut -c1-300 | tail -40
    timeout 150 python3 benchmarks/evaluator.py --device cuda 2>&1 | tee "$OUT/evaluator_cuda.txt" | tail -30
    timeout 60 python3 -m kforge.cli capture --example tiny_cnn --device cuda --workdir /tmp/wd_cli --json \
        > "$OUT/cli_capture.json" 2> "$OUT/cli_capture.err"
    python3 - "$OUT/cli_capture.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
cards = d.get("cards", [])
print("cli capture on cuda:", len(cards), "cards; coverage", d.get("coverage"),
      "; shares sum", round(sum(c.get("share", 0) for c in cards), 3))
PY
    ;;
  judge)
    # the evaluator and the region generator after a change: GPU tests (the judge's attack corpus, the
    # generated region kernels against eager), the evaluator's throughput with the phase table, and the
    # hand-written regions (the clock cross-check on large sets; the losers of the last run)
    timeout 300 python3 -m pytest -v -rfEs --tb=short -p no:cacheprovider -p no:logging -o addopts="" --timeout=150 \
        tests/test_gpu.py tests/test_gpu_attacks.py tests/test_regions_gpu.py 2>&1 \
        | grep --line-buffered -v "^DEBUG" | tee "$OUT/gpu_tests.txt" | grep -E "FAILED|ERROR|passed|failed|^E " | cut -c1-300 | tail -30
    timeout 100 python3 benchmarks/evaluator.py --device cuda 2>&1 | tee "$OUT/evaluator_cuda.txt" | tail -25
    timeout 170 python3 benchmarks/regions.py --iterations "${KF_ITERATIONS:-6}" --models "" --deadline 130 2>&1 \
        | grep --line-buffered -v "^DEBUG" | tee "$OUT/regions_hand.txt" | tail -16 ;;
  final)
    # what a session's last call needs: graph-mode tests, the measured dispatch cost, the vision end to end
    # NB: 150 s: at 80 s the graph-mode tests were cut twice after their first test
    timeout 150 python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -o addopts="" tests/test_compile.py \
        "tests/test_deploy.py::test_works_under_torch_compile" 2>&1 | tee "$OUT/compile_tests.txt" | tail -6
    [ "${KF_DEPLOY_OVERHEAD:-0}" = 1 ] && timeout 60 python3 benchmarks/deploy_overhead.py --device cuda 2>&1 \
        | tee "$OUT/deploy_overhead.txt" | tail -8
    install_wheels
    timeout 150 python3 benchmarks/end_to_end.py resnet50 --modes default,reduce-overhead 2>&1 | grep --line-buffered -v "^DEBUG" \
        | tee "$OUT/e2e_resnet50.txt" | tail -22
    timeout 160 python3 benchmarks/end_to_end.py sd35_vae_decoder --modes default,reduce-overhead 2>&1 | grep --line-buffered -v "^DEBUG" \
        | tee "$OUT/e2e_vae.txt" | tail -22 ;;
  regions)
    install_wheels   # diffusers (carry [".whl"])
    timeout 140 python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -o addopts="" tests/test_regions_gpu.py 2>&1 \
        | tee "$OUT/regions_gpu_test.txt" | tail -8
    # NB: KF_ITERATIONS candidates a region (the default, eager's numerics, then one-choice neighbours)
    timeout 420 python3 benchmarks/regions.py --iterations "${KF_ITERATIONS:-5}" --layers 2 --max-model-regions 5 \
        --deadline 330 2>&1 \
        | grep --line-buffered -v "^DEBUG" | tee "$OUT/regions.txt" | tail -60 ;;
  vision)
    bash benchmarks/device_e2e.sh vision ;;
  maxautotune)
    # NB: its own call: on 2026-12-02 Inductor's autotuning of ResNet-50's convolutions outran a 150 s step,
    # and then a 560 s call (Triton conv templates). KF_CONV_BACKENDS=ATEN keeps max-autotune's GEMM
    # autotuning and CUDA graphs but times only ATen's convolutions (what the 2026-12-02g figures used).
    [ -n "${KF_CONV_BACKENDS:-}" ] && export TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS=$KF_CONV_BACKENDS
    timeout 540 python3 benchmarks/end_to_end.py resnet50 --modes max-autotune 2>&1 | grep --line-buffered -v "^DEBUG" \
        | grep -v "^  triton_\|^  convolution\|^AUTOTUNE\|^strides:\|^dtypes:\|^SingleProcess\|^Autotune\|^{\"num_choices" \
        | tee "$OUT/e2e_resnet50_max_autotune.txt" | tail -16 ;;
  decode)
    # NB: -v names each case as it ends: a segfault kills pytest, the last name printed is the case before it
    timeout 300 python3 -X faulthandler -m pytest -v -rfEs --tb=short -p no:cacheprovider \
        -o addopts="" tests/test_models_gpu.py 2>&1 | grep --line-buffered -v "^DEBUG" | tee "$OUT/decode_gpu_tests.txt" \
        | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed|Fatal|Segmentation|^E |File .*(cudagraph|launcher|kforge)" \
        | cut -c1-300 | head -40 ;;
  control)
    # the compile-mode check with its A/A control where kernels are placed (the VAE's group_norm winners),
    # then the graph-mode and decode GPU tests (carry [".whl"])
    install_wheels
    timeout 230 python3 benchmarks/end_to_end.py sd35_vae_decoder --modes default,reduce-overhead 2>&1 | grep --line-buffered -v "^DEBUG" \
        | tee "$OUT/e2e_vae.txt" | grep -v "^\[transformers\]\|UserWarning\|warn" | tail -24
    timeout 200 python3 -m pytest -v -rfEs --tb=short -p no:cacheprovider -o addopts="" --timeout=120 \
        tests/test_compile.py tests/test_models_gpu.py 2>&1 | grep --line-buffered -v "^DEBUG" | tee "$OUT/compile_gpu_tests.txt" \
        | grep -E "FAILED|ERROR|passed|failed|^E " | cut -c1-300 | tail -20 ;;
  fused)
    # the SD3.5 VAE decoder's group_norm -> SiLU pairs as fused group_norm_silu cards (graph capture; under compile
    # the channels-last twins, whose design is nhwc_tiles), searched with the built-in strategies, then the model
    # under compile default with and without them, then the GPU time per kernel of both arms (--profile)
    # (carry [".whl"]; the twins' GPU tests are in `twins`); then (KF_SOFTMAX_S=seconds) the Gemma attention
    # softmax at the paper's 50 iterations.
    # NB: no store by default: the VAE's examples (bf16 tensors of up to 512 MB) made archiving it outrun the step
    # (2026-12-03j); KF_STORE's is lean (no examples)
    # KF_STORE=runs/vae_store.tgz: the search's store without its examples, written there and into $OUT after the
    # search; a later call given it back (carry it) searches nothing again and spends its time on other modes
    # KF_MODES=max-autotune with KF_CONV_BACKENDS=ATEN: max-autotune's GEMM autotuning and CUDA graphs, the
    # convolutions from ATen (Triton's convolution templates did not finish autotuning in a call before)
    [ -n "${KF_CONV_BACKENDS:-}" ] && export TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS=$KF_CONV_BACKENDS
    install_wheels
    prof_mode=${KF_PROFILE_MODE-default}   # KF_PROFILE_MODE= (empty): no profile
    # --ops: the fused pairs and the lone group_norm (the mid-block attention's), each a channels-last twin
    timeout "${KF_VAE_S:-520}" python3 benchmarks/region_e2e.py sd35_vae_decoder --ops group_norm_silu,group_norm \
        --modes "${KF_MODES:-default}" --iterations "${KF_ITERATIONS:-1}" --max-cards "${KF_MAX_CARDS:-7}" --no-inductor-baseline \
        ${prof_mode:+--profile "$prof_mode"} ${KF_STORE:+--store "$KF_STORE" --lean-store} 2>&1 \
        | grep --line-buffered -v "^DEBUG" | tee "$OUT/fused_vae.txt" \
        | grep -v "Warning\|warn\|^$\|This call\|originates from\|File \"\|is_torch_version" | tail -45
    if [ -n "${KF_SOFTMAX_S:-}" ]; then
      timeout "$KF_SOFTMAX_S" python3 benchmarks/seed_workloads.py gemma4_e2b --attn eager --ops softmax --iterations 50 --deepen \
          --no-e2e --skip-compile 2>&1 | grep --line-buffered -v "^DEBUG" | tee "$OUT/seed_gemma_softmax.txt" \
          | grep -E "^##|winner|eager |failed|Error" | tail -6
    fi ;;
  resnet)
    # ResNet-50 (batch 8, f32): the region cards (the residual add + relu between convolutions, as the
    # channels-last twins Inductor's layout asks for) searched, then compile default with and without them;
    # and the GPU time per kernel of compile + kforge against plain compile (--profile). No store: ResNet-50's
    # was 897 MB, too large to come back from the device (2026-12-03)
    timeout "${KF_RESNET_S:-420}" python3 benchmarks/region_e2e.py resnet50 --ops region --modes "${KF_MODES:-default}" \
        --iterations "${KF_ITERATIONS:-3}" --max-cards "${KF_MAX_CARDS:-6}" --no-inductor-baseline --profile default 2>&1 \
        | grep --line-buffered -v "^DEBUG" | tee "$OUT/resnet_regions.txt" | grep -v "Warning\|warn\|^ \{4\}\|^$\|This call" | tail -40 ;;
  gdn)
    # Qwen 3.5's gated delta rule (transformers' PyTorch fallback) as one kforge kernel: every configuration of
    # the built-in CUDA strategy against the function eagerly and compiled alone, then the 4-layer model's
    # 512-token prefill eager and under compile (KF_MODES) with and without it, interleaved (benchmarks/gated_delta.py)
    timeout "${KF_GDN_S:-480}" python3 benchmarks/gated_delta.py --modes "${KF_MODES:-default,reduce-overhead}" 2>&1 \
        | grep --line-buffered -v "^DEBUG" | tee "$OUT/gated_delta.txt" \
        | grep -v "Warning\|warn\|^$\|This call\|originates from\|File \"\|is_torch_version\|^    \|^E1\|AUTOTUNE" | tail -40 ;;
  gdn_e2e)
    # KF_GDN_TESTS=0: no tests first (all the call's time to the model); KF_GDN_S=0: the tests only (they and the
    # model do not fit one 600 s call); KF_STORE=PATH.tgz: the search's store, resumed from when it exists and
    # written back (and into $OUT), so a later call times other modes unsearched
    if [ "${KF_GDN_TESTS:-1}" != 0 ]; then
      # NB: only the GPU-marked tests (-m gpu): with test_functions.py's CPU tests too, 150 s did not suffice
      # (2026-12-04c); all six GPU ones took 128 s on a cold machine (2026-12-04e), before barriers=1 doubled the configurations
      timeout "${KF_GDN_TESTS_S:-300}" python3 -m pytest -v -rfEs --tb=short -p no:cacheprovider -p no:logging -o addopts="" \
          -m gpu tests/test_recurrent_gpu.py tests/test_functions.py 2>&1 | grep --line-buffered -v "^DEBUG" \
          | tee "$OUT/gdn_tests.txt" | grep -E "PASSED|passed|failed|^E |FAILED|Error" | cut -c1-300 | tail -12
    fi
    [ "${KF_GDN_S:-270}" = 0 ] && exit 0   # NB: timeout 0 would be no limit at all
    timeout "${KF_GDN_S:-270}" python3 benchmarks/region_e2e.py qwen35_moe --layers 4 --experts grouped_mm \
        --ops gated_delta_rule --no-regions --iterations "${KF_ITERATIONS:-3}" --modes "${KF_MODES:-reduce-overhead,default}" \
        ${KF_STORE:+--store "$KF_STORE"} \
        2>&1 | grep --line-buffered -v "^DEBUG" | tee "$OUT/region_e2e_gdn.txt" \
        | grep -v "Warning\|warn\|^$\|This call\|originates from\|File \"\|^    \|^E1\|AUTOTUNE" | tail -45 ;;
  gdn_decode)
    # Qwen 3.5 decoding through kforge (issue 14's decode tokens/s): the session's model is Generate(model, N), so
    # capture sees the prompt and each one-token step (two gated_delta_rule cards); then decode tokens/s, eager
    # and each of KF_MODES, with and without the kernels (region_e2e.py --decode). KF_STORE as in gdn_e2e.
    e2e_step "${KF_DECODE_S:-560}" region_e2e_decode qwen35_moe --layers 4 --experts grouped_mm \
        --ops gated_delta_rule --no-regions --decode "${KF_DECODE_TOKENS:-16}" --iterations "${KF_ITERATIONS:-3}" \
        --modes "${KF_MODES:-reduce-overhead}" --rounds "${KF_ROUNDS:-6}" ${KF_STORE:+--store "$KF_STORE"} ;;
  profile)
    install_wheels
    # KF_PROFILE_MODELS: which seed models (default: the two vision ones); Qwen 3.5 at 4 layers, grouped_mm
    # experts, as its end-to-end rows run
    for m in ${KF_PROFILE_MODELS:-resnet50 sd35_vae_decoder}; do
      extra=""; [ "$m" = qwen35_moe ] && extra="--layers 4 --experts grouped_mm"
      # KF_PROFILE_SOURCES=N: also the Triton source of the N largest Inductor kernels a mode (a cold compile)
      timeout "${KF_PROFILE_S:-200}" python3 benchmarks/compiled_profile.py $m $extra --modes "${KF_MODES:-default}" \
          --sources "${KF_PROFILE_SOURCES:-0}" 2>&1 \
          | grep --line-buffered -v "^DEBUG\|Warning\|warn" | tee "$OUT/compiled_profile_$m.txt" | tail -45
    done ;;
  moe)
    # Qwen 3.5's experts as one kernel for decode steps (moe_experts): its GPU tests, then Qwen 3.5 (4 layers)
    # decoding through kforge with gated_delta_rule and moe_experts (capture of Generate(model, N), their cards
    # searched, the model-level check over the whole decode, decode tokens/s eager and KF_MODES).
    # KF_MOE_TESTS=0: no tests; KF_MOE_S=0: tests only
    if [ "${KF_MOE_TESTS:-1}" != 0 ]; then
      gpu_tests "${KF_MOE_TESTS_S:-150}" tests/test_moe_experts.py moe_experts_tests 18
    fi
    [ "${KF_MOE_S:-420}" = 0 ] && exit 0
    e2e_step "${KF_MOE_S:-420}" region_e2e_moe_decode qwen35_moe --layers 4 --experts grouped_mm \
        --ops gated_delta_rule,moe_experts --no-regions --decode "${KF_DECODE_TOKENS:-16}" --iterations "${KF_ITERATIONS:-3}" \
        --modes "${KF_MODES:-reduce-overhead}" --rounds "${KF_ROUNDS:-6}" ${KF_STORE:+--store "$KF_STORE"} ;;
  moe_designs)
    # both CUDA designs of moe_experts timed in one run at Qwen 3.5's decode step (gemv_two_pass and gemv_pairs,
    # each default config plus KF_EXTRA sampled ones, against transformers' batched_mm), then the GPU cases of both
    # at every shape (about 100 s: 2026-12-04v's 80 s limit cut them)
    timeout 150 python3 benchmarks/builtin_kernels.py --only moe --extra "${KF_EXTRA:-5}" 2>&1 | grep -v "^DEBUG" \
        | tee "$OUT/moe_designs.txt" | tail -16
    gpu_tests "${KF_MOE_TESTS_S:-200}" "tests/test_moe_experts.py" moe_experts_tests 12 ;;
  decode_profile)
    # where Qwen 3.5's decode time goes (4 layers, grouped_mm experts, 16 tokens, static cache): GPU kernels a token
    # and the host's top operators by self CPU time, eager and KF_MODES (compiled_profile.py --decode)
    timeout "${KF_PROFILE_S:-200}" python3 benchmarks/compiled_profile.py qwen35_moe --layers 4 --experts grouped_mm \
        --decode "${KF_DECODE_TOKENS:-16}" --modes "${KF_MODES:-reduce-overhead}" --top 25 2>&1 \
        | grep --line-buffered -v "^DEBUG\|Warning\|warn" | tee "$OUT/decode_profile_qwen35_moe.txt" | tail -80 ;;
  twins)
    # KF_TWINS_TESTS: pytest node ids to run instead of every GPU test of test_fused.py ("0": none)
    if [ "${KF_TWINS_TESTS:-}" != "0" ]; then
      timeout "${KF_TWINS_TESTS_S:-150}" python3 -m pytest -v -rfEs --tb=short -p no:cacheprovider -p no:logging -o addopts="" \
          ${KF_TWINS_TESTS:-tests/test_fused.py -k gpu} -s 2>&1 \
          | grep --line-buffered -v "^DEBUG" | tee "$OUT/fused_gpu_test.txt" | grep -E "PASSED|FAILED|passed|failed|^E |nhwc_tiles" | cut -c1-300 | tail -16
    fi
    # KF_TWINS_OPS: group_norm_silu and/or biased_group_norm_silu (the convolution's bias as a prologue)
    for op in ${KF_TWINS_OPS:-group_norm_silu}; do
      timeout "${KF_TWINS_S:-300}" python3 benchmarks/gn_twins.py --op "$op" --configs "${KF_TWINS_CONFIGS:-4}" \
          --deadline "${KF_TWINS_DEADLINE:-200}" 2>&1 | grep --line-buffered -v "^DEBUG" | tee "$OUT/gn_twins_$op.txt" | tail -30
    done ;;
  owed)
    # issue 14's owed seed searches (the Gemma attention softmax and the Qwen router softmax at the paper's 50
    # iterations; stores and .jsonl land in $OUT), then the graph-mode and decode GPU tests
    S="python3 benchmarks/seed_workloads.py"
    timeout 150 $S gemma4_e2b --attn eager --ops softmax --iterations 50 --deepen --no-e2e --skip-compile 2>&1 \
        | grep --line-buffered -v "^DEBUG" | tee "$OUT/seed_gemma_softmax.txt" | grep -E "^##|winner|eager |failed|Error" | tail -8
    timeout 150 $S qwen35_moe --layers 4 --ops softmax --iterations 50 --deepen --no-e2e --skip-compile 2>&1 \
        | grep --line-buffered -v "^DEBUG" | tee "$OUT/seed_qwen_softmax.txt" | grep -E "^##|winner|eager |failed|Error" | tail -8
    [ "${KF_TESTS:-1}" = 1 ] && timeout 200 python3 -m pytest -v -rfEs --tb=short -p no:cacheprovider -o addopts="" --timeout=120 \
        tests/test_compile.py tests/test_models_gpu.py 2>&1 | grep --line-buffered -v "^DEBUG" | tee "$OUT/compile_gpu_tests.txt" \
        | grep -E "FAILED|ERROR|passed|failed|^E " | cut -c1-300 | tail -20 ;;
  accuracy)
    # the decode GPU test as it now compiles (steps only, dynamic=None), then which of eager and compile is
    # nearer the float64 model (Gemma 4 E2B, 35 layers, bf16 and float32)
    timeout 200 python3 -X faulthandler -m pytest -v -rfEs --tb=short -p no:cacheprovider \
        -o addopts="" tests/test_models_gpu.py 2>&1 | grep --line-buffered -v "^DEBUG" | tee "$OUT/decode_gpu_tests.txt" \
        | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed|Fatal|Segmentation|^E " | cut -c1-300 | head -30
    timeout 330 python3 benchmarks/compile_diff.py gemma4_e2b --layers 35 --backends inductor --dtypes bfloat16,float32 \
        --float64 --deadline 250 2>&1 | grep --line-buffered -v "^DEBUG" | tee "$OUT/compile_diff_float64.txt" | tail -8 ;;
  gelu)
    # the SD3.5 transformer's feed-forward as linear_gelu (the GEMM and its tanh GELU in one cuBLASLt call with the
    # GELU_BIAS epilogue): its GPU tests, then the model captured with regions, its linear_gelu cards searched, and
    # end to end under KF_MODES with the model-level check (carry .whl). KF_GELU_TESTS=0: no tests; KF_GELU_S=0: tests only
    install_wheels
    if [ "${KF_GELU_TESTS:-1}" != 0 ]; then
      gpu_tests "${KF_GELU_TESTS_S:-150}" tests/test_linear_gelu.py linear_gelu_tests 16
    fi
    [ "${KF_GELU_S:-420}" = 0 ] && exit 0
    e2e_step "${KF_GELU_S:-420}" region_e2e_linear_gelu sd35_transformer --ops linear_gelu --no-inductor-baseline \
        --iterations "${KF_ITERATIONS:-2}" --max-cards 4 --modes "${KF_MODES:-reduce-overhead}" ${KF_STORE:+--store "$KF_STORE"} \
        --lean-store ;;
  rope)
    # Gemma 4's q/k RMSNorm + rotary embedding as one kernel (rms_norm_rope): its GPU tests, then Gemma 4 E2B
    # (KF_ROPE_LAYERS, default 35, 512-token prefill) captured with regions, its rms_norm_rope cards searched, and
    # end to end under KF_MODES with the model-level check. KF_ROPE_TESTS=0: no tests; KF_ROPE_S=0: tests only.
    # NB: both do not fit one call (tests about 140 s, the model step about 500 s at 35 layers: capture 89 s, search
    # 15 s, three reduce-overhead compiles); the tests passed on the H200 (2026-12-04n, p): KF_ROPE_TESTS=0
    if [ "${KF_ROPE_TESTS:-1}" != 0 ]; then
      gpu_tests "${KF_ROPE_TESTS_S:-200}" tests/test_rms_norm_rope.py rms_norm_rope_tests 14
    fi
    [ "${KF_ROPE_S:-560}" = 0 ] && exit 0
    e2e_step "${KF_ROPE_S:-560}" region_e2e_rms_norm_rope gemma4_e2b --layers "${KF_ROPE_LAYERS:-35}" \
        --ops rms_norm_rope --no-inductor-baseline --iterations "${KF_ITERATIONS:-3}" --max-cards 4 \
        --modes "${KF_MODES:-reduce-overhead}" ${KF_STORE:+--store "$KF_STORE"} --lean-store ;;
  sd35t_regions)
    # the SD3.5 transformer's region cards (adaLN's layer_norm + modulation, the gated residual adds, the q/k
    # RMSNorms: 1.10x-1.38x over Inductor's kernels alone on 2026-12-02) and its linear_gelu cards searched
    # together, then end to end under KF_MODES with the model-level check, which weighs each operator's kernels
    # together (carry [".whl"]). Never run: if the 560 s do not cover the search and three compiles, give
    # KF_STORE=$OUT/sd35t_store.tgz, then carry the file back as .device-cache/sd35t_store.tgz
    # (KF_STORE=.device-cache/sd35t_store.tgz): the second call searches nothing again
    install_wheels
    e2e_step "${KF_SD35T_S:-560}" region_e2e_sd35t_regions sd35_transformer --ops region,linear_gelu \
        --no-inductor-baseline --iterations "${KF_ITERATIONS:-3}" --max-cards "${KF_MAX_CARDS:-12}" \
        --modes "${KF_MODES:-reduce-overhead}" ${KF_STORE:+--store "$KF_STORE"} --lean-store ;;
  sd35t)
    install_wheels
    timeout 560 python3 benchmarks/end_to_end.py sd35_transformer --modes "${KF_MODES:-default,reduce-overhead}" 2>&1 \
        | grep --line-buffered -v "^DEBUG" | tee "$OUT/e2e_sd35_transformer.txt" | tail -16 ;;
  cluster)
    # the local multi-device path's rate on this GPU (the Ray issue's GPU figure; Ray itself cannot travel here)
    timeout 120 python3 benchmarks/cluster_throughput.py --device cuda --configs local:1 2>&1 | grep --line-buffered -v "^DEBUG" \
        | tee "$OUT/cluster_cuda.txt" | tail -4 ;;
  region_e2e)
    # NB: 370 s cut the first run inside the end-to-end check (capture 86 s with each region's Inductor
    # baseline, search of 6 cards 98 s, then n + 2 compiled forwards per mode)
    timeout 560 python3 benchmarks/region_e2e.py gemma4_e2b --layers 2 --iterations 4 --max-cards 4 \
        --no-inductor-baseline 2>&1 | grep --line-buffered -v "^DEBUG" | tee "$OUT/region_e2e_gemma.txt" | tail -40 ;;
  probe)
    # why a region winner slowed the compiled model (region_e2e of 2026-12-02: 0.55x in default mode, 0.53x in
    # reduce-overhead, with one region kernel): plain / ATen path / region / region released, profiles; then the
    # corpus's newest CUDA attacks and the hand-written regions with the launch probe
    TORCH_LOGS=perf_hints timeout 330 python3 benchmarks/region_compile_probe.py gemma4_e2b --layers 2 2>"$OUT/probe.err" \
        | grep --line-buffered -v "^DEBUG" | tee "$OUT/probe.txt" | tail -60
    grep -i "skipping cudagraph" "$OUT/probe.err" | sort | uniq -c | head -5
    # NB: the attacks only when asked (KF_ATTACKS="..."): all of them passed on the H200 on 2026-12-02
    [ -n "${KF_ATTACKS:-}" ] && timeout 150 python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -o addopts="" \
        --timeout=60 tests/test_gpu_attacks.py -k "$KF_ATTACKS" 2>&1 \
        | tee "$OUT/gpu_attacks.txt" | grep -E "FAILED|ERROR|passed|failed|^E " | cut -c1-300 | tail -15
    timeout 120 python3 benchmarks/regions.py --iterations 3 --models "" --deadline 90 2>&1 \
        | grep --line-buffered -v "^DEBUG" | tee "$OUT/regions_hand.txt" | tail -14 ;;
  walls)
    # issue 42's walls on the GPU: the judge's GPU tests and CUDA attacks (sealed inputs, re-checks, the binary's
    # imports), the binary wall on real nvcc builds, eager region deployment's GPU tests; then the evaluator's
    # throughput before (the tree of 873fb26 carried in .base/: carry [".base"]) and after, in this one call
    gpu_tests "${KF_WALLS_TESTS_S:-300}" "${KF_WALLS_TESTS:-tests/test_gpu.py tests/test_gpu_attacks.py tests/test_binary_wall.py tests/test_linear_gelu.py tests/test_regions_gpu.py tests/test_eager_regions.py}" \
        walls_gpu_tests 30
    if [ -d .base/kforge ]; then
      (cd .base && PYTHONPATH=$PWD KFORGE_CACHE=/tmp/kf-bench-before timeout 110 python3 benchmarks/evaluator.py --device cuda \
          --json "$OUT/evaluator_cuda_before.json" 2>&1 | tail -14)
    fi
    KFORGE_CACHE=/tmp/kf-bench-after timeout 110 python3 benchmarks/evaluator.py --device cuda \
        --json "$OUT/evaluator_cuda_after.json" 2>&1 | tail -14 ;;
  owed41)
    # the GPU runs owed at the end of 2026-12-06's first session: the eager region deployment's and the cuBLASLt
    # link's GPU tests, the libc-walk attack and nvcc builds through the compiler's jail; then issue 41's GPU
    # repeatability table (KF_REPEAT_ARGS) and what an eager and a compiled user get (what_a_user_gets.py)
    gpu_tests "${KF_OWED_TESTS_S:-150}" "-m gpu tests/test_eager_regions.py tests/test_linear_gelu.py" owed_gpu_tests 20
    gpu_tests 90 "-k libc_walk tests/test_gpu_attacks.py" owed_libc_walk 6
    timeout "${KF_REPEAT_S:-240}" python3 benchmarks/repeatability.py --device cuda --runs "${KF_RUNS:-5}" \
        ${KF_REPEAT_ARGS:---example tiny_chains --cards 3} --json-out "$OUT/repeatability_cuda.json" 2>&1 \
        | grep --line-buffered -v "^DEBUG" | tee "$OUT/repeatability_cuda.txt" | tail -30
    timeout "${KF_USER_S:-130}" python3 benchmarks/what_a_user_gets.py --device cuda --modes "${KF_MODES:-default}" \
        --json "$OUT/what_a_user_gets_cuda.json" 2>&1 | grep --line-buffered -v "^DEBUG\|Warning\|warn_once" \
        | tee "$OUT/what_a_user_gets_cuda.txt" | tail -30 ;;
  gpu44)
    [ -d build/cutlass ] && export CUTLASS_PATH=$PWD/build/cutlass
    # issue 44 (2026-12-07): the GPU suite on the refactored code (kernel ABI header, traced patterns, one deployment
    # plan, CUDA replay by default), with the dispatch cost through a replayed plan and in process first
    for r in 1 0; do
      KFORGE_CUDA_REPLAY=$r timeout 60 python3 -c "from kforge.deploy import measure_dispatch_cost as m; print('KFORGE_CUDA_REPLAY=$r:', m('cuda').describe())" 2>&1 | grep -v "Warn" | tail -2
    done | tee "$OUT/dispatch_cost.txt"
    gpu_tests "${KF_GPU_A_S:-250}" "-m gpu tests/test_gpu.py tests/test_regions_gpu.py tests/test_compile.py tests/test_eager_regions.py tests/test_functions.py tests/test_linear_gelu.py tests/test_moe_experts.py tests/test_rms_norm_rope.py tests/test_abi.py" gpu44_a 30
    gpu_tests "${KF_GPU_B_S:-230}" "${KF_GPU_B_FILES:-tests/test_gpu_attacks.py tests/test_gpu_replay.py}" gpu44_b 20 ;;
  s29a)
    # what session 28's calls did not reach: why the dispatch cost fell back (warnings shown), the GPU tests its suite
    # was cut before (moe_experts, rms_norm_rope, the ABI, attention with both CUDA designs, the current stream both
    # ways), then the attention cards with flash_tiles and wgmma_tiles against eager's SDPA and compile. wgmma_tiles
    # builds with CuTe: the CUTLASS headers carried compressed in .carry/cutlass.tar.xz (66 builds, ~2 min on 16 cores)
    if [ -f .carry/cutlass.tar.xz ]; then mkdir -p build/cutlass && tar xJf .carry/cutlass.tar.xz -C build/cutlass; fi
    [ -d build/cutlass ] && export CUTLASS_PATH=$PWD/build/cutlass
    KFORGE_CUDA_REPLAY=1 timeout 40 python3 -W always -c "from kforge.deploy import measure_dispatch_cost as m; print('replayed plan:', m('cuda').describe())" 2>&1 | grep -v "^DEBUG" | tail -6 | cut -c1-600 | tee "$OUT/dispatch_cost.txt"
    gpu_tests "${KF_GPU_A_S:-330}" "-m gpu tests/test_moe_experts.py tests/test_rms_norm_rope.py tests/test_abi.py tests/test_attention.py tests/test_attention_wgmma.py tests/test_gpu.py::test_a_deployed_cuda_kernel_launches_on_the_current_stream" s29_a 30
    timeout "${KF_ATT_S:-200}" python3 benchmarks/attention.py --device cuda --modes "${KF_ATT_MODES:-default}" \
        --jobs 15 --json-out "$OUT/attention.json" 2>&1 | grep --line-buffered -v "^DEBUG" | tee "$OUT/attention.txt" \
        | tail -12 ;;
  s28a)
    # session 28's first call: the GPU suite on the current code (the attention family's GPU test in it), the judge's
    # CUDA attacks and replay, then the attention cards at the seed shapes against eager's SDPA and compile
    KFORGE_CUDA_REPLAY=1 timeout 60 python3 -c "from kforge.deploy import measure_dispatch_cost as m; print('replayed plan:', m('cuda').describe())" 2>&1 | grep -v "Warn" | tail -2 | tee "$OUT/dispatch_cost.txt"
    gpu_tests "${KF_GPU_A_S:-230}" "-m gpu tests/test_gpu.py tests/test_regions_gpu.py tests/test_compile.py tests/test_eager_regions.py tests/test_functions.py tests/test_linear_gelu.py tests/test_moe_experts.py tests/test_rms_norm_rope.py tests/test_abi.py tests/test_attention.py" s28_a 30
    gpu_tests "${KF_GPU_B_S:-150}" "tests/test_gpu_attacks.py tests/test_gpu_replay.py" s28_b 16
    timeout "${KF_ATT_S:-140}" python3 benchmarks/attention.py --device cuda --modes "${KF_ATT_MODES:-default}" \
        --jobs 14 --json-out "$OUT/attention.json" 2>&1 | grep --line-buffered -v "^DEBUG" | tee "$OUT/attention.txt" \
        | tail -24 ;;
  s28b)
    # session 28's vendor call: every GEMM- and convolution-headed chain through kforge's compile path (CUTLASS headers
    # carried compressed: carry [".carry"], .carry/cutlass.tar.xz = include/ and tools/ of the nvidia-cutlass wheel)
    # against eager, compile default and compile max-autotune; KF_VENDOR_CASES picks cases (default: all)
    if [ -f .carry/cutlass.tar.xz ]; then mkdir -p build/cutlass && tar xJf .carry/cutlass.tar.xz -C build/cutlass; fi
    KFORGE_CACHE="${KFORGE_CACHE:-/tmp/kcache}" timeout "${KF_VENDOR_S:-560}" python3 benchmarks/vendor_chains.py \
        --device cuda --cutlass build/cutlass --cases "${KF_VENDOR_CASES:-}" --jobs 15 \
        --budget-s "${KF_VENDOR_BUDGET_S:-470}" --json-out "$OUT/vendor.json" 2>&1 | grep --line-buffered -v "^DEBUG" \
        | grep -v "^AUTOTUNE\|^  triton_\|^  mm \|^  addmm\|^  bmm\|^  convolution\|^strides:\|^dtypes:\|^SingleProcess\|^Autotune\|num_choices" \
        | tee "$OUT/vendor.txt" | tail -60 ;;
  s28c)
    # session 28's last call (little budget left): why the dispatch cost fell back, the tensor-core attention design's
    # GPU test, then two vendor chains through CUTLASS (the wall's fix) against eager and compile default
    KFORGE_CUDA_REPLAY=1 timeout 40 python3 -W always -c "from kforge.deploy import measure_dispatch_cost as m; print('replayed plan:', m('cuda').describe())" 2>&1 | grep -v "^DEBUG" | tail -6 | cut -c1-600 | tee "$OUT/dispatch_cost.txt"
    if [ -f .carry/cutlass.tar.xz ]; then mkdir -p build/cutlass && tar xJf .carry/cutlass.tar.xz -C build/cutlass; fi
    [ -d build/cutlass ] && export CUTLASS_PATH=$PWD/build/cutlass
    gpu_tests "${KF_WGMMA_S:-300}" "-m gpu tests/test_attention_wgmma.py tests/test_gpu.py::test_a_deployed_cuda_kernel_launches_on_the_current_stream" s28_c 24
    KFORGE_CACHE=/tmp/kcache timeout "${KF_VENDOR_S:-110}" python3 benchmarks/vendor_chains.py --device cuda \
        --cutlass build/cutlass --cases "${KF_VENDOR_CASES:-gemm_bias_relu,conv_bn_relu_resnet3x3}" --modes default --jobs 15 \
        --budget-s 60 --json-out "$OUT/vendor.json" 2>&1 | grep --line-buffered -v "^DEBUG\|^E1\|AUTOTUNE" \
        | tee "$OUT/vendor.txt" | tail -8 ;;
  vendor41)
    # issues 45 and 41 (2026-12-07): vendor-headed chains (CUTLASS through kforge's compile path, in parallel, then
    # eager / compile default / max-autotune / kforge; carry build/cutlass), then a seed model's repeatability
    [ -d build/cutlass ] && export CUTLASS_PATH=$PWD/build/cutlass
    KFORGE_CACHE="${KFORGE_CACHE:-/tmp/kcache}" timeout "${KF_VENDOR_S:-320}" python3 benchmarks/vendor_chains.py \
        --device cuda --cutlass build/cutlass --cases "${KF_VENDOR_CASES:-gemm_bias_relu,gemm_bias_gelu_sd35,conv_bn_relu_resnet3x3}" \
        --jobs 14 --budget-s "${KF_VENDOR_BUDGET_S:-240}" --json-out "$OUT/vendor.json" 2>&1 | grep --line-buffered -v "^DEBUG" \
        | tee "$OUT/vendor.txt" | tail -30
    timeout "${KF_REPEAT_S:-250}" python3 benchmarks/repeatability.py --device cuda --runs "${KF_RUNS:-5}" \
        ${KF_REPEAT_ARGS:---model gemma4_e2b --layers 2 --cards 3} --json-out "$OUT/repeatability_cuda.json" 2>&1 \
        | grep --line-buffered -v "^DEBUG" | tee "$OUT/repeatability_cuda.txt" | tail -25 ;;
  attention45)
    # issue 45: the attention cards at the seed shapes (Gemma 4's sliding and full layers, the SD3.5 joint attention,
    # a soft-capped written-out chain), every flash_tiles configuration against eager's SDPA and compile, one run
    timeout "${KF_ATT_S:-400}" python3 benchmarks/attention.py --device cuda --modes "${KF_ATT_MODES:-default}" \
        --jobs 14 --json-out "$OUT/attention.json" 2>&1 | grep --line-buffered -v "^DEBUG" | tee "$OUT/attention.txt" \
        | tail -20 ;;
  rewrites45)
    # issue 45: batch norm folded into the convolution before it and channels-last chains, ResNet-50 eager / compile
    # default with and without each
    timeout "${KF_RW_S:-560}" python3 benchmarks/rewrites.py --device cuda --batch "${KF_RW_BATCH:-32}" --resolution 224 \
        --rounds "${KF_RW_ROUNDS:-20}" --reps 10 --sets "${KF_RW_SETS:-fold_batch_norm,channels_last,fold_batch_norm+channels_last}" \
        --json-out "$OUT/rewrites_cuda.json" 2>&1 | grep -v "^DEBUG" \
        | tee "$OUT/rewrites_cuda.txt" | tail -20 ;;
  owed0607)
    # issue 41/42, 2026-12-07: what the dispatch cost is through a replayed plan (the default) and in process, then the
    # model-level figure of what_a_user_gets with replayed kernels (cut by its step last time)
    for r in 1 0; do
      KFORGE_CUDA_REPLAY=$r timeout 60 python3 -c "from kforge.deploy import measure_dispatch_cost as m; print('KFORGE_CUDA_REPLAY=$r:', m('cuda').describe())" 2>&1 | grep -v "Warn" | tail -2
    done | tee "$OUT/dispatch_cost.txt"
    timeout "${KF_USER_S:-420}" python3 benchmarks/what_a_user_gets.py --device cuda --modes "${KF_MODES:-default}" \
        --json "$OUT/what_a_user_gets_cuda.json" 2>&1 | grep --line-buffered -v "^DEBUG\|Warning\|warn_once\|warnings.warn" \
        | tee "$OUT/what_a_user_gets_cuda.txt" | tail -30 ;;
  vendor)
    # issue 45: vendor-headed chains (CUTLASS builds in parallel, then eager / compile default / max-autotune / kforge)
    KFORGE_CACHE="${KFORGE_CACHE:-/tmp/kcache}" timeout "${KF_VENDOR_S:-540}" python3 benchmarks/vendor_chains.py \
        --device cuda --cutlass build/cutlass --cases "${KF_VENDOR_CASES:-gemm_bias_relu,gemm_bias_gelu_sd35,conv_bn_relu_resnet3x3}" \
        --jobs 14 --budget-s "${KF_VENDOR_BUDGET_S:-420}" --json-out "$OUT/vendor.json" 2>&1 | grep --line-buffered -v "^DEBUG" \
        | tee "$OUT/vendor.txt" | tail -40 ;;
  replay42)
    # issue 42's CUDA side: candidates recorded in the sandbox and replayed by kforge's launcher (the replay's own
    # tests first, the attack corpus deployed without screen or wall after), eager regions on torch 2.11 past
    # dynamo's limit, the judge's CUDA attacks (the runner changed), then what a user gets
    gpu_tests "${KF_REPLAY_S:-120}" "tests/test_gpu_replay.py::test_builtin_softmax_winners_replay_with_their_librarys_outputs tests/test_gpu_replay.py::test_a_replay_is_captured_by_a_cuda_graph tests/test_gpu_replay.py::test_attack_libc_walk_deployed_as_apply_deploys_it_never_runs_its_host_code tests/test_gpu_replay.py::test_host_code_a_replay_cannot_do_is_refused_at_deploy" replay_tests 14
    gpu_tests 100 "tests/test_eager_regions.py::test_region_kernels_run_though_the_models_forward_has_been_compiled_past_dynamos_limit tests/test_eager_regions.py::test_on_the_gpu_region_kernels_run_eagerly_and_in_a_captured_cuda_graph" eve41_tests 4
    gpu_tests "${KF_ATTACKS_S:-130}" "tests/test_gpu_attacks.py" gpu_attacks 6
    gpu_tests "${KF_CORPUS_S:-100}" "tests/test_gpu_replay.py::test_the_cuda_attack_corpus_deployed_without_screen_or_wall_reaches_nothing" replay_corpus 8
    timeout "${KF_USER_S:-150}" python3 benchmarks/what_a_user_gets.py --device cuda --modes "${KF_MODES:-default}" \
        --json "$OUT/what_a_user_gets_cuda.json" 2>&1 | grep --line-buffered -v "^DEBUG\|Warning\|warn_once" \
        | tee "$OUT/what_a_user_gets_cuda.txt" | tail -30 ;;
  eve41)
    # issue 41, 2026-12-06 evening: the captured forward's own frame on torch 2.11 (the CPU test that reproduces the
    # dropped region kernels, then the GPU test of eager regions), what a user gets (with the fix), then the
    # repeatability of a seed model's three largest cards (KF_REPEAT_ARGS)
    gpu_tests "${KF_OWED_TESTS_S:-120}" "tests/test_eager_regions.py::test_region_kernels_run_though_the_models_forward_has_been_compiled_past_dynamos_limit tests/test_eager_regions.py::test_on_the_gpu_region_kernels_run_eagerly_and_in_a_captured_cuda_graph" eve41_tests 6
    timeout "${KF_USER_S:-200}" python3 benchmarks/what_a_user_gets.py --device cuda --modes "${KF_MODES:-default}" \
        --json "$OUT/what_a_user_gets_cuda.json" 2>&1 | grep --line-buffered -v "^DEBUG\|Warning\|warn_once" \
        | tee "$OUT/what_a_user_gets_cuda.txt" | tail -30
    timeout "${KF_REPEAT_S:-280}" python3 benchmarks/repeatability.py --device cuda --runs "${KF_RUNS:-5}" \
        ${KF_REPEAT_ARGS:---model gemma4_e2b --layers 2 --cards 3} --json-out "$OUT/repeatability_cuda.json" 2>&1 \
        | grep --line-buffered -v "^DEBUG" | tee "$OUT/repeatability_cuda.txt" | tail -30 ;;
  repeat)
    # issue 41 on the GPU: verdicts that repeat (benchmarks/repeatability.py, KF_RUNS fresh runs of the same session),
    # then the owed GPU tests of the experts and recurrent kernels
    timeout "${KF_REPEAT_S:-330}" python3 benchmarks/repeatability.py --device cuda --runs "${KF_RUNS:-5}" \
        ${KF_REPEAT_ARGS:-} --json-out "$OUT/repeatability_cuda.json" 2>&1 | grep --line-buffered -v "^DEBUG" \
        | tee "$OUT/repeatability_cuda.txt" | tail -40
    [ "${KF_REPEAT_TESTS:-1}" = 0 ] || gpu_tests "${KF_REPEAT_TESTS_S:-200}" "tests/test_moe_experts.py tests/test_recurrent_gpu.py" \
        moe_recurrent_tests 12 ;;
  *) echo "usage: bash benchmarks/device_session.sh owed0607|vendor|replay42|eve41|owed41|walls|repeat|tests|judge|final|regions|vision|maxautotune|decode|control|fused|resnet|gdn|gdn_e2e|gdn_decode|profile|moe|moe_designs|decode_profile|twins|owed|accuracy|gelu|rope|sd35t|sd35t_regions|cluster|region_e2e|probe" >&2; exit 2 ;;
esac
