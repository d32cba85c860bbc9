#!/usr/bin/env python3
"""Decode throughput of a running server with and without a JSON-schema constraint, at batch 1 and a
larger batch (N requests in flight at once), and the MTP draft acceptance under grammars. A client
only: it starts nothing.

    python3 scripts/bench_structured.py --base-url http://127.0.0.1:30000 --batches 1,16 --rounds 7
    python3 scripts/bench_structured.py --base-url http://127.0.0.1:30000 --acceptance

Throughput: each request is greedy with thinking off; the plain ones run to --max-tokens with
`ignore_eos`, the constrained ones write one JSON string field (the demo model rarely closes it before
the budget; the mean tokens per request are printed to check the lengths match). Throughput is
completion tokens over the wall time of the whole batch. Plain and constrained batches alternate
(the order flips every round), so a machine whose load drifts hurts both alike; the medians, their
spread (min..max) and the median of each round's paired ratio are printed.

Acceptance (--acceptance, a server with MTP on): greedy requests under several schemas and a regex,
thinking off; prints draft tokens, accepted tokens and their ratio per grammar and in total, from the
`usage.spec_decoding` the server reports. Deterministic (greedy): one pass is enough.
Standard library only.
"""

import argparse
import json
import statistics
import threading
import time
import urllib.request

SCHEMA = {
    "type": "object",
    "properties": {"notes": {"type": "string"}},
    "required": ["notes"],
}

QUESTIONS = [
    "What is 47 + 38?",
    "Is 91 prime?",
    "Write a Python is_prime function.",
    "What's the weather like in Paris?",
]

# Grammars for the acceptance measurement: structure the model must be held to, where drafts the
# grammar forbids are likely.
ACCEPTANCE_GRAMMARS = {
    "sum (enum + bounded int)": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "sum",
                "schema": {
                    "type": "object",
                    "properties": {
                        "operation": {"enum": ["add", "subtract", "multiply"]},
                        "answer": {"type": "integer", "minimum": 0, "maximum": 999},
                    },
                    "required": ["operation", "answer"],
                    "additionalProperties": False,
                },
            },
        }
    },
    "person (nested, arrays, bounded strings)": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "person",
                "schema": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 24},
                        "age": {"type": "integer", "minimum": 0, "maximum": 120},
                        "tags": {
                            "type": "array",
                            "items": {"enum": ["math", "code", "weather", "other"]},
                            "maxItems": 3,
                        },
                        "address": {
                            "type": "object",
                            "properties": {"city": {"type": "string", "maxLength": 16}},
                            "required": ["city"],
                        },
                    },
                    "required": ["name", "age", "tags", "address"],
                },
            },
        }
    },
    "notes (one free string)": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA}}
    },
    "regex (yes/no sentence)": {"regex": "(Yes|No), [0-9]{1,3} is (not )?prime\\."},
}


def post(url, body):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def run_batch(url, batch, max_tokens, constrained):
    results = [None] * batch

    def one(i):
        body = {
            "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            "temperature": 0,
            "max_tokens": max_tokens,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        if not constrained:
            body["ignore_eos"] = True
        if constrained:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "reply", "schema": SCHEMA},
            }
        results[i] = post(url, body)["usage"]["completion_tokens"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(batch)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return sum(results), elapsed


def throughput(url, batches, max_tokens, rounds):
    print("batch | plain tok/s median (min..max) | json_schema tok/s median (min..max) | "
          "change of medians | paired ratio median (min..max) | tokens per request (plain / json)")
    for batch in batches:
        rates = {False: [], True: []}
        lengths = {}
        for r in range(rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for constrained in order:
                tokens, elapsed = run_batch(url, batch, max_tokens, constrained)
                rates[constrained].append(tokens / elapsed)
                lengths[constrained] = tokens / batch
        plain, constrained = rates[False], rates[True]
        ratios = [c / p - 1.0 for p, c in zip(plain, constrained)]
        change = (statistics.median(constrained) / statistics.median(plain) - 1.0) * 100.0
        print(
            f"{batch} | {statistics.median(plain):.1f} ({min(plain):.1f}..{max(plain):.1f}) | "
            f"{statistics.median(constrained):.1f} ({min(constrained):.1f}..{max(constrained):.1f}) | "
            f"{change:+.1f} % | {statistics.median(ratios) * 100:+.1f} % "
            f"({min(ratios) * 100:+.1f}..{max(ratios) * 100:+.1f} %) | "
            f"{lengths[False]:.0f} / {lengths[True]:.0f}"
        )


def acceptance(url, max_tokens):
    print("grammar | requests | output tokens | draft tokens | accepted | acceptance")
    total_drafted = total_accepted = 0
    for name, fields in ACCEPTANCE_GRAMMARS.items():
        drafted = accepted = output = 0
        for question in QUESTIONS:
            body = {
                "messages": [{"role": "user", "content": question}],
                "temperature": 0,
                "max_tokens": max_tokens,
                "chat_template_kwargs": {"enable_thinking": False},
                **fields,
            }
            usage = post(url, body)["usage"]
            spec = usage.get("spec_decoding") or {}
            drafted += spec.get("draft_tokens", 0)
            accepted += spec.get("accepted_tokens", 0)
            output += usage["completion_tokens"]
        total_drafted += drafted
        total_accepted += accepted
        rate = accepted / drafted if drafted else float("nan")
        print(f"{name} | {len(QUESTIONS)} | {output} | {drafted} | {accepted} | {rate:.3f}")
    rate = total_accepted / total_drafted if total_drafted else float("nan")
    print(f"all | {len(QUESTIONS) * len(ACCEPTANCE_GRAMMARS)} | - | {total_drafted} | {total_accepted} | {rate:.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5, help="plain/constrained pairs per batch size")
    parser.add_argument("--acceptance", action="store_true", help="measure MTP acceptance under grammars")
    args = parser.parse_args()
    url = args.base_url.rstrip("/") + "/v1/chat/completions"
    run_batch(url, 1, 8, True)  # builds the grammar vocabulary once, outside the measurement
    if args.acceptance:
        acceptance(url, args.max_tokens)
    else:
        throughput(url, [int(b) for b in args.batches.split(",")], args.max_tokens, args.rounds)


if __name__ == "__main__":
    main()
