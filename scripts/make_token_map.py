#!/usr/bin/env python3
"""Writes a token map for `--speculative-token-map` (a JSON array of token ids).

The draft model's head then keeps only these rows of the trunk's output head (docs/serving.md,
"Speculative decoding"). Three ways to make one:

  # the N most frequent ids of a sample of your traffic (plain text files, or .jsonl files whose
  # lines hold a "text" field), plus every special token of the tokenizer:
  python scripts/make_token_map.py --tokenizer MODEL_DIR --text sample1.txt sample2.jsonl \
      --size 32768 --out map.json
  # SGLang's `.pt` map (a tensor or list of ids; needs torch):
  python scripts/make_token_map.py --from-pt freq_32768.pt --out map.json
  # the ids 0 .. N-1, for timing with --load-format dummy (random weights: which rows are kept
  # does not matter there):
  python scripts/make_token_map.py --first 32768 --out map.json
"""

import argparse
import collections
import json
import os
import sys


def frequent_ids(tokenizer_path, files, size):
    from tokenizers import Tokenizer

    if os.path.isdir(tokenizer_path):
        tokenizer_path = os.path.join(tokenizer_path, "tokenizer.json")
    tokenizer = Tokenizer.from_file(tokenizer_path)
    counts = collections.Counter()
    for path in files:
        with open(path, encoding="utf-8") as f:
            for line in f if path.endswith(".jsonl") else [f.read()]:
                text = json.loads(line)["text"] if path.endswith(".jsonl") else line
                if text:
                    counts.update(tokenizer.encode(text, add_special_tokens=False).ids)
    special = sorted(tokenizer.get_added_tokens_decoder().keys())
    ids = list(special)
    chosen = set(ids)
    for token, _ in counts.most_common():
        if len(ids) >= size:
            break
        if token not in chosen:
            ids.append(token)
            chosen.add(token)
    if len(ids) < size:
        print(f"note: the text holds {len(ids)} distinct ids (special tokens included), "
              f"fewer than --size {size}", file=sys.stderr)
    return ids


def ids_from_pt(path):
    import torch

    loaded = torch.load(path, map_location="cpu", weights_only=True)
    values = loaded.tolist() if hasattr(loaded, "tolist") else list(loaded)
    return [int(v) for v in values]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", nargs="+", help="text or .jsonl files to count token ids in")
    source.add_argument("--from-pt", help="a SGLang token map (.pt) to convert")
    source.add_argument("--first", type=int, help="the ids 0 .. N-1")
    parser.add_argument("--tokenizer", help="the model directory or its tokenizer.json (with --text)")
    parser.add_argument("--size", type=int, default=32768, help="ids to keep (with --text)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.text:
        if not args.tokenizer:
            parser.error("--text needs --tokenizer")
        ids = frequent_ids(args.tokenizer, args.text, args.size)
    elif args.from_pt:
        ids = ids_from_pt(args.from_pt)
    else:
        ids = list(range(args.first))
    with open(args.out, "w") as f:
        json.dump(ids, f)
    print(f"{args.out}: {len(ids)} token ids")


if __name__ == "__main__":
    main()
