//! `deltaserve bench`: prefill and decode throughput of one sequence on a model (real weights or
//! `--load-format dummy`), optionally speculative decoding with the MTP head, a per-op profile, and
//! the fraction of the measured read bandwidth (roofline) reached. Numbers only; nothing asserts.

use super::bench_picks::is_greedy;
use super::bench_runs::{measure, median, Measured, Phase, RunPlan};
use crate::loading::{load_model, with_model};
use crate::model_flags::ModelFlags;
use crate::weight_format::describe_weights;
use anyhow::{bail, Context, Result};
use clap::Args;
use deltaserve_engine::SamplingParams;
use deltaserve_model::config::ModelConfig;
use serde_json::{json, Value};
use std::time::Instant;

/// `bench` measures a model in-process; `bench serve` drives a running server.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchCli {
    #[command(subcommand)]
    pub serve: Option<BenchSubcommand>,
    #[command(flatten)]
    pub model: BenchArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum BenchSubcommand {
    /// Load-test any OpenAI-compatible server (deltaserve, SGLang, vLLM, llama.cpp): request and token
    /// throughput, TTFT / TPOT / end-to-end latency percentiles.
    Serve(super::bench_serve::BenchServeArgs),
}

pub fn dispatch(cli: BenchCli) -> Result<()> {
    match cli.serve {
        Some(BenchSubcommand::Serve(args)) => super::bench_serve::run(args),
        None => run(cli.model),
    }
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelFlags,
    /// Prompt tokens processed in one prefill forward.
    #[arg(long = "prefill-len", default_value_t = 512)]
    pub prefill_len: usize,
    /// Decode steps after the prefill (each commits one token, or k+1 with speculation).
    #[arg(long = "decode-len", default_value_t = 32)]
    pub decode_len: usize,
    /// Also run speculative decoding with the model's MTP head, k drafts per step (0 = off). Every
    /// draft is accepted whatever the model predicts (forced acceptance), so a step commits k+1
    /// tokens and the cost of verification is visible even with random (dummy) weights.
    #[arg(long = "speculative-num-steps", default_value_t = 0)]
    pub speculative_num_steps: usize,
    /// Time every op on the device in a separate, profiled run (the backend must support it).
    #[arg(long)]
    pub profile: bool,
    /// Measure the read bandwidth of the memory the weights live in (device memory when the backend
    /// can measure it, else host memory with --threads threads) and report the roofline fraction.
    #[arg(long = "measure-bandwidth")]
    pub measure_bandwidth: bool,
    /// Untimed runs (a prefill and two decode steps) before measuring: kernel compilation, GEMM plan
    /// selection and first-touch allocation stay out of the numbers.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Also run batched decode: for each B (comma-separated), B sequences each prefilled with
    /// --prefill-len tokens, then --decode-len steps that decode all of them at once; reports each
    /// step time and its ratio to a batch-1 step through the same path.
    #[arg(long = "batch", value_delimiter = ',')]
    pub batch: Vec<usize>,
    /// Sample the plain and batched decode steps' tokens at this temperature, as `serve` samples
    /// (on the GPU with cuda) instead of picking the most likely one (0). Speculative steps keep
    /// greedy picks (forced acceptance), so the two do not go together.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// With --temperature: keep the K most likely tokens (0 = all).
    #[arg(long = "top-k", default_value_t = 0)]
    pub top_k: usize,
    /// With --temperature: keep the smallest most likely set holding this probability (1 = all).
    #[arg(long = "top-p", default_value_t = 1.0)]
    pub top_p: f32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The decode steps' sampling settings, each flag checked.
fn decode_sampling(args: &BenchArgs) -> Result<SamplingParams> {
    let (temperature, top_k, top_p) = (args.temperature, args.top_k, args.top_p);
    if !(temperature >= 0.0 && temperature.is_finite()) {
        bail!("--temperature {temperature}: must be a finite number >= 0 (0 = greedy)");
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        bail!("--top-p {top_p}: must be in (0, 1]");
    }
    if temperature == 0.0 && (top_k != 0 || top_p != 1.0) {
        bail!("--top-k / --top-p filter sampled tokens: give --temperature above 0 with them");
    }
    Ok(SamplingParams {
        temperature,
        top_k,
        top_p,
        ..SamplingParams::default()
    })
}

/// Streams over 1 GiB with `threads` threads and returns bytes per second.
fn measure_read_bandwidth(threads: usize) -> f64 {
    let words = (1usize << 30) / 8;
    let data: Vec<u64> = (0..words as u64).collect();
    let threads = threads.max(1);
    let chunk = words.div_ceil(threads);
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = data
                .chunks(chunk)
                .map(|part| {
                    s.spawn(move || {
                        let mut acc = [0u64; 8];
                        for lanes in part.chunks_exact(8) {
                            for (a, &v) in acc.iter_mut().zip(lanes) {
                                *a = a.wrapping_add(v);
                            }
                        }
                        acc.iter().fold(0u64, |x, &y| x.wrapping_add(y))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, |x, y| x.wrapping_add(y))
        });
        std::hint::black_box(total);
        best = best.min(start.elapsed().as_secs_f64());
    }
    (words * 8) as f64 / best
}

/// The profile of one phase: per op, and the phase's profiled wall time it is a share of.
fn phase_profile(phase: &Phase) -> (Value, Value) {
    let steps = phase.step_s.len().max(1) as f64;
    let wall = phase.total_s();
    let ops: Vec<Value> = phase
        .ops
        .iter()
        .map(|o| {
            json!({
                "op": o.name,
                "calls": o.calls,
                "total_ms": o.seconds * 1e3,
                "ms_per_step": o.seconds * 1e3 / steps,
                "percent_of_phase": 100.0 * o.seconds / wall,
            })
        })
        .collect();
    let op_s: f64 = phase.ops.iter().map(|o| o.seconds).sum();
    let summary = json!({
        "steps": phase.step_s.len(),
        "profiled_wall_ms": wall * 1e3,
        "timed_ops_ms": op_s * 1e3,
        "outside_timed_ops_ms": (wall - op_s) * 1e3,
    });
    (Value::Array(ops), summary)
}

/// Ops listed per phase in the table; the JSON has all of them.
const TABLE_OPS: usize = 20;

fn print_profile(name: &str, phase: &Phase) {
    let steps = phase.step_s.len().max(1);
    let wall = phase.total_s();
    let op_s: f64 = phase.ops.iter().map(|o| o.seconds).sum();
    println!(
        "{name}: {:.2} ms profiled wall over {steps} step(s), {:.2} ms in timed ops",
        wall * 1e3,
        op_s * 1e3
    );
    println!(
        "  {:<44} {:>7} {:>11} {:>10} {:>7}",
        "op", "calls", "total ms", "ms/step", "% phase"
    );
    let row = |label: &str, calls: String, s: f64| {
        println!(
            "  {label:<44} {calls:>7} {:>11.3} {:>10.3} {:>7.1}",
            s * 1e3,
            s * 1e3 / steps as f64,
            100.0 * s / wall
        );
    };
    for o in phase.ops.iter().take(TABLE_OPS) {
        row(&o.name, o.calls.to_string(), o.seconds);
    }
    let rest = &phase.ops[phase.ops.len().min(TABLE_OPS)..];
    if !rest.is_empty() {
        let calls: u64 = rest.iter().map(|o| o.calls).sum();
        let s = rest.iter().map(|o| o.seconds).sum();
        row(&format!("({} more ops)", rest.len()), calls.to_string(), s);
    }
    row(
        "(outside timed ops: host, launches, copies)",
        String::new(),
        wall - op_s,
    );
}

pub fn run(args: BenchArgs) -> Result<()> {
    let settings = args.model.clone().settings()?.resolved()?;
    anyhow::ensure!(args.prefill_len > 0, "--prefill-len must be at least 1");
    anyhow::ensure!(
        args.batch.iter().all(|&b| b > 0),
        "--batch: every batch size must be at least 1"
    );
    let k = args.speculative_num_steps;
    let sampling = decode_sampling(&args)?;
    if k > 0 && !is_greedy(&sampling) {
        bail!(
            "--temperature {} with --speculative-num-steps {k}: speculative steps are measured with forced acceptance and greedy picks; sample plain or batched decode (drop --speculative-num-steps) or drop --temperature",
            args.temperature
        );
    }
    let config = ModelConfig::from_dir(&settings.model_path)
        .with_context(|| format!("--model-path {}", settings.model_path.display()))?;
    if k > 0 && config.mtp_num_hidden_layers == 0 {
        bail!(
            "--speculative-num-steps {k}: {} has no MTP head (mtp_num_hidden_layers is 0 in its config.json); speculative decoding drafts with it, so run without --speculative-num-steps",
            settings.model_path.display()
        );
    }
    let load_start = Instant::now();
    let model = load_model(&settings)?;
    let load_s = load_start.elapsed().as_secs_f64();
    let plan = RunPlan {
        prefill_len: args.prefill_len,
        decode_len: args.decode_len,
        speculative_num_steps: k,
        warmup: args.warmup,
        profile: args.profile,
        measure_bandwidth: args.measure_bandwidth,
        batches: args.batch.clone(),
        sampling,
    };
    let measured = with_model!(&model, m => measure(m, &plan))?;
    let cpu_kernels = model.cpu_kernels();
    let kv_cache_dtype =
        with_model!(&model, m => deltaserve_tensor::Backend::kv_dtype(&m.backend)).name();
    // What the loaded matrices occupy as stored (FP8 codes and scales where they were kept).
    let weight_bytes = with_model!(&model, m => m.decode_weight_bytes());
    let mtp_bytes = with_model!(&model, m => m.mtp_forward_weight_bytes()).unwrap_or(0);
    let draft_vocab_size = with_model!(&model, m => m.config.draft_vocab_size());
    drop(model);
    let backend = measured.backend;
    let threads = if settings.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        settings.threads
    };
    let plain = &measured.plain;
    let prefill_s = plain.prefill.total_s();
    let decode_median = plain.decode.median_s();
    let decode_bandwidth = weight_bytes as f64 / decode_median;
    let (bandwidth, bandwidth_source) = match measured.device_bandwidth {
        Some(b) => (Some(b), Some("device read".to_string())),
        None if args.measure_bandwidth => (
            Some(measure_read_bandwidth(threads)),
            Some(format!("host read, {threads} threads")),
        ),
        None => (None, None),
    };

    let speculative = measured.speculative.as_ref().map(|s| {
        let step_s: Vec<f64> = s
            .verify
            .step_s
            .iter()
            .zip(&s.draft.step_s)
            .map(|(v, d)| v + d)
            .collect();
        let step = median(&step_s);
        let bytes_per_step = weight_bytes + k * mtp_bytes;
        json!({
            "num_steps": k,
            "forced_acceptance": true,
            "tokens_per_step": k + 1,
            "steps": step_s.len(),
            "step_ms_median": step * 1e3,
            "verify_ms_median": s.verify.median_s() * 1e3,
            "draft_ms_median": s.draft.median_s() * 1e3,
            "verify_share_of_step": s.verify.total_s() / (s.verify.total_s() + s.draft.total_s()),
            "decode_tokens_per_s": (k + 1) as f64 / step,
            "speedup_over_plain_decode": (k + 1) as f64 / step * decode_median,
            "prefill_with_hidden_ms": s.prefill.total_s() * 1e3,
            "mtp_prefill_ms": s.mtp_prefill.total_s() * 1e3,
            "mtp_forward_weight_bytes": mtp_bytes,
            "weight_bytes_per_step": bytes_per_step,
            "weight_gb_per_s": bytes_per_step as f64 / step / 1e9,
            "roofline_fraction": bandwidth.map(|b| bytes_per_step as f64 / step / b),
            "tokens_per_s_at_roofline": bandwidth.map(|b| (k + 1) as f64 * b / bytes_per_step as f64),
        })
    });
    let profiled = measured.profiled.as_ref();
    let profile = profiled.and_then(Option::as_ref).map(|p| {
        let mut phases = vec![("prefill", &p.plain.prefill), ("decode", &p.plain.decode)];
        if let Some(s) = &p.speculative {
            phases.push(("verify", &s.verify));
            phases.push(("draft", &s.draft));
        }
        let batch_names: Vec<String> = p
            .batched
            .iter()
            .map(|(b, _)| format!("decode_batch_{b}"))
            .collect();
        for (name, (_, phase)) in batch_names.iter().zip(&p.batched) {
            phases.push((name.as_str(), phase));
        }
        let (mut ops, mut summaries) = (serde_json::Map::new(), serde_json::Map::new());
        for (name, phase) in phases {
            let (o, s) = phase_profile(phase);
            ops.insert(name.into(), o);
            summaries.insert(name.into(), s);
        }
        (Value::Object(ops), Value::Object(summaries))
    });
    let batch1_step = measured
        .batched
        .iter()
        .find(|(b, _)| *b == 1)
        .map(|(_, p)| p.median_s());
    let batched: Vec<Value> = measured
        .batched
        .iter()
        .map(|(b, phase)| {
            let step = phase.median_s();
            json!({
                "batch": b,
                "steps": phase.step_s.len(),
                "step_ms_median": step * 1e3,
                "tokens_per_s": *b as f64 / step,
                "step_ratio_to_batch_1": batch1_step.map(|one| step / one),
            })
        })
        .collect();
    let report = json!({
        "model": settings.model_path,
        "load_format": format!("{:?}", settings.load_format).to_lowercase(),
        "backend": backend,
        "batch": 1,
        "tp_size": settings.tp_size,
        "cpu_kernels": cpu_kernels,
        "kv_cache_dtype": kv_cache_dtype,
        "quantization": settings.quantization.map(|q| format!("{q:?}").to_lowercase()),
        "weights": describe_weights(&config, settings.load_format, settings.quantization),
        "decode_sampling": (!is_greedy(&plan.sampling)).then(|| json!({
            "temperature": plan.sampling.temperature,
            "top_k": plan.sampling.top_k,
            "top_p": plan.sampling.top_p,
        })),
        "draft_model_quantization": settings
            .draft_quantization
            .map(|q| format!("{q:?}").to_lowercase()),
        "speculative_token_map": settings.draft_token_map,
        "draft_vocab_size": draft_vocab_size,
        "kernel_overrides": kernel_overrides(),
        "threads": threads,
        "load_seconds": load_s,
        "timings": "un-profiled run after the warm-up; profile numbers come from a separate run",
        "warmup_runs": args.warmup,
        "prefill_tokens": args.prefill_len,
        "prefill_tokens_per_s": args.prefill_len as f64 / prefill_s,
        "prefill_ms": prefill_s * 1e3,
        "decode_tokens": args.decode_len,
        "decode_tokens_per_s": 1.0 / decode_median,
        "decode_ms_per_token_median": decode_median * 1e3,
        "decode_weight_bytes_per_token": weight_bytes,
        "decode_weight_gb_per_s": decode_bandwidth / 1e9,
        "read_bandwidth_gb_per_s": bandwidth.map(|b| b / 1e9),
        "read_bandwidth_source": bandwidth_source,
        "roofline_fraction": bandwidth.map(|b| decode_bandwidth / b),
        "decode_tokens_per_s_at_roofline": bandwidth.map(|b| b / weight_bytes as f64),
        "speculative": speculative,
        "batched_decode": batched,
        "cuda_graphs": measured.step_graphs.map(|c| json!({
            "recorded": c.recorded,
            "replayed_steps": c.replayed,
            "failed": c.failed,
        })),
        "profile_supported": profiled.map(Option::is_some),
        "profile": profile.as_ref().map(|p| &p.0),
        "profile_phases": profile.as_ref().map(|p| &p.1),
    });
    if args.json {
        println!("{report}");
        return Ok(());
    }
    print_table(&args, &settings.model_path, &report, &measured, threads);
    Ok(())
}

