#!/usr/bin/env python3
"""Peer measurement for docs/benchmarks.md: Hugging Face transformers (bf16, random weights) prefill and
decode throughput of a Qwen3.5/3.6 model built from a config.json (nested text_config), on the CPU or on a
CUDA GPU. Prints one JSON line.

    .venv/bin/python scripts/bench_transformers.py --device cpu --config examples/qwen3.5-0.8b/config.json --threads 2
    python scripts/bench_transformers.py --device cuda --config examples/qwen3.6-27b/config.json

The model is constructed directly on the target device in bf16 (27B-class: ~54 GB of weights, no f32 copy
first), with transformers' own random initialisation, which runs on the device. The two devices run the
same code; only the device, the synchronisation around each timing and the memory accounting differ.

Measured: warm-up (one prefill of the same length and a few decode steps), then `--repeats` prefills of
`--prefill-len` random tokens into a fresh cache (median reported) and `--decode-len` single-token decode
steps after the last one (median step reported). The JSON also records what actually ran: the attention
implementation, and whether the Gated DeltaNet and causal-conv1d calls went to flash-linear-attention /
causal-conv1d kernels or to transformers' torch fallbacks (traced during one short forward, so it shows
what ran rather than what is installed). transformers has no MTP speculation for qwen3_5, so none is used.
"""
import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

import torch
import transformers
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from qwen35_text_config import text_config

