#!/usr/bin/env python3
"""Evaluate the bundled demo model (models/demo) with transformers, greedy, on the held-out prompts.

Measures: accuracy of two-digit addition and subtraction and of primality below 100, is_prime functions that
pass unit tests when executed, reasoning closed by `</think>`, well-formed Qwen3-Coder XML tool calls, and the
MTP head's mean accept length with 3 greedy draft steps (bonus token included). Writes the per-prompt greedy
replies (token ids and text) to tests/data/demo/hf_greedy.jsonl for the Rust side, and the summary to
docs/demo_model.md.

The model is loaded from the saved bf16 safetensors (exactly what the Rust loader reads) and run in float32.
Greedy replies are generated in left-padded batches, then every reply is re-checked by one unpadded
teacher-forced forward pass (argmax must reproduce each token); any prompt that disagrees is regenerated
alone, so the stored replies are single-sequence greedy decodes.

Usage:
  python scripts/eval_demo_model.py                       # GPU if present; writes the files above
  python scripts/eval_demo_model.py --smoke --model-dir /tmp/demo_smoke/model --heldout /tmp/demo_smoke/heldout.jsonl \
      --showcase /tmp/demo_smoke/showcase.jsonl      # CPU; writes under /tmp/demo_eval_smoke
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_demo_model import build_models, mtp_chain, rope  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "tests" / "data" / "demo"
DRAFT_STEPS = 3

TARGETS = {
    "add2": 0.90, "sub2": 0.90, "prime": 0.90, "code_is_prime": 0.90, "think_closed": 0.99, "tool_call_wellformed": 0.95,
    "mtp_accept_length": 2.5,
}


# ----------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------


def load_checkpoint(model_dir: Path, device, dtype=torch.float32):
    """Trunk (Qwen3_5ForCausalLM) and MtpHead from a models/demo-style directory."""
    from safetensors.torch import load_file

    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type") != "qwen3_5" or "text_config" not in config:
        raise ValueError(f"{model_dir}/config.json: expected model_type qwen3_5 with a text_config")
    text_dict = config["text_config"]
    trunk, mtp = build_models(text_dict, torch.device("cpu"))
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    tensors = {}
    for file in sorted(set(index["weight_map"].values())):
        tensors.update(load_file(str(model_dir / file)))
    trunk_state, mtp_state = {}, {}
    for name, value in tensors.items():
        if name.startswith("model.language_model."):
            trunk_state["model." + name[len("model.language_model."):]] = value
        elif name == "lm_head.weight":
            trunk_state[name] = value
        elif name.startswith("mtp."):
            mtp_state[name[len("mtp."):]] = value
        else:
            raise ValueError(f"{model_dir}: unexpected tensor {name}")
    trunk.load_state_dict(trunk_state, strict=True)
    mtp.load_state_dict(mtp_state, strict=True)
    trunk.to(device=device, dtype=dtype).eval()
    mtp.to(device=device, dtype=dtype).eval()
    return trunk, mtp, config


def hf_native_check(model_dir: Path, trunk, prompt_ids: list[int], device) -> dict:
    """Load the directory with transformers' own Qwen3_5ForConditionalGeneration and compare logits."""
    from transformers import Qwen3_5ForConditionalGeneration

    result = Qwen3_5ForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32,
                                                             output_loading_info=True)
    model, info = result if isinstance(result, tuple) else (result, {})
    model.to(device).eval()
    ids = torch.tensor([prompt_ids], device=device)
    with torch.no_grad():
        native = model(input_ids=ids, use_cache=False).logits.float()
        ours = trunk(input_ids=ids, use_cache=False).logits.float()
    missing = sorted(info.get("missing_keys", []))
    unexpected = sorted(info.get("unexpected_keys", []))
    del model
    return {
        "max_abs_logit_diff": float((native - ours).abs().max()),
        "missing_non_vision_keys": [k for k in missing if ".visual." not in k and not k.startswith("model.visual")],
        "unexpected_non_mtp_keys": [k for k in unexpected if not k.startswith("mtp.")],
    }


def tokenizer_checks(model_dir: Path, records: list[dict], tokenizer) -> dict:
    """The shipped tokenizer_config.json (AutoTokenizer + chat_template) reproduces the stored prompts."""
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(model_dir))
    template_mismatch, encode_mismatch = [], []
    for r in records:
        rendered = auto.apply_chat_template(r["messages"], tools=r["tools"], tokenize=False,
                                            add_generation_prompt=True, enable_thinking=r["thinking"])
        if rendered != r["prompt"]:
            template_mismatch.append(r["id"])
        if auto.encode(r["prompt"], add_special_tokens=False) != tokenizer.encode(r["prompt"],
                                                                                   add_special_tokens=False).ids:
            encode_mismatch.append(r["id"])
    return {"chat_template_mismatches": template_mismatch, "auto_tokenizer_encode_mismatches": encode_mismatch,
            "auto_tokenizer_class": type(auto).__name__}


