#!/usr/bin/env python3
"""A bf16 GGUF of a randomly initialised Qwen3.5 text model, for llama.cpp's `llama-bench` (the CPU peer of
docs/benchmarks.md, issue 19). The weights are transformers' own random initialisation of the shape in
`--config` (a config.json with a text_config, as in examples/); the GGUF is written by llama.cpp's converter
as gathered by scripts/build_llama_cpp_peer.sh (`--converter DIR/convert`).

    python3 scripts/make_random_gguf.py --config examples/qwen3.5-0.8b/config.json \
        --converter target/llama-cpp-peer/convert --out /tmp/qwen35-0.8b-bf16.gguf

The converter needs a tokenizer. A Qwen3.5 tokenizer cannot be fetched (no network on the benchmark
machines), so the demo model's tokenizer (models/demo, a byte-level BPE with Qwen's special tokens) is
written beside the checkpoint; the converter pads the vocabulary to the config's `vocab_size` with unused
entries, so the output matrix and the embedding keep the real shape (248,320 rows). The converter identifies
a BPE pre-tokenizer by hashing the token ids of a test string, and the demo tokenizer's hash is not in its
table, so this script tells it the pre-tokenizer is "qwen35", the name a real Qwen3.5 checkpoint gets.
llama-bench feeds random token ids and never tokenizes text, so the tokenizer changes no measured work.
"""
import argparse
import os
import runpy
import shutil
import sys
import tempfile
import time

import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from qwen35_text_config import text_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="config.json with a text_config (or a flat text config)")
    ap.add_argument("--converter", required=True,
                    help="directory holding convert_hf_to_gguf.py, conversion/ and gguf-py/")
    ap.add_argument("--out", required=True, help="GGUF file to write")
    ap.add_argument("--tokenizer-dir", default=os.path.join(REPO, "models", "demo"),
                    help="directory with tokenizer.json and tokenizer_config.json (default: models/demo)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init-device", default="cpu",
                    help="where transformers initialises the random weights (cuda: seconds instead of minutes "
                         "for the 9B shape; the checkpoint is saved from there)")
    return ap.parse_args()


def write_checkpoint(config: Qwen3_5TextConfig, tokenizer_dir: str, directory: str, device: str) -> None:
    """A random bf16 Qwen3_5ForCausalLM saved as safetensors, with the tokenizer files beside it."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen3_5ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.save_pretrained(directory)
    for name in DEMO_TOKENIZER_FILES:
        source = os.path.join(tokenizer_dir, name)
        if not os.path.isfile(source):
            sys.exit(f"make_random_gguf: --tokenizer-dir {tokenizer_dir} has no {name}")
        shutil.copy(source, directory)


def convert(converter_dir: str, checkpoint: str, out: str) -> None:
    """Runs the vendored convert_hf_to_gguf.py in this process, with the pre-tokenizer named (see above)."""
    script = os.path.join(converter_dir, "convert_hf_to_gguf.py")
    if not os.path.isfile(script):
        sys.exit(f"make_random_gguf: --converter {converter_dir} has no convert_hf_to_gguf.py")
    sys.path[:0] = [converter_dir, os.path.join(converter_dir, "gguf-py")]
    from conversion import base  # the converter's own package, from converter_dir

    base.TextModel.get_vocab_base_pre = lambda _self, _tokenizer: "qwen35"
    # --no-mtp: transformers' Qwen3_5ForCausalLM has no MTP block, and without the flag the converter counts
    # the config's MTP layer in the block count, so llama.cpp would look for weights that are not there.
    sys.argv = [script, checkpoint, "--outtype", "bf16", "--no-mtp", "--outfile", out]
    runpy.run_path(script, run_name="__main__")


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    config = text_config(args.config)
    with tempfile.TemporaryDirectory(prefix="random-qwen35-") as checkpoint:
        started = time.perf_counter()
        write_checkpoint(config, args.tokenizer_dir, checkpoint, args.init_device)
        print(f"make_random_gguf: random checkpoint in {time.perf_counter() - started:.1f} s", flush=True)
        started = time.perf_counter()
        convert(args.converter, checkpoint, args.out)
        print(f"make_random_gguf: {args.out} in {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
