#!/usr/bin/env python3
"""Build the golden fixtures under tests/fixtures/ with Hugging Face transformers.

Each fixture is a tiny RANDOM checkpoint written through transformers' own model classes
(`save_pretrained`), plus the outputs transformers computes for it in float32: prefill logits,
cached decode logits, a greedy generation and, for Qwen3.5 checkpoints with an MTP head, the
logits of a small Python implementation of the MTP math (docs/model.md, "MTP head").

Run from the repository root:  .venv/bin/python scripts/make_fixtures.py
The script is seeded and CPU-only; running it twice gives byte-identical .npy files.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import (
    GenerationConfig,
    Qwen3_5Config,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES_DIR = REPO_ROOT / "tests" / "fixtures"
GENERATOR = "scripts/make_fixtures.py"

PREFILL_LEN = 100  # > 64 and not a multiple of 64: GDN's chunked path crosses a chunk boundary
DECODE_PROMPT_LEN = 70
DECODE_STEPS = 6
GREEDY_PROMPT_LEN = 20
GREEDY_NEW_TOKENS = 32
MTP_LEN = 40
# Smallest top1-top2 logit gap accepted over the greedy steps. The greedy prompt is re-drawn
# (deterministically) until every step clears it, so a bf16 compute path picks the same tokens.
MIN_GREEDY_MARGIN = 0.1
MAX_PROMPT_DRAWS = 400

# Weight scales: linears ~ N(0, 1/in) keep activations O(1); the head is wider so logits spread.
LM_HEAD_GAIN = 3.0
ROUTER_GAIN = 2.0
ZERO_CENTRED_NORM_STD = 0.2
GATED_NORM_STD = 0.2
DT_BIAS_MEAN = -1.0
DT_BIAS_STD = 0.5
CONV_HALF_RANGE = 0.5

# A tiny vision tower: the Qwen3.5 classes always build one; our loader ignores model.visual.*.
TINY_VISION = dict(
    depth=1,
    hidden_size=16,
    intermediate_size=32,
    num_heads=2,
    patch_size=4,
    spatial_merge_size=1,
    temporal_patch_size=2,
    num_position_embeddings=16,
    deepstack_visual_indexes=[],
)

# Shared tiny text geometry (hidden 64, nq 4 / nkv 2, head_dim 32, rotary dim 8).
TINY_TEXT = dict(
    vocab_size=256,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
)

# Keys real Qwen3.5 / 3.6 text_configs carry that transformers only passes through.
QWEN35_PASSTHROUGH = dict(
    attn_output_gate=True,
    mamba_ssm_dtype="float32",
    mtp_num_hidden_layers=1,
    mtp_use_dedicated_embeddings=False,
    output_gate_type="swish",
)


# --------------------------------------------------------------------------------------------
# Random weights
# --------------------------------------------------------------------------------------------

ZERO_CENTRED_NORM_SUFFIXES = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
)
FINAL_NORM_NAMES = ("model.norm.weight", "model.language_model.norm.weight", "mtp.norm.weight")


def _normal(shape, std, gen, mean=0.0):
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean


def _uniform(shape, low, high, gen):
    return torch.rand(shape, generator=gen, dtype=torch.float32) * (high - low) + low


def _random_vision_value(name: str, shape, gen) -> torch.Tensor:
    """The vision tower is never read by deltaserve; it only has to be non-default."""
    if len(shape) == 1:
        base = 1.0 if ".norm" in name and name.endswith(".weight") else 0.0
        return _normal(shape, 0.1, gen, mean=base)
    fan_in = int(np.prod(shape[1:]))
    return _normal(shape, fan_in**-0.5, gen)


def random_value(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Draw the random value of one parameter, chosen from its checkpoint name.

    Raises on a name no rule covers, so no parameter keeps transformers' default init
    (zeros for the 1+w norms, ones for dt_bias, ...), which could hide a skipped term.
    """
    if name.startswith("model.visual."):
        return _random_vision_value(name, shape, gen)
    if name.endswith("linear_attn.A_log"):
        return torch.log(_uniform(shape, 1.0, 16.0, gen))
    if name.endswith("linear_attn.dt_bias"):
        return _normal(shape, DT_BIAS_STD, gen, mean=DT_BIAS_MEAN)
    if name.endswith("linear_attn.conv1d.weight"):
        return _uniform(shape, -CONV_HALF_RANGE, CONV_HALF_RANGE, gen)
    if name.endswith("linear_attn.norm.weight"):  # plain-w gated RMSNorm of the GDN output
        return _normal(shape, GATED_NORM_STD, gen, mean=1.0)
    if name.endswith(ZERO_CENTRED_NORM_SUFFIXES) or name in FINAL_NORM_NAMES:
        return _normal(shape, ZERO_CENTRED_NORM_STD, gen)
    if name.endswith("embed_tokens.weight"):
        return _normal(shape, 1.0, gen)
    if name == "lm_head.weight":
        return _normal(shape, LM_HEAD_GAIN * shape[1] ** -0.5, gen)
    if name.endswith("mlp.gate.weight"):  # MoE router
        return _normal(shape, ROUTER_GAIN * shape[1] ** -0.5, gen)
    if name.endswith("mlp.experts.gate_up_proj"):  # [E, 2*Im, H]
        return _normal(shape, shape[2] ** -0.5, gen)
    if name.endswith("mlp.experts.down_proj"):  # [E, H, Im]
        return _normal(shape, shape[2] ** -0.5, gen)
    if name.endswith(".weight") and len(shape) == 2:  # every other Linear, [out, in]
        return _normal(shape, shape[1] ** -0.5, gen)
    raise ValueError(f"no randomisation rule for parameter {name!r} of shape {tuple(shape)}")


