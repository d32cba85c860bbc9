#!/usr/bin/env bash
# Session 28, call 3: main with GEMV_BF16_SETS=1 as the default (4692b0c). On an H200 the issues'
# target table first (never measured on one since session 19), then the GPU suite's core; on any
# other card the GPU suite on the defaults (ops includes the CUDA-core form's own test now), then
# the three bf16 shapes' MTP k=3 on the defaults against GEMV_BF16_SETS=0 (the CUDA cores).
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
C=GEMV_BF16_SETS=0
case $gpu in
  *H200*)
    DEADLINE=${TARGETS_DEADLINE:-250} scripts/h200_targets.sh
    DEADLINE=${SUITE_DEADLINE:-200} scripts/h200_call.sh test:ops test:demo_heldout test:graphs doctor serve \
      test:golden test:moe test:fp8
    ;;
  *)
    DEADLINE=${SUITE_DEADLINE:-420} scripts/h200_call.sh test:ops test:demo_heldout test:graphs test:golden \
      test:moe test:fp8 doctor serve "mtp:qwen3.6-27b+qwen3.6-35b-a3b+qwen3.5-9b:$C," \
      test:demo_fp8 test:dummy_weights test:sampling
    ;;
esac
