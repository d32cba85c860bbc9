#!/usr/bin/env python3
"""The cuBLAS GEMV floor of one decode step: every weight matrix a batch-1 decode step of a config
reads (random bf16, each its own allocation so nothing is served from L2), multiplied by a one-row
activation with torch (cuBLAS) in layer order, captured in one CUDA graph and replayed. The replay
time is what a decode step would cost if it did nothing but cuBLAS GEMVs with no launch gaps: the
floor that deltaserve's decode is compared with in the same run (docs/benchmarks.md).

Also measures the device's read bandwidth (a reduction over 8 GiB) so the floor can be put against
the roofline. Prints one JSON object.

    python3 scripts/gemv_floor.py --config examples/qwen3.6-27b/config.json [--batch 1]
"""

import argparse
import json

import torch


def text_config(path):
    with open(path) as f:
        config = json.load(f)
    return config.get("text_config", config)


def decode_matrices(c):
    """(name, rows, cols) of every matrix one decode step reads, in layer order."""
    h = c["hidden_size"]
    layers = c["num_hidden_layers"]
    interval = c.get("full_attention_interval", 4)
    heads, kv_heads, head_dim = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    inter = c["intermediate_size"]
    out = []
    for i in range(layers):
        if (i + 1) % interval == 0:
            out += [
                ("q", heads * head_dim, h),
                ("gate", heads * head_dim, h),
                ("k", kv_heads * head_dim, h),
                ("v", kv_heads * head_dim, h),
                ("o", h, heads * head_dim),
            ]
        else:
            out += [
                ("qkv", 2 * hk * dk + hv * dv, h),
                ("z", hv * dv, h),
                ("b", hv, h),
                ("a", hv, h),
                ("out", h, hv * dv),
            ]
        out += [("mlp_gate", inter, h), ("mlp_up", inter, h), ("mlp_down", h, inter)]
    out.append(("lm_head", c["vocab_size"], h))
    return out


def time_graph(fn, iters):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def read_bandwidth():
    data = torch.empty(8 << 30, dtype=torch.uint8, device="cuda").view(torch.float32)
    data.uniform_()
    seconds = time_graph(lambda: data.sum(), 10)
    return data.numel() * 4 / seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    c = text_config(args.config)
    shapes = decode_matrices(c)
    torch.manual_seed(0)
    weights = []
    for _, rows, cols in shapes:
        w = torch.empty(rows, cols, dtype=torch.bfloat16, device="cuda")
        w.uniform_(-0.05, 0.05)
        weights.append(w)
    width = max(cols for _, _, cols in shapes)
    x = torch.randn(args.batch, width, dtype=torch.bfloat16, device="cuda")
    outs = [torch.empty(args.batch, rows, dtype=torch.bfloat16, device="cuda") for _, rows, _ in shapes]

    def step():
        for w, o in zip(weights, outs):
            torch.matmul(x[:, : w.shape[1]], w.t(), out=o)

    seconds = time_graph(step, args.iters)
    total_bytes = sum(w.numel() * 2 for w in weights)
    bandwidth = read_bandwidth()
    print(
        json.dumps(
            {
                "config": args.config,
                "device": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "batch": args.batch,
                "matrices": len(shapes),
                "weight_bytes": total_bytes,
                "step_ms": seconds * 1e3,
                "floor_tokens_per_s": args.batch / seconds,
                "floor_gb_per_s": total_bytes / seconds / 1e9,
                "read_bandwidth_gb_per_s": bandwidth / 1e9,
                "roofline_tokens_per_s": bandwidth / total_bytes * args.batch,
            }
        )
    )


if __name__ == "__main__":
    main()
