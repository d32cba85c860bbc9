//! `deltaserve bench`: prefill and decode throughput of one sequence on a model (real weights or
//! `--load-format dummy`), the decode step's achieved weight bandwidth, and, for comparison, the
//! machine's measured read bandwidth with the same number of threads. Numbers only; nothing asserts.

use crate::loading::{load_model, with_model, ModelArgs};
use anyhow::Result;
use clap::Args;
use deltaserve_model::config::ModelConfig;
use deltaserve_model::{argmax, ForwardInput, Model};
use deltaserve_tensor::{Backend, BatchLayout, DType};
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
    Serve(deltaserve_api::BenchServeArgs),
}

pub fn dispatch(cli: BenchCli) -> Result<()> {
    match cli.serve {
        Some(BenchSubcommand::Serve(args)) => {
            let report = deltaserve_api::run_bench_serve_blocking(&args)?;
            println!("{}", report.render());
            Ok(())
        }
        None => run(cli.model),
    }
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens processed in one prefill forward.
    #[arg(long = "prefill-len", default_value_t = 512)]
    pub prefill_len: usize,
    /// Tokens generated one at a time after the prefill.
    #[arg(long = "decode-len", default_value_t = 32)]
    pub decode_len: usize,
    /// Also measure the machine's memory read bandwidth (streams over 1 GiB with --threads threads).
    #[arg(long = "measure-bandwidth")]
    pub measure_bandwidth: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Bytes of weights one decode step reads for one token: every matrix except the embedding table
/// (one row of it), with only the routed experts of MoE layers.
pub fn decode_weight_bytes(c: &ModelConfig, bytes_per_param: usize) -> usize {
    let (h, d) = (c.hidden_size, c.head_dim);
    let attn = h * c.num_attention_heads * d * 3 + 2 * h * c.num_key_value_heads * d;
    let g = c.gdn_shape();
    let (key_len, value_len) = (g.key_heads * g.key_dim, g.value_heads * g.value_dim);
    let gdn = h * (2 * key_len + value_len) + h * value_len + 2 * h * g.value_heads + value_len * h;
    let dense = 3 * h * c.intermediate_size;
    let mut params = 0;
    for layer in 0..c.num_hidden_layers {
        params += if c.is_full_attention(layer) {
            attn
        } else {
            gdn
        };
        params += match &c.moe {
            Some(m) if m.layer_is_moe.get(layer).copied().unwrap_or(false) => {
                m.num_experts * h
                    + m.top_k * 3 * h * m.moe_intermediate_size
                    + 3 * h * m.shared_expert_intermediate_size
                    + h
            }
            _ => dense,
        };
    }
    params += c.vocab_size * h + h; // lm_head (or the tied table, read whole) + one embedding row
    params * bytes_per_param
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

struct Timings {
    prefill_s: f64,
    decode_s: Vec<f64>,
}

fn run_on<B: Backend>(m: &Model<B>, prefill_len: usize, decode_len: usize) -> Timings {
    let vocab = m.config.vocab_size as u32;
    // Deterministic token ids spread over the vocabulary.
    let prompt: Vec<u32> = (0..prefill_len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761)) % vocab)
        .collect();
    let mut cache = m.single_sequence_cache(prefill_len + decode_len + 1);
    let blocks: Vec<u32> = (0..cache.geometry.num_blocks as u32).collect();
    let bs = cache.geometry.block_size;
    let start = Instant::now();
    let batch = BatchLayout::packed(bs, [(prompt.len(), 0, blocks.clone(), 0)]);
    let out = m.forward(
        &ForwardInput {
            tokens: &prompt,
            batch: &batch,
            logit_rows: &[prompt.len() as u32 - 1],
            hidden_rows: &[],
        },
        &mut cache,
    );
    let mut next = argmax(&m.backend.to_host(&out.logits));
    let prefill_s = start.elapsed().as_secs_f64();
    let bar = indicatif::ProgressBar::new(decode_len as u64);
    let mut decode_s = Vec::with_capacity(decode_len);
    for step in 0..decode_len {
        let t0 = Instant::now();
        let batch = BatchLayout::packed(bs, [(1, prefill_len + step, blocks.clone(), 0)]);
        let out = m.forward(
            &ForwardInput {
                tokens: &[next],
                batch: &batch,
                logit_rows: &[0],
                hidden_rows: &[],
            },
            &mut cache,
        );
        next = argmax(&m.backend.to_host(&out.logits));
        decode_s.push(t0.elapsed().as_secs_f64());
        bar.inc(1);
    }
    bar.finish_and_clear();
    Timings {
        prefill_s,
        decode_s,
    }
}

pub fn run(mut args: BenchArgs) -> Result<()> {
    args.model = args.model.resolved()?;
    anyhow::ensure!(args.prefill_len > 0, "--prefill-len must be at least 1");
    let load_start = Instant::now();
    let model = load_model(&args.model)?;
    let load_s = load_start.elapsed().as_secs_f64();
    let (config, backend) = with_model!(&model, m => (m.config.clone(), m.backend.name()));
    let timings = with_model!(&model, m => run_on(m, args.prefill_len, args.decode_len));
    let weight_bytes =
        decode_weight_bytes(&config, config.dtype.unwrap_or(DType::BF16).size_bytes());
    // Median step time: robust to the first steps warming caches.
    let mut steps = timings.decode_s.clone();
    steps.sort_by(f64::total_cmp);
    let median = steps.get(steps.len() / 2).copied().unwrap_or(f64::NAN);
    let decode_bandwidth = weight_bytes as f64 / median;
    let threads = if args.model.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        args.model.threads
    };
    let machine_bandwidth = args
        .measure_bandwidth
        .then(|| measure_read_bandwidth(threads));
    let report = serde_json::json!({
        "model": args.model.model_path,
        "load_format": format!("{:?}", args.model.load_format).to_lowercase(),
        "backend": backend,
        "threads": threads,
        "load_seconds": load_s,
        "prefill_tokens": args.prefill_len,
        "prefill_tokens_per_s": args.prefill_len as f64 / timings.prefill_s,
        "decode_tokens": args.decode_len,
        "decode_tokens_per_s": 1.0 / median,
        "decode_ms_per_token_median": median * 1e3,
        "decode_weight_bytes_per_token": weight_bytes,
        "decode_weight_gb_per_s": decode_bandwidth / 1e9,
        "machine_read_gb_per_s": machine_bandwidth.map(|b| b / 1e9),
        "fraction_of_read_bandwidth": machine_bandwidth.map(|b| decode_bandwidth / b),
    });
    if args.json {
        println!("{report}");
    } else {
        println!("model           {}", args.model.model_path.display());
        println!("backend         {backend} ({threads} threads)");
        println!(
            "prefill         {:.1} tok/s ({} tokens)",
            args.prefill_len as f64 / timings.prefill_s,
            args.prefill_len
        );
        println!(
            "decode          {:.2} tok/s (median {:.1} ms/token over {})",
            1.0 / median,
            median * 1e3,
            args.decode_len
        );
        println!(
            "decode weights  {:.2} GB/token read -> {:.1} GB/s",
            weight_bytes as f64 / 1e9,
            decode_bandwidth / 1e9
        );
        if let Some(b) = machine_bandwidth {
            println!(
                "machine read    {:.1} GB/s -> decode reaches {:.0} %",
                b / 1e9,
                100.0 * decode_bandwidth / b
            );
        }
    }
    Ok(())
}
