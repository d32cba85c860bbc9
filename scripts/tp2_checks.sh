#!/usr/bin/env bash
# Tensor parallelism over NCCL on two GPUs (issue 20; the code is issue 13's). Takes the directory
# holding the release binary and the cuda test binaries built on another machine
# (`cargo build --release` + `cargo test -p deltaserve-cuda --release --no-run`, copied there, the
# test binaries named by their test file: tensor_parallel, ops, ...), a folder for the logs, and a
# part:
#   checks  the TP GPU tests (NCCL collectives, every fixture split vs whole, the demo's held-out
#           greedy split vs whole and MTP on vs off under the split), doctor --tp-size 2 on the demo
#           and the fixtures, serve --tp-size 2 with MTP + smoke + bench serve, and the seeds' serve
#           line on the 27B shape (dummy weights) with the planner capped at 48 GB per GPU.
#   single  on ONE GPU (kind nvidia-h200): the TP GPU tests with a one-rank NCCL group, and serve
#           through the tensor-parallel path with a one-rank NCCL group (--tp-force-communicator)
#           with MTP + smoke: the NCCL plumbing proven before two GPUs are lent.
#   bench   the 27B shape (dummy weights): decode batch 1 and prefill, TP 2 against TP 1 in the same
#           run; bench serve at concurrency 1, 16 and 64 against serve --tp-size 2 and --tp-size 1.
# Every process started here runs with NVLink multicast (NVLS) off: never cuMulticastCreate.
# The 27B-shape servers use random weights (--load-format dummy), so they skip the canary and borrow
# the demo model's tokenizer.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bins=${1:?binary directory}
out=${2:?output folder}
part=${3:-checks}
mkdir -p "$out"
# Test binaries find fixtures through the path they were built in.
if [ ! -e /work/main ]; then mkdir -p /work && ln -s "$PWD" /work/main; fi
ds="$bins/deltaserve"
m27=examples/qwen3.6-27b

# serve_wait PORT LOG ARGS...: starts a server in the background (pid in $server), waits for /health.
serve_wait() {
  local port=$1 log=$2
  shift 2
  "$ds" serve --port "$port" "$@" >"$log" 2>&1 &
  server=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0
    kill -0 $server 2>/dev/null || return 1
    sleep 1
  done
  return 1
}

stop_server() {
  kill -TERM $server 2>/dev/null
  wait $server
  echo "serve exit: $?"
}

