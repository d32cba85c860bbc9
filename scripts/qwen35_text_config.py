"""The Qwen3.5 text config of a deltaserve example or checkpoint directory's config.json, as transformers
builds it: the nested `text_config` of a multimodal config, or the flat text config itself. Shared by the
scripts that build a random checkpoint of an example's shape (bench_transformers.py, make_random_gguf.py)."""

import json

from transformers import Qwen3_5TextConfig


def text_config(path: str) -> Qwen3_5TextConfig:
    with open(path) as f:
        raw = json.load(f)
    text = raw.get("text_config", raw)
    fields = {k: v for k, v in text.items() if k not in ("model_type", "torch_dtype", "dtype")}
    return Qwen3_5TextConfig(**fields)
