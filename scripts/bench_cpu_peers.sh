#!/usr/bin/env bash
# The CPU peer comparison of docs/benchmarks.md (issue 19), all in one run on one machine: llama.cpp's CPU
# build (`llama-bench -p 512 -n 32 -t 2` on a bf16 GGUF of a random Qwen3.5-0.8B-shaped checkpoint) against
# `deltaserve bench --backend cpu --threads 2` on the same shape with dummy bf16 weights, prefill 512 tokens
# (logits of the last row only on both sides) and 32 decode steps, at the AVX2 level and, where the CPU has
# AVX-512F, the AVX-512 level. Each deltaserve run also measures the machine's streaming read bandwidth
# (`--measure-bandwidth`, 2 threads), so every round carries its own ceiling.
#
#     scripts/bench_cpu_peers.sh PEER_DIR DELTASERVE_BIN OUT_DIR [ROUNDS]
#     taskset -c 0,1 scripts/bench_cpu_peers.sh PEER_DIR target/release/deltaserve OUT_DIR 2   # 2 pinned cores
#
# PEER_DIR is what scripts/build_llama_cpp_peer.sh leaves (or its llama-cpp-peer.tar.xz unpacked):
# bin/llama-bench and convert/. Needs python3 with torch and transformers 5.x (PYTHON to pick another) and
# no network. The GGUF (1.5 GB) is made here, once, at $GGUF (default ${TMPDIR:-/tmp}/deltaserve-peer-
# qwen35-0.8b-bf16.gguf) and kept outside OUT_DIR. Rounds alternate the order of the peers (odd rounds:
# llama.cpp first; even rounds: deltaserve first), so a neighbour's load falls on both sides. With
# WITH_TRANSFORMERS=1, transformers (scripts/bench_transformers_cpu.py: bf16, eager, 2 threads, last-row
# logits) runs once after the rounds. Raw outputs, the machine description and summary.md go to OUT_DIR.
set -euo pipefail

if [[ $# -lt 3 || $# -gt 4 ]]; then
    echo "usage: $0 PEER_DIR DELTASERVE_BIN OUT_DIR [ROUNDS]" >&2
    exit 2
fi
peer=$(realpath -m "$1")
deltaserve=$(realpath -m "$2")
out=$(realpath -m "$3")
rounds=${4:-2}
python=${PYTHON:-python3}
repo=$(cd "$(dirname "$0")/.." && pwd)
config="examples/qwen3.5-0.8b"
gguf=${GGUF:-${TMPDIR:-/tmp}/deltaserve-peer-qwen35-0.8b-bf16.gguf}
threads=2

llama_bench="$peer/bin/llama-bench"
[[ -x "$llama_bench" ]] || { echo "bench_cpu_peers: PEER_DIR $peer has no executable bin/llama-bench" >&2; exit 1; }
[[ -f "$peer/convert/convert_hf_to_gguf.py" ]] \
    || { echo "bench_cpu_peers: PEER_DIR $peer has no convert/convert_hf_to_gguf.py" >&2; exit 1; }
[[ -x "$deltaserve" ]] || { echo "bench_cpu_peers: DELTASERVE_BIN $deltaserve is not an executable" >&2; exit 1; }
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "bench_cpu_peers: ROUNDS must be a positive integer, got '$rounds'" >&2; exit 1; }
cd "$repo"
mkdir -p "$out"

levels=(avx2)
grep -qw avx512f /proc/cpuinfo && levels+=(avx512)

{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(uname -srm)"
    echo "cpus allowed to this run: $(taskset -pc $$ 2>/dev/null | sed 's/.*: //') (nproc $(nproc))"
    echo "deltaserve: $deltaserve"
    echo "llama-bench: $llama_bench"
    echo "deltaserve levels run: ${levels[*]}"
    echo
    lscpu
    echo
    grep -m1 '^flags' /proc/cpuinfo
    echo
    free -g
} > "$out/machine.txt"
cp "$peer/BUILD_INFO" "$out/llama-cpp-build-info.txt" 2>/dev/null || true

if [[ ! -s "$gguf" ]]; then
    echo "bench_cpu_peers: making $gguf"
    TQDM_DISABLE=1 "$python" scripts/make_random_gguf.py --config "$config/config.json" \
        --converter "$peer/convert" --out "$gguf.partial" > "$out/make_gguf.log" 2>&1 \
        || { echo "bench_cpu_peers: making the GGUF failed, see $out/make_gguf.log" >&2; exit 1; }
    mv "$gguf.partial" "$gguf"
fi

note() {
    echo "$(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg): $*" | tee -a "$out/runs.txt"
}

run_llama() {
    local round=$1
    note "round $round llama-bench"
    "$llama_bench" -m "$gguf" -p 512 -n 32 -t "$threads" -o json \
        > "$out/llama-bench-$round.json" 2> "$out/llama-bench-$round.log" \
        || { echo "bench_cpu_peers: llama-bench failed, see $out/llama-bench-$round.log" >&2; exit 1; }
}

run_deltaserve() {
    local round=$1 level
    for level in "${levels[@]}"; do
        note "round $round deltaserve $level"
        DELTASERVE_CPU_LEVEL=$level "$deltaserve" bench --backend cpu --model-path "$config" --load-format dummy \
            --prefill-len 512 --decode-len 32 --threads "$threads" --measure-bandwidth --json \
            > "$out/deltaserve-$level-$round.json" 2> "$out/deltaserve-$level-$round.log" \
            || { echo "bench_cpu_peers: deltaserve bench failed, see $out/deltaserve-$level-$round.log" >&2; exit 1; }
    done
}

for ((round = 1; round <= rounds; round++)); do
    if ((round % 2 == 1)); then
        run_llama "$round"
        run_deltaserve "$round"
    else
        run_deltaserve "$round"
        run_llama "$round"
    fi
done
if [[ "${WITH_TRANSFORMERS:-0}" == 1 ]]; then
    note "transformers"
    "$python" scripts/bench_transformers_cpu.py --config "$config/config.json" --threads "$threads" \
        > "$out/transformers.json" 2> "$out/transformers.log" \
        || { echo "bench_cpu_peers: transformers failed, see $out/transformers.log" >&2; exit 1; }
fi
note "done"

"$python" scripts/cpu_peers_summary.py "$out" > "$out/summary.md"
cat "$out/summary.md"
