"""Times the bf16 GEMMs of a prefill chunk with torch (cuBLAS / cuBLASLt, its heuristics) on the
shapes of a model config, to see what layout of the same products the library runs fastest: each
matrix alone, matrices that share an input stacked into one (more output tiles per launch, fewer
partial waves), and f32 against bf16 output (deltaserve's GEMMs write f32).

    python3 scripts/microbench/prefill_gemms.py --config examples/qwen3.6-27b/config.json --tokens 2048

Prints one JSON line per case: name, shapes, median microseconds over the repetitions, TFLOP/s.
Needs a CUDA GPU; the products are of random bf16 matrices.
"""

import argparse
import json
import statistics

import torch


def text_config(path):
    cfg = json.load(open(path))
    return cfg.get("text_config", cfg)


def time_us(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def mm_f32_out(x, w):
    # bf16 inputs, f32 accumulation and output, as deltaserve's cuBLAS call.
    return torch.mm(x, w.t(), out_dtype=torch.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    c = text_config(args.config)
    h, inter = c["hidden_size"], c["intermediate_size"]
    kd, vd = c["linear_key_head_dim"], c["linear_value_head_dim"]
    kh, vh = c["linear_num_key_heads"], c["linear_num_value_heads"]
    hd, qh, kvh = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    t = args.tokens
    dev = torch.device("cuda")
    x = torch.randn(t, h, device=dev, dtype=torch.bfloat16)
    outputs = [("bf16", lambda a, b: a @ b.t())]
    try:
        mm_f32_out(x[:16], x[:16])
        outputs.insert(0, ("f32", mm_f32_out))
    except (TypeError, RuntimeError) as e:
        print(json.dumps({"note": f"torch.mm has no f32 output for bf16 inputs here: {e}"}))
    groups = {
        "mlp_gate_up": [inter, inter],
        "gdn_in": [2 * kh * kd + vh * vd, vh * vd, vh, vh],
        "attn_in": [qh * hd, qh * hd, kvh * hd, kvh * hd],
    }
    for name, rows in groups.items():
        ws = [torch.randn(n, h, device=dev, dtype=torch.bfloat16) for n in rows]
        stacked = torch.cat(ws, 0)
        flops = 2.0 * t * h * sum(rows)
        for out, fn in outputs:
            separate = time_us(lambda: [fn(x, w) for w in ws], args.reps)
            one = time_us(lambda: fn(x, stacked), args.reps)
            cases = [("separate", separate), ("stacked", one)]
            if len(set(rows)) == 1:
                # One batched launch over the matrices (cublasGemmStridedBatched, the input's batch
                # stride 0): no copy of the weights into one allocation needed.
                batched_w = stacked.view(len(rows), rows[0], h).transpose(1, 2)
                batched_x = x.unsqueeze(0).expand(len(rows), t, h)
                if out == "f32":
                    run = lambda: torch.bmm(batched_x, batched_w, out_dtype=torch.float32)
                else:
                    run = lambda: torch.bmm(batched_x, batched_w)
                try:
                    cases.append(("batched", time_us(run, args.reps)))
                except (TypeError, RuntimeError) as e:
                    print(json.dumps({"note": f"{name} batched {out}: {e}"}))
            for layout, us in cases:
                print(json.dumps({"name": f"{name}/{layout}/{out}", "rows": rows, "k": h, "tokens": t,
                                  "us": round(us, 1), "tflops": round(flops / us / 1e6, 1)}))
        del ws, stacked
    for name, n, k in [("mlp_down", h, inter), ("o_proj", h, qh * hd), ("gdn_out", h, vh * vd)]:
        a = torch.randn(t, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        flops = 2.0 * t * n * k
        for out, fn in outputs:
            us = time_us(lambda: fn(a, w), args.reps)
            print(json.dumps({"name": f"{name}/{out}", "rows": [n], "k": k, "tokens": t, "us": round(us, 1),
                              "tflops": round(flops / us / 1e6, 1)}))


if __name__ == "__main__":
    main()
