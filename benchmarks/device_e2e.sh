#!/usr/bin/env bash
# Issue 14's end-to-end tables on the H200, one device call each (<= ~8 min of timeouts):
#   device run: bash benchmarks/device_e2e.sh vision    (ResNet-50 + SD3.5 VAE decoder)
#   device run: bash benchmarks/device_e2e.sh gemma     (Gemma 4 E2B, 35 layers: the seed store's depth; prefill + decode)
#   device run: bash benchmarks/device_e2e.sh qwen      (Qwen 3.5 at 4 layers, the seed store's depth; grouped_mm experts)
#   (KF_DECODE=0: prefill only)
#   (language: both in one call; on 2026-12-02 it ran out of its 2 x 230 s before either decoded compiled)
#   device run: bash benchmarks/device_e2e.sh diagnose  (ResNet-50: where kforge's time goes)
# The VAE needs diffusers: carry a wheel (here: pip download diffusers importlib_metadata --no-deps -d .whl;
# run with carry=[".whl"]). Tables print; end_to_end_<model>.json land in $OUT.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 KFORGE_CACHE=/tmp/kfc TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-deps --root-user-action=ignore .whl/*.whl 2>&1 | tail -2
E="python3 benchmarks/end_to_end.py"
case "${1:-}" in
  vision)
    timeout 270 $E resnet50 2>&1 | tee "$OUT/e2e_resnet50.txt" | grep -v "^DEBUG"
    timeout 200 $E sd35_vae_decoder --modes default,reduce-overhead 2>&1 | tee "$OUT/e2e_vae.txt" | grep -v "^DEBUG" ;;
  gemma)
    timeout 540 $E gemma4_e2b --attn eager --decode ${KF_DECODE:-32} --modes default,reduce-overhead 2>&1 \
      | tee "$OUT/e2e_gemma.txt" | grep -v "^DEBUG" ;;
  qwen)
    # NB: with the seed's eager experts, compile (dynamic=False) recompiled per expert token count
    timeout 540 $E qwen35_moe --experts grouped_mm --decode ${KF_DECODE:-32} --modes default,reduce-overhead 2>&1 \
      | tee "$OUT/e2e_qwen.txt" | grep -v "^DEBUG" ;;
  language)
    timeout 230 $E gemma4_e2b --attn eager --decode 32 --modes default,reduce-overhead 2>&1 \
      | tee "$OUT/e2e_gemma.txt" | grep -v "^DEBUG"
    timeout 230 $E qwen35_moe --experts grouped_mm --decode 32 --modes default,reduce-overhead 2>&1 \
      | tee "$OUT/e2e_qwen.txt" | grep -v "^DEBUG" ;;
  diagnose)
    timeout 400 $E resnet50 --modes default --diagnose 2>&1 | tee "$OUT/e2e_resnet50_diagnose.txt" | grep -v "^DEBUG" ;;
  *) echo "usage: bash benchmarks/device_e2e.sh vision|gemma|qwen|language|diagnose" >&2; exit 2 ;;
esac