# A chat request, to show a server that skipped the canary (dummy weights) serves.
chat_once() {
  local model
  model=$(curl -s "http://127.0.0.1:$1/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
  curl -s "http://127.0.0.1:$1/v1/chat/completions" -H 'content-type: application/json' \
    -d "{\"model\": \"$model\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 16}"
}

if [ "$part" = checks ]; then
  nvidia-smi >"$out/nvidia-smi.txt" 2>&1
  nvidia-smi topo -m >>"$out/nvidia-smi.txt" 2>&1
  start=$(date +%s)
  DELTASERVE_TP_GPUS=2 "$bins/tensor_parallel" --test-threads=1 --nocapture >"$out/test-tensor_parallel.log" 2>&1
  echo "test tensor_parallel (2 GPUs): rc=$? in $(( $(date +%s) - start )) s"
  grep -E "skipped|max \|diff\||identical|accepted" "$out/test-tensor_parallel.log"
  "$ds" doctor --backend cuda --tp-size 2 --model-path demo >"$out/doctor-tp2.log" 2>&1
  echo "doctor --tp-size 2 demo: rc=$?"
  for f in tests/fixtures/*/; do
    [ -f "$f/config.json" ] || continue
    "$ds" doctor --backend cuda --tp-size 2 --model-path "$f" >>"$out/doctor-tp2.log" 2>&1
    echo "doctor --tp-size 2 $f: rc=$?"
  done
  port=18080
  if serve_wait $port "$out/serve-tp2.log" --backend cuda --tp-size 2 --enable-metrics \
      --speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 \
      --speculative-num-draft-tokens 4; then
    "$ds" smoke --url "http://127.0.0.1:$port" >"$out/smoke-tp2.log" 2>&1
    echo "smoke (serve --tp-size 2, MTP): rc=$?"
    "$ds" bench serve --url "http://127.0.0.1:$port" --concurrency 8 --num-prompts 64 --input-len 64 \
      --output-len 128 --endpoint chat --stream >"$out/bench-serve-demo-tp2.log" 2>&1
    echo "bench serve demo tp2: rc=$?"
    curl -s "http://127.0.0.1:$port/metrics" >"$out/metrics-tp2.txt"
    curl -s "http://127.0.0.1:$port/server_info" >"$out/server-info-tp2.json"
  else
    echo "serve --tp-size 2 did not become healthy (see serve-tp2.log)"
  fi
  stop_server
  # The seeds' command line, on the 27B shape, as if on two 48 GB GPUs.
  port=18081
  if serve_wait $port "$out/serve-27b-seeds.log" --model-path $m27 --load-format dummy --skip-canary \
      --tokenizer-path demo --tp-size 2 --speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 \
      --speculative-num-draft-tokens 4 --mem-fraction-static 0.88 --device-memory-cap-gb 48 \
      --context-length 262144 --reasoning-parser qwen3 --tool-call-parser qwen3_coder; then
    chat_once $port >"$out/chat-27b-seeds.json"
    echo "27b seeds line (tp 2, 48 GB per GPU): serves: $(head -c 200 "$out/chat-27b-seeds.json")"
    nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv >>"$out/serve-27b-seeds.log"
  else
    echo "27b seeds line did not become healthy (see serve-27b-seeds.log)"
  fi
  grep -E "tensor parallel|KV pool|state-slot|note" "$out/serve-27b-seeds.log"
  stop_server
fi

if [ "$part" = single ]; then
  DELTASERVE_TP_GPUS=1 "$bins/tensor_parallel" --test-threads=1 --nocapture >"$out/test-tensor_parallel-1gpu.log" 2>&1
  echo "test tensor_parallel (1 GPU, one-rank NCCL group): rc=$?"
  grep -E "skipped|max \|diff\||identical|accepted" "$out/test-tensor_parallel-1gpu.log"
  port=18082
  if serve_wait $port "$out/serve-nccl1.log" --backend cuda --tp-force-communicator --enable-metrics \
      --speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 \
      --speculative-num-draft-tokens 4; then
    "$ds" smoke --url "http://127.0.0.1:$port" >"$out/smoke-nccl1.log" 2>&1
    echo "smoke (one-rank NCCL group, MTP): rc=$?"
  else
    echo "serve with a one-rank NCCL group did not become healthy (see serve-nccl1.log)"
  fi
  grep -E "tensor parallel|canary" "$out/serve-nccl1.log"
  stop_server
fi

if [ "$part" = bench ]; then
  for tp in 1 2; do
    "$ds" bench --backend cuda --tp-size $tp --model-path $m27 --load-format dummy --prefill-len 512 \
      --decode-len 32 --json >"$out/bench-27b-tp$tp.json" 2>"$out/bench-27b-tp$tp.err"
    echo "bench 27b tp $tp: rc=$? $(head -c 400 "$out/bench-27b-tp$tp.json")"
  done
  for tp in 1 2; do
    port=$((18090 + tp))
    if serve_wait $port "$out/serve-27b-tp$tp.log" --backend cuda --tp-size $tp --model-path $m27 \
        --load-format dummy --skip-canary --tokenizer-path demo --mem-fraction-static 0.88; then
      for c in 1 16 64; do
        "$ds" bench serve --url "http://127.0.0.1:$port" --concurrency $c --num-prompts $((c * 4)) \
          --input-len 512 --output-len 128 --endpoint completions >"$out/bench-serve-27b-tp$tp-c$c.log" 2>&1
        echo "bench serve 27b tp $tp concurrency $c: rc=$?"
      done
    else
      echo "serve 27b tp $tp did not become healthy"
    fi
    stop_server
  done
fi
