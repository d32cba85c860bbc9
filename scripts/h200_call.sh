#!/usr/bin/env bash
# One device call as the H200 sessions make them: the binaries packed by scripts/pack_device_binaries.sh
# are unpacked, then each STEP runs in order inside a deadline (steps that would start with less than
# 20 s left are skipped and said so), and everything lands in one tarball under $OUT (the device tool
# brings back at most 8 files, so one archive plus the summary).
#
#   DEADLINE=540 scripts/h200_call.sh STEP...      # on the device, from the repository root
#
# Steps:
#   test:NAME                 a cuda test binary (ops skips paged_attention: 160 s; run it as test:ops_attention)
#   variants:SHAPE+SHAPE:D,D  scripts/h200_decode_variants.sh over the shapes, one run per DELTASERVE_CUDA_DEFINES
#                             value (comma-separated; an empty one is the defaults)
#   mtp:SHAPES:D,D            the same with MTP k=3, forced acceptance
#   fp8:SHAPES:D,D, fp8mtp:SHAPES:D,D  the same two with block-FP8 weights kept on the device
#                             (--quantization fp8, DELTASERVE_CUDA_FP8_WEIGHTS=1)
#   batch:SHAPES:D,D, fp8batch:SHAPES:D,D  batched decode steps (`bench --batch $BATCH`, default
#                             8,16,32,64), bf16 or FP8 kept
#                             (these six take more bench flags as a fourth field, named in the runs' files,
#                             e.g. "fp8mtp:qwen3.6-27b::--speculative-draft-model-quantization fp8")
#   floor:SHAPE               scripts/gemv_floor.py (torch/cuBLAS GEMV sweep in a CUDA graph) for the shape
#   doctor                    doctor --backend cuda on the demo model
#   serve                     serve with MTP k=3, then deltaserve smoke against it
#   servebench:SHAPE:C[:FLAGS]  serve the shape (dummy weights, default flags plus FLAGS, e.g. "--quantization
#                             fp8"), then `bench serve` at concurrency C (2C prompts, 256 in / 128 out, streamed);
#                             the server's decode log lines (gen_tok/s, host_share) and /metrics land next to
#                             the report
#   servefp8:N:D,D            serve --quantization fp8 (MTP k=3) + smoke, N times per DELTASERVE_CUDA_DEFINES
#                             value (an empty one is the defaults): a race shows as a failed canary or smoke
#   ncu:D,D                   Nsight Compute on 24 GEMV launches of a 27B FP8 decode (un-captured), one run
#                             per DELTASERVE_CUDA_DEFINES value: raw CSV + scripts/ncu_summary.py lines
#   ncukernel:SHAPE:REGEX:FLAGS:D,D  the same on the first 24 launches of the kernels matching REGEX in a
#                             short un-captured bench of SHAPE with FLAGS (e.g. MTP's verify lanes:
#                             "ncukernel:qwen3.6-35b-a3b:gemv_bf16_lanes_t4:--speculative-num-steps 3:"; prefill
#                             16 and 6 decode steps unless FLAGS name their own, e.g. a batch-64 step's
#                             expert kernels: "ncukernel:qwen3.6-35b-a3b:moe_(gate_up|down)_fp8_t1:
#                             --quantization fp8 --batch 64 --prefill-len 4 --decode-len 3:", where 4-token
#                             prefills take the by-slot kernels, so the matches are the batch's)
#   ncustep:SHAPE:FLAGS:DEFS  Nsight Compute on every kernel of a short un-captured bench of the shape (prefill
#                             8, 3 decode steps, bench FLAGS added, e.g. "--quantization fp8", under
#                             DELTASERVE_CUDA_DEFINES=DEFS): raw CSV + scripts/ncu_step.py's table of the
#                             last decode step, kernel by kernel
#   ncucycle:SHAPE:FLAGS:DEFS the same for one whole MTP k=3 cycle (forced acceptance: a verify of 4
#                             tokens and its 3 draft steps), from a bench of 8 decode tokens (up to 360 s)
#   profile:SHAPE:FLAGS:DEFS  `bench --profile` of the shape (dummy weights, prefill 256, 8 decode steps, bench
#                             FLAGS added, e.g. "--quantization fp8 --batch 64": FP8 kept when FLAGS name it),
#                             every op timed by CUDA events in a separate run: a batch-64 step op by op in
#                             seconds, where Nsight Compute over a batched bench runs for many minutes
#   sh:COMMAND                any command (its output in sh.log)
# Each step's one-line result goes to summary.log (also printed); the raw files to $OUT/results.tgz.
# CARRY (default .carry) is the folder the binaries were packed into.
set -u
t0=$(date +%s)
deadline=${DEADLINE:-540}
carry=${CARRY:-.carry}
left() { echo $((deadline - ($(date +%s) - t0))); }
res=/tmp/res
bins=/tmp/b
mkdir -p "$res" "$bins"
tar -xJf "$carry/bins.tar.xz" -C "$bins"
# The test binaries find their fixtures through the path they were built in.
if [ ! -e /work/main ]; then mkdir -p /work && ln -s "$PWD" /work/main; fi
export PYTHONUNBUFFERED=1
finish() {
  tar -czf "$OUT/results.tgz" -C "$res" .
  cp "$res/summary.log" "$OUT/" 2>/dev/null
}
trap finish EXIT
log() { echo "$*" | tee -a "$res/summary.log"; }
# A step's DELTASERVE_CUDA_DEFINES values into the array d: comma-separated, an empty value is the
# defaults ("" alone: the defaults once; "D," is D, then the defaults: the added comma keeps the
# trailing empty value, which read drops).
split_defines() { IFS=, read -ra d <<<"$1,"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >"$res/nvidia-smi.txt" 2>&1
for step in "$@"; do
  if [ "$(left)" -lt 20 ]; then
    log "== skipped $step (deadline)"
    continue
  fi
  s=$(date +%s)
  case $step in
    variants:* | mtp:* | fp8:* | fp8mtp:* | batch:* | fp8batch:*)
      IFS=: read -r kind shapes defs more <<<"$step"
      split_defines "$defs"
      # bf16 kinds leave DELTASERVE_CUDA_FP8_WEIGHTS empty: the device default, so the FP8 matrices of
      # --speculative-draft-model-quantization fp8 stay FP8 as a plain serve on the H200 keeps them.
      spec=0 fp8="" args="" tag="" batch=""
      case $kind in mtp | fp8mtp) spec=1 ;; esac
      case $kind in fp8 | fp8mtp | fp8batch) fp8=1 args="--quantization fp8" tag=fp8 ;; esac
      case $kind in batch | fp8batch) batch=${BATCH:-8,16,32,64} ;; esac
      if [ -n "$more" ]; then
        args="$args $more"
        more_tag=${more//[^A-Za-z0-9]/}
        tag="${tag:+$tag-}${more_tag:0:40}"
      fi
      DELTASERVE_CUDA_FP8_WEIGHTS=$fp8 ARGS=$args TAG=$tag SPEC=$spec BATCH=$batch timeout "$(left)" \
        scripts/h200_decode_variants.sh "$bins/deltaserve" "$res/v" "${shapes//+/ }" "${d[@]}" 2>&1 |
        tee -a "$res/summary.log"
      ;;
    floor:*)
      shape=${step#floor:}
      timeout "$(left)" python3 scripts/gemv_floor.py --config "examples/$shape/config.json" \
        >"$res/floor-$shape.json" 2>"$res/floor-$shape.err"
      log "== floor $shape rc=$? $(cat "$res/floor-$shape.json")"
      ;;
    test:*)
      t=${step#test:}
      filter=()
      case $t in
        ops) filter=(--skip paged_attention) ;;
        ops_attention)
          t=ops
          filter=(paged_attention)
          ;;
      esac
      cap=$(($(left) < 240 ? $(left) : 240))
      timeout "$cap" "$bins/$t" --test-threads=1 --nocapture "${filter[@]}" >"$res/test-${step#test:}.log" 2>&1
      log "== test ${step#test:} rc=$? $(($(date +%s) - s)) s $(grep -E '^test result' "$res/test-${step#test:}.log" | tail -1)"
      ;;
    doctor)
      timeout 120 "$bins/deltaserve" doctor --backend cuda --model-path demo >"$res/doctor.log" 2>&1
      log "== doctor demo rc=$? $(tail -1 "$res/doctor.log")"
      ;;
    serve)
      port=18080
      "$bins/deltaserve" serve --port $port --enable-metrics --speculative-algorithm NEXTN --speculative-num-steps 3 \
        --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 >"$res/serve.log" 2>&1 &
      server=$!
      for _ in $(seq 120); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 1; done
      timeout 90 "$bins/deltaserve" smoke --url http://127.0.0.1:$port >"$res/smoke.log" 2>&1
      log "== smoke rc=$? $(tail -1 "$res/smoke.log")"
      kill -TERM $server
      wait $server
      log "== serve exit $?"
      ;;
    servebench:*)
      IFS=: read -r _ shape conc flags <<<"$step"
      port=18090
      name="bench-serve-$shape-c$conc${flags:+-${flags//[^A-Za-z0-9]/}}"
      # shellcheck disable=SC2086 # FLAGS are serve flags, split on purpose
      "$bins/deltaserve" serve --port $port --enable-metrics --model-path "examples/$shape" \
        --load-format dummy --tokenizer-path models/demo --skip-canary $flags >"$res/$name-server.log" 2>&1 &
      server=$!
      for _ in $(seq 150); do grep -q "^listening" "$res/$name-server.log" && break; sleep 1; done
      timeout "$(($(left) < 180 ? $(left) : 180))" "$bins/deltaserve" bench serve --url "http://127.0.0.1:$port" \
        --concurrency "$conc" --num-prompts $((2 * conc)) --input-len 256 --output-len 128 --stream \
        >"$res/$name.txt" 2>&1
      log "== $name rc=$? $(grep -m1 'Output token throughput' "$res/$name.txt")"
      curl -s "http://127.0.0.1:$port/metrics" >"$res/$name-metrics.txt"
      grep -E '^deltaserve_engine_(host_gap|device_work)' "$res/$name-metrics.txt" | tee -a "$res/summary.log"
      grep '^decode:' "$res/$name-server.log" | tail -4 | tee -a "$res/summary.log"
      kill -TERM $server
      wait $server
      ;;
    servefp8:*)
      IFS=: read -r _ times defs <<<"$step"
      split_defines "$defs"
      port=18100
      for defines in "${d[@]}"; do
        for i in $(seq "$times"); do
          [ "$(left)" -lt 20 ] && break
          port=$((port + 1))
          name="servefp8-${defines:-default}-$i"
          name=${name//[^A-Za-z0-9._-]/_}
          DELTASERVE_CUDA_DEFINES="$defines" "$bins/deltaserve" serve --port $port --quantization fp8 \
            --speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 \
            --speculative-num-draft-tokens 4 >"$res/$name.log" 2>&1 &
          server=$!
          for _ in $(seq 90); do grep -q "^listening" "$res/$name.log" && break; sleep 1; done
          timeout 60 "$bins/deltaserve" smoke --url http://127.0.0.1:$port >"$res/$name-smoke.log" 2>&1
          log "== $name smoke rc=$? $(tail -1 "$res/$name-smoke.log") | $(grep -m1 -oE 'canary ok|CANARY FAILED.*' "$res/$name.log" | cut -c1-60)"
          kill -TERM $server
          wait $server
        done
      done
      ;;
    ncu:* | ncukernel:*)
      # ncu:D,D           24 GEMV launches of a 27B FP8 decode, one run per defines value;
      # ncukernel:SHAPE:REGEX:FLAGS:D,D   the first 24 launches of the kernels matching REGEX in a
      # short un-captured bench of SHAPE with FLAGS (e.g. a verify's lanes: "qwen3.6-35b-a3b:
      # gemv_bf16_lanes_t4:--speculative-num-steps 3").
      if [ "${step%%:*}" = ncu ]; then
        shape=qwen3.6-27b regex=gemv skip=700 flags="--quantization fp8" defs=${step#ncu:}
      else
        IFS=: read -r _ shape regex flags defs <<<"$step"
        skip=0
      fi
      lengths=""
      [[ " $flags " == *" --prefill-len "* ]] || lengths+=" --prefill-len 16"
      [[ " $flags " == *" --decode-len "* ]] || lengths+=" --decode-len 6"
      split_defines "$defs"
      for defines in "${d[@]}"; do
        name="ncu-${shape}-${regex}-${defines:-default}"
        name=${name//[^A-Za-z0-9._-]/_}
        # shellcheck disable=SC2086 # FLAGS are bench flags, split on purpose
        DELTASERVE_CUDA_DEFINES="$defines" timeout "$(($(left) < 200 ? $(left) : 200))" ncu --clock-control none \
          -k "regex:$regex" --launch-skip "$skip" --launch-count 24 --csv --page raw --metrics \
          gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__warps_active.avg.per_cycle_active,smsp__issue_active.avg.per_cycle_active,launch__grid_size,launch__registers_per_thread,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,sm__cycles_active.avg,gpc__cycles_elapsed.max \
          "$bins/deltaserve" bench --backend cuda --model-path "examples/$shape" --load-format dummy \
          $flags $lengths --disable-cuda-graph >"$res/$name.csv" 2>"$res/$name.err"
        log "== $name rc=$?"
        python3 scripts/ncu_summary.py "$res/$name.csv" | tee -a "$res/summary.log"
      done
      ;;
    ncustep:* | ncucycle:*)
      IFS=: read -r kind shape flags defines <<<"$step"
      name="$kind-$shape${flags:+-${flags//[^A-Za-z0-9]/}}${defines:+-${defines//[^A-Za-z0-9]/_}}"
      # A plain step: 3 decode steps, the last one cut out. An MTP cycle: 8 decode tokens, so the run
      # ends in two whole speculative cycles (a verify of 4 tokens and 3 draft steps each) after its
      # plain decode steps; ~6,800 launches on the 35B-A3B shape at ~30 ms each under Nsight Compute.
      decode=3 cap=200 period=20 more=""
      [ "$kind" = ncucycle ] && decode=8 cap=360 period=300 more="--speculative-num-steps 3"
      # shellcheck disable=SC2086 # FLAGS are bench flags, split on purpose
      DELTASERVE_CUDA_DEFINES="$defines" timeout "$(($(left) < cap ? $(left) : cap))" \
        ncu --clock-control none --csv --page raw --metrics gpu__time_duration.sum,dram__bytes_read.sum \
        "$bins/deltaserve" bench --backend cuda --model-path "examples/$shape" --load-format dummy \
        --prefill-len 8 --decode-len $decode --warmup 0 --disable-cuda-graph $more $flags \
        >"$res/$name.csv" 2>"$res/$name.err"
      log "== $name rc=$?"
      python3 scripts/ncu_step.py "$res/$name.csv" --min-period $period 2>&1 | tee -a "$res/summary.log"
      ;;
    profile:*)
      IFS=: read -r _ shape flags defines <<<"$step"
      name="profile-$shape${flags:+-${flags//[^A-Za-z0-9]/}}${defines:+-${defines//[^A-Za-z0-9]/_}}"
      fp8=0
      case " $flags " in *" --quantization fp8 "*) fp8=1 ;; esac
      # shellcheck disable=SC2086 # FLAGS are bench flags, split on purpose
      DELTASERVE_CUDA_FP8_WEIGHTS=$fp8 DELTASERVE_CUDA_DEFINES="$defines" \
        timeout "$(($(left) < 180 ? $(left) : 180))" "$bins/deltaserve" bench --backend cuda \
        --model-path "examples/$shape" --load-format dummy --prefill-len 256 --decode-len 8 --profile $flags \
        >"$res/$name.txt" 2>"$res/$name.err"
      log "== $name rc=$?"
      # The batched steps' tables past batch 1, or the plain decode's when FLAGS ask for no batch.
      table='^decode, batch [0-9]+:'
      grep -Eq "$table" "$res/$name.txt" || table='^decode:'
      awk -v t="$table" '$0 ~ t { on = $3 != "1:"; if (on) print; next } on && /^  / { print; next } { on = 0 }' \
        "$res/$name.txt" | tee -a "$res/summary.log"
      ;;
    sh:*)
      timeout "$(left)" bash -c "${step#sh:}" >>"$res/sh.log" 2>&1
      log "== sh rc=$?"
      ;;
    *) log "== unknown step $step" ;;
  esac
done
log "total $(($(date +%s) - t0)) s"
