#!/usr/bin/env bash
# Decode speed of kernel variants in one call, each against the same binary: for every model shape
# and every DELTASERVE_CUDA_DEFINES value given, one `bench` (batch 1, MTP k=3 with forced acceptance
# when SPEC=1), its JSON under OUT named after the shape and the defines. An empty defines value
# ("") is the binary's defaults. ARGS: more bench flags (e.g. "--quantization fp8"), TAG: a suffix for
# the names of those runs, BATCH: batch sizes for `bench --batch` (e.g. "8,16,32,64"; their step
# times are printed too). Usage:
#   scripts/h200_decode_variants.sh BIN OUT "qwen3.6-27b qwen3.5-9b" "" "GEMV_SPLIT_BLOCKS=0" ...
set -u
ds=${1:?deltaserve binary}
out=${2:?output folder}
shapes=${3:?model shapes under examples/}
shift 3
mkdir -p "$out"
for shape in $shapes; do
  for defines in "$@"; do
    prefill_tag=""
    # Runs of another prompt length get their own names (a 2048-token run and a 512-token run of one
    # shape and defines would otherwise write the same file).
    [ "${PREFILL:-512}" != 512 ] && prefill_tag="-p$PREFILL"
    name="$shape${TAG:+-$TAG}$prefill_tag-${defines:-default}"
    name=${name//[^A-Za-z0-9._-]/_}
    spec=()
    [ "${SPEC:-0}" = 1 ] && spec=(--speculative-num-steps 3) && name="$name-mtp3"
    [ -n "${BATCH:-}" ] && spec+=(--batch "$BATCH") && name="$name-batch"
    start=$(date +%s)
    DELTASERVE_CUDA_DEFINES="$defines" timeout "${BENCH_TIMEOUT:-120}" "$ds" bench --backend cuda --model-path "examples/$shape" \
      --load-format dummy --prefill-len "${PREFILL:-512}" --decode-len "${DECODE:-64}" "${spec[@]}" ${ARGS:-} \
      --measure-bandwidth --json >"$out/$name.json" 2>"$out/$name.err"
    rc=$?
    python3 - "$out/$name.json" "$name" "$rc" "$(( $(date +%s) - start ))" <<'PY'
import json, sys
path, name, rc, secs = sys.argv[1:]
try:
    d = json.load(open(path))
    s = d.get("speculative") or {}
    print(f"{name}: rc={rc} {secs}s decode {d['decode_tokens_per_s']:.1f} tok/s "
          f"({d['decode_ms_per_token_median']:.2f} ms) roofline {d['roofline_fraction'] or 0:.3f} "
          f"prefill {d['prefill_tokens_per_s']:.0f} tok/s"
          + (f" mtp {s.get('decode_tokens_per_s', 0):.1f} tok/s verify {s.get('verify_ms_median', 0):.2f} ms draft {s.get('draft_ms_median', 0):.2f} ms" if s else "")
          + "".join(f" batch {b['batch']} {b['step_ms_median']:.2f} ms" for b in d.get("batched_decode") or []))
except Exception as e:
    print(f"{name}: rc={rc} {secs}s no JSON ({e})")
PY
  done
done