# Functions whose callers reveal which Gated DeltaNet / conv / attention implementation ran.
TRACED = {
    "gdn_chunk": "chunk_gated_delta_rule",
    "gdn_recurrent": "recurrent_gated_delta_rule",
    "conv1d": "causal_conv1d",
    "attention": "attention_forward",
}
TRANSFORMERS_DIR = os.path.dirname(transformers.__file__)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="config.json with a text_config (or a flat text config)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--prefill-len", type=int, default=512)
    ap.add_argument("--decode-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=None, help="timed prefills (default: 3 on cuda, 1 on cpu)")
    ap.add_argument("--attn", choices=["auto", "sdpa", "eager"], default="auto",
                    help="attention implementation; auto = sdpa when torch and the model support it")
    ap.add_argument("--logits-to-keep", type=int, default=1,
                    help="prefill logits rows (1 = last row only, as generate() does; 0 = every row)")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


def choose_attention(requested: str) -> str:
    if requested != "auto":
        return requested
    sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    return "sdpa" if sdpa and getattr(Qwen3_5ForCausalLM, "_supports_sdpa", False) else "eager"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(config: Qwen3_5TextConfig, device: torch.device) -> Qwen3_5ForCausalLM:
    """The model allocated (and randomly initialised) on `device` directly in bf16."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen3_5ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    # No `.to(bfloat16)` afterwards: it would also round the f32 RoPE frequency buffers, which a
    # checkpoint loaded in bf16 keeps in f32. `param_dtypes` in the output shows what was built.
    return model.eval()


def classify(filename: str) -> str:
    if filename.startswith(TRANSFORMERS_DIR):
        return "transformers torch fallback"
    for package in ("fla", "causal_conv1d", "kernels"):
        if f"{os.sep}{package}{os.sep}" in filename:
            return package
    return filename


def trace_paths(model, vocab: int, device: torch.device) -> dict:
    """Which implementation each traced function resolved to during a short prefill and one decode step."""
    seen: dict = {}

    def profiler(frame, event, _arg):
        if event == "call":
            code = frame.f_code
            for key, needle in TRACED.items():
                if needle in code.co_name:
                    seen.setdefault(key, set()).add(f"{code.co_name} [{classify(code.co_filename)}]")

    ids = torch.randint(0, vocab, (1, 16), device=device)
    sys.setprofile(profiler)
    try:
        out = model(ids, use_cache=True, logits_to_keep=1)
        model(out.logits[:, -1:].argmax(-1), past_key_values=out.past_key_values, use_cache=True)
        sync(device)
    finally:
        sys.setprofile(None)
    return {key: sorted(seen.get(key, [])) for key in TRACED}


def fast_path_summary(paths: dict) -> dict:
    def verdict(keys) -> str:
        calls = [c for k in keys for c in paths[k]]
        if not calls:
            return "not seen"
        fallback = all("transformers torch fallback" in c for c in calls)
        return "torch fallback" if fallback else "kernel: " + ", ".join(calls)

    return {
        "gated_delta_rule": verdict(["gdn_chunk", "gdn_recurrent"]),
        "causal_conv1d": verdict(["conv1d"]),
    }


def installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def prefill(model, ids, logits_to_keep: int, device: torch.device):
    sync(device)
    start = time.perf_counter()
    out = model(ids, use_cache=True, logits_to_keep=logits_to_keep)
    sync(device)
    return out, time.perf_counter() - start


def decode(model, out, steps: int, device: torch.device) -> list:
    cache = out.past_key_values
    token = out.logits[:, -1:].argmax(-1)
    times = []
    for _ in range(steps):
        sync(device)
        start = time.perf_counter()
        out = model(token, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        token = out.logits[:, -1:].argmax(-1)
        sync(device)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_transformers: --device cuda, but torch sees no CUDA device")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (3 if device.type == "cuda" else 1)
    torch.manual_seed(args.seed)

    config = text_config(args.config)
    config._attn_implementation = choose_attention(args.attn)
    started = time.perf_counter()
    model = build(config, device)
    sync(device)
    build_s = time.perf_counter() - started
    params = sum(p.numel() for p in model.parameters())
    param_dtypes: dict = {}
    for p in model.parameters():
        key = str(p.dtype).removeprefix("torch.")
        param_dtypes[key] = param_dtypes.get(key, 0) + p.numel()
    if device.type == "cuda":
        weights_bytes = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)

    ids = torch.randint(0, config.vocab_size, (1, args.prefill_len), device=device)
    with torch.inference_mode():
        paths = trace_paths(model, config.vocab_size, device)
        out, _ = prefill(model, ids, args.logits_to_keep, device)  # warm-up
        decode(model, out, 3, device)
        del out
        prefill_times = []
        for _ in range(repeats):
            out, seconds = prefill(model, ids, args.logits_to_keep, device)
            prefill_times.append(seconds)
            if len(prefill_times) < repeats:
                del out
        steps = decode(model, out, args.decode_len, device)

    prefill_s = statistics.median(prefill_times)
    step_s = statistics.median(steps)
    result = {
        "peer": "transformers",
        "version": transformers.__version__,
        "torch": torch.__version__,
        "device": args.device,
        "config": args.config,
        "params": params,
        "dtype": "bfloat16",
        "param_dtypes": param_dtypes,
        "attn": model.config._attn_implementation,
        "fast_paths": fast_path_summary(paths),
        "traced_calls": paths,
        "installed": {name: installed(name) for name in ("fla", "causal_conv1d", "kernels")},
        "speculative": "none",
        "speculative_note": "transformers has no MTP speculative decoding for qwen3_5",
        "compiled": False,
        "build_s": round(build_s, 2),
        "prefill_tokens": args.prefill_len,
        "prefill_logits_to_keep": args.logits_to_keep,
        "prefill_repeats": repeats,
        "prefill_s_median": prefill_s,
        "prefill_tokens_per_s": args.prefill_len / prefill_s,
        "decode_steps": args.decode_len,
        "decode_context_start": args.prefill_len,
        "decode_tokens_per_s": 1.0 / step_s,
        "decode_ms_per_token_median": step_s * 1e3,
        "decode_ms_per_token_min": min(steps) * 1e3,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        result.update({
            "gpu": props.name,
            "cuda": torch.version.cuda,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "weights_gib": round(weights_bytes / 2**30, 2),
            "peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2),
        })
    else:
        import resource

        result.update({
            "threads": torch.get_num_threads(),
            # ru_maxrss is in KiB on Linux.
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        })
    print(json.dumps(result))


if __name__ == "__main__":
    main()