# ----------------------------------------------------------------------------------------------------------
# Greedy generation
# ----------------------------------------------------------------------------------------------------------


def generate_batch(trunk, prompts: list[list[int]], max_new_tokens: int, eos_ids: list[int], pad_id: int,
                   device) -> list[list[int]]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        attention[row, width - len(p):] = 1
    with torch.no_grad():
        out = trunk.generate(input_ids=ids.to(device), attention_mask=attention.to(device), do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=eos_ids, pad_token_id=pad_id,
                             temperature=None, top_p=None, top_k=None)
    replies = []
    for row in out[:, width:].tolist():
        reply = []
        for token in row:
            reply.append(token)
            if token in eos_ids:
                break
        replies.append(reply)
    return replies


def teacher_forced(trunk, sequences: list[list[int]], device, chunk: int = 16):
    """Post-norm hidden states and logits for unpadded sequences (batched with right padding, which cannot
    change causal outputs at real positions)."""
    results = []
    for start in range(0, len(sequences), chunk):
        group = sequences[start:start + chunk]
        width = max(len(s) for s in group)
        ids = torch.zeros((len(group), width), dtype=torch.long)
        for row, s in enumerate(group):
            ids[row, :len(s)] = torch.tensor(s)
        ids = ids.to(device)
        with torch.no_grad():
            hidden = trunk.model(input_ids=ids, use_cache=False).last_hidden_state
            logits = trunk.lm_head(hidden).float()
        for row, s in enumerate(group):
            results.append((ids[row:row + 1, :len(s)], hidden[row:row + 1, :len(s)], logits[row, :len(s)]))
    return results


def verify_reply(logits: torch.Tensor, prompt_len: int, reply: list[int]) -> tuple[list[int], list[float]]:
    """Positions where argmax disagrees with the reply, and the top-1 minus top-2 logit margin per token."""
    predicted = logits[prompt_len - 1: prompt_len - 1 + len(reply)]
    top2 = predicted.topk(2, dim=-1)
    argmax = top2.indices[:, 0].tolist()
    margins = (top2.values[:, 0] - top2.values[:, 1]).tolist()
    mismatches = [i for i, (a, b) in enumerate(zip(argmax, reply)) if a != b]
    return mismatches, [round(m, 3) for m in margins]


# ----------------------------------------------------------------------------------------------------------
# MTP speculative-decoding acceptance
# ----------------------------------------------------------------------------------------------------------


def simulated_accept_lengths(trunk, mtp, ids: torch.Tensor, hidden: torch.Tensor, prompt_len: int,
                             steps: int) -> list[int]:
    """Accept lengths (accepted drafts + bonus) of greedy speculative decoding over a known greedy sequence.

    Round at committed length n+1 (tokens x_0..x_n, x_n the newest): draft s (1-based) comes from the chained
    MTP output for the pair started at t = n-1 and proposes x_{n+s}. Drafts are accepted while they equal the
    greedy tokens; the target then adds one bonus token. The chained outputs of mtp_chain() attend to exactly
    the keys a sequential draft would (see chain_attention_mask), so one pass covers every round.
    """
    with torch.no_grad():
        outputs = mtp_chain(trunk, mtp, ids, hidden, steps)
        drafts = [trunk.lm_head(o).argmax(-1)[0].tolist() for o in outputs]
    tokens = ids[0].tolist()
    last = len(tokens) - 1
    n = prompt_len  # x_P came from the prefill; the first round drafts from (h_{P-1}, x_P)
    lengths = []
    while n < last:
        accepted = 0
        for s in range(1, steps + 1):
            target = n + s
            if target > last or drafts[s - 1][n - 1] != tokens[target]:
                break
            accepted += 1
        committed = min(accepted + 1, last - n)
        lengths.append(committed)
        n += committed
    return lengths


