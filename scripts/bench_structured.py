#!/usr/bin/env python3
"""Decode throughput of a running server with and without a JSON-schema constraint, at batch 1 and a
larger batch (N requests in flight at once). A client only: it starts nothing.

    python3 scripts/bench_structured.py --base-url http://127.0.0.1:30000 --batches 1,16

Each request is greedy with thinking off: the plain ones run to --max-tokens with `ignore_eos`, the
constrained ones write one JSON string field (the demo model rarely closes it before the budget; the
mean tokens per request are printed to check the lengths match). Throughput is completion tokens
over the wall time of the whole batch, the best of --repeats runs. Standard library only.
"""

import argparse
import json
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    url = args.base_url.rstrip("/") + "/v1/chat/completions"
    run_batch(url, 1, 8, True)  # builds the grammar vocabulary once, outside the measurement
    print("batch | plain tok/s | json_schema tok/s | change | tokens per request (plain / json)")
    for batch in [int(b) for b in args.batches.split(",")]:
        rates, lengths = {}, {}
        for constrained in (False, True):
            best = 0.0
            for _ in range(args.repeats):
                tokens, elapsed = run_batch(url, batch, args.max_tokens, constrained)
                best = max(best, tokens / elapsed)
                lengths[constrained] = tokens / batch
            rates[constrained] = best
        change = (rates[True] / rates[False] - 1.0) * 100.0
        print(
            f"{batch} | {rates[False]:.1f} | {rates[True]:.1f} | {change:+.1f} % | "
            f"{lengths[False]:.0f} / {lengths[True]:.0f}"
        )


if __name__ == "__main__":
    main()
