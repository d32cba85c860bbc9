#!/usr/bin/env python3
"""The table of one scripts/bench_cpu_peers.sh run: reads OUT_DIR's llama-bench-R.json and
deltaserve-LEVEL-R.json and prints, per round, prefill and decode throughput of every peer with the decode
weight bandwidth as a fraction of the streaming read measured by the deltaserve runs of the same round,
and transformers' row when the run has one (transformers.json).

    python3 scripts/cpu_peers_summary.py OUT_DIR

llama.cpp's decode bandwidth uses deltaserve's count of the bytes a decode step reads (every matrix plus
the tied embedding as the output layer, bf16): the GGUF holds the same matrices in bf16, so a step of
either reads the same bytes. Note: llama-bench's tg32 decodes from an empty context, deltaserve's 32 steps
follow its 512-token prefill.
"""
import glob
import json
import os
import re
import sys


def rounds_of(out: str) -> list:
    found = set()
    for path in glob.glob(os.path.join(out, "*-*.json")):
        match = re.search(r"-(\d+)\.json$", path)
        if match:
            found.add(int(match.group(1)))
    return sorted(found)


def llama_rows(path: str) -> dict:
    """{"prefill": (avg, stddev), "decode": (avg, stddev)} from llama-bench's JSON array."""
    with open(path) as f:
        tests = json.load(f)
    rows = {}
    for test in tests:
        key = "prefill" if test["n_prompt"] > 0 and test["n_gen"] == 0 else "decode"
        rows[key] = (test["avg_ts"], test["stddev_ts"], test)
    return rows


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: cpu_peers_summary.py OUT_DIR")
    out = sys.argv[1]
    rounds = rounds_of(out)
    if not rounds:
        sys.exit(f"cpu_peers_summary: no llama-bench-R.json or deltaserve-LEVEL-R.json in {out}")

    print("| round | peer | prefill 512 tokens | decode | decode weight bandwidth / streaming read |")
    print("|---|---|---|---|---|")
    described = None
    for r in rounds:
        deltaserve = {}
        for path in sorted(glob.glob(os.path.join(out, f"deltaserve-*-{r}.json"))):
            with open(path) as f:
                record = json.load(f)
            deltaserve[record["cpu_kernels"]] = record
        reads = [d["read_bandwidth_gb_per_s"] for d in deltaserve.values() if d.get("read_bandwidth_gb_per_s")]
        read = sum(reads) / len(reads) if reads else None
        step_bytes = next((d["decode_weight_bytes_per_token"] for d in deltaserve.values()), None)

        llama_path = os.path.join(out, f"llama-bench-{r}.json")
        if os.path.exists(llama_path):
            rows = llama_rows(llama_path)
            prefill, prefill_sd, test = rows["prefill"]
            decode, decode_sd, _ = rows["decode"]
            described = described or test
            if step_bytes and read:
                gbps = decode * step_bytes / 1e9
                fraction = f"{gbps:.1f} / {read:.1f} GB/s = {100 * gbps / read:.0f} %"
            else:
                fraction = "-"
            print(f"| {r} | llama.cpp (llama-bench, AVX2 build) | {prefill:.1f} ± {prefill_sd:.1f} tok/s "
                  f"| {decode:.2f} ± {decode_sd:.2f} tok/s | {fraction} |")
        for level, d in deltaserve.items():
            fraction = (f"{d['decode_weight_gb_per_s']:.1f} / {d['read_bandwidth_gb_per_s']:.1f} GB/s = "
                        f"{100 * d['roofline_fraction']:.0f} %") if d.get("roofline_fraction") else "-"
            print(f"| {r} | deltaserve `cpu` ({level}) | {d['prefill_tokens_per_s']:.1f} tok/s "
                  f"| {d['decode_tokens_per_s']:.2f} tok/s | {fraction} |")
    transformers_path = os.path.join(out, "transformers.json")
    if os.path.exists(transformers_path):
        with open(transformers_path) as f:
            t = json.load(f)
        print(f"| after the rounds | transformers {t['version']} (torch {t['torch']}, {t['attn']}, "
              f"logits of {t['prefill_logits_to_keep']} row) | {t['prefill_tokens_per_s']:.1f} tok/s "
              f"| {t['decode_tokens_per_s']:.2f} tok/s | - |")
    if described:
        print()
        print(f"llama-bench: build {described.get('build_commit')} ({described.get('build_number')}), "
              f"cpu_info \"{described.get('cpu_info')}\", backends {described.get('backends')}, "
              f"model {described.get('model_type')}, {described.get('model_size', 0) / 1e9:.2f} GB, "
              f"threads {described.get('n_threads')}, repetitions {len(described.get('samples_ts', []))}")
        print(f"deltaserve decode step reads {step_bytes} bytes (the read fraction of llama.cpp uses it too)")


if __name__ == "__main__":
    main()