fn print_table(
    args: &BenchArgs,
    model_path: &std::path::Path,
    r: &Value,
    measured: &Measured,
    threads: usize,
) {
    let f = |key: &str| r[key].as_f64().unwrap_or(f64::NAN);
    println!("model           {}", model_path.display());
    let kernels = r["cpu_kernels"]
        .as_str()
        .map_or(String::new(), |k| format!(", {k} kernels"));
    println!(
        "backend         {} ({threads} threads{kernels}, KV cache {}); timings from an un-profiled run after {} warm-up run(s)",
        measured.backend,
        r["kv_cache_dtype"].as_str().unwrap_or("?"),
        args.warmup
    );
    println!(
        "prefill         {:.1} tok/s ({} tokens in {:.1} ms)",
        f("prefill_tokens_per_s"),
        args.prefill_len,
        f("prefill_ms")
    );
    let picks = if args.temperature > 0.0 {
        format!(
            "sampled at temperature {}, top-k {}, top-p {}",
            args.temperature, args.top_k, args.top_p
        )
    } else {
        "greedy".to_string()
    };
    println!(
        "decode          {:.2} tok/s (median {:.2} ms/token over {} steps, {picks})",
        f("decode_tokens_per_s"),
        f("decode_ms_per_token_median"),
        args.decode_len
    );
    println!(
        "decode weights  {:.3} GB/token read -> {:.1} GB/s",
        f("decode_weight_bytes_per_token") / 1e9,
        f("decode_weight_gb_per_s")
    );
    let s = &r["speculative"];
    if !s.is_null() {
        let g = |key: &str| s[key].as_f64().unwrap_or(f64::NAN);
        let k = args.speculative_num_steps;
        println!(
            "speculative     MTP k={k}, FORCED acceptance (all {k} drafts accepted whatever the model predicts): {} tokens/step",
            k + 1
        );
        println!(
            "  step          median {:.2} ms: verify forward {:.2} ms + MTP drafting {:.2} ms (medians; verify {:.0} % of the time)",
            g("step_ms_median"),
            g("verify_ms_median"),
            g("draft_ms_median"),
            100.0 * g("verify_share_of_step")
        );
        println!(
            "  decode        {:.2} tok/s effective ({:.2}x plain decode)",
            g("decode_tokens_per_s"),
            g("speedup_over_plain_decode")
        );
        println!(
            "  weights       {:.3} GB/step read (trunk once + MTP head {k}x at {:.3} GB) -> {:.1} GB/s",
            g("weight_bytes_per_step") / 1e9,
            g("mtp_forward_weight_bytes") / 1e9,
            g("weight_gb_per_s")
        );
    }
    for b in r["batched_decode"].as_array().into_iter().flatten() {
        let g = |key: &str| b[key].as_f64().unwrap_or(f64::NAN);
        println!(
            "batch {:<9} step {:.2} ms (median of {}), {:.1} tok/s, {:.2}x the batch-1 step",
            b["batch"],
            g("step_ms_median"),
            b["steps"],
            g("tokens_per_s"),
            g("step_ratio_to_batch_1")
        );
    }
    if let Some(source) = r["read_bandwidth_source"].as_str() {
        println!(
            "bandwidth       {:.1} GB/s measured ({source})",
            f("read_bandwidth_gb_per_s")
        );
        println!(
            "roofline        decode reaches {:.1} % (best {:.1} tok/s at this bandwidth)",
            100.0 * f("roofline_fraction"),
            f("decode_tokens_per_s_at_roofline")
        );
        if !s.is_null() {
            println!(
                "                speculative reaches {:.1} % (best {:.1} tok/s at this bandwidth)",
                100.0 * s["roofline_fraction"].as_f64().unwrap_or(f64::NAN),
                s["tokens_per_s_at_roofline"].as_f64().unwrap_or(f64::NAN)
            );
        }
    }
    match &measured.profiled {
        None => {}
        Some(None) => println!(
            "profile         the {} backend cannot profile ops; no profiled run",
            measured.backend
        ),
        Some(Some(p)) => {
            println!(
                "profile         from a separate profiled run (ops synchronised and timed: its wall times exceed the timings above)"
            );
            print_profile("prefill", &p.plain.prefill);
            print_profile("decode", &p.plain.decode);
            if let Some(s) = &p.speculative {
                print_profile("speculative verify", &s.verify);
                print_profile("speculative drafting", &s.draft);
            }
            for (b, phase) in &p.batched {
                print_profile(&format!("decode, batch {b}"), phase);
            }
        }
    }
}

/// The environment variables that change which kernels run (for measuring variants), as set for
/// this run: recorded in the JSON so that a figure says what produced it.
fn kernel_overrides() -> Value {
    let set: serde_json::Map<String, Value> = deltaserve_cuda::KERNEL_VARIANT_ENV
        .into_iter()
        .chain([deltaserve_tensor::cpu::CPU_LEVEL_ENV])
        .filter_map(|name| Some((name.to_string(), Value::from(std::env::var(name).ok()?))))
        .collect();
    Value::Object(set)
}
