#!/usr/bin/env bash
# Prefill speed of kernel variants against one binary, in alternating rounds (round r runs every
# variant once, in order), so drift on the device falls on all of them alike; then each variant's
# tok/s per round and its mean. A variant is a DELTASERVE_CUDA_DEFINES value; "" is the defaults.
#
#   ROUNDS=3 PREFILL=2048 scripts/h200_prefill_ab.sh BIN OUT SHAPE "" "BF16_TWIN=1" "GEMM_PAIRS=1" ...
#
# Each run is scripts/h200_decode_variants.sh (its JSON under OUT, named after the shape, the
# prompt length, the defines and the round); in h200_call.sh: "sh:ROUNDS=3 scripts/h200_prefill_ab.sh
# /tmp/b/deltaserve /tmp/res/ab qwen3.6-27b '' 'BF16_TWIN=1'".
set -u
ds=${1:?deltaserve binary}
out=${2:?output folder}
shape=${3:?model shape under examples/}
shift 3
rounds=${ROUNDS:-3}
export PREFILL=${PREFILL:-2048} DECODE=${DECODE:-8}
for round in $(seq "$rounds"); do
  for defines in "$@"; do
    # ROUND is not read by any kernel: it only gives each round's run its own name (and PTX).
    scripts/h200_decode_variants.sh "$ds" "$out" "$shape" "${defines:+$defines }ROUND=$round"
  done
done
python3 - "$out" "$shape" "$PREFILL" "$@" <<'PY'
import glob, json, re, statistics, sys
out, shape, prefill, variants = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
for defines in variants:
    runs = []
    for path in glob.glob(f"{out}/{shape}*ROUND*.json"):
        try:
            d = json.load(open(path))
        except ValueError:
            continue  # a failed run (its line above says why)
        if d.get("prefill_tokens") != int(prefill):
            continue
        got = (d.get("kernel_overrides") or {}).get("DELTASERVE_CUDA_DEFINES", "")
        if re.sub(r"\s*ROUND=\d+", "", got).strip() == defines.strip():
            runs.append(d["prefill_tokens_per_s"])
    mean = f"{statistics.mean(runs):.0f}" if runs else "-"
    print(f"prefill {prefill} {shape} [{defines or 'defaults'}]: {' / '.join(f'{r:.0f}' for r in runs)} tok/s, mean {mean}")
PY
