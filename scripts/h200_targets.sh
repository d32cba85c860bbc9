#!/usr/bin/env bash
# The issues' GPU targets in one device call (issues 12, 14 and 21; every figure against a floor or
# a peer measured in the same call where the issue asks for one), on main's defaults:
#   decode and MTP k=3 (forced acceptance) of the 35B-A3B, 27B and 9B shapes, and with a draft head
#   of 32k rows (--speculative-token-map; ids 0..32767, dummy weights); the cuBLAS GEMV floors
#   of the 27B and 9B; the 27B FP8 decode and MTP with the FP8 draft; prefill of 2048 tokens (the
#   27B's in FP8 too); batched decode steps; `serve` at concurrency 64 (27B, then 35B-A3B); a
#   32k-token prompt's time to first token; last, the 35B-A3B as its FP8 checkpoint ships
#   (examples/qwen3.6-35b-a3b-fp8: decode, MTP and `serve` c=64 with default flags). llama.cpp
#   (issue 12's 9B peer) needs its own call: scripts/llama_cpp_cuda_peer.sh.
#
#   scripts/pack_device_binaries.sh                          # here, then on the GPU machine:
#   DEADLINE=560 scripts/h200_targets.sh                     # results: $OUT/results.tgz, $OUT/summary.log
#                                                            # and the table: $OUT/targets.md (scripts/targets_table.py)
set -u
cd "$(dirname "$0")/.."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
long='/tmp/b/deltaserve serve --port 18100 --model-path examples/qwen3.6-27b --load-format dummy --tokenizer-path models/demo --skip-canary > /tmp/res/long-server.log 2>&1 & for i in $(seq 150); do grep -q ^listening /tmp/res/long-server.log && break; sleep 1; done; python3 scripts/long_prompt_ttft.py http://127.0.0.1:18100 32768; kill %1; wait'
DEADLINE=${DEADLINE:-560} scripts/h200_call.sh "mtp:qwen3.6-35b-a3b+qwen3.6-27b+qwen3.5-9b:" \
  "sh:python3 scripts/make_token_map.py --first 32768 --out /tmp/map32k.json" \
  "mtp:qwen3.6-35b-a3b+qwen3.6-27b::--speculative-token-map /tmp/map32k.json" \
  floor:qwen3.6-27b floor:qwen3.5-9b \
  "fp8mtp:qwen3.6-27b::--speculative-draft-model-quantization fp8" \
  "sh:PREFILL=2048 DECODE=8 scripts/h200_decode_variants.sh /tmp/b/deltaserve /tmp/res/p 'qwen3.6-27b qwen3.6-35b-a3b' ''" \
  "sh:DELTASERVE_CUDA_FP8_WEIGHTS=1 ARGS='--quantization fp8' TAG=fp8 PREFILL=2048 DECODE=8 scripts/h200_decode_variants.sh /tmp/b/deltaserve /tmp/res/p qwen3.6-27b ''" \
  batch:qwen3.6-27b+qwen3.6-35b-a3b: servebench:qwen3.6-27b:64 "sh:$long" servebench:qwen3.6-35b-a3b:64 \
  "mtp:qwen3.6-35b-a3b-fp8:" servebench:qwen3.6-35b-a3b-fp8:64
python3 scripts/targets_table.py /tmp/res | tee "$OUT/targets.md"
