#!/usr/bin/env bash
# llama.cpp's CUDA build as the GPU peer of docs/benchmarks.md (issue 12: the 9B shape's decode against
# llama.cpp measured in the same run on the same GPU). A peer, never a dependency: nothing in the project
# links or imports it. Two steps, because the GPU machine has no network:
#
#   scripts/llama_cpp_cuda_peer.sh pack [CARRY_DIR]     # here: the pinned sdist's vendored llama.cpp, pruned,
#                                                       # as CARRY_DIR/llama-cpp-src.tar.xz (default .carry)
#   scripts/llama_cpp_cuda_peer.sh bench CARRY_DIR DELTASERVE_BIN OUT_DIR [SHAPE]
#                                                       # on the GPU machine, from the repository root
#
# `bench` builds `llama-bench` with CUDA for the GPU it runs on (cmake + nvcc; sm from nvidia-smi), makes a
# bf16 GGUF of a random Qwen3.5 checkpoint of examples/SHAPE (default qwen3.5-9b) with llama.cpp's own
# converter (scripts/make_random_gguf.py; the two run side by side), then measures, in this order:
#   deltaserve bench --backend cuda --model-path examples/SHAPE --load-format dummy --prefill-len 512
#       --decode-len 64 --measure-bandwidth --json                  (decode after a 512-token prompt)
#   llama-bench -m GGUF -ngl 99 -p 512 -n 64 -d 0,512 -r 5 -o json   (tg64 after 0 and 512 tokens: -d is
#       the context already in the cache, so "-d 512" is the same work as deltaserve's decode above)
#   python3 scripts/gemv_floor.py --config examples/SHAPE/config.json   (the cuBLAS GEMV floor and read
#       bandwidth of the same step)
#   deltaserve bench ... again, so a drift of the GPU's clocks shows on both sides of the peer.
# Both sides are bf16 weights, batch 1, greedy logits of one row per step, CUDA graphs on (llama.cpp's
# default). Raw outputs, BUILD_INFO and summary.txt land in OUT_DIR.
set -euo pipefail

# The same source as the CPU peer (scripts/build_llama_cpp_peer.sh).
# shellcheck source=scripts/llama_cpp_source.sh
source "$(dirname "$0")/llama_cpp_source.sh"
# What the CUDA build of llama-bench does not read: documentation, vocabularies and test data, the web UI,
# and the other GPU backends. Pruned so the source travels as ~5 MB instead of 176 MB.
PRUNE=(docs models media tests benches tools/ui
    ggml/src/ggml-sycl ggml/src/ggml-vulkan ggml/src/ggml-opencl ggml/src/ggml-metal ggml/src/ggml-hexagon
    ggml/src/ggml-et ggml/src/ggml-cann ggml/src/ggml-musa ggml/src/ggml-webgpu ggml/src/ggml-openvino
    ggml/src/ggml-zdnn ggml/src/ggml-zendnn ggml/src/ggml-virtgpu)

usage() {
    sed -n '2,22p' "$0" >&2
    exit 2
}

pack() {
    local carry work src
    carry=$(realpath -m "${1:-.carry}")
    work=$(mktemp -d)
    trap 'rm -rf "$work"' RETURN
    mkdir -p "$carry"
    src=$(llama_cpp_source "$work")
    (cd "$src" && rm -rf "${PRUNE[@]}")
    echo "llama-cpp-python sdist $SDIST_VERSION sha256 $SDIST_SHA256, vendored llama.cpp, pruned" > "$src/PEER_SOURCE"
    tar -cJf "$carry/llama-cpp-src.tar.xz" -C "$src" .
    ls -la "$carry/llama-cpp-src.tar.xz"
}

# One line from a run's JSON: deltaserve's decode rate, or each llama-bench test's.
summarize() {
    python3 - "$@" <<'PY' 2>&1 || true
import json, sys
kind, path = sys.argv[1:]
data = json.load(open(path))
if kind == "deltaserve":
    print(f"{data['decode_tokens_per_s']:.1f} tok/s decode, roofline {data['roofline_fraction']:.3f}")
else:
    print("; ".join(f"{'pp' if r['n_prompt'] else 'tg'}{r['n_prompt'] or r['n_gen']} at depth {r['n_depth']}: "
                    f"{r['avg_ts']:.1f} +- {r['stddev_ts']:.1f} tok/s" for r in data))
PY
}

