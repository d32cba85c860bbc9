#!/usr/bin/env bash
# Prefix cache on vs off, in one run, on the demo model (docs/benchmarks.md, "Prefix cache on the CPU"):
#   multi-turn: conversations of 5 chat turns, each resending the history; TTFT per turn;
#   agent: the same with a long system prompt in front;
#   shared prefix: one long system prompt, different questions.
# Each mode runs against a server with the cache (default flags) and one with --disable-radix-cache,
# alternating, REPEAT times. Raw JSON reports, server logs and /metrics go to $OUT.
#
#   BIN=target/release/deltaserve OUT=docs/measurements scripts/bench_prefix_cache.sh
# Another model: SERVE_FLAGS (word-split into serve's arguments), e.g. the 27B shape on a GPU, with
# the demo tokenizer's vocabulary so that every streamed token has text (examples/README.md):
#   SERVE_FLAGS="--model-path examples/qwen3.6-27b-demo-vocab --load-format dummy
#   --tokenizer-path models/demo --skip-canary" TAG=h200-prefix-cache-27b CONVERSATIONS=3 \
#   REPEAT=1 scripts/bench_prefix_cache.sh
set -euo pipefail

BIN=${BIN:-target/release/deltaserve}
OUT=${OUT:-docs/measurements}
TAG=${TAG:-cpu-prefix-cache-demo}
PORT=${PORT:-31555}
REPEAT=${REPEAT:-2}
CONVERSATIONS=${CONVERSATIONS:-6}
# Any of: multiturn multiturn-nothink agent tools tools-nothink sharedprefix.
WORKLOADS=${WORKLOADS:-multiturn agent sharedprefix}
read -ra serve_flags <<<"${SERVE_FLAGS:-}"
mkdir -p "$OUT"

grep -o -w 'avx[0-9a-z_]*\|fma\|amx[a-z_]*' /proc/cpuinfo | sort -u | tr '\n' ' ' > "$OUT/$TAG-cpuinfo.txt"
{ echo; grep -m1 'model name' /proc/cpuinfo; nproc; date -u; } >> "$OUT/$TAG-cpuinfo.txt"

serve() { # NAME [serve flags...]: starts a server, waits for /health
    local name=$1
    shift
    "$BIN" serve --port "$PORT" --enable-metrics "${serve_flags[@]}" "$@" >"$OUT/$TAG-$name-server.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 1 600); do
        if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then
            return 0
        fi
        sleep 0.2
    done
    echo "server $name never became healthy" >&2
    kill "$SERVER"
    exit 1
}

stop() {
    curl -sf "http://127.0.0.1:$PORT/metrics" >"$OUT/$TAG-$1-metrics.txt" || true
    kill "$SERVER"
    wait "$SERVER" || true
}

bench() { # NAME MODE-FLAGS...
    local name=$1
    shift
    "$BIN" bench serve --url "http://127.0.0.1:$PORT" --endpoint chat --stream --seed 7 \
        --output-file "$OUT/$TAG-$name.json" "$@" >"$OUT/$TAG-$name.txt"
}

for round in $(seq 1 "$REPEAT"); do
    for cache in off on; do
        flags=()
        if [ "$cache" = off ]; then flags=(--disable-radix-cache); fi
        serve "$cache-$round" "${flags[@]}"
        for workload in $WORKLOADS; do
            case $workload in
            # Chat: 5 turns of ~128-word questions and 64-token replies (thinking on: the template
            # drops earlier turns' reasoning, and only the content is resent).
            multiturn) bench "multiturn-$cache-$round" --multi-turn 5 --num-prompts "$CONVERSATIONS" \
                --concurrency 1 --input-len 128 --output-len 64 ;;
            # The same with thinking off.
            multiturn-nothink) bench "multiturn-nothink-$cache-$round" --multi-turn 5 \
                --num-prompts "$CONVERSATIONS" --concurrency 1 --input-len 128 --output-len 64 \
                --chat-template-kwargs '{"enable_thinking":false}' ;;
            # Agent-like: a ~1000-word system prompt, then 5 turns of ~48 words.
            agent) bench "agent-$cache-$round" --multi-turn 5 --shared-prefix-len 1000 \
                --num-prompts "$CONVERSATIONS" --concurrency 1 --input-len 48 --output-len 64 ;;
            # An agent loop: a ~200-word system prompt and a tool definition, a question, then 4
            # turns that each resend the reply as a tool call (reasoning included) and its ~48-word
            # result; with thinking on, then off.
            tools) bench "tools-$cache-$round" --multi-turn 5 --tool-calls --resend-reasoning \
                --shared-prefix-len 200 --num-prompts "$CONVERSATIONS" --concurrency 1 --input-len 48 \
                --output-len 64 ;;
            tools-nothink) bench "tools-nothink-$cache-$round" --multi-turn 5 --tool-calls \
                --shared-prefix-len 200 --num-prompts "$CONVERSATIONS" --concurrency 1 --input-len 48 \
                --output-len 64 --chat-template-kwargs '{"enable_thinking":false}' ;;
            # One long system prompt, 16 different questions.
            sharedprefix) bench "sharedprefix-$cache-$round" --shared-prefix-len 1000 --num-prompts 16 \
                --concurrency 1 --input-len 32 --output-len 32 ;;
            *) echo "unknown workload $workload" >&2; exit 2 ;;
            esac
        done
        stop "$cache-$round"
    done
done
echo "reports in $OUT/$TAG-*.json"