@torch.no_grad()
def randomise_(module: nn.Module, gen: torch.Generator, prefix: str = "") -> None:
    """Overwrite every parameter of `module` with a random value (see `random_value`)."""
    for name, param in module.named_parameters():
        param.copy_(random_value(prefix + name, tuple(param.shape), gen))


# --------------------------------------------------------------------------------------------
# MTP head (docs/model.md, "MTP head"), built from transformers' own modules
# --------------------------------------------------------------------------------------------


class MtpHead(nn.Module):
    """The `mtp.*` tensors of a Qwen3.5 checkpoint, with names equal to the stored ones."""

    def __init__(self, text_config, norm_cls, layer_cls):
        super().__init__()
        hidden = text_config.hidden_size
        layer_config = copy.deepcopy(text_config)
        layer_config.num_hidden_layers = 1
        layer_config.layer_types = ["full_attention"]
        layer_config._attn_implementation = "eager"
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = norm_cls(hidden, eps=text_config.rms_norm_eps)
        self.pre_fc_norm_hidden = norm_cls(hidden, eps=text_config.rms_norm_eps)
        self.layers = nn.ModuleList([layer_cls(layer_config, 0)])
        self.norm = norm_cls(hidden, eps=text_config.rms_norm_eps)

    def forward(self, hidden, next_embeds, position_embeddings, attention_mask, position_ids):
        """One MTP pass over T pairs (h_t, embed(x_{t+1})); returns the post-`mtp.norm` states."""
        fused = torch.cat(
            [self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1
        )
        states = self.fc(fused)
        states = self.layers[0](
            states,
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            position_ids=position_ids,
        )
        return self.norm(states)


def new_mtp_head(model) -> MtpHead:
    text_model = model.model.language_model
    full_layer_index = model.config.text_config.layer_types.index("full_attention")
    layer_cls = type(text_model.layers[full_layer_index])
    return MtpHead(model.config.text_config, type(text_model.norm), layer_cls)


@torch.no_grad()
def run_mtp(model, mtp: MtpHead, mtp_ids: list[int]) -> tuple[np.ndarray, np.ndarray, float]:
    """MTP logits [n-1, V] and hidden [n-1, H] for mtp_ids, plus the lm_head(h) check value.

    h_t is the trunk's POST-final-norm hidden state (the tensor fed to lm_head). Pair t is
    (h_t, embed(x_{t+1})) at RoPE position t, t = 0..n-2, with causal attention over the pairs.
    """
    ids = torch.tensor([mtp_ids])
    text_model = model.model.language_model
    trunk = text_model(input_ids=ids, use_cache=False)
    hidden = trunk.last_hidden_state  # post model.language_model.norm
    full_logits = model(input_ids=ids, use_cache=False).logits
    head_check = (model.lm_head(hidden) - full_logits).abs().max().item()
    if head_check > 1e-5:
        raise AssertionError(f"lm_head(post-norm hidden) differs from the logits by {head_check}")

    pairs = len(mtp_ids) - 1
    next_embeds = text_model.embed_tokens(ids[:, 1:])
    positions = torch.arange(pairs)[None, :]
    # Text-only M-RoPE: the T, H and W rows all carry the token index.
    rope_positions = positions[None].expand(3, 1, pairs)
    cos_sin = text_model.rotary_emb(next_embeds, rope_positions)
    causal = torch.full((pairs, pairs), float("-inf")).triu(1)[None, None]
    mtp_hidden = mtp(hidden[:, :-1], next_embeds, cos_sin, causal, positions)
    mtp_logits = model.lm_head(mtp_hidden)

    # Causality: the first k pairs alone give the same rows as the full run.
    k = pairs // 2
    prefix_cos_sin = tuple(t[:, :k] for t in cos_sin)
    prefix = mtp(
        hidden[:, :k], next_embeds[:, :k], prefix_cos_sin, causal[..., :k, :k], positions[:, :k]
    )
    prefix_diff = (prefix - mtp_hidden[:, :k]).abs().max().item()
    if prefix_diff > 1e-5:
        raise AssertionError(f"MTP rows depend on later pairs: max diff {prefix_diff}")
    return as_f32(mtp_logits[0]), as_f32(mtp_hidden[0]), head_check


# --------------------------------------------------------------------------------------------
# Checkpoint files
# --------------------------------------------------------------------------------------------


def read_safetensors_dir(directory: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                tensors[name] = handle.get_tensor(name)
    return tensors


def hf_saved_tensors(model, **save_kwargs) -> dict[str, torch.Tensor]:
    """The tensors exactly as `save_pretrained` names and shapes them."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, **save_kwargs)
        return read_safetensors_dir(Path(tmp))


def pack_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert `experts.{e}.{gate,up,down}_proj.weight` -> packed `gate_up_proj` [E, 2Im, H]
    (gate rows first, then up) + `down_proj` [E, H, Im], the layout of transformers' modules."""
    out = {}
    groups: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name, value in tensors.items():
        head, sep, tail = name.partition(".mlp.experts.")
        if not sep:
            out[name] = value
            continue
        expert, proj, _ = tail.split(".", 2)
        groups.setdefault(head, {}).setdefault(int(expert), {})[proj] = value
    for head, experts in groups.items():
        order = sorted(experts)
        if order != list(range(len(order))):
            raise AssertionError(f"{head}: expert indices {order} are not 0..E-1")
        out[f"{head}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([experts[e]["gate_proj"], experts[e]["up_proj"]], dim=0) for e in order]
        ).contiguous()
        out[f"{head}.mlp.experts.down_proj"] = torch.stack(
            [experts[e]["down_proj"] for e in order]
        ).contiguous()
    return out


def is_per_expert(tensors) -> bool:
    return any(".mlp.experts.0.gate_proj.weight" in name for name in tensors)


def write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    ordered = {k: v.contiguous() for k, v in sorted(tensors.items())}
    save_file(ordered, str(path), metadata={"format": "pt"})


def config_dict(model) -> dict:
    """config.json exactly as save_pretrained writes it."""
    with tempfile.TemporaryDirectory() as tmp:
        model.config.save_pretrained(tmp)
        return json.loads((Path(tmp) / "config.json").read_text())


def realistic_qwen35_config(config: dict, weights_dtype: str) -> dict:
    """Add the keys real Qwen3.5 / 3.6 config.json files carry but transformers 5 folds away."""
    text = config["text_config"]
    text["full_attention_interval"] = 4
    text["partial_rotary_factor"] = text["rope_parameters"]["partial_rotary_factor"]
    text["dtype"] = weights_dtype
    config.pop("dtype", None)  # real files carry the dtype in text_config only
    config["language_model_only"] = False
    vision = config["vision_config"]
    vision["deepstack_visual_indexes"] = []
    vision.pop("rope_parameters", None)
    # Released files name the vision model_type like the top level; transformers maps it back.
    vision["model_type"] = config["model_type"]
    config["text_config"] = {k: text[k] for k in sorted(text)}
    return {k: config[k] for k in sorted(config)}


def flat_rope(config: dict) -> dict:
    """Replace `rope_parameters` with the flat `rope_theta` + `partial_rotary_factor` keys."""
    rope = config.pop("rope_parameters")
    if rope.get("rope_type", "default") != "default":
        raise AssertionError(f"flat rope keys only describe default rope, got {rope}")
    config["rope_theta"] = rope["rope_theta"]
    config["partial_rotary_factor"] = rope["partial_rotary_factor"]
    return {k: config[k] for k in sorted(config)}


# --------------------------------------------------------------------------------------------
# Expected outputs
# --------------------------------------------------------------------------------------------


def as_f32(tensor: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(tensor.detach().to(torch.float32).cpu().numpy(), dtype="<f4")


def draw_ids(seed: list[int], length: int, vocab: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, vocab, size=length)]


@torch.no_grad()
def logits_of(model, ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]


@torch.no_grad()
def cached_decode(model, prompt: list[int], steps: list[int]) -> torch.Tensor:
    """Prefill `prompt` with use_cache=True, then feed `steps` one token at a time through the
    returned cache; row i holds the logits after feeding steps[i]."""
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    cache = out.cache
    rows = []
    for token in steps:
        out = model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True)
        cache = out.cache
        rows.append(out.logits[0, -1])
    return torch.stack(rows)


@torch.no_grad()
def greedy(model, prompt: list[int]) -> tuple[list[int], float, torch.Tensor]:
    generation = GenerationConfig(
        do_sample=False,
        max_new_tokens=GREEDY_NEW_TOKENS,
        min_new_tokens=GREEDY_NEW_TOKENS,
        eos_token_id=None,
        pad_token_id=None,
        bos_token_id=None,
        return_dict_in_generate=True,
        output_logits=True,
    )
    out = model.generate(
        input_ids=torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        generation_config=generation,
    )
    tokens = [int(t) for t in out.sequences[0, len(prompt) :]]
    step_logits = torch.stack([step[0] for step in out.logits])
    top2 = step_logits.topk(2, dim=-1).values
    margin = float((top2[:, 0] - top2[:, 1]).min())
    if tokens != step_logits.argmax(-1).tolist() or len(tokens) != GREEDY_NEW_TOKENS:
        raise AssertionError("generate() did not return the argmax of its own logits")
    return tokens, margin, step_logits


def choose_greedy_prompt(model, seed: int, vocab: int):
    """Draw greedy prompts (deterministic sequence of seeds) until the smallest top1-top2 gap
    over all generated steps is at least MIN_GREEDY_MARGIN."""
    best = None
    for draw in range(MAX_PROMPT_DRAWS):
        prompt = draw_ids([seed, 3, draw], GREEDY_PROMPT_LEN, vocab)
        tokens, margin, step_logits = greedy(model, prompt)
        if best is None or margin > best[2]:
            best = (prompt, tokens, margin, step_logits, draw)
        if margin >= MIN_GREEDY_MARGIN:
            return best
    raise AssertionError(
        f"no greedy prompt in {MAX_PROMPT_DRAWS} draws reached margin {MIN_GREEDY_MARGIN}; "
        f"best {best[2]}"
    )


def _identity_conv(weight: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(weight)
    out[..., -1] = 1.0  # the tap on the current token
    return out


# "What if an implementation skipped this term": each entry replaces some parameters by the value
# that makes the term a no-op (or its transformers default), and the prefill logits must move.
SKIPPED_TERMS = {
    "zero_centred_norm_weights": (
        lambda n: n.endswith("layernorm.weight") or n in FINAL_NORM_NAMES,
        torch.zeros_like,
    ),
    "attention_q_k_norm_weights": (
        lambda n: n.endswith(("q_norm.weight", "k_norm.weight")),
        torch.zeros_like,
    ),
    "gdn_gated_norm_weight": (lambda n: n.endswith("linear_attn.norm.weight"), torch.ones_like),
    "gdn_A_log": (lambda n: n.endswith("linear_attn.A_log"), torch.zeros_like),
    "gdn_dt_bias": (lambda n: n.endswith("linear_attn.dt_bias"), torch.zeros_like),
    "gdn_conv1d": (lambda n: n.endswith("linear_attn.conv1d.weight"), _identity_conv),
    "shared_expert_gate": (lambda n: n.endswith("shared_expert_gate.weight"), torch.zeros_like),
}
MIN_SKIP_EFFECT = 0.05
GDN_CHUNK = 64


@contextmanager
def gdn_state_dropped_at_chunk_boundary(model):
    """Patch transformers' chunked delta rule so the state is NOT carried from the first chunk
    into the rest of the sequence (what a buggy chunk loop would do)."""
    gdn = next(m for name, m in model.named_modules() if name.endswith("linear_attn"))
    module = sys.modules[type(gdn).__module__]
    original = module.torch_chunk_gated_delta_rule

    def dropping(query, key, value, g, beta, **kwargs):
        if query.shape[1] <= GDN_CHUNK:
            return original(query, key, value, g, beta, **kwargs)
        head = [t[:, :GDN_CHUNK] for t in (query, key, value, g, beta)]
        tail = [t[:, GDN_CHUNK:] for t in (query, key, value, g, beta)]
        first, _ = original(*head, **kwargs)
        second, state = original(*tail, **(kwargs | {"initial_state": None}))
        return torch.cat([first, second], dim=1), state

    module.torch_chunk_gated_delta_rule = dropping
    try:
        yield
    finally:
        module.torch_chunk_gated_delta_rule = original


@torch.no_grad()
def skipped_term_effects(model, ids: list[int], reference: torch.Tensor) -> dict[str, float]:
    """Max |logit change| when each term of SKIPPED_TERMS is neutralised; must be visible."""
    effects = {}
    names = [name for name, _ in model.named_parameters()]
    for label, (selects, neutral) in SKIPPED_TERMS.items():
        chosen = [name for name in names if selects(name)]
        if not chosen:
            continue
        params = dict(model.named_parameters())
        saved = {name: params[name].detach().clone() for name in chosen}
        for name in chosen:
            params[name].copy_(neutral(params[name]))
        effects[label] = float((logits_of(model, ids) - reference).abs().max())
        for name, value in saved.items():
            params[name].copy_(value)
    with gdn_state_dropped_at_chunk_boundary(model):
        dropped = logits_of(model, ids)
    effects["gdn_state_dropped_at_chunk_boundary"] = float(
        (dropped[GDN_CHUNK:] - reference[GDN_CHUNK:]).abs().max()
    )
    if float((dropped[:GDN_CHUNK] - reference[:GDN_CHUNK]).abs().max()) != 0.0:
        raise AssertionError("the chunk-boundary patch changed the first chunk")
    routers = [m for m in model.modules() if hasattr(m, "norm_topk_prob")]
    if routers:  # Qwen3-Next: flip the renormalisation rule
        for router in routers:
            router.norm_topk_prob = not router.norm_topk_prob
        effects["norm_topk_prob_flipped"] = float((logits_of(model, ids) - reference).abs().max())
        for router in routers:
            router.norm_topk_prob = not router.norm_topk_prob
    if float((logits_of(model, ids) - reference).abs().max()) != 0.0:
        raise AssertionError("model not restored after the skipped-term checks")
    weak = {k: v for k, v in effects.items() if v < MIN_SKIP_EFFECT}
    if weak:
        raise AssertionError(f"terms whose removal barely changes the logits: {weak}")
    return effects


@dataclass
class Expected:
    """Everything written next to the checkpoint, plus the numbers that back the notes."""

    ids: dict
    arrays: dict[str, np.ndarray]
    checks: dict = field(default_factory=dict)


def compute_expected(model, seed: int, mtp: MtpHead | None) -> Expected:
    vocab = model.config.get_text_config().vocab_size
    prefill_ids = draw_ids([seed, 1], PREFILL_LEN, vocab)
    decode_prompt_ids = draw_ids([seed, 2, 0], DECODE_PROMPT_LEN, vocab)
    decode_ids = draw_ids([seed, 2, 1], DECODE_STEPS, vocab)

    prefill = logits_of(model, prefill_ids)
    decode = cached_decode(model, decode_prompt_ids, decode_ids)
    # The cached (recurrent) decode must agree with one uncached (chunked) forward.
    full = logits_of(model, decode_prompt_ids + decode_ids)[-DECODE_STEPS:]
    decode_vs_full = float((decode - full).abs().max())

    prompt, tokens, margin, step_logits, draw = choose_greedy_prompt(model, seed, vocab)
    teacher = logits_of(model, prompt + tokens[:-1])[GREEDY_PROMPT_LEN - 1 :]
    if teacher.argmax(-1).tolist() != tokens:
        raise AssertionError("teacher-forced argmax disagrees with generate()")
    greedy_vs_full = float((teacher - step_logits).abs().max())

    top2 = prefill.topk(2, dim=-1).values
    checks = {
        "prefill_logits_std": float(prefill.std()),
        "prefill_min_top1_top2": float((top2[:, 0] - top2[:, 1]).min()),
        "decode_vs_uncached_max_abs_diff": decode_vs_full,
        "greedy_vs_uncached_max_abs_diff": greedy_vs_full,
        "greedy_prompt_draw": draw,
        "skipped_term_max_abs_logit_change": skipped_term_effects(model, prefill_ids, prefill),
    }
    for name, value in checks.items():
        if isinstance(value, float) and name.endswith("max_abs_diff") and value > 1e-3:
            raise AssertionError(f"{name} = {value}: cached and uncached paths disagree")

    ids = {
        "prefill_ids": prefill_ids,
        "decode_prompt_ids": decode_prompt_ids,
        "decode_ids": decode_ids,
        "greedy_prompt_ids": prompt,
        "greedy_tokens": tokens,
        "greedy_min_margin": margin,
        "mtp_ids": None,
    }
    arrays = {"prefill_logits": as_f32(prefill), "decode_logits": as_f32(decode)}
    if mtp is not None:
        mtp_ids = draw_ids([seed, 4], MTP_LEN, vocab)
        mtp_logits, mtp_hidden, head_check = run_mtp(model, mtp, mtp_ids)
        ids["mtp_ids"] = mtp_ids
        arrays["mtp_logits"] = mtp_logits
        arrays["mtp_hidden"] = mtp_hidden
        checks["lm_head_of_post_norm_hidden_max_abs_diff"] = head_check
        checks["mtp_logits_std"] = float(mtp_logits.std())
    return Expected(ids=ids, arrays=arrays, checks=checks)


def write_expected(directory: Path, expected: Expected, weights_dtype: str, notes: str) -> None:
    record = {
        "generator": GENERATOR,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "compute_dtype": "float32",
        "weights_dtype": weights_dtype,
        **expected.ids,
        "notes": notes,
        "checks": expected.checks,
    }
    # One key per line, id lists on one line each: readable and diff-friendly.
    lines = [f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in record.items()]
    (directory / "expected.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")
    for name, array in expected.arrays.items():
        if array.dtype != np.dtype("<f4") or not array.flags["C_CONTIGUOUS"]:
            raise AssertionError(f"{name}: expected C-order <f4, got {array.dtype}")
        np.save(directory / f"{name}.npy", array, allow_pickle=False)


# --------------------------------------------------------------------------------------------
# Loading the written fixture back through transformers
# --------------------------------------------------------------------------------------------


def load_fixture(model_cls, directory: Path):
    model = model_cls.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    )
    # Weights come back as views into the mmapped file at arbitrary byte offsets, and CPU kernels
    # round differently for differently aligned operands. Fresh (aligned) copies make the outputs
    # independent of the file layout (packed vs per-expert, sharded vs single file).
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.clone()
    return model.eval()


def assert_loaded_weights(model, reference: dict[str, torch.Tensor], directory: Path) -> None:
    """Every parameter transformers loaded from `directory` equals the intended value exactly."""
    loaded = model.state_dict()
    missing = sorted(set(reference) ^ set(loaded))
    if missing:
        raise AssertionError(f"{directory.name}: names differ after reload: {missing[:8]}")
    for name, value in reference.items():
        if not torch.equal(loaded[name], value.to(torch.float32)):
            raise AssertionError(f"{directory.name}: {name} changed on the save/load round trip")


@torch.no_grad()
def load_mtp(model, directory: Path) -> MtpHead:
    stored = {
        name.removeprefix("mtp."): value.to(torch.float32)
        for name, value in read_safetensors_dir(directory).items()
        if name.startswith("mtp.")
    }
    mtp = new_mtp_head(model).eval()
    mtp.load_state_dict(stored, strict=True)  # the stored names must be exactly a trunk layer's
    return mtp


def reset_dir(directory: Path) -> None:
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


def qwen35_dense_config() -> Qwen3_5Config:
    text = dict(
        TINY_TEXT,
        num_hidden_layers=8,
        intermediate_size=128,
        linear_num_value_heads=6,  # value/key head ratio 3, as in Qwen3.5-27B
        full_attention_interval=4,  # layers 3 and 7 are full attention
        rope_parameters=dict(
            rope_type="default",
            rope_theta=10000.0,
            partial_rotary_factor=0.25,
            mrope_section=[2, 1, 1],  # sums to rotary_dim / 2 = 4
            mrope_interleaved=True,
        ),
        tie_word_embeddings=False,
        **QWEN35_PASSTHROUGH,
    )
    return Qwen3_5Config(text_config=text, vision_config=dict(TINY_VISION, out_hidden_size=64))


def qwen35_moe_config() -> Qwen3_5MoeConfig:
    text = dict(
        TINY_TEXT,
        num_hidden_layers=4,
        linear_num_value_heads=6,
        full_attention_interval=4,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        rope_parameters=dict(
            rope_type="default",
            rope_theta=10000000.0,
            partial_rotary_factor=0.25,
            mrope_section=[2, 1, 1],
            mrope_interleaved=True,
        ),
        tie_word_embeddings=False,
        **QWEN35_PASSTHROUGH,
    )
    return Qwen3_5MoeConfig(text_config=text, vision_config=dict(TINY_VISION, out_hidden_size=64))


def qwen35_text_tied_config() -> Qwen3_5TextConfig:
    return Qwen3_5TextConfig(
        **TINY_TEXT,
        num_hidden_layers=4,
        intermediate_size=128,
        linear_num_value_heads=4,  # ratio 2
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        rope_theta=1000000.0,
        partial_rotary_factor=0.25,
        tie_word_embeddings=True,
    )


def qwen3_next_config() -> Qwen3NextConfig:
    return Qwen3NextConfig(
        **TINY_TEXT,
        num_hidden_layers=4,
        intermediate_size=128,  # the dense layer's MLP
        linear_num_value_heads=4,  # ratio 2, as in Qwen3-Next-80B
        full_attention_interval=4,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        rope_theta=10000.0,
        partial_rotary_factor=0.25,
        tie_word_embeddings=False,
    )


def new_random_model(model_cls, config, seed: int):
    torch.manual_seed(seed)  # only feeds transformers' own init, which randomise_ overwrites
    model = model_cls(config).eval()
    gen = torch.Generator().manual_seed(seed)
    randomise_(model, gen)
    return model, gen


def new_random_mtp(model, gen: torch.Generator) -> MtpHead:
    mtp = new_mtp_head(model).eval()
    randomise_(mtp, gen, prefix="mtp.")
    return mtp


def to_bf16_like_qwen35(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """bf16 everywhere except linear_attn.A_log and linear_attn.norm.weight, which Qwen3.5
    checkpoints store as F32 (vLLM PR #51836 reads it from the Qwen3.5-27B index)."""
    out = {}
    for name, value in tensors.items():
        keep_f32 = name.endswith(("linear_attn.A_log", "linear_attn.norm.weight"))
        out[name] = value if keep_f32 else value.to(torch.bfloat16)
    return out


def build_qwen35_dense(seed: int) -> list[str]:
    model, gen = new_random_model(Qwen3_5ForConditionalGeneration, qwen35_dense_config(), seed)
    mtp = new_random_mtp(model, gen)
    trunk = hf_saved_tensors(model)
    mtp_tensors = {"mtp." + k: v for k, v in mtp.state_dict().items()}
    written = []
    for fixture, weights_dtype in (("qwen35_f32", "float32"), ("qwen35_bf16", "bfloat16")):
        directory = FIXTURES_DIR / fixture
        reset_dir(directory)
        tensors = trunk | mtp_tensors
        if weights_dtype == "bfloat16":
            tensors = to_bf16_like_qwen35(tensors)
        write_safetensors(directory / "model.safetensors", tensors)
        config = realistic_qwen35_config(config_dict(model), weights_dtype)
        write_json(directory / "config.json", config)

        loaded = load_fixture(Qwen3_5ForConditionalGeneration, directory)
        reference = {k: v.to(torch.float32) for k, v in tensors.items() if not k.startswith("mtp.")}
        assert_loaded_weights(loaded, reference, directory)
        expected = compute_expected(loaded, seed, load_mtp(loaded, directory))
        notes = (
            "Qwen3_5ForConditionalGeneration, 8 layers (3 and 7 full attention), GDN HK 2 / HV 6, "
            "untied lm_head, tiny vision tower under model.visual.*, mtp.* added by the script. "
        )
        if weights_dtype == "bfloat16":
            notes += (
                "Same random weights as qwen35_f32 rounded to bf16; linear_attn.A_log and "
                "linear_attn.norm.weight stay F32 as in Qwen3.5 checkpoints. Outputs computed in "
                "float32 on the stored values. "
            )
        write_expected(directory, expected, weights_dtype, notes + COMMON_NOTES)
        written.append(fixture)
    return written


def build_qwen35_text_tied(seed: int) -> list[str]:
    model, _ = new_random_model(Qwen3_5ForCausalLM, qwen35_text_tied_config(), seed)
    directory = FIXTURES_DIR / "qwen35_text_tied"
    reset_dir(directory)
    tensors = hf_saved_tensors(model)
    if "lm_head.weight" in tensors:
        raise AssertionError("tied checkpoint must not store lm_head.weight")
    write_safetensors(directory / "model.safetensors", tensors)
    write_json(directory / "config.json", flat_rope(config_dict(model)))

    loaded = load_fixture(Qwen3_5ForCausalLM, directory)
    assert_loaded_weights(loaded, model.state_dict(), directory)
    if loaded.config.rope_parameters != model.config.rope_parameters:
        raise AssertionError(f"flat rope keys reloaded as {loaded.config.rope_parameters}")
    if loaded.lm_head.weight.data_ptr() != loaded.model.embed_tokens.weight.data_ptr():
        raise AssertionError("lm_head is not tied to embed_tokens after reload")
    expected = compute_expected(loaded, seed, None)
    notes = (
        "Qwen3_5ForCausalLM with a flat qwen3_5_text config: explicit layer_types "
        "(linear, linear, full, linear), flat rope_theta 1e6 + partial_rotary_factor, "
        "tie_word_embeddings true (no lm_head.weight; logits use embed_tokens). "
    )
    write_expected(directory, expected, "float32", notes + COMMON_NOTES)
    return ["qwen35_text_tied"]


def build_qwen35_moe(seed: int) -> list[str]:
    model, gen = new_random_model(Qwen3_5MoeForConditionalGeneration, qwen35_moe_config(), seed)
    mtp = new_random_mtp(model, gen)
    directory = FIXTURES_DIR / "qwen35_moe"
    reset_dir(directory)
    saved = hf_saved_tensors(model)
    # transformers 5.24 writes per-expert tensors for this class; real Qwen3.5-MoE checkpoints
    # ship packed experts, so the script packs them (transformers loads both layouts).
    trunk = pack_experts(saved) if is_per_expert(saved) else saved
    mtp_tensors = {"mtp." + k: v for k, v in mtp.state_dict().items()}
    tensors = trunk | mtp_tensors
    write_safetensors(directory / "model.safetensors", tensors)
    write_json(directory / "config.json", realistic_qwen35_config(config_dict(model), "float32"))

    loaded = load_fixture(Qwen3_5MoeForConditionalGeneration, directory)
    assert_loaded_weights(loaded, model.state_dict(), directory)
    expected = compute_expected(loaded, seed, load_mtp(loaded, directory))
    layout = "per-expert" if is_per_expert(saved) else "packed"
    notes = (
        "Qwen3_5MoeForConditionalGeneration, 4 layers (3 full attention), every layer MoE: "
        "8 experts, top-2 always renormalised, moe_intermediate 32, shared expert 48 with sigmoid "
        f"gate. Experts stored PACKED (save_pretrained wrote {layout}; the script packs). "
        "mtp.layers.0 has an MoE "
        "MLP with the same names as a trunk layer. "
    )
    write_expected(directory, expected, "float32", notes + COMMON_NOTES)
    return ["qwen35_moe"]


def build_qwen3_next(seed: int) -> list[str]:
    model, _ = new_random_model(Qwen3NextForCausalLM, qwen3_next_config(), seed)
    # Stored bf16 like the real Qwen3-Next checkpoints (and to keep tests/fixtures small).
    model = model.to(torch.bfloat16)
    sharded = FIXTURES_DIR / "qwen3_next"
    reset_dir(sharded)
    model.save_pretrained(sharded, max_shard_size="250KB")
    (sharded / "generation_config.json").unlink(missing_ok=True)
    config = config_dict(model)
    # Shape of the released Qwen3-Next config.json (transformers 4.57 era): no layer_types (the
    # pattern comes from full_attention_interval), torch_dtype, rope_scaling null.
    config.pop("layer_types")
    config.pop("dtype")
    config["torch_dtype"] = "bfloat16"
    config["full_attention_interval"] = 4
    config["rope_scaling"] = None
    config["use_sliding_window"] = False
    write_json(sharded / "config.json", flat_rope(config))
    shards = sorted(p.name for p in sharded.glob("*.safetensors"))
    if not (2 <= len(shards) <= 3) or not (sharded / "model.safetensors.index.json").exists():
        raise AssertionError(f"expected 2-3 shards plus an index, got {shards}")

    saved = read_safetensors_dir(sharded)
    other_layout = pack_experts(saved) if is_per_expert(saved) else None
    if other_layout is None:
        raise AssertionError("save_pretrained wrote packed experts; re-write as per-expert instead")
    other_name = "qwen3_next_packed"
    other = FIXTURES_DIR / other_name
    reset_dir(other)
    write_safetensors(other / "model.safetensors", other_layout)
    shutil.copy(sharded / "config.json", other / "config.json")

    expected = None
    for directory in (sharded, other):
        loaded = load_fixture(Qwen3NextForCausalLM, directory)
        assert_loaded_weights(loaded, model.state_dict(), directory)
        if loaded.config.layer_types != model.config.layer_types:
            raise AssertionError(f"layer_types reloaded as {loaded.config.layer_types}")
        this = compute_expected(loaded, seed, None)
        if expected is None:
            expected = this
        elif this.ids != expected.ids or any(
            not np.array_equal(this.arrays[k], expected.arrays[k]) for k in expected.arrays
        ):
            raise AssertionError("per-expert and packed checkpoints give different outputs")
    notes = (
        "Qwen3NextForCausalLM, flat config (rope_theta, partial_rotary_factor, "
        "full_attention_interval "
        "4 -> layer 3 full attention), fused in_proj_qkvz / in_proj_ba, 8 experts top-2 with "
        "norm_topk_prob FALSE, shared expert 48, layer 1 dense (mlp_only_layers [1], "
        "intermediate 128). "
        "All tensors bf16; outputs computed in float32 on the stored values. "
    )
    write_expected(
        sharded, expected, "bfloat16",
        notes + "Sharded by save_pretrained (per-expert experts.{e}.*_proj.weight). "
        + COMMON_NOTES,
    )
    write_expected(
        other, expected, "bfloat16",
        notes + "Same weights as qwen3_next, experts packed into gate_up_proj [E,2Im,H] + "
        "down_proj "
        "[E,H,Im], single file; outputs identical to qwen3_next. " + COMMON_NOTES,
    )
    return ["qwen3_next", other_name]


COMMON_NOTES = (
    "prefill_logits: one uncached forward over prefill_ids. decode_logits[i]: logits after feeding "
    "decode_ids[i] one token at a time through transformers' cache, after prefilling "
    "decode_prompt_ids with use_cache=True. greedy: generate(do_sample=False) without eos. "
    "Eager attention, float32 compute, torch CPU with 1 thread."
)

FIXTURE_DIRS = (
    "qwen35_f32",
    "qwen35_bf16",
    "qwen35_text_tied",
    "qwen35_moe",
    "qwen3_next",
    "qwen3_next_packed",
)

BUILDERS = {
    "qwen35_dense": (build_qwen35_dense, 3501),
    "qwen35_text_tied": (build_qwen35_text_tied, 3502),
    "qwen35_moe": (build_qwen35_moe, 3503),
    "qwen3_next": (build_qwen3_next, 3504),
}


def file_report() -> list[str]:
    lines = []
    total = 0
    for path in sorted(p for name in FIXTURE_DIRS for p in (FIXTURES_DIR / name).rglob("*")):
        if path.is_file():
            size = path.stat().st_size
            total += size
            digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
            lines.append(f"{size:>9}  {digest}  {path.relative_to(FIXTURES_DIR)}")
    lines.append(f"{total:>9}  total bytes")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", choices=sorted(BUILDERS), action="append", help="build only these groups"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    FIXTURES_DIR.mkdir(parents=True, exist_ok=True)
    for key in args.only or BUILDERS:
        build, seed = BUILDERS[key]
        for fixture in build(seed):
            checks = json.loads((FIXTURES_DIR / fixture / "expected.json").read_text())
            print(f"{fixture}: margin {checks['greedy_min_margin']:.4f} checks {checks['checks']}")
    print("\n".join(file_report()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