build() {
    local peer=$1 sm
    sm=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
    local flags=(
        -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
        -DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$sm" -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=ON
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
    )
    {
        cat "$peer/src/PEER_SOURCE"
        echo "cmake flags: ${flags[*]}"
        echo "nvcc: $(nvcc --version | tail -1)"
        echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
    } > "$peer/BUILD_INFO"
    cmake -S "$peer/src" -B "$peer/build" "${flags[@]}" > "$peer/cmake-configure.log" 2>&1
    cmake --build "$peer/build" --target llama-bench -j "$(nproc)" > "$peer/cmake-build.log" 2>&1
}

bench() {
    [[ $# -ge 3 && $# -le 4 ]] || usage
    local carry deltaserve out shape config peer gguf started
    carry=$(realpath -m "$1")
    deltaserve=$(realpath -m "$2")
    out=$(realpath -m "$3")
    shape=${4:-qwen3.5-9b}
    config="examples/$shape"
    [[ -f "$config/config.json" ]] || { echo "llama_cpp_cuda_peer: no $config/config.json" >&2; exit 1; }
    [[ -f "$carry/llama-cpp-src.tar.xz" ]] \
        || { echo "llama_cpp_cuda_peer: $carry has no llama-cpp-src.tar.xz (run the pack step here first)" >&2; exit 1; }
    [[ -x "$deltaserve" ]] || { echo "llama_cpp_cuda_peer: $deltaserve is not an executable" >&2; exit 1; }
    mkdir -p "$out"
    peer=${PEER_DIR:-/tmp/llama-cpp-cuda-peer}
    gguf=${GGUF:-/tmp/deltaserve-peer-$shape-bf16.gguf}
    started=$(date +%s)
    note() { echo "[$(( $(date +%s) - started ))s] $*" | tee -a "$out/summary.txt"; }

    note "building llama-bench (CUDA) and making $gguf side by side"
    mkdir -p "$peer/src"
    tar -xJf "$carry/llama-cpp-src.tar.xz" -C "$peer/src"
    build "$peer" &
    local build_pid=$!
    TQDM_DISABLE=1 python3 scripts/make_random_gguf.py --config "$config/config.json" --init-device cuda \
        --converter "$peer/src" --out "$gguf" > "$out/make_gguf.log" 2>&1 &
    local gguf_pid=$!
    local rc_build=0 rc_gguf=0
    wait "$build_pid" || rc_build=$?
    cp "$peer/BUILD_INFO" "$peer/cmake-configure.log" "$out/" 2>/dev/null || true
    tail -20 "$peer/cmake-build.log" > "$out/cmake-build-tail.log" 2>/dev/null || true
    wait "$gguf_pid" || rc_gguf=$?
    note "build rc=$rc_build, gguf rc=$rc_gguf ($(du -h "$gguf" 2>/dev/null | cut -f1))"
    [[ $rc_build -eq 0 && $rc_gguf -eq 0 ]] || exit 1

    local ds_args=(bench --backend cuda --model-path "$config" --load-format dummy --prefill-len 512
        --decode-len 64 --measure-bandwidth --json)
    "$deltaserve" "${ds_args[@]}" > "$out/deltaserve-1.json" 2> "$out/deltaserve-1.err" || true
    note "deltaserve 1: $(summarize deltaserve "$out/deltaserve-1.json")"
    "$peer/build/bin/llama-bench" -m "$gguf" -ngl 99 -p 512 -n 64 -d 0,512 -r 5 -o json \
        > "$out/llama-bench.json" 2> "$out/llama-bench.log" || true
    note "llama-bench: $(summarize llama "$out/llama-bench.json")"
    python3 scripts/gemv_floor.py --config "$config/config.json" > "$out/gemv-floor.json" 2> "$out/gemv-floor.err" || true
    note "gemv floor: $(tail -c 300 "$out/gemv-floor.json")"
    "$deltaserve" "${ds_args[@]}" > "$out/deltaserve-2.json" 2> "$out/deltaserve-2.err" || true
    note "deltaserve 2: $(summarize deltaserve "$out/deltaserve-2.json")"
}

case ${1:-} in
    pack) shift; pack "$@" ;;
    bench) shift; bench "$@" ;;
    *) usage ;;
esac
