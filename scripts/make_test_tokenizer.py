#!/usr/bin/env python3
"""Build the small tokenizer fixture of deltaserve-text and the expectations its Rust tests compare against.

Trains a byte-level BPE tokenizer shaped like Qwen3.5's (NFC normaliser, letters / single digits split,
ByteLevel without prefix space, Qwen's special tokens as added tokens) on generated English / code / math
text, then writes into tests/fixtures/tokenizer/:
  tokenizer.json, tokenizer_config.json (chat_template = scripts/chat_template.jinja), generation_config.json,
  expected.json: encodings, decodings (also of random id runs with broken UTF-8), renders of
  chat_template.jinja for several conversations, the messages its raise_exception rejects with, and renders
  of small snippets exercising the jinja features HF templates use, all computed with HF tokenizers /
  transformers' jinja2 environment.

Needs only what /work/main/.venv already has (tokenizers, transformers, jinja2); runs in a few seconds and
its output is deterministic.

Chat renders go through transformers' `apply_chat_template` (jinja2). Before rendering, tool-call arguments
given as JSON strings are parsed into objects, the same normalisation deltaserve-text applies (vLLM does it
too; transformers does not), so both sides see the same messages.

Re-run:  .venv/bin/python scripts/make_test_tokenizer.py
"""

import json
import random
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "tokenizer"
TEMPLATE = ROOT / "scripts" / "chat_template.jinja"

VOCAB_SIZE = 1500
# Added tokens in Qwen's order. As in Qwen's tokenizer_config.json only the ChatML control tokens are
# `special` (skipped by decode(skip_special_tokens=True)); the think / tool tags stay in decoded text so that
# the reasoning and tool-call parsers can see them.
CONTROL_TOKENS = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]
# Qwen3.5's split: contractions, letters with marks, single digits, punctuation runs, newlines, spaces.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{M}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

WORDS = (
    "the model reads a prompt and writes an answer one token at a time while the server streams each piece "
    "to the client . a request waits in the queue until the scheduler finds room for its cache and state "
    "we measure latency throughput and memory for every batch size and report the numbers in a table "
    "please explain why the sky is blue and how light scatters in the air above the sea "
    "what is the capital of france paris is the capital and largest city of the country "
    "think step by step before you answer then check the result against the question "
    "weather city temperature forecast tomorrow sunny rain cloudy wind degrees celsius "
    "function call tool result search query file path line number error message value "
    "about after again against all also always among another answer any around because been before being "
    "below between both bring build came change children close come could country different does during "
    "early enough even every example family far feel few find first follow food form found four friend "
    "give good government great group grow hand hard have head hear help high home house important keep "
    "kind know land large last later learn leave left letter life light little live long look made make "
    "many mean might mile more most mother mountain move much music must name near need never new next "
    "night number often old only open order other own page paper part people picture place plant play "
    "point present problem question quick read real right river room run said same school second see "
    "sentence set should show side since small something sometimes song sound spell stand start state "
    "still story study such take talk tell than their them there these thing thought three through time "
    "together took tree try turn under until upon very walk want watch water well went were where which "
    "while white whole why with without word work world would write year young"
).split()
SYLLABLES = "ka ton ri mel sa vor en di lu pra ste ga ko nim or fe quan bri zel ux".split()
NAMES = ["alice", "bob", "carol", "dave", "value", "count", "total", "items", "result", "index"]
CODE_LINES = [
    "def {f}({a}, {b}):\n    return {a} + {b}\n",
    "for {a} in range({n}):\n    print({a} * {n})\n",
    "fn {f}({a}: u32) -> u32 {{\n    {a} * {n}\n}}\n",
    "let {a} = vec![{n}, {m}, {n}];\n",
    "if {a} > {n} {{\n    return Err(\"too large\".into());\n}}\n",
    "{{\"name\": \"{f}\", \"arguments\": {{\"{a}\": {n}, \"{b}\": \"{m}\"}}}}\n",
    "    {a}.append({b})  # keep the {a} list sorted\n",
]
EXTRA_TEXT = [
    "Café naïve résumé façade déjà vu.",
    "日本語のテキストと中文文本。",
    "Emoji: 😀 🚀 👍🏽 🇫🇷 ✨",
    "Ünïcödé ωμέγα λόγος Привет мир",
]


def sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) if rng.random() < 0.85 else made_up_word(rng) for _ in range(rng.randint(5, 16))]
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice([".", "?", "!", ":"])


def made_up_word(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))


def code(rng: random.Random) -> str:
    line = rng.choice(CODE_LINES)
    a, b = rng.sample(NAMES, 2)
    return line.format(f=rng.choice(NAMES) + "_fn", a=a, b=b, n=rng.randint(0, 999), m=rng.randint(0, 99))


def math(rng: random.Random) -> str:
    x, y = rng.randint(0, 9999), rng.randint(1, 999)
    op = rng.choice(["+", "-", "*", "/"])
    result = {"+": x + y, "-": x - y, "*": x * y, "/": round(x / y, 3)}[op]
    return f"{x} {op} {y} = {result}"


def chat_sample(rng: random.Random) -> str:
    return (
        f"<|im_start|>user\n{sentence(rng)}<|im_end|>\n<|im_start|>assistant\n<think>\n{sentence(rng)}\n"
        f"</think>\n\n{sentence(rng)}<|im_end|>\n"
    )


def corpus() -> list[str]:
    rng = random.Random(1234)
    kinds = [sentence, sentence, sentence, code, code, math, chat_sample]
    lines = [rng.choice(kinds)(rng) for _ in range(12000)]
    return lines + EXTRA_TEXT * 5


def train() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    for t in SPECIAL_TOKENS:
        token = AddedToken(t, special=t in CONTROL_TOKENS, normalized=False)
        if t in CONTROL_TOKENS:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
    return tok


def write_configs(tok: Tokenizer) -> None:
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    added = {
        str(ids[t]): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t in CONTROL_TOKENS,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": TEMPLATE.read_text(),
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    generation = {
        "bos_token_id": ids["<|endoftext|>"],
        "do_sample": True,
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "transformers_version": "5.24.0",
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (OUT / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


ENCODE_TEXTS = [
    "Hello world",
    "The model reads a prompt and writes an answer.",
    "  leading spaces and trailing   ",
    "line one\nline two\n\n\nline five\r\n",
    "12345 + 678 = 13023, pi ~ 3.14159",
    "I'm sure they'll say we've done it, don't you think? IT'S FINE",
    "def add(a, b):\n    return a + b\n",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "Café naïve résumé — déjà vu",
    "Cafe\u0301 (decomposed e + accent, NFC composes it)",
    "日本語のテキストと中文文本。",
    "Emoji: 😀 🚀 👍🏽 🇫🇷 ✨ 🦀",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nok\n</think>\n\nHello<|im_end|>",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "text<think>inside</think>after<|endoftext|>",
    "tabs\tand\u00a0non-breaking\u2003spaces",
    "",
]


def conversations() -> list[dict]:
    weather_tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city, in °C. Use <city> names like \"Paris\".",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "days": {"type": "integer"},
                    "detailed": {"type": "boolean"},
                },
                "required": ["city"],
            },
        },
    }
    search_tool = {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "filters": {"type": "object"}, "limit": {"type": "number"}},
                "required": ["query"],
            },
        },
    }
    return [
        {"name": "plain_chat", "messages": [{"role": "user", "content": "Hello! How are you?"}]},
        {
            "name": "system_prompt",
            "messages": [
                {"role": "system", "content": "You are a terse assistant.\n"},
                {"role": "user", "content": "  What is 2 + 2?  "},
            ],
        },
        {
            "name": "no_generation_prompt",
            "add_generation_prompt": False,
            "messages": [
                {"role": "user", "content": "Say hi."},
                {"role": "assistant", "content": "Hi!"},
            ],
        },
        {
            "name": "multi_turn_reasoning",
            "messages": [
                {"role": "system", "content": "Think carefully."},
                {"role": "user", "content": "What is 17 * 3?"},
                {"role": "assistant", "reasoning_content": "17 * 3 = 51.", "content": "51"},
                {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "17 * 4?"}]},
                {"role": "assistant", "content": "<think>\n17 * 4 = 68.\n</think>\n\n68"},
                {"role": "user", "content": "Thanks. Now 日本語 please 😀"},
            ],
        },
        {
            "name": "last_turn_keeps_reasoning",
            "add_generation_prompt": False,
            "messages": [
                {"role": "user", "content": "Pick a number."},
                {"role": "assistant", "reasoning": "Any number works.\n", "content": "7"},
            ],
        },
        {
            "name": "tools_call_and_response",
            "tools": [weather_tool, search_tool],
            "messages": [
                {"role": "system", "content": "Use tools when needed."},
                {"role": "user", "content": "Weather in Paris and Tokyo for 2 days?"},
                {
                    "role": "assistant",
                    "content": "Let me check both cities.",
                    "reasoning_content": "I need the weather tool twice.",
                    "tool_calls": [
                        {
                            "id": "call_0",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
                        },
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {
                                "name": "get_weather",
                                "arguments": {"city": "Tokyo", "days": 2, "detailed": True},
                            },
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": "call_0", "name": "get_weather", "content": "Sunny, 21 °C"},
                {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"sky": "rain", "c": 14.5}'},
            ],
        },
        {
            "name": "tools_multi_step",
            "tools": [search_tool],
            "messages": [
                {"role": "user", "content": "Find papers on delta rules."},
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": "Search first.",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {
                                "name": "search",
                                "arguments": '{"query": "gated delta rule", "filters": {"year": [2024, 2025], "open": true}, "limit": 2.5}',
                            },
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "1. Gated Delta Networks (2024)"},
                {"role": "assistant", "reasoning_content": "One more search.", "content": "", "tool_calls": [
                    {"id": "c2", "type": "function", "function": {"name": "search", "arguments": {"query": "DeltaNet\nchunked"}}}
                ]},
                {"role": "tool", "tool_call_id": "c2", "content": "2. Parallelizing Linear Transformers"},
            ],
        },
        {
            "name": "tools_without_system",
            "tools": [weather_tool],
            "messages": [{"role": "user", "content": "Is it raining in Oslo?"}],
        },
        {
            "name": "thinking_disabled",
            "kwargs": {"enable_thinking": False},
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Name a color."},
            ],
        },
        {
            "name": "thinking_enabled_explicit",
            "kwargs": {"enable_thinking": True},
            "messages": [{"role": "user", "content": "Name a fruit."}],
        },
    ]


