#!/usr/bin/env python3
"""Train the bundled demo model (models/demo): our own byte-level BPE tokenizer, a small Qwen3.5 text model
(3 Gated DeltaNet layers to 1 gated full-attention layer) and its MTP head, trained jointly.

The MTP head follows docs/model.md, "MTP head": for the pair (h_t, x_{t+1}) it computes
fc(cat(pre_fc_norm_embedding(embed[x_{t+1}]), pre_fc_norm_hidden(h_t))) with h_t the trunk's POST-final-norm
hidden state, runs one full-attention decoder layer (transformers' own Qwen3.5 layer class), applies mtp.norm
and the shared lm_head, and is trained to predict x_{t+2}. A second, chained MTP step (input: the MTP's own
post-norm output and x_{t+2}, at position t+1, attending to the true pairs up to t) is trained too, because
speculative decoding runs the head several times on its own outputs.

Writes models/demo/{config.json, generation_config.json, tokenizer.json, tokenizer_config.json,
model-0000k-of-0000n.safetensors, model.safetensors.index.json} and docs/demo_training.png.

Usage:
  python scripts/make_demo_corpus.py --out /tmp/demo/corpus.jsonl
  python scripts/train_demo_model.py --corpus /tmp/demo/corpus.jsonl --time-budget 430
  python scripts/train_demo_model.py --smoke --corpus /tmp/demo_smoke/corpus.jsonl \
      --heldout /tmp/demo_smoke/heldout.jsonl   # CPU, under a minute; writes under /tmp/demo_smoke
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parent.parent
CHAT_TEMPLATE_PATH = REPO_ROOT / "scripts" / "chat_template.jinja"
DEFAULT_MODEL_DIR = REPO_ROOT / "models" / "demo"
DEFAULT_PLOT = REPO_ROOT / "docs" / "demo_training.png"

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
                  "</tool_call>", "<tool_response>", "</tool_response>"]
# Qwen3.5's pre-tokenizer split: case-insensitive English contractions, letter runs (with one leading
# non-letter, non-digit character), SINGLE digits, punctuation runs, newlines, other whitespace.
PRETOKENIZE_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                       r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
MAX_SHARD_BYTES = 15 * 1024 * 1024
MTP_WEIGHT = 0.3
MTP_CHAIN_WEIGHT = 0.5  # relative to the first MTP step


def model_dims(smoke_tiny: bool) -> dict:
    """Text-config dimensions. Head sizes match the real Qwen3.5 models (D=256, dk=dv=128)."""
    dims = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=8, num_attention_heads=4,
                num_key_value_heads=2, head_dim=256, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4)
    if smoke_tiny:
        dims.update(hidden_size=64, intermediate_size=128, num_hidden_layers=4, head_dim=64,
                    linear_key_head_dim=32, linear_value_head_dim=32)
    return dims


# ----------------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------------


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)

    def without_specials():
        for text in texts:
            for token in SPECIAL_TOKENS:
                text = text.replace(token, "\n")
            yield text

    tokenizer.train_from_iterator(without_specials(), trainer, length=len(texts))
    return tokenizer


def special_ids(tokenizer) -> dict[str, int]:
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        raise RuntimeError(f"tokenizer: special tokens {missing} missing after training")
    return ids


# ----------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------


class EncodedCorpus:
    """Token ids and loss masks (True on trained assistant tokens) of every usable training conversation."""

    def __init__(self, records: list[dict], tokenizer, max_len: int):
        im_end = tokenizer.token_to_id("<|im_end|>")
        full = tokenizer.encode_batch([r["text"] for r in records], add_special_tokens=False)
        flat_prompts = [r["text"][:n] for r in records for n in r["prompt_chars"]]
        prompt_encodings = tokenizer.encode_batch(flat_prompts, add_special_tokens=False)
        self.ids: list[np.ndarray] = []
        self.masks: list[np.ndarray] = []
        self.dropped_long = 0
        cursor = 0
        for record, encoding in zip(records, full):
            token_list = encoding.ids
            ids = np.asarray(token_list, dtype=np.int64)
            mask = np.zeros(len(ids), dtype=bool)
            for _ in record["prompt_chars"]:
                prompt_ids = prompt_encodings[cursor].ids
                cursor += 1
                start = len(prompt_ids)
                if token_list[:start] != prompt_ids:
                    raise RuntimeError(f"tokenizer: the prompt of a {record['task']} conversation does not "
                                       "tokenize to a prefix of the full conversation")
                ends = np.nonzero(ids[start:] == im_end)[0]
                if len(ends) == 0:
                    raise RuntimeError(f"corpus: a trained {record['task']} turn has no <|im_end|>")
                mask[start:start + ends[0] + 1] = True
            if len(ids) > max_len:
                self.dropped_long += 1
                continue
            self.ids.append(ids)
            self.masks.append(mask)
        self.lengths = np.array([len(x) for x in self.ids])

    def token_count(self) -> int:
        return int(self.lengths.sum())


def make_batches(corpus: EncodedCorpus, tokens_per_batch: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffled batches of similar-length conversations, each padded length * size <= tokens_per_batch."""
    order = rng.permutation(len(corpus.ids))
    batches = []
    group = 256
    for start in range(0, len(order), group):
        chunk = order[start:start + group]
        chunk = chunk[np.argsort(corpus.lengths[chunk], kind="stable")]
        current: list[int] = []
        for index in chunk:
            padded = round_up(max(corpus.lengths[current + [index]]), 64)
            if current and padded * (len(current) + 1) > tokens_per_batch:
                batches.append(np.array(current))
                current = []
            current.append(index)
        if current:
            batches.append(np.array(current))
    rng.shuffle(batches)
    return batches


