#!/usr/bin/env bash
# Session 28, call 2: GEMV_BF16_SETS=1 as split in session 27 (the diagonal form for one token, four
# tokens an mma for 2-4) against the defaults in the same call, then the whole GPU suite under it
# (the gate for making it the default).
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
S=GEMV_BF16_SETS=1
DEADLINE=${DEADLINE:-300} scripts/h200_call.sh \
  "mtp:qwen3.6-27b+qwen3.6-35b-a3b+qwen3.5-9b:,$S,,$S" \
  "fp8mtp:qwen3.6-27b:,$S:--speculative-draft-model-quantization fp8" \
  "sh:timeout 150 /tmp/b/ops --test-threads=1 bf16_lane_kernels > /tmp/res/test-ops-lanes.log 2>&1; rc=\$?; grep -E '^test |test result' /tmp/res/test-ops-lanes.log; exit \$rc"
export DELTASERVE_CUDA_DEFINES=$S
DEADLINE=$((${SUITE_DEADLINE:-280})) scripts/h200_call.sh test:ops test:graphs test:golden test:moe test:fp8 \
  test:sampling test:demo_heldout test:demo_fp8 test:dummy_weights doctor serve
