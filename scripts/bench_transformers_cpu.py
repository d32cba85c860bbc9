#!/usr/bin/env python3
"""Peer measurement for docs/benchmarks.md: transformers (eager, CPU, bf16) prefill and decode throughput
on a random-weight model built from a config.json (e.g. examples/qwen3.5-0.8b), with the same thread count
as `deltaserve bench`. Prints one JSON line.

    .venv/bin/python scripts/bench_transformers_cpu.py --config examples/qwen3.5-0.8b/config.json --threads 2
"""
import argparse
import json
import time

import torch
import transformers
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill-len", type=int, default=512)
    ap.add_argument("--decode-len", type=int, default=32)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    text = json.load(open(args.config))["text_config"]
    config = Qwen3_5TextConfig(**{k: v for k, v in text.items() if k not in ("model_type", "torch_dtype")})
    config._attn_implementation = "eager"
    with torch.device("cpu"):
        model = Qwen3_5ForCausalLM(config).to(torch.bfloat16).eval()
    ids = torch.randint(0, config.vocab_size, (1, args.prefill_len))
    with torch.inference_mode():
        model(ids[:, :8], use_cache=False)  # warm-up
        start = time.perf_counter()
        out = model(ids, use_cache=True)
        prefill_s = time.perf_counter() - start
        cache = out.past_key_values
        token = out.logits[:, -1:].argmax(-1)
        steps = []
        for _ in range(args.decode_len):
            t0 = time.perf_counter()
            out = model(token, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            token = out.logits[:, -1:].argmax(-1)
            steps.append(time.perf_counter() - t0)
    steps.sort()
    median = steps[len(steps) // 2]
    print(json.dumps({
        "peer": "transformers", "version": transformers.__version__, "torch": torch.__version__,
        "threads": args.threads, "dtype": "bfloat16", "attn": "eager",
        "prefill_tokens": args.prefill_len, "prefill_tokens_per_s": args.prefill_len / prefill_s,
        "decode_tokens_per_s": 1.0 / median, "decode_ms_per_token_median": median * 1e3,
    }))


if __name__ == "__main__":
    main()
