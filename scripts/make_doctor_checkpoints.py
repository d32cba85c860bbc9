#!/usr/bin/env python3
"""Small random f32 checkpoints that `deltaserve doctor` must pass on a correct backend in any
precision (issue 12, "doctor compares like with like"): 6-layer hybrids whose random weights
amplify rounding, the shapes the fixtures do not cover.

  dense_dk_ne_dv   Qwen3.5 dense, 3 value heads per key head, key head dim 16 != value head dim 32
  qwen35_moe       Qwen3.5-MoE, 8 experts top-2, shared expert (packed experts)
  qwen3_next       Qwen3-Next, 8 experts top-2 without renormalisation, one dense layer

Written in the Hugging Face layout (config.json + model.safetensors, MTP head for Qwen3.5) under
OUT; no expected outputs (doctor computes its own reference). Seeded: the same OUT every run.

  python scripts/make_doctor_checkpoints.py OUT
  deltaserve doctor --backend cuda --model-path OUT/dense_dk_ne_dv
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import (
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3NextForCausalLM,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as fx  # noqa: E402  (the fixtures' random init and file layout)

LAYERS = 6


def dense_dk_ne_dv():
    config = fx.qwen35_dense_config()
    text = config.text_config
    text.num_hidden_layers = LAYERS
    text.linear_value_head_dim = 32
    text.layer_types = ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 2
    return Qwen3_5ForConditionalGeneration, config


def qwen35_moe():
    config = fx.qwen35_moe_config()
    config.text_config.num_hidden_layers = LAYERS
    config.text_config.layer_types = (
        ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 2
    )
    return Qwen3_5MoeForConditionalGeneration, config


def qwen3_next():
    config = fx.qwen3_next_config()
    config.num_hidden_layers = LAYERS
    config.layer_types = ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 2
    return Qwen3NextForCausalLM, config


def write(out: Path, name: str, build, seed: int) -> None:
    model_cls, config = build()
    model, gen = fx.new_random_model(model_cls, config, seed)
    tensors = fx.hf_saved_tensors(model)
    if fx.is_per_expert(tensors):
        tensors = fx.pack_experts(tensors)
    config_json = fx.config_dict(model)
    if "text_config" in config_json:
        mtp = fx.new_random_mtp(model, gen)
        tensors |= {"mtp." + k: v for k, v in mtp.state_dict().items()}
        config_json = fx.realistic_qwen35_config(config_json, "float32")
        config_json["text_config"]["full_attention_interval"] = 4
    directory = out / name
    fx.reset_dir(directory)
    fx.write_safetensors(directory / "model.safetensors", tensors)
    fx.write_json(directory / "config.json", config_json)
    print(f"{directory}: {sum(t.numel() for t in tensors.values())} parameters")


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    torch.set_grad_enabled(False)
    for seed, (name, build) in enumerate(
        [("dense_dk_ne_dv", dense_dk_ne_dv), ("qwen35_moe", qwen35_moe), ("qwen3_next", qwen3_next)]
    ):
        write(out, name, build, 100 + seed)


if __name__ == "__main__":
    main()
