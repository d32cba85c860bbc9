#!/usr/bin/env bash
# Session 27, call 2: the bf16 lane kernels with four tokens an mma (GEMV_BF16_SETS=1) against the
# CUDA-core default, their test and the demo's checks under the switch; the draft head limited to
# 32k rows (--speculative-token-map; dummy weights, so ids 0..32767); then the one-token FP8 W8A8
# form (GEMV_FP8_DIAG=1) if the deadline leaves time.
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
S=GEMV_BF16_SETS=1
R4="GEMV_BF16_SETS=1 GEMV_LANE_ROWS_MULTI=4"
F=GEMV_FP8_DIAG=1
DEADLINE=${DEADLINE:-360} scripts/h200_call.sh \
  "sh:timeout 150 /tmp/b/ops --test-threads=1 bf16_lane_kernels > /tmp/res/test-ops-lanes.log 2>&1; rc=\$?; grep -E '^test |test result' /tmp/res/test-ops-lanes.log; exit \$rc" \
  "mtp:qwen3.6-27b:,$S,$R4,,$S" \
  "sh:python3 scripts/make_token_map.py --first 32768 --out /tmp/map32k.json" \
  "mtp:qwen3.6-27b+qwen3.6-35b-a3b+qwen3.5-9b::--speculative-token-map /tmp/map32k.json" \
  "mtp:qwen3.6-35b-a3b+qwen3.5-9b:,$S,,$S" \
  "sh:DELTASERVE_CUDA_DEFINES=$S timeout 100 /tmp/b/demo_heldout --test-threads=1 > /tmp/res/test-demo-heldout-sets.log 2>&1; rc=\$?; grep -E 'test result' /tmp/res/test-demo-heldout-sets.log; exit \$rc" \
  "sh:DELTASERVE_CUDA_DEFINES=$S timeout 60 /tmp/b/deltaserve doctor --backend cuda --model-path demo > /tmp/res/doctor-sets.log 2>&1; rc=\$?; tail -2 /tmp/res/doctor-sets.log; exit \$rc" \
  "fp8mtp:qwen3.6-27b::--speculative-draft-model-quantization fp8 --speculative-token-map /tmp/map32k.json" \
  "sh:timeout 60 /tmp/b/fp8 --test-threads=1 one_token_on_the_tensor > /tmp/res/test-fp8-diag.log 2>&1; rc=\$?; grep -E '^test |test result' /tmp/res/test-fp8-diag.log; exit \$rc" \
  "fp8mtp:qwen3.6-27b:,$F,:--speculative-draft-model-quantization fp8"
