#!/usr/bin/env bash
# Issue 18's throughput figure on the CPU (demo model): one engine against two, each engine on cores
# of its own (taskset), the load generator on the last two cores.
#
#   scripts/dp_bench.sh BIN OUT [THREADS_PER_ENGINE]
#
# Runs, with T = THREADS_PER_ENGINE (default 1) and C = 16 requests in flight per engine:
#   one      one worker, --threads T, cores 0..T-1, concurrency C
#   dp2      one worker, --dp-size 2 --threads 2T, cores 0..2T-1, concurrency 2C (and C: dp2-c16)
#   two      two workers, --threads T each, on cores 0..T-1 and T..2T-1, one load generator each at
#            concurrency C, run at the same time (what two workers behind a router can give at most)
#   gateway  (when GATEWAY_PYTHON names a python with sglang-router installed) the same two workers
#            behind SGLang Model Gateway (round robin), one load generator at concurrency 2C
# Writes each `bench serve` JSON and the servers' logs to OUT, and prints a summary line per run.
# With fewer than 2T+2 cores the load generator (and the gateway) share the engines' cores: said in
# OUT/notes.txt, and the figures then understate what separate cores give.
# Environment: PROMPTS_PER_SLOT (default 4: 4C prompts per run), INPUT_LEN (64), OUTPUT_LEN (128),
# GATEWAY_PYTHON.
set -euo pipefail

BIN=$1
OUT=$2
T=${3:-1}
C=16
PROMPTS_PER_SLOT=${PROMPTS_PER_SLOT:-4}
INPUT_LEN=${INPUT_LEN:-64}
OUTPUT_LEN=${OUTPUT_LEN:-128}
CORES=$(nproc)
if ((CORES < 2 * T)); then
    echo "dp_bench: needs at least $((2 * T)) cores (2 engines x $T threads), found $CORES" >&2
    exit 1
fi
mkdir -p "$OUT"
lscpu >"$OUT/lscpu.txt"
if ((CORES >= 2 * T + 2)); then
    CLIENT_CORES="$((CORES - 2))-$((CORES - 1))"
    echo "load generator on cores $CLIENT_CORES of $CORES" >"$OUT/notes.txt"
else
    CLIENT_CORES="0-$((CORES - 1))"
    echo "only $CORES cores: the load generator (and gateway) share the engines' cores" >"$OUT/notes.txt"
fi

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# start NAME CORES PORT FLAGS...: a demo worker on CORES.
start() {
    local name=$1 cores=$2 port=$3
    shift 3
    taskset -c "$cores" "$BIN" serve --backend cpu --port "$port" --max-running-requests "$C" \
        --max-mamba-cache-size "$C" --enable-metrics "$@" >"$OUT/$name-server-$port.log" 2>&1 &
    PIDS+=($!)
}

wait_healthy() {
    local port=$1
    for _ in $(seq 600); do
        if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then return 0; fi
        sleep 0.2
    done
    echo "dp_bench: the server on port $port never became healthy" >&2
    exit 1
}

# bench NAME PORT CONCURRENCY: one `bench serve` run, pinned to the client cores.
bench() {
    local name=$1 port=$2 c=$3
    taskset -c "$CLIENT_CORES" "$BIN" bench serve --url "http://127.0.0.1:$port" --concurrency "$c" \
        --num-prompts $((PROMPTS_PER_SLOT * c)) --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" \
        --endpoint chat --stream --output-file "$OUT/$name.json" >"$OUT/$name.txt" 2>&1
}

stop_all() {
    cleanup
    PIDS=()
}

summary() {
    python3 - "$@" <<'EOF'
import json, sys
for path in sys.argv[1:]:
    r = json.load(open(path))
    print(f"{path.rsplit('/', 1)[-1]:<14} " + " ".join(
        f"{k}={r[k]}" for k in r if k in ("output_throughput", "request_throughput", "completed", "failed", "concurrency")))
EOF
}

start one "0-$((T - 1))" 18001 --threads "$T"
wait_healthy 18001
bench one 18001 "$C"
stop_all

start dp2 "0-$((2 * T - 1))" 18002 --threads $((2 * T)) --dp-size 2
wait_healthy 18002
bench dp2 18002 $((2 * C))
bench dp2-c16 18002 "$C"
curl -s "http://127.0.0.1:18002/metrics" | grep -E '^deltaserve_engine_generated_tokens_total' >"$OUT/dp2-metrics.txt"
stop_all

start two-a "0-$((T - 1))" 18003 --threads "$T"
start two-b "$T-$((2 * T - 1))" 18004 --threads "$T"
wait_healthy 18003
wait_healthy 18004
bench two-a 18003 "$C" &
client_a=$!
bench two-b 18004 "$C" &
client_b=$!
wait "$client_a"
wait "$client_b"

if [[ -n "${GATEWAY_PYTHON:-}" ]]; then
    taskset -c "$CLIENT_CORES" "$GATEWAY_PYTHON" -m sglang_router.launch_router --host 127.0.0.1 \
        --port 18005 --worker-urls http://127.0.0.1:18003 http://127.0.0.1:18004 \
        --policy round_robin --prometheus-host 127.0.0.1 --prometheus-port 18006 \
        >"$OUT/gateway.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 300); do
        if curl -sf "http://127.0.0.1:18005/v1/models" | grep -q demo; then break; fi
        sleep 0.2
    done
    bench gateway 18005 $((2 * C))
fi
stop_all

summary "$OUT"/*.json | tee "$OUT/summary.txt"
