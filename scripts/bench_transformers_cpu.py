#!/usr/bin/env python3
"""The CPU peer measurement of docs/benchmarks.md under its original name: scripts/bench_transformers.py
with `--device cpu`, eager attention, 2 threads unless given, and the logits of the last prefill row only,
the same work as `deltaserve bench` (a server needs the next token's logits, not every row's; computing all
512 rows of a 248k-entry lm_head would add ~0.25 TFLOP to the peer's prefill). Prints one JSON line.

    .venv/bin/python scripts/bench_transformers_cpu.py --config examples/qwen3.5-0.8b/config.json --threads 2
"""
import os
import runpy
import sys

GENERAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_transformers.py")

if __name__ == "__main__":
    given = sys.argv[1:]
    defaults = ["--device", "cpu", "--attn", "eager", "--logits-to-keep", "1"]
    if not any(a == "--threads" or a.startswith("--threads=") for a in given):
        defaults += ["--threads", "2"]
    # argparse keeps the last value of a repeated option, so what the caller gave wins.
    sys.argv = [GENERAL] + defaults + given
    runpy.run_path(GENERAL, run_name="__main__")
