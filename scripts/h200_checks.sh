#!/usr/bin/env bash
# The GPU half of deltaserve's checks, as run on the H200 for docs/benchmarks.md (issue 7). Takes the
# directory holding the release binary and the cuda test binaries built on another machine
# (scripts/pack_device_binaries.sh packs them small enough to travel, then unpack them there), and a
# folder for the logs. Part `checks`: every GPU test, doctor on the demo model and the fixtures, serve
# with MTP + smoke + bench serve. Part `perf`: issue 12's decode figures against same-run floors. Part `bench`: the Qwen3.6-27B-shaped dummy model, with and without
# MTP, profiled, with the device's read bandwidth; then transformers on the same GPU as the peer.
set -u
bins=${1:?binary directory}
out=${2:?output folder}
part=${3:-checks}
mkdir -p "$out"
# Test binaries find fixtures through the path they were built in.
if [ ! -e /work/main ]; then mkdir -p /work && ln -s "$PWD" /work/main; fi
ds="$bins/deltaserve"

if [ "$part" = checks ]; then
  nvidia-smi >"$out/nvidia-smi.txt" 2>&1
  for t in ops sampling dummy_weights golden demo_heldout; do
    start=$(date +%s)
    "$bins/$t" --test-threads=1 --nocapture >"$out/test-$t.log" 2>&1
    echo "test $t: rc=$? in $(( $(date +%s) - start )) s"
  done
  "$ds" doctor --backend cuda --model-path demo >"$out/doctor.log" 2>&1
  echo "doctor demo: rc=$?"
  for f in tests/fixtures/*/; do
    [ -f "$f/config.json" ] || continue
    "$ds" doctor --backend cuda --model-path "$f" >>"$out/doctor.log" 2>&1
    echo "doctor $f: rc=$?"
  done
  port=18080
  "$ds" serve --port $port --enable-metrics --speculative-algorithm NEXTN --speculative-num-steps 3 \
    --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 >"$out/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
  "$ds" smoke --url "http://127.0.0.1:$port" >"$out/smoke.log" 2>&1
  echo "smoke: rc=$?"
  "$ds" bench serve --url "http://127.0.0.1:$port" --concurrency 8 --num-prompts 64 --input-len 64 \
    --output-len 128 --endpoint chat --stream >"$out/bench-serve.log" 2>&1
  echo "bench serve: rc=$?"
  curl -s "http://127.0.0.1:$port/metrics" >"$out/metrics.txt"
  kill -TERM $server; wait $server; echo "serve exit: $?"
fi

if [ "$part" = bench ]; then
  m=examples/qwen3.6-27b
  "$ds" bench --backend cuda --model-path $m --load-format dummy --prefill-len 512 --decode-len 32 \
    --measure-bandwidth --profile --json >"$out/bench-27b.json" 2>"$out/bench-27b.err"
  echo "bench 27b: rc=$?"
  "$ds" bench --backend cuda --model-path $m --load-format dummy --prefill-len 512 --decode-len 32 \
    --speculative-num-steps 3 --measure-bandwidth --profile --json >"$out/bench-27b-mtp3.json" 2>"$out/bench-27b-mtp3.err"
  echo "bench 27b mtp3: rc=$?"
  python3 scripts/bench_transformers.py --device cuda --config $m/config.json --prefill-len 512 \
    --decode-len 32 >"$out/transformers-27b.json" 2>"$out/transformers-27b.err"
  echo "transformers 27b: rc=$?"
fi

if [ "$part" = perf ]; then
  # Issue 12's figures, each against a floor measured in the same run: the cuBLAS GEMV sweep + CUDA
  # graph (scripts/gemv_floor.py) and the device's read bandwidth, for the 27B and 9B shapes; batched
  # decode (batch 1 vs 16 through the same path); MTP k=3 with forced acceptance.
  for shape in qwen3.6-27b qwen3.5-9b; do
    m=examples/$shape
    python3 scripts/gemv_floor.py --config $m/config.json >"$out/floor-$shape.json" 2>"$out/floor-$shape.err"
    echo "gemv floor $shape: rc=$? $(cat "$out/floor-$shape.json")"
    "$ds" bench --backend cuda --model-path $m --load-format dummy --prefill-len 512 --decode-len 64 \
      --measure-bandwidth --batch 16 --json >"$out/bench-$shape.json" 2>"$out/bench-$shape.err"
    echo "bench $shape: rc=$?"
  done
  m=examples/qwen3.6-27b
  "$ds" bench --backend cuda --model-path $m --load-format dummy --prefill-len 512 --decode-len 32 \
    --speculative-num-steps 3 --profile --json >"$out/bench-qwen3.6-27b-mtp3-profile.json" 2>"$out/bench-27b-mtp3.err"
  echo "bench 27b mtp3 + profile: rc=$?"
fi