def reference_speculative_decode(trunk, mtp, prompt: list[int], eos_ids: list[int], max_new: int, steps: int,
                                 device) -> tuple[list[int], list[int]]:
    """Plain sequential greedy speculative decoding with full recomputation (no caches, no custom masks),
    used to validate simulated_accept_lengths on a few prompts."""
    def trunk_hidden(tokens):
        ids = torch.tensor([tokens], device=device)
        return trunk.model(input_ids=ids, use_cache=False).last_hidden_state

    def mtp_last(pair_embeds, pair_hidden):
        n = pair_embeds.shape[1]
        positions = torch.arange(n, device=device)[None]
        return mtp(pair_embeds, pair_hidden, rope(trunk, pair_hidden, positions))[:, -1]

    embed = trunk.model.embed_tokens
    with torch.no_grad():
        tokens = list(prompt)
        h = trunk_hidden(tokens)
        tokens.append(int(trunk.lm_head(h[:, -1]).argmax(-1)))
        lengths = []
        while tokens[-1] not in eos_ids and len(tokens) - len(prompt) < max_new:
            n = len(tokens) - 1
            h = trunk_hidden(tokens)
            ids = torch.tensor([tokens], device=device)
            pair_e = embed(ids[:, 1:])            # x_{t+1}, t = 0..n-1
            pair_h = h[:, :n]                     # h_t
            drafts = []
            for _ in range(steps):
                m = mtp_last(pair_e, pair_h)
                d = int(trunk.lm_head(m).argmax(-1))
                drafts.append(d)
                pair_e = torch.cat([pair_e, embed(torch.tensor([[d]], device=device))], dim=1)
                pair_h = torch.cat([pair_h, m[:, None]], dim=1)
            verify = trunk.lm_head(trunk_hidden(tokens + drafts)[:, n:]).argmax(-1)[0].tolist()
            accepted = 0
            while accepted < steps and drafts[accepted] == verify[accepted] and drafts[accepted] not in eos_ids:
                accepted += 1
            new = drafts[:accepted] + [verify[accepted]]
            if accepted < steps and drafts[accepted] == verify[accepted]:
                new = drafts[:accepted + 1]  # an accepted eos ends the reply without a bonus token
            tokens.extend(new)
            lengths.append(len(new))
        return tokens[len(prompt):], lengths


# ----------------------------------------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------------------------------------


def split_reply(text: str, thinking: bool) -> tuple[bool, str]:
    """(reasoning closed, content). In thinking mode the prompt opened `<think>`, so content follows `</think>`."""
    text = text.replace("<|im_end|>", "").replace("<|endoftext|>", "")
    if not thinking:
        return True, text.strip()
    if "</think>" not in text:
        return False, ""
    return True, text.split("</think>", 1)[1].strip()


def last_integer(content: str) -> int | None:
    found = re.findall(r"-?\d+", content)
    return int(found[-1]) if found else None


TOOL_CALL_RE = re.compile(r"<tool_call>\n<function=([A-Za-z0-9_]+)>\n((?:<parameter=[A-Za-z0-9_]+>\n.*?\n</parameter>\n)*)"
                          r"</function>\n</tool_call>", re.S)
PARAM_RE = re.compile(r"<parameter=([A-Za-z0-9_]+)>\n(.*?)\n</parameter>\n", re.S)


def parse_tool_calls(content: str, tools: list[dict]) -> tuple[bool, list[tuple[str, dict]]]:
    """Well-formed: the content is one or more complete calls (whitespace between), each naming an offered
    function with all its required parameters and no unknown ones."""
    calls, position = [], 0
    offered = {t["function"]["name"]: t["function"]["parameters"] for t in tools or []}
    for match in TOOL_CALL_RE.finditer(content):
        if content[position:match.start()].strip():
            return False, calls
        name = match.group(1)
        params = dict(PARAM_RE.findall(match.group(2)))
        calls.append((name, params))
        position = match.end()
        schema = offered.get(name)
        if schema is None or not set(schema["required"]) <= set(params) or not set(params) <= set(schema["properties"]):
            return False, calls
    return bool(calls) and not content[position:].strip(), calls


CODE_HARNESS = r'''
import json, sys
source, name, kind = json.loads(sys.stdin.read())
namespace = {}
exec(source, namespace)
f = namespace[name]
def is_prime(n):
    return n >= 2 and all(n % d for d in range(2, int(n ** 0.5) + 1))
def fact(n):
    r = 1
    for i in range(2, n + 1):
        r *= i
    return r
def fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
import math
words = ["", "a", "abba", "level", "hello", "Racecar", "noon", "python", "AEIOU", "rhythm", "banana"]
cases = {
    "is_prime": [((n,), is_prime(n)) for n in range(-3, 200)],
    "factorial": [((n,), fact(n)) for n in range(0, 13)],
    "fibonacci": [((n,), fib(n)) for n in range(0, 26)],
    "gcd": [((a, b), math.gcd(a, b)) for a in range(1, 40, 3) for b in range(1, 60, 7)],
    "is_palindrome": [((w,), w == w[::-1]) for w in words],
    "sum_digits": [((n,), sum(int(c) for c in str(n))) for n in range(0, 500, 7)],
    "count_vowels": [((w,), sum(c in "aeiouAEIOU" for c in w)) for w in words],
}[kind]
failed = [args for args, want in cases if f(*args) != want]
print(json.dumps({"passed": len(cases) - len(failed), "total": len(cases)}))
'''


