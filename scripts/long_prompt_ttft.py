#!/usr/bin/env python3
"""Time to first token of one long prompt against a running OpenAI-compatible server (issue 12).

Usage: long_prompt_ttft.py URL TOKENS. Sends a /v1/completions request of about TOKENS prompt tokens
(random numbered words; a 500-word probe first measures tokens per word) with max_tokens 1, not
streamed, and prints the prompt tokens the server counted and the seconds to the answer."""
import json, sys, time, urllib.request, random
url, target = sys.argv[1], int(sys.argv[2])
rng = random.Random(7)
words = ["alpha", "river", "stone", "seven", "green", "market", "window", "number", "cloud", "table", "music", "paper"]
with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
    model = json.load(r)["data"][0]["id"]
def ask(n_words):
    prompt = " ".join(rng.choice(words) + str(rng.randrange(100)) for _ in range(n_words))
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.load(r)
    return time.time() - t0, out["usage"]["prompt_tokens"]
dt, toks = ask(500)
per_word = toks / 500
dt, toks = ask(int(target / per_word))
print(json.dumps({"prompt_tokens": toks, "seconds_to_first_token": round(dt, 3), "target": target}))