RENDER_ERRORS = [
    {
        "name": "system_not_first",
        "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}],
        "message": "A system message is only allowed as the first message.",
    },
    {
        "name": "unknown_role",
        "messages": [{"role": "narrator", "content": "Once upon a time"}],
        "message": "Unknown message role: narrator",
    },
    {
        "name": "image_part",
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        "message": "Only text content parts are supported, found a part of type image_url.",
    },
]


# Jinja features HF chat templates use, each rendered by transformers' own jinja2 environment; the Rust
# tests render the same snippets with minijinja. `messages`, `tools`, `documents` and
# `add_generation_prompt` are set as apply_chat_template sets them (empty / None / False).
FEATURE_CONTEXT = {
    "s": "  abc Hello world  ",
    "xs": [3, 1, 2, 3],
    "words": ["b", "a", "c"],
    "d": {"k": "v", "n": 1, "z": None},
    "ms": [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"}, {"role": "user", "content": "U2"}],
    "n": 7,
    "f": 2.5,
    "b": True,
    "nothing": None,
    "text": "<think>\nr\n</think>\n\nanswer",
}
FEATURE_TEMPLATES = {
    "slices": "{{ xs[::-1] }} {{ xs[1:] }} {{ xs[-1] }} {{ s[2:5] }} {{ s[::-1] }}",
    "loop_vars": "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }};{% endfor %}",
    "loop_adjacent": "{% for x in xs %}{% if not loop.first %}{{ loop.previtem }}{% endif %}>{{ x }}<{% if not loop.last %}{{ loop.nextitem }}{% endif %} {% endfor %}",
    "loop_controls": "{% for x in xs %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "loop_else_and_filter": "{% for x in [] %}{{ x }}{% else %}empty{% endfor %} {% for x in xs if x > 1 %}{{ x }}{% endfor %}",
    "string_filters": "{{ s|trim }}|{{ s|upper }}|{{ s|lower }}|{{ s|replace('l', 'L') }}|{{ s|length }}|{{ s|capitalize }}|{{ s|title }}",
    "list_filters": "{{ words|join(', ') }} {{ xs|first }} {{ xs|last }} {{ xs|count }} {{ words|sort|list }} {{ xs|reverse|list }} {{ xs|unique|list }} {{ xs|min }} {{ xs|max }} {{ xs|sum }}",
    "dict_filters": "{{ d|items|list }} {{ d|dictsort }} {{ d|length }} {{ d|list }}",
    "select_map": "{{ ms|selectattr('role', 'equalto', 'user')|list|length }} {{ ms|map(attribute='role')|join(',') }} {{ ms|rejectattr('role', 'equalto', 'user')|map(attribute='content')|first }}",
    "default_filter": "{{ missing|default('dflt') }} {{ nothing|default('x') }} {{ nothing|default('x', true) }} {{ ''|default('e', true) }}",
    "tests": "{{ nothing is none }} {{ missing is defined }} {{ missing is undefined }} {{ xs is sequence }} {{ s is string }} {{ d is mapping }} {{ n is number }} {{ b is boolean }} {{ s is iterable }} {{ n is integer }} {{ f is float }} {{ xs is not string }} {{ n is odd }} {{ n is divisibleby 7 }}",
    "in_and_compare": "{{ 'abc' in s }} {{ 'k' in d }} {{ 3 in xs }} {{ 1 == 1.0 }} {{ n > 5 and not b }} {{ 'a' < 'b' }}",
    "py_string_methods": "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.startswith('  a') }}|{{ s.endswith('d  ') }}|{{ s.split()|length }}|{{ s.split('o') }}|{{ s.replace('l', '_') }}|{{ s.upper() }}|{{ s.lower() }}|{{ s.find('H') }}|{{ s.count('l') }}|{{ s.strip().title() }}",
    "py_string_args": "{{ text.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}|{{ text.split('</think>')[-1].lstrip('\\n') }}|{{ 'a,b,,c'.split(',') }}|{{ 'x\\ny'.splitlines() }}|{{ '-'.join(words) }}",
    "py_dict_methods": "{{ d.get('k') }} {{ d.get('missing') }} {{ d.get('missing', 'fb') }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }}",
    "arithmetic": "{{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ n * f }} {{ -n }} {{ 10 - 2.5 }} {{ 1 / 3 }} {{ (n + 1) * 2 }}",
    "concat_and_printing": "{{ 'a' ~ 1 ~ 'b' }} {{ [1, 2] + [3] }} {{ 'ab' * 3 }} {{ nothing }} {{ b }} {{ f }} {{ d }} {{ ms[0] }} {{ words }} {{ missing }}|",
    "concat_python_values": "{{ 'a' ~ nothing ~ b ~ f ~ 1e20 }}",
    "conversions": "{{ n|string }} {{ '42'|int + 1 }} {{ '2.5'|float * 2 }} {{ f|int }} {{ b|string }} {{ xs|string }} {{ 3.0|round }} {{ 2.567|round(2) }} {{ -3|abs }}",
    "builtins": "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ dict(a=1, b='x') }} {{ namespace(v=1).v }} {{ '%s-%d'|format('x', 3) }}",
    "namespace_and_set": "{% set ns = namespace(found=false, count=0) %}{% for m in ms %}{% if m.role == 'user' %}{% set ns.found = true %}{% set ns.count = ns.count + 1 %}{% endif %}{% endfor %}{{ ns.found }} {{ ns.count }}{% set x = 5 %}{% set y %}block {{ x }}{% endset %} {{ y }}",
    "macros": "{% macro m(a, b='d') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, b=2) }}{{ m(a=3) }}{% macro outer() %}{{ caller() }}{% endmacro %}{% call outer() %}inner{% endcall %}",
    "whitespace_control": "a  {%- if true -%}  b  {%- endif -%}  c\n  {% if true %}\n    d\n  {% endif %}\n{# comment #}\ne{{ ' f ' }}\n",
    "trailing_newline": "line\n\n",
    "tojson_variants": "{{ d|tojson }} {{ xs|tojson(indent=2) }} {{ 'é\"<'|tojson }} {{ nothing|tojson }} {{ f|tojson }} {{ ms[0]|tojson(separators=(',', ':')) }} {{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}",
    "raw_block": "{% raw %}{{ not rendered }}{% endraw %}",
    "if_expr_and_filters_chain": "{{ 'yes' if b else 'no' }} {{ 'yes' if nothing else 'no' }} {{ ms|length > 2 }} {{ (ms|last).content|lower }}",
    "apply_chat_template_variables": "{{ messages|length }} {{ tools is none }} {{ documents is none }} {{ add_generation_prompt }} {{ eos_token }} {{ pad_token }} {{ bos_token is defined }}",
}


def feature_renders(hf) -> list[dict]:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    rendered = []
    for name, template in FEATURE_TEMPLATES.items():
        compiled = _compile_jinja_template(template)
        context = {**hf.special_tokens_map, **FEATURE_CONTEXT}
        try:
            text = compiled.render(messages=[], tools=None, documents=None, add_generation_prompt=False, **context)
            rendered.append({"name": name, "template": template, "text": text})
        except Exception as err:  # recorded so the Rust test can show which side fails
            rendered.append({"name": name, "template": template, "error": f"{type(err).__name__}: {err}"})
    return rendered


def normalized_messages(messages: list[dict]) -> list[dict]:
    """Parse JSON-string tool-call arguments into objects, as deltaserve-text does before rendering."""
    out = json.loads(json.dumps(messages))
    for message in out:
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    parsed = json.loads(arguments)
                except json.JSONDecodeError:
                    continue
                if isinstance(parsed, dict):
                    function["arguments"] = parsed
    return out


def expectations(hf) -> dict:
    encodes = []
    for text in ENCODE_TEXTS:
        ids = hf.encode(text, add_special_tokens=False)
        encodes.append({"text": text, "ids": ids, "tokens": hf.convert_ids_to_tokens(ids)})

    rng = random.Random(99)
    decodes = []
    id_lists = [e["ids"] for e in encodes if e["ids"]]
    # Random id runs, including byte tokens that form broken UTF-8 on their own.
    id_lists += [[rng.randrange(len(hf)) for _ in range(rng.randint(1, 12))] for _ in range(30)]
    for ids in id_lists:
        for skip in (False, True):
            decodes.append({"ids": ids, "skip_special_tokens": skip, "text": hf.decode(ids, skip_special_tokens=skip)})

    renders = []
    for conv in conversations():
        add_gen = conv.get("add_generation_prompt", True)
        kwargs = conv.get("kwargs", {})
        text = hf.apply_chat_template(
            normalized_messages(conv["messages"]),
            tools=conv.get("tools"),
            add_generation_prompt=add_gen,
            tokenize=False,
            **kwargs,
        )
        renders.append(
            {
                "name": conv["name"],
                "messages": conv["messages"],
                "tools": conv.get("tools"),
                "add_generation_prompt": add_gen,
                "kwargs": kwargs,
                "text": text,
                "ids": hf.encode(text, add_special_tokens=False),
            }
        )

    for case in RENDER_ERRORS:
        try:
            hf.apply_chat_template(case["messages"], add_generation_prompt=True, tokenize=False)
        except Exception as err:  # jinja2.TemplateError from raise_exception
            assert str(err) == case["message"], (case["name"], str(err))
        else:
            raise AssertionError(f"{case['name']} rendered without error")

    added = {t: hf.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    return {
        "vocab_size": len(hf),
        "added_ids": added,
        # Ids that decode(skip_special_tokens=True) drops.
        "skipped_ids": [i for i in added.values() if hf.decode([i], skip_special_tokens=True) == ""],
        "encode": encodes,
        "decode": decodes,
        "renders": renders,
        "render_errors": RENDER_ERRORS,
        "feature_context": FEATURE_CONTEXT,
        "feature_renders": feature_renders(hf),
    }


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    tok = train()
    tok.save(str(OUT / "tokenizer.json"))
    write_configs(tok)
    hf = AutoTokenizer.from_pretrained(str(OUT))
    expected = expectations(hf)
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n")
    sizes = {p.name: p.stat().st_size for p in sorted(OUT.iterdir())}
    print(f"vocab {expected['vocab_size']}, {len(expected['encode'])} encodings, "
          f"{len(expected['decode'])} decodings, {len(expected['renders'])} renders; files {sizes}")


if __name__ == "__main__":
    main()