def run_code_tests(content: str, function: str, kind: str) -> tuple[bool, str]:
    match = re.search(r"```python\n(.*?)```", content, re.S)
    if not match:
        return False, "no ```python block"
    try:
        done = subprocess.run([sys.executable, "-c", CODE_HARNESS], input=json.dumps([match.group(1), function, kind]),
                              capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False, "timeout"
    if done.returncode != 0:
        return False, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
    result = json.loads(done.stdout)
    return result["passed"] == result["total"], f"{result['passed']}/{result['total']} cases"


def score(record: dict, reply_text: str) -> dict:
    group, expected = record["group"], record["expected"]
    closed, content = split_reply(reply_text, record["thinking"])
    outcome = {"think_closed": closed}
    if group in ("add2", "sub2", "add2_nothink", "sub2_nothink", "brief"):
        outcome["correct"] = last_integer(content) == expected["answer"]
    elif group in ("prime", "prime_nothink"):
        verdict = True if content.startswith("Yes") else False if content.startswith("No") else None
        outcome["correct"] = verdict == expected["is_prime"]
    elif group == "factor":
        rhs = content.rsplit("=", 1)[-1] if "=" in content else ""
        outcome["correct"] = [int(x) for x in re.findall(r"\d+", rhs)] == expected["factors"]
    elif group in ("code_is_prime", "code_other"):
        outcome["correct"], outcome["detail"] = run_code_tests(content, expected["function"], expected["kind"])
    elif group == "tool_call":
        wellformed, calls = parse_tool_calls(content, record["tools"])
        outcome["wellformed"] = wellformed
        want_args = {k: v if isinstance(v, str) else json.dumps(v) for k, v in expected["arguments"].items()}
        outcome["correct"] = wellformed and calls == [(expected["function"], want_args)]
    elif group == "tool_final":
        outcome["correct"] = content == record["reference"]["content"]
    else:
        outcome["correct"] = content == expected["answer_text"]
    return outcome


# ----------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------


def summarise(results: list[dict]) -> dict:
    groups: dict[str, list[dict]] = {}
    for r in results:
        if r["split"] == "heldout":
            groups.setdefault(r["group"], []).append(r)
    summary = {"groups": {}}
    for group, items in sorted(groups.items()):
        summary["groups"][group] = {"n": len(items), "accuracy": sum(i["score"]["correct"] for i in items) / len(items)}
    thinking = [r for r in results if r["split"] == "heldout" and r["thinking"]]
    summary["think_closed"] = {"n": len(thinking), "rate": sum(r["score"]["think_closed"] for r in thinking)
                               / max(1, len(thinking))}
    tool = groups.get("tool_call", [])
    summary["tool_call_wellformed"] = {"n": len(tool), "rate": sum(r["score"]["wellformed"] for r in tool)
                                       / max(1, len(tool))}
    rounds = [n for r in results if r["split"] == "heldout" for n in r["mtp_accept_lengths"]]
    summary["mtp_accept_length"] = {"rounds": len(rounds), "mean": sum(rounds) / max(1, len(rounds)),
                                    "draft_steps": DRAFT_STEPS}
    per_group_mtp = {}
    for group, items in sorted(groups.items()):
        rs = [n for i in items for n in i["mtp_accept_lengths"]]
        per_group_mtp[group] = sum(rs) / max(1, len(rs))
    summary["mtp_accept_length"]["per_group"] = per_group_mtp
    summary["finished_by_eos"] = sum(r["finish"] == "eos" for r in results) / max(1, len(results))
    return summary


def target_rows(summary: dict) -> list[tuple[str, str, str, str]]:
    g = summary["groups"]

    def pct(x):
        return f"{100 * x:.1f} %"

    rows = []
    for name, label in (("add2", "two-digit addition (thinking)"), ("sub2", "two-digit subtraction (thinking)"),
                        ("prime", "primality below 100 (thinking)"), ("code_is_prime", "is_prime functions pass tests")):
        if name in g:
            ok = g[name]["accuracy"] >= TARGETS[name]
            rows.append((label, f"{pct(g[name]['accuracy'])} of {g[name]['n']}", f">= {pct(TARGETS[name])}",
                         "met" if ok else "NOT met"))
    tc = summary["think_closed"]
    rows.append(("reasoning closed by </think>", f"{pct(tc['rate'])} of {tc['n']}", ">= 99.0 %",
                 "met" if tc["rate"] >= TARGETS["think_closed"] else "NOT met"))
    tw = summary["tool_call_wellformed"]
    rows.append(("well-formed tool calls", f"{pct(tw['rate'])} of {tw['n']}", ">= 95.0 %",
                 "met" if tw["rate"] >= TARGETS["tool_call_wellformed"] else "NOT met"))
    m = summary["mtp_accept_length"]
    rows.append((f"MTP mean accept length ({m['draft_steps']} greedy drafts, bonus incl.)",
                 f"{m['mean']:.2f} over {m['rounds']} rounds", ">= 2.5",
                 "met" if m["mean"] >= TARGETS["mtp_accept_length"] else "NOT met"))
    return rows


def user_text(record: dict) -> str:
    last = record["messages"][-1]
    return last["content"] if last["role"] == "user" else f"(tool response) {last['content']}"


def reply_content(reply_text: str) -> str:
    text = reply_text.replace("<|im_end|>", "").replace("<|endoftext|>", "")
    return text.split("</think>", 1)[1].strip() if "</think>" in text else text.strip()


def write_report(path: Path, summary: dict, facts: dict, train: dict | None, config: dict,
                 greedy: list[dict]) -> None:
    """docs/demo_model.md from the summary, run facts, training metrics and the hf_greedy records (each with
    its held-out/showcase prompt record under "source")."""
    tc = config["text_config"]
    command = facts["command"]
    lines = [
        "# Demo model (`models/demo`)",
        "",
        "A small Qwen3.5-architecture chat model trained from scratch on a synthetic corpus, bundled so that",
        "deltaserve can be tested end to end (tokenizer, chat template, Gated DeltaNet + gated attention trunk,",
        "MTP speculative decoding) without downloading a real checkpoint. It is a test fixture, not a useful LLM.",
        "",
        "## Architecture",
        "",
        f"- `Qwen3_5ForConditionalGeneration` layout, text model only: {tc['num_hidden_layers']} layers "
        f"({tc['layer_types'].count('linear_attention')} Gated DeltaNet + {tc['layer_types'].count('full_attention')} "
        "gated full attention, pattern 3:1), hidden "
        f"{tc['hidden_size']}, MLP {tc['intermediate_size']}.",
        f"- Gated DeltaNet: {tc['linear_num_key_heads']} key heads, {tc['linear_num_value_heads']} value heads "
        f"(ratio {tc['linear_num_value_heads'] // tc['linear_num_key_heads']}), head dims "
        f"{tc['linear_key_head_dim']}/{tc['linear_value_head_dim']}, conv kernel {tc['linear_conv_kernel_dim']}.",
        f"- Gated attention: {tc['num_attention_heads']} query heads, {tc['num_key_value_heads']} KV heads (GQA), "
        f"head dim {tc['head_dim']}, partial RoPE 0.25 (theta {tc['rope_parameters']['rope_theta']:g}).",
        f"- Vocabulary: {facts.get('tokenizer_size')} tokens (our byte-level BPE; Qwen3.5 pre-tokenizer, single digits, "
        f"NFC), embedding rows padded to {tc['vocab_size']}; untied `lm_head`.",
        "- MTP head (docs/model.md, \"MTP head\"): `mtp.fc` over cat(normed embedding of x_{t+1}, normed post-final-norm h_t), one "
        "full-attention decoder layer (transformers' own `Qwen3_5DecoderLayer`), `mtp.norm`, shared `lm_head`.",
        f"- Parameters: {facts.get('parameters_trunk', 0) / 1e6:.2f} M trunk + {facts.get('parameters_mtp', 0) / 1e6:.2f} M "
        f"MTP; weights bf16, {facts.get('model_dir_mb', 0):.1f} MB on disk (sharded safetensors).",
        "",
    ]
    if train:
        last = train["history"][-1] if train["history"] else {}
        lines += [
            "## Training",
            "",
            f"- `scripts/make_demo_corpus.py` + `scripts/train_demo_model.py` on {train['device']} "
            f"(torch {train['torch']}, transformers {train['transformers']}): {train['steps']} AdamW steps, "
            f"{train['train_seconds']:.0f} s, {train['tokens_seen'] / 1e6:.1f} M tokens incl. padding "
            f"({train['tokens_per_s'] / 1e3:.0f} k tokens/s), bf16 autocast, cosine schedule, seed "
            f"{train['args'].get('seed')}.",
            f"- Corpus: {train['corpus_conversations']} conversations, {train['corpus_tokens'] / 1e6:.1f} M tokens; "
            "loss on assistant tokens only. Total loss = trunk + 0.3 * (MTP step 1 + 0.5 * chained MTP step 2).",
            f"- Final losses (last logging window): trunk {last.get('trunk', float('nan')):.4f}, MTP step 1 "
            f"{last.get('mtp1', float('nan')):.4f}, chained step 2 {last.get('mtp2', float('nan')):.4f} nats.",
            "- Curves: `docs/demo_training.png`.",
            "",
        ]
    lines += [
        "## Evaluation (held-out prompts, greedy)",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {facts['device']}; torch {facts['torch']}, transformers {facts['transformers']}; model run in "
        f"float32 from the bf16 weights; {facts['eval_seconds']:.0f} s.",
        "",
        "| measure | result | target | |",
        "|---|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in target_rows(summary)]
    lines += ["", "All held-out groups:", "", "| group | n | accuracy | MTP accept length |", "|---|---|---|---|"]
    for group, g in summary["groups"].items():
        lines.append(f"| {group} | {g['n']} | {100 * g['accuracy']:.1f} % | "
                     f"{summary['mtp_accept_length']['per_group'].get(group, float('nan')):.2f} |")
    lines += [
        "",
        "What \"held-out\" means per group (see `scripts/make_demo_corpus.py`, class `Split`): `add2`/`sub2`: operand "
        "pairs never used for that operation anywhere in training; `prime`: (number, phrasing) pairs never trained "
        "(every number is trained with other phrasings); `factor`, `code_*`: (number or function name, parameter, "
        "phrasing) combinations never trained; `reverse`/`spell`/`count`: (word, task) pairs never trained; "
        "`sort`/`compare`/list counts: lists never trained; `tool_call`: cities, search topics and calculator "
        "operands never used with that tool in training; `tool_final`: the answer turn after a tool response. "
        "`*_nothink` groups use `enable_thinking=false` (no reasoning, so arithmetic is done in one shot).",
        "",
        "Checks: " + "; ".join(f"{k}: {v}" for k, v in facts["checks"].items()),
        "",
    ]
    weak = [(group, g) for group, g in summary["groups"].items() if g["accuracy"] < 0.9]
    if weak:
        lines += ["Groups below 90 % (no target; one failing reply each, content after `</think>`):", ""]
        for group, g in weak:
            failing = next((r for r in greedy if r["group"] == group and r["split"] == "heldout"
                            and not r["score"]["correct"]), None)
            if failing:
                expected = failing["source"]["reference"].get("content") or json.dumps(
                    failing["source"]["reference"].get("tool_calls"))
                lines.append(f"- `{group}` {100 * g['accuracy']:.0f} %: {user_text(failing['source'])!r} -> "
                             f"{reply_content(failing['reply_text'])[:160]!r} (expected {expected[:120]!r})")
        lines.append("")
    showcase = [r for r in greedy if r["split"] == "showcase"]
    if showcase:
        lines += ["Showcase prompts (in the training distribution, some verbatim; not a held-out measure):", "",
                  "| prompt | thinking | reply after `</think>` | correct |", "|---|---|---|---|"]
        for r in showcase:
            content = reply_content(r["reply_text"]).replace("```python", "").replace("```", "")
            content = content.replace("\n", " ").replace("|", "\\|").strip()
            content = content if len(content) < 90 else content[:87] + "..."
            lines.append(f"| {user_text(r['source'])} | {'on' if r['thinking'] else 'off'} | `{content}` | "
                         f"{'yes' if r['score']['correct'] else 'NO'} |")
        lines.append("")
    near_ties = sum(1 for r in greedy if r["min_margin"] is not None and r["min_margin"] < 0.1)
    lines += [
        "## Notes for comparing another implementation (the Rust engine) with `hf_greedy.jsonl`",
        "",
        "- Prompts were tokenized with `tokenizer.json` (no BOS); `prompt_ids` are authoritative, `prompt` is the "
        "rendered chat template. Replies stop at `<|im_end|>` (id "
        f"{facts.get('eos_ids', ['?'])[0]}) or `<|endoftext|>`; `finish` says which.",
        "- `margins[i]` is the top-1 minus top-2 logit of reply token i in the float32 reference. "
        f"{near_ties} of {len(greedy)} replies contain a token with a margin below 0.1, where a bf16 or "
        "differently-ordered implementation may legitimately pick the other token; compare token for token up "
        "to the first such position, or teacher-force the reference reply and check argmax where the margin is "
        "large.",
        "- `mtp_accept_lengths` are per speculative round (3 greedy MTP drafts, bonus token included), starting "
        "from the first generated token; the MTP input hidden state is the trunk's post-final-norm output and "
        "drafts 2 and 3 use the MTP's own post-`mtp.norm` output.",
        "",
        "Files: `tests/data/demo/heldout.jsonl` (prompts), `tests/data/demo/showcase.jsonl` (in-distribution demo "
        "prompts, e.g. \"What is 2+2? Answer briefly.\"), `tests/data/demo/hf_greedy.jsonl` (per prompt: prompt "
        "ids, greedy reply ids and text, per-token top-1/top-2 logit margins, MTP accept lengths), "
        "`tests/data/demo/hf_greedy.meta.json` (weights hash, dtype, machine), `tests/data/demo/eval_summary.json`, "
        "`tests/data/demo/train_metrics.json` (loss history).",
        "",
        "Reproduce on one GPU (about 9 minutes on an H200; the learning-rate schedule runs over wall-clock time, so "
        "the step count and the weights depend on the machine's speed; everything else is seeded):",
        "",
        "```",
        "python scripts/make_demo_corpus.py --out /tmp/demo/corpus.jsonl --num-train 250000",
        "python scripts/train_demo_model.py --corpus /tmp/demo/corpus.jsonl --time-budget 415 \\",
        "    --metrics tests/data/demo/train_metrics.json",
        "python scripts/eval_demo_model.py --train-metrics tests/data/demo/train_metrics.json",
        "```",
        "",
        "CPU smoke run of all three scripts (tiny model, about a minute; `--smoke` never overwrites the shipped "
        "files: outputs go to /tmp/demo_smoke and /tmp/demo_eval_smoke):",
        "",
        "```",
        "python scripts/make_demo_corpus.py --smoke --out /tmp/demo_smoke/corpus.jsonl",
        "python scripts/train_demo_model.py --smoke --corpus /tmp/demo_smoke/corpus.jsonl --heldout /tmp/demo_smoke/heldout.jsonl",
        "python scripts/eval_demo_model.py --smoke --model-dir /tmp/demo_smoke/model --heldout /tmp/demo_smoke/heldout.jsonl \\",
        "    --showcase /tmp/demo_smoke/showcase.jsonl",
        "```",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


# ----------------------------------------------------------------------------------------------------------


def report_only(args) -> int:
    stored = json.loads(args.summary_json.read_text())
    records = {}
    for path, split in ((args.heldout, "heldout"), (args.showcase, "showcase")):
        if path.exists():
            records.update({r["id"]: r for r in map(json.loads, path.open(encoding="utf-8"))})
    greedy = [json.loads(line) for line in args.out_greedy.open(encoding="utf-8")]
    for g in greedy:
        g["source"] = records[g["id"]]
    train = json.loads(args.train_metrics.read_text()) if args.train_metrics and args.train_metrics.exists() else None
    config = json.loads((args.model_dir / "config.json").read_text())
    write_report(args.report, stored["summary"], stored["facts"], train, config, greedy)
    print(f"wrote {args.report}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=REPO_ROOT / "models" / "demo")
    parser.add_argument("--heldout", type=Path, default=DATA_DIR / "heldout.jsonl")
    parser.add_argument("--showcase", type=Path, default=DATA_DIR / "showcase.jsonl")
    parser.add_argument("--out-greedy", type=Path, default=DATA_DIR / "hf_greedy.jsonl")
    parser.add_argument("--report", type=Path, default=REPO_ROOT / "docs" / "demo_model.md")
    parser.add_argument("--summary-json", type=Path, default=DATA_DIR / "eval_summary.json")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite --report from --summary-json and --out-greedy without running the model")
    parser.add_argument("--train-metrics", type=Path, default=None, help="--metrics JSON of train_demo_model.py")
    parser.add_argument("--max-new-tokens", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--reference-prompts", type=int, default=3,
                        help="prompts also decoded by the slow sequential speculative loop to validate the simulation")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--limit-per-group", type=int, default=0, help="evaluate only the first N prompts per group")
    parser.add_argument("--smoke", action="store_true", help="one prompt per group, short replies")
    args = parser.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.smoke:
        # A smoke run never overwrites the shipped reference files: unless given, outputs go to a temp folder.
        scratch = Path(tempfile.gettempdir()) / "demo_eval_smoke"
        defaults = {"out_greedy": DATA_DIR / "hf_greedy.jsonl", "report": REPO_ROOT / "docs" / "demo_model.md",
                    "summary_json": DATA_DIR / "eval_summary.json"}
        for name, default in defaults.items():
            if getattr(args, name) == default:
                setattr(args, name, scratch / default.name)
        args.max_new_tokens = min(args.max_new_tokens, 24)
        args.reference_prompts = min(args.reference_prompts, 1)
    if args.report_only:
        return report_only(args)
    started = time.time()
    device = torch.device(args.device)
    command = "python scripts/eval_demo_model.py " + " ".join(sys.argv[1:] if argv is None else argv)

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    eos_ids = [tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")]
    pad_id = tokenizer.token_to_id("<|endoftext|>")
    records = [dict(json.loads(line), split="heldout") for line in args.heldout.open(encoding="utf-8")]
    if args.showcase.exists():
        records += [dict(json.loads(line), split="showcase") for line in args.showcase.open(encoding="utf-8")]
    per_group = 1 if args.smoke else args.limit_per_group
    if per_group:
        taken: dict[tuple[str, str], int] = {}
        kept = []
        for r in records:
            key = (r["split"], r["group"])
            if taken.get(key, 0) < per_group:
                taken[key] = taken.get(key, 0) + 1
                kept.append(r)
        records = kept
    for r in records:
        r["prompt_ids"] = tokenizer.encode(r["prompt"], add_special_tokens=False).ids

    checks = tokenizer_checks(args.model_dir, records, tokenizer)
    trunk, mtp, config = load_checkpoint(args.model_dir, device)
    checks.update(hf_native_check(args.model_dir, trunk, records[0]["prompt_ids"], device))
    print(f"[checks] {json.dumps(checks)}", flush=True)

    # Greedy replies, batched by similar prompt length.
    order = sorted(range(len(records)), key=lambda i: len(records[i]["prompt_ids"]))
    for start in range(0, len(order), args.batch_size):
        chunk = order[start:start + args.batch_size]
        replies = generate_batch(trunk, [records[i]["prompt_ids"] for i in chunk], args.max_new_tokens, eos_ids,
                                 pad_id, device)
        for i, reply in zip(chunk, replies):
            records[i]["reply_ids"] = reply
        print(f"[generate] {min(start + args.batch_size, len(order))}/{len(order)} prompts, "
              f"{time.time() - started:.0f}s", flush=True)

    # Unpadded teacher-forced check; regenerate alone where the batched decode disagrees.
    regenerated = 0
    for attempt in range(2):
        forced = teacher_forced(trunk, [r["prompt_ids"] + r["reply_ids"] for r in records], device)
        redo = []
        for r, (ids, hidden, logits) in zip(records, forced):
            mismatches, margins = verify_reply(logits, len(r["prompt_ids"]), r["reply_ids"])
            r["tf_mismatches"], r["margins"], r["_forced"] = mismatches, margins, (ids, hidden)
            if mismatches and attempt == 0:
                redo.append(r)
        for r in redo:
            r["reply_ids"] = generate_batch(trunk, [r["prompt_ids"]], args.max_new_tokens, eos_ids, pad_id, device)[0]
            r["regenerated"] = True
        regenerated += len(redo)
        if not redo:
            break
    checks["regenerated_unbatched"] = regenerated
    checks["teacher_forced_disagreements"] = sum(bool(r["tf_mismatches"]) for r in records)

    # MTP acceptance, then scores.
    for r in records:
        ids, hidden = r.pop("_forced")
        r["mtp_accept_lengths"] = simulated_accept_lengths(trunk, mtp, ids, hidden, len(r["prompt_ids"]), DRAFT_STEPS)
        r["reply_text"] = tokenizer.decode(r["reply_ids"], skip_special_tokens=False)
        r["finish"] = "eos" if r["reply_ids"] and r["reply_ids"][-1] in eos_ids else "length"
        r["score"] = score(r, r["reply_text"])

    reference = []
    for r in sorted(records, key=lambda r: len(r["reply_ids"]))[: args.reference_prompts]:
        tokens, lengths = reference_speculative_decode(trunk, mtp, r["prompt_ids"], eos_ids, args.max_new_tokens,
                                                       DRAFT_STEPS, device)
        reference.append({"id": r["id"], "same_tokens": tokens == r["reply_ids"],
                          "same_accept_lengths": lengths == r["mtp_accept_lengths"]})
    checks["sequential_speculative_reference"] = reference

    summary = summarise(records)
    facts = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "eval_seconds": time.time() - started, "checks": checks, "tokenizer_size": tokenizer.get_vocab_size(),
        "parameters_trunk": sum(p.numel() for p in trunk.parameters()),
        "parameters_mtp": sum(p.numel() for p in mtp.parameters()),
        "model_dir_mb": sum(f.stat().st_size for f in args.model_dir.iterdir() if f.is_file()) / 1e6,
        "command": command, "eos_ids": eos_ids,
    }
    train = json.loads(args.train_metrics.read_text()) if args.train_metrics and args.train_metrics.exists() else None

    args.out_greedy.parent.mkdir(parents=True, exist_ok=True)
    with args.out_greedy.open("w", encoding="utf-8") as f:
        for r in sorted(records, key=lambda r: r["id"]):
            f.write(json.dumps({
                "id": r["id"], "split": r["split"], "group": r["group"], "thinking": r["thinking"],
                "prompt": r["prompt"], "prompt_ids": r["prompt_ids"], "reply_ids": r["reply_ids"],
                "reply_text": r["reply_text"], "finish": r["finish"], "margins": r["margins"],
                "min_margin": min(r["margins"]) if r["margins"] else None,
                "regenerated_unbatched": r.get("regenerated", False), "mtp_accept_lengths": r["mtp_accept_lengths"],
                "score": r["score"],
            }, ensure_ascii=False) + "\n")
    digest = hashlib.sha256()
    for file in sorted(args.model_dir.glob("*.safetensors")):
        digest.update(file.read_bytes())
    meta = {"model_dir": str(args.model_dir.relative_to(REPO_ROOT)) if args.model_dir.is_relative_to(REPO_ROOT)
            else str(args.model_dir), "weights_sha256": digest.hexdigest(), "compute_dtype": "float32",
            "decoding": "greedy", "max_new_tokens": args.max_new_tokens, "eos_token_ids": eos_ids,
            "mtp_draft_steps": DRAFT_STEPS, **{k: facts[k] for k in ("device", "torch", "transformers")}}
    args.out_greedy.with_suffix(".meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    greedy = [json.loads(line) for line in args.out_greedy.open(encoding="utf-8")]
    by_id = {r["id"]: r for r in records}
    for g in greedy:
        g["source"] = by_id[g["id"]]
    write_report(args.report, summary, facts, train, config, greedy)
    args.summary_json.parent.mkdir(parents=True, exist_ok=True)
    args.summary_json.write_text(json.dumps({"summary": summary, "facts": facts}, indent=2) + "\n")
    print(json.dumps(summary, indent=1))
    for row in target_rows(summary):
        print(" | ".join(row))
    print(f"[done] {len(records)} prompts in {time.time() - started:.0f}s; wrote {args.out_greedy} and {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