def round_up(x: int, multiple: int) -> int:
    return (int(x) + multiple - 1) // multiple * multiple


def collate(corpus: EncodedCorpus, batch: np.ndarray, pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    # Padding to a multiple of 64 (the GDN chunk size, which pads anyway) keeps the number of shapes small.
    length = round_up(max(corpus.lengths[batch]), 64)
    ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), length), dtype=torch.bool)
    for row, index in enumerate(batch):
        n = corpus.lengths[index]
        ids[row, :n] = torch.from_numpy(corpus.ids[index])
        mask[row, :n] = torch.from_numpy(corpus.masks[index])
    return ids.to(device, non_blocking=True), mask.to(device, non_blocking=True)


# ----------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------


def text_config_dict(dims: dict, vocab_size: int, ids: dict[str, int], max_positions: int) -> dict:
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                   for i in range(dims["num_hidden_layers"])]
    rotary_dim = int(dims["head_dim"] * 0.25)
    half = rotary_dim // 2
    mrope_section = [half - 2 * (half // 3), half // 3, half // 3] if half != 32 else [11, 11, 10]
    return {
        "model_type": "qwen3_5_text",
        "vocab_size": vocab_size,
        **dims,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-6,
        "initializer_range": 0.02,
        "layer_types": layer_types,
        "full_attention_interval": 4,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": mrope_section, "mrope_interleaved": True},
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "mamba_ssm_dtype": "float32",
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": ids["<|endoftext|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "dtype": "bfloat16",
    }


def build_text_config(text_dict: dict):
    from transformers import Qwen3_5TextConfig

    kwargs = {k: v for k, v in text_dict.items() if k not in ("model_type", "dtype")}
    config = Qwen3_5TextConfig(**kwargs)
    config._attn_implementation = "sdpa"
    return config


class MtpHead(nn.Module):
    """Qwen3.5 multi-token-prediction head (docs/model.md, "MTP head"). Embedding and lm_head are the trunk's, passed in."""

    def __init__(self, text_config):
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

        hidden, eps = text_config.hidden_size, text_config.rms_norm_eps
        layer_config = copy.deepcopy(text_config)
        layer_config.layer_types = ["full_attention"]
        layer_config.num_hidden_layers = 1
        layer_config._attn_implementation = "sdpa"
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(hidden, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(hidden, eps=eps)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(layer_config, 0)])
        self.norm = Qwen3_5RMSNorm(hidden, eps=eps)
        std = text_config.initializer_range
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, Qwen3_5RMSNorm):
                nn.init.zeros_(module.weight)

    def forward(self, next_token_embeds: torch.Tensor, hidden: torch.Tensor,
                position_embeddings: tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Post-mtp.norm output for each (hidden_t, embed[x_{t+1}]) pair; causal when attention_mask is None."""
        fused = self.fc(torch.cat([self.pre_fc_norm_embedding(next_token_embeds), self.pre_fc_norm_hidden(hidden)],
                                  dim=-1))
        out = self.layers[0](fused, position_embeddings=position_embeddings, attention_mask=attention_mask)
        if isinstance(out, tuple):
            out = out[0]
        return self.norm(out)


def rope(trunk, like: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for text positions [B, N] (the three M-RoPE rows are equal for text)."""
    return trunk.model.rotary_emb(like, positions.unsqueeze(0).expand(3, -1, -1))


def chain_attention_mask(num_pairs: int, steps: int, device) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Mask and positions for `steps` chained MTP steps computed in one pass.

    Block 0 holds the true pairs t = 0..N-1 (position t). Block s >= 1 holds the s-th chained input for
    t = 0..N-1-s (position t + s): it attends to the true pairs 0..t and to blocks 1..s at the same t, exactly
    the keys a sequential speculative draft would have in its KV cache. Returns (mask [1,1,Q,Q] bool,
    positions [Q], block offsets).
    """
    block_t, block_id, offsets = [], [], []
    for s in range(steps):
        offsets.append(sum(len(x) for x in block_t))
        t = torch.arange(num_pairs - s, device=device)
        block_t.append(t)
        block_id.append(torch.full_like(t, s))
    t = torch.cat(block_t)
    b = torch.cat(block_id)
    to_true = (b[None, :] == 0) & (t[None, :] <= t[:, None])
    to_chain = (b[None, :] >= 1) & (t[None, :] == t[:, None]) & (b[None, :] <= b[:, None])
    mask = (to_true | to_chain)[None, None]
    return mask, t + b, offsets


def mtp_chain(trunk, mtp: MtpHead, ids: torch.Tensor, hidden: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Outputs of `steps` chained MTP steps over a teacher-forced sequence.

    ids [B, L], hidden [B, L, H] = trunk post-norm hidden. Returns a list m_1..m_steps; m_s[:, t] is the
    step-s output for the pair started at t and predicts x_{t+1+s}; m_s has L - s columns.
    """
    embeds = trunk.model.embed_tokens(ids)
    num_pairs = ids.shape[1] - 1
    positions = torch.arange(num_pairs, device=ids.device)[None].expand(ids.shape[0], -1)
    outputs = [mtp(embeds[:, 1:], hidden[:, :-1], rope(trunk, hidden, positions))]
    for s in range(1, steps):
        mask, pos, offsets = chain_attention_mask(num_pairs, s + 1, ids.device)
        inputs_e = [embeds[:, 1:]] + [embeds[:, 1 + r:] for r in range(1, s + 1)]
        inputs_h = [hidden[:, :-1]] + [outputs[r - 1][:, : num_pairs - r] for r in range(1, s + 1)]
        pos = pos[None].expand(ids.shape[0], -1)
        out = mtp(torch.cat(inputs_e, dim=1), torch.cat(inputs_h, dim=1), rope(trunk, hidden, pos), mask)
        outputs.append(out[:, offsets[s]:])
    return outputs


def build_models(text_dict: dict, device):
    from transformers import Qwen3_5ForCausalLM

    config = build_text_config(text_dict)
    trunk = Qwen3_5ForCausalLM(config)
    trunk.config._attn_implementation = "sdpa"
    mtp = MtpHead(config)
    return trunk.to(device), mtp.to(device)


def check_torch_gdn_path() -> None:
    """flash-linear-attention's backward refuses Hopper; transformers must use its torch GDN path."""
    for package in ("fla", "causal_conv1d"):
        if importlib.util.find_spec(package) is not None:
            raise RuntimeError(f"package {package!r} is importable; transformers would route Gated DeltaNet through "
                               "it. Train in an environment without it (the torch path is needed).")


# ----------------------------------------------------------------------------------------------------------
# Saving in the layout of real Qwen3.5 checkpoints
# ----------------------------------------------------------------------------------------------------------


def checkpoint_tensors(trunk, mtp) -> dict[str, torch.Tensor]:
    tensors = {}
    for name, value in trunk.state_dict().items():
        if name.startswith("model."):
            tensors["model.language_model." + name[len("model."):]] = value
        elif name == "lm_head.weight":
            tensors[name] = value
        else:
            raise RuntimeError(f"unexpected trunk tensor {name}")
    for name, value in mtp.state_dict().items():
        tensors["mtp." + name] = value
    return {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in sorted(tensors.items())}


def save_sharded(tensors: dict[str, torch.Tensor], out_dir: Path) -> list[str]:
    from safetensors.torch import save_file

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, value in tensors.items():
        nbytes = value.numel() * value.element_size()
        if shards[-1] and size + nbytes > MAX_SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = value
        size += nbytes
    for old in out_dir.glob("model*.safetensors"):
        old.unlink()
    weight_map, names = {}, []
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out_dir / file), metadata={"format": "pt"})
        (out_dir / file).chmod(0o644)
        names.append(file)
        weight_map.update({name: file for name in shard})
    total = sum(v.numel() * v.element_size() for v in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return names


def write_model_dir(out_dir: Path, tokenizer, text_dict: dict, trunk, mtp, ids: dict[str, int]) -> None:
    import transformers

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    hidden = text_dict["hidden_size"]
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text_dict,
        # No vision weights ship with the demo. This minimal tower only lets HF instantiate the class.
        "vision_config": {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 32, "intermediate_size": 64,
                          "num_heads": 2, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
                          "temporal_patch_size": 2, "out_hidden_size": hidden, "num_position_embeddings": 64,
                          "hidden_act": "gelu_pytorch_tanh", "initializer_range": 0.02},
        "tie_word_embeddings": False,
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "dtype": "bfloat16",
        "transformers_version": transformers.__version__,
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {
        "do_sample": True,
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "transformers_version": transformers.__version__,
    }
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    added = {str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": True} for t in SPECIAL_TOKENS}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": text_dict["max_position_embeddings"],
        "split_special_tokens": False,
        "added_tokens_decoder": dict(sorted(added.items(), key=lambda kv: int(kv[0]))),
        "chat_template": CHAT_TEMPLATE_PATH.read_text(encoding="utf-8"),
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")
    save_sharded(checkpoint_tensors(trunk, mtp), out_dir)


# ----------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------


def losses(trunk, mtp, ids: torch.Tensor, mask: torch.Tensor, chain_steps: int) -> list[torch.Tensor]:
    """[trunk loss, mtp step-1 loss, (mtp step-2 loss)]: mean CE over trained target tokens."""
    hidden = trunk.model(input_ids=ids, use_cache=False).last_hidden_state
    results = []
    targets = mask[:, 1:]
    logits = trunk.lm_head(hidden[:, :-1][targets])
    results.append(F.cross_entropy(logits.float(), ids[:, 1:][targets]))
    for s, out in enumerate(mtp_chain(trunk, mtp, ids, hidden, chain_steps), start=1):
        # out[:, t] predicts x_{t+1+s}; the last column has no target inside the sequence.
        targets = mask[:, 1 + s:]
        logits = trunk.lm_head(out[:, :-1][targets])
        results.append(F.cross_entropy(logits.float(), ids[:, 1 + s:][targets]))
    return results


def lr_at(step: int, progress: float, peak: float, warmup: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to 10 % over `progress` in [0, 1] (the fraction
    of the run done, by time or by steps, whichever is further)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, max(0.0, progress))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def parameter_groups(modules: list[nn.Module], weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for module in modules:
        for name, p in module.named_parameters():
            (decay if p.ndim >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def plot_curves(history: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(steps, [h["trunk"] for h in history], label="trunk loss (next token)")
    ax.plot(steps, [h["mtp1"] for h in history], label="MTP step 1 loss (token t+2)")
    if history and "mtp2" in history[0]:
        ax.plot(steps, [h["mtp2"] for h in history], label="MTP chained step 2 loss (token t+3)")
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy on assistant tokens (nats)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True, help="JSONL written by make_demo_corpus.py")
    parser.add_argument("--heldout", type=Path, default=REPO_ROOT / "tests" / "data" / "demo" / "heldout.jsonl")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--plot", type=Path, default=DEFAULT_PLOT)
    parser.add_argument("--metrics", type=Path, default=None, help="JSON with the loss history and run facts")
    parser.add_argument("--smoke", action="store_true", help="CPU-sized run: few steps, small batches")
    parser.add_argument("--full-size", action="store_true",
                        help="with --smoke: keep the real model dimensions (slow on CPU: ~30 s a step)")
    parser.add_argument("--time-budget", type=float, default=430.0,
                        help="seconds of optimisation; the cosine schedule runs over this wall-clock time")
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--tokens-per-batch", type=int, default=49_152)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--vocab-size", type=int, default=4000)
    parser.add_argument("--max-len", type=int, default=640)
    parser.add_argument("--tokenizer-texts", type=int, default=60_000, help="conversations the BPE is trained on")
    parser.add_argument("--chain-steps", type=int, default=2, help="MTP steps trained (1 = plain MTP loss)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--log-every", type=int, default=25)
    args = parser.parse_args(argv)
    if args.smoke:
        # A smoke run never overwrites the shipped model: its outputs go next to the corpus unless given.
        if args.out_dir == DEFAULT_MODEL_DIR:
            args.out_dir = args.corpus.parent / "model"
        if args.plot == DEFAULT_PLOT:
            args.plot = args.corpus.parent / "demo_training.png"
        args.time_budget = min(args.time_budget, 25.0)
        args.max_steps = min(args.max_steps, 12)
        args.tokens_per_batch = min(args.tokens_per_batch, 2048)
        args.warmup = min(args.warmup, 4)
        args.log_every = 2

    check_torch_gdn_path()
    # The torch GDN path does its chunk algebra in fp32; TF32 matmuls are plenty for training.
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    started = time.time()

    records = [json.loads(line) for line in args.corpus.open(encoding="utf-8")]
    heldout_keys, heldout_users = set(), set()
    if args.heldout.exists():
        for line in args.heldout.open(encoding="utf-8"):
            r = json.loads(line)
            if r["keys"]:
                heldout_keys.add(r["keys"][0])  # the held-out question; later keys belong to its chat history
            if r["messages"][-1]["role"] == "user":
                heldout_users.add(r["messages"][-1]["content"])
    final_keys = {r["keys"][0] for r in records if r["keys"]}
    leaked = [r for r in records if set(r["keys"]) & heldout_keys or r["user"] in heldout_users]
    if leaked:
        raise RuntimeError(f"{len(leaked)} training conversations ask a held-out question, e.g. {leaked[0]['user']!r}")
    print(f"[data] {len(records)} conversations, {len(final_keys)} distinct final-question keys, "
          f"held-out keys checked: {len(heldout_keys)}", flush=True)

    tokenizer = train_tokenizer([r["text"] for r in records[: args.tokenizer_texts]], args.vocab_size)
    ids = special_ids(tokenizer)
    vocab_rows = round_up(tokenizer.get_vocab_size(), 128)
    corpus = EncodedCorpus(records, tokenizer, args.max_len)
    del records
    print(f"[tokenizer] {tokenizer.get_vocab_size()} tokens (embedding rows {vocab_rows}); special ids {ids}; "
          f"{len(corpus.ids)} conversations, {corpus.token_count()} tokens, "
          f"{int(sum(m.sum() for m in corpus.masks))} trained, {corpus.dropped_long} dropped as longer than "
          f"{args.max_len}; {time.time() - started:.1f}s", flush=True)

    dims = model_dims(args.smoke and not args.full_size)
    text_dict = text_config_dict(dims, vocab_rows, ids, max_positions=8192)
    trunk, mtp = build_models(text_dict, device)
    trunk_params = sum(p.numel() for p in trunk.parameters())
    mtp_params = sum(p.numel() for p in mtp.parameters())
    print(f"[model] trunk {trunk_params / 1e6:.2f} M + MTP {mtp_params / 1e6:.2f} M = "
          f"{(trunk_params + mtp_params) / 1e6:.2f} M parameters; layer types {text_dict['layer_types']}", flush=True)

    optimizer = torch.optim.AdamW(parameter_groups([trunk, mtp], args.weight_decay), lr=args.lr,
                                  betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    use_bf16 = device.type == "cuda"
    data_rng = np.random.default_rng(args.seed)
    batches: list[np.ndarray] = []
    history: list[dict] = []
    step, epoch, tokens_seen = 0, 0, 0
    window = {"trunk": 0.0, "mtp1": 0.0, "mtp2": 0.0, "n": 0, "tokens": 0}
    train_started = time.time()
    window_started = train_started
    trunk.train()
    mtp.train()
    finished = False
    while not finished:
        if not batches:
            batches = make_batches(corpus, args.tokens_per_batch, data_rng)
            epoch += 1
        batch = batches.pop()
        input_ids, mask = collate(corpus, batch, ids["<|endoftext|>"], device)
        progress = max((time.time() - train_started) / args.time_budget, step / args.max_steps)
        lr = lr_at(step, progress, args.lr, args.warmup)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16):
            parts = losses(trunk, mtp, input_ids, mask, args.chain_steps)
        mtp_loss = parts[1] + sum(MTP_CHAIN_WEIGHT * p for p in parts[2:])
        loss = parts[0] + MTP_WEIGHT * mtp_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(list(trunk.parameters()) + list(mtp.parameters()), 1.0)
        optimizer.step()
        step += 1
        tokens_seen += input_ids.numel()
        window["tokens"] += input_ids.numel()
        for key, value in zip(("trunk", "mtp1", "mtp2"), parts):
            window[key] += value.detach()
        window["n"] += 1
        elapsed = time.time() - train_started
        finished = elapsed >= args.time_budget or step >= args.max_steps
        if step % args.log_every == 0 or finished:
            n = window["n"]
            entry = {"step": step, "epoch": epoch, "lr": lr, "trunk": float(window["trunk"]) / n,
                     "mtp1": float(window["mtp1"]) / n,
                     "grad_norm": float(grad_norm), "elapsed_s": round(elapsed, 1),
                     "tokens_per_s": round(window["tokens"] / max(1e-9, time.time() - window_started))}
            if args.chain_steps >= 2:
                entry["mtp2"] = float(window["mtp2"]) / n
            history.append(entry)
            print("[train] " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                        for k, v in entry.items()), flush=True)
            window = {"trunk": 0.0, "mtp1": 0.0, "mtp2": 0.0, "n": 0, "tokens": 0}
            window_started = time.time()
    train_seconds = time.time() - train_started

    trunk.eval()
    mtp.eval()
    write_model_dir(args.out_dir, tokenizer, text_dict, trunk, mtp, ids)
    size = sum(f.stat().st_size for f in args.out_dir.iterdir() if f.is_file())
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    title = (f"demo model: {(trunk_params + mtp_params) / 1e6:.1f} M params, {step} steps, "
             f"{train_seconds:.0f}s on {device_name}")
    plot_curves(history, args.plot, title)
    facts = {
        "steps": step, "epochs_started": epoch, "train_seconds": round(train_seconds, 1),
        "tokens_seen": tokens_seen, "tokens_per_s": round(tokens_seen / max(train_seconds, 1e-9)),
        "trunk_params": trunk_params, "mtp_params": mtp_params, "device": device_name,
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "corpus_conversations": len(corpus.ids), "corpus_tokens": corpus.token_count(),
        "vocab": tokenizer.get_vocab_size(), "embedding_rows": vocab_rows, "model_dir_bytes": size,
        "args": {k: str(v) for k, v in vars(args).items()}, "history": history,
    }
    if args.metrics:
        args.metrics.parent.mkdir(parents=True, exist_ok=True)
        args.metrics.write_text(json.dumps(facts, indent=2) + "\n")
    print(f"[done] {step} steps in {train_seconds:.0f}s ({facts['tokens_per_s']} tokens/s incl. padding); "
          f"wrote {args.out_dir} ({size / 1e6:.1f} MB) and {args.plot}; total {time.time() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
