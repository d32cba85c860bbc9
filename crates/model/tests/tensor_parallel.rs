//! Tensor parallelism on the CPU: every fixture (dense, MoE, Qwen3-Next fused layout, tied head,
//! head ratios 1, 2 and 3) split over 2 ranks of the in-process communicator computes the logits
//! the whole model computes (prefill, step-by-step decode with the cache and state pools, the MTP
//! head); a synthetic shape that divides 4 ways (dummy weights, MoE, MTP) does the same over 2 and
//! 4 ranks, also with fewer KV heads than ranks (copied); a block-FP8 model splits on block
//! boundaries and computes the whole model's logits, while a split through a block (the FP8
//! fixtures) stops the load naming the tensor; a split that does not divide is refused naming the
//! config field; and a group one of whose ranks fails mid-step (on rank 0 or
//! on a follower) computes the same logits again in the steps after.

#[path = "support/faulty.rs"]
mod faulty;
#[path = "support/fixtures.rs"]
mod fixtures;

use deltaserve_model::config::ModelConfig;
use deltaserve_model::dummy::DummySource;
use deltaserve_model::error::LoadError;
use deltaserve_model::online_fp8::Fp8QuantizingSource;
use deltaserve_model::quantization::Fp8Quantization;
use deltaserve_model::safetensors::SafetensorsSource;
use deltaserve_model::source::TensorSource;
use deltaserve_model::{load_tensor_parallel, npy, ForwardInput, Model, MtpInput};
use deltaserve_tensor::cpu::{CpuBackend, CpuOptions};
use deltaserve_tensor::{Backend, BatchLayout, Communicator, DType, InProcessGroup};
use faulty::{faulty_pair, INJECTED};
use fixtures::{blocks_of, fixture_dirs, full_cache, ids, max_abs_diff};
use serde_json::Value;
use std::path::Path;

/// Splitting a matmul over ranks changes only where its sum is cut: each rank sums its share of
/// the inner dimension and the all-reduce adds the N partial sums (in rank order) instead of one
/// accumulator running over all of it. Both are f32 sums of the same products, so each
/// row-parallel output moves by a few f32 ulps; through ~10 layers (GDN recurrences over 100
/// tokens, norms) that noise grows to at most 2.4e-4 absolute on logits of magnitude up to ~14
/// (~2e-5 relative; measured over every fixture, qwen35_f32 prefill being the largest). The
/// tolerance is 4x that, and half of what the golden tests allow against transformers (another
/// summation order of the same math). A wrong shard (a head, a conv channel or an expert slice
/// from the wrong rank, a missing all-reduce) moves logits by O(0.1) to O(1).
const TP_TOLERANCE: f32 = 1e-3;

fn cpu() -> CpuBackend {
    CpuBackend::with_options(CpuOptions {
        threads: 1,
        ..CpuOptions::default()
    })
    .unwrap()
}

/// The model split over `tp` ranks of the in-process communicator (`tp` = 1: the whole model).
fn load_tp(config: &ModelConfig, source: &dyn TensorSource, tp: usize) -> Model<CpuBackend> {
    try_load_tp(config, source, tp).unwrap()
}

fn try_load_tp(
    config: &ModelConfig,
    source: &dyn TensorSource,
    tp: usize,
) -> Result<Model<CpuBackend>, LoadError> {
    let comms: Vec<Box<dyn Communicator<CpuBackend>>> = InProcessGroup::new(tp)
        .into_iter()
        .map(|g| Box::new(g) as Box<dyn Communicator<CpuBackend>>)
        .collect();
    let backends = (0..tp).map(|_| cpu()).collect();
    load_tensor_parallel(backends, comms, config, source, true, &mut |_, _| {})
}

/// Prefill logits of every row, then the logits of `decode` tokens fed one at a time on the same
/// cache, then (with an MTP head) the MTP logits over the prefill's hidden states.
fn run<B: Backend>(m: &Model<B>, prompt: &[u32], decode: &[u32]) -> Vec<(String, Vec<f32>)> {
    let total = prompt.len() + decode.len();
    let mut cache = full_cache(m, 1, total);
    let blocks = blocks_of(0, total.div_ceil(16), 1);
    let rows: Vec<u32> = (0..prompt.len() as u32).collect();
    let batch = BatchLayout::packed(16, [(prompt.len(), 0, blocks.clone(), 0)]);
    let out = m.forward(
        &ForwardInput {
            tokens: prompt,
            batch: &batch,
            logit_rows: &rows,
            hidden_rows: &rows,
        },
        &mut cache,
    );
    let mut results = vec![("prefill".to_string(), m.backend.to_host(&out.logits))];
    let hidden = m.backend.to_host(&out.hidden);
    for (i, &tok) in decode.iter().enumerate() {
        let batch = BatchLayout::packed(16, [(1, prompt.len() + i, blocks.clone(), 0)]);
        let out = m.forward(
            &ForwardInput {
                tokens: &[tok],
                batch: &batch,
                logit_rows: &[0],
                hidden_rows: &[],
            },
            &mut cache,
        );
        results.push((format!("decode {i}"), m.backend.to_host(&out.logits)));
    }
    if m.has_mtp() {
        // The MTP head over the prompt: hidden of token t with token t+1, at t's position.
        let n = prompt.len() - 1;
        let batch = BatchLayout::packed(16, [(n, 0, blocks, 0)]);
        let rows: Vec<u32> = (0..n as u32).collect();
        let out = m
            .mtp_forward(
                &MtpInput {
                    hidden: &hidden[..n * m.config.hidden_size],
                    next_tokens: &prompt[1..],
                    batch: &batch,
                    logit_rows: &rows,
                    hidden_rows: &[],
                },
                &mut cache,
            )
            .unwrap();
        results.push(("mtp".to_string(), m.backend.to_host(&out.logits)));
    }
    results
}

fn assert_same(name: &str, tp: usize, whole: &[(String, Vec<f32>)], split: &[(String, Vec<f32>)]) {
    assert_eq!(whole.len(), split.len());
    for ((what, a), (_, b)) in whole.iter().zip(split) {
        let diff = max_abs_diff(a, b);
        let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
        println!(
            "{name}: tp {tp} vs tp 1: {what}: max |diff| = {diff:.2e} (max |logit| {scale:.1})"
        );
        assert!(
            diff <= TP_TOLERANCE,
            "{name}: {what} with tp {tp} differs from tp 1 by {diff}"
        );
    }
}

#[test]
fn every_fixture_split_over_two_ranks_matches_the_whole_model() {
    for dir in fixture_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let expected: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap())
                .unwrap();
        let prompt = ids(&expected, "prefill_ids");
        let decode: Vec<u32> = prompt[..8].to_vec();
        let config = ModelConfig::from_dir(&dir).unwrap();
        let source = SafetensorsSource::open(&dir).unwrap();
        let whole = run(&load_tp(&config, &source, 1), &prompt, &decode);
        // The whole model itself still reproduces transformers (golden.rs checks it in depth).
        let (_, theirs) = npy::read_f32(&dir.join("prefill_logits.npy")).unwrap();
        assert!(max_abs_diff(&whole[0].1, &theirs) <= 2e-3, "{name}");
        if config.quantization.is_some() {
            // The block-FP8 fixtures' matrices are 64-128 wide, inside one 128 x 128 block
            // each: every two-way split cuts a block, which must stop the load.
            let err = try_load_tp(&config, &source, 2)
                .err()
                .unwrap_or_else(|| panic!("{name}: a split through FP8 blocks loaded"))
                .to_string();
            assert!(
                err.contains("--tp-size 2") && err.contains("block-FP8 weight `model."),
                "{name}: {err}"
            );
            assert!(err.contains("cuts its [128, 128] scale blocks"), "{err}");
            continue;
        }
        let split = run(&load_tp(&config, &source, 2), &prompt, &decode);
        assert_same(&name, 2, &whole, &split);
    }
}

/// A config whose heads and widths divide by 4: GDN with 3 value heads per key head, gated
/// attention with 2 query heads per KV head, MoE with a shared expert, an MTP head, untied head.
fn four_way_config() -> ModelConfig {
    four_way_config_with_kv_heads(4)
}

/// `four_way_config` with `kv_heads` KV heads (2: four ranks each keep a copy of one).
fn four_way_config_with_kv_heads(kv_heads: usize) -> ModelConfig {
    small_moe_config(
        "four_way",
        SmallMoe {
            vocab: 512,
            hidden: 64,
            layers: 4,
            heads: 8,
            kv_heads,
            head_dim: 32,
            gdn_key_heads: 4,
            gdn_value_heads: 12,
            gdn_head_dim: 16,
            experts: 8,
            expert_width: 32,
            shared_width: 48,
        },
    )
}

/// The sizes of a small Qwen3.5-MoE text model (top-2 routing, GDN and attention alternating, an
/// MTP head, untied head, f32).
struct SmallMoe {
    vocab: usize,
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    gdn_key_heads: usize,
    gdn_value_heads: usize,
    gdn_head_dim: usize,
    experts: usize,
    expert_width: usize,
    shared_width: usize,
}

fn small_moe_config(name: &str, m: SmallMoe) -> ModelConfig {
    let json = format!(
        r#"{{
        "model_type": "qwen3_5_moe",
        "text_config": {{
            "model_type": "qwen3_5_moe_text",
            "vocab_size": {}, "hidden_size": {}, "num_hidden_layers": {},
            "num_attention_heads": {}, "num_key_value_heads": {}, "head_dim": {},
            "linear_num_key_heads": {}, "linear_num_value_heads": {},
            "linear_key_head_dim": {}, "linear_value_head_dim": {}, "linear_conv_kernel_dim": 4,
            "num_experts": {}, "num_experts_per_tok": 2, "moe_intermediate_size": {},
            "shared_expert_intermediate_size": {},
            "full_attention_interval": 2, "rms_norm_eps": 1e-6,
            "rope_parameters": {{"rope_type": "default", "rope_theta": 10000.0,
                                "partial_rotary_factor": 0.25}},
            "mtp_num_hidden_layers": 1, "tie_word_embeddings": false,
            "eos_token_id": 0, "dtype": "float32"
        }}
    }}"#,
        m.vocab,
        m.hidden,
        m.layers,
        m.heads,
        m.kv_heads,
        m.head_dim,
        m.gdn_key_heads,
        m.gdn_value_heads,
        m.gdn_head_dim,
        m.gdn_head_dim,
        m.experts,
        m.expert_width,
        m.shared_width,
    );
    let path = format!("{name}/config.json");
    ModelConfig::from_json_str(&json, Path::new(&path)).unwrap()
}

#[test]
fn dummy_weights_split_two_and_four_ways_match_the_whole_model() {
    let config = four_way_config();
    // The dummy source generates every full tensor from its name; each rank keeps its share, so
    // every tp size sees the same whole model.
    let source = DummySource::new(DType::F32, 5).with_tied_embeddings(false);
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 97 + 13) % 512).collect();
    let decode = [7u32, 300, 511, 0];
    let whole = run(&load_tp(&config, &source, 1), &prompt, &decode);
    for tp in [2, 4] {
        let split = run(&load_tp(&config, &source, tp), &prompt, &decode);
        assert_same("four-way shape", tp, &whole, &split);
    }
}

/// A block-FP8 model (`--quantization fp8` on dummy weights) whose every split width is a whole
/// number of 128 x 128 blocks per rank: head_dim 128, GDN key and value heads of 128, expert and
/// shared-expert widths of 256. Each rank keeps its share's codes and scales, and the logits are
/// the whole model's.
#[test]
fn block_fp8_split_on_block_boundaries_matches_the_whole_model() {
    let config = small_moe_config(
        "fp8_aligned",
        SmallMoe {
            vocab: 256,
            hidden: 128,
            layers: 2,
            heads: 2,
            kv_heads: 2,
            head_dim: 128,
            gdn_key_heads: 2,
            gdn_value_heads: 4,
            gdn_head_dim: 128,
            experts: 4,
            expert_width: 256,
            shared_width: 256,
        },
    );
    let dummy = DummySource::new(DType::F32, 9).with_tied_embeddings(false);
    let source = Fp8QuantizingSource::new(Box::new(dummy), Fp8Quantization::qwen_default());
    let prompt: Vec<u32> = (0..21u32).map(|i| (i * 53 + 3) % 256).collect();
    let decode = [5u32, 250, 64];
    let whole = run(&load_tp(&config, &source, 1), &prompt, &decode);
    let split = run(&load_tp(&config, &source, 2), &prompt, &decode);
    assert_same("block-FP8 aligned", 2, &whole, &split);
}

/// Fewer KV heads than ranks: with 2 KV heads over 4 ranks each rank keeps a copy of the KV head
/// its two query heads read (as SGLang and vLLM replicate them); the logits stay the whole model's.
#[test]
fn copied_kv_heads_split_four_ways_match_the_whole_model() {
    let config = four_way_config_with_kv_heads(2);
    let source = DummySource::new(DType::F32, 6).with_tied_embeddings(false);
    let prompt: Vec<u32> = (0..33u32).map(|i| (i * 61 + 5) % 512).collect();
    let decode = [3u32, 200, 17];
    let whole = run(&load_tp(&config, &source, 1), &prompt, &decode);
    let split = run(&load_tp(&config, &source, 4), &prompt, &decode);
    assert_same("copied KV heads", 4, &whole, &split);
}

/// The `qwen35_f32` fixture's config and weights.
fn qwen35_f32() -> (ModelConfig, SafetensorsSource) {
    let dir = fixture_dirs()
        .into_iter()
        .find(|d| d.ends_with("qwen35_f32"))
        .unwrap();
    let config = ModelConfig::from_dir(&dir).unwrap();
    let source = SafetensorsSource::open(&dir).unwrap();
    (config, source)
}

#[test]
fn greedy_generation_split_equals_whole() {
    let (config, source) = qwen35_f32();
    let whole = load_tp(&config, &source, 1);
    let split = load_tp(&config, &source, 2);
    assert_eq!(split.tp_size(), 2);
    for seed in 0..3u32 {
        let prompt: Vec<u32> = (0..(5 + 7 * seed))
            .map(|i| (i * 31 + seed * 11) % 256)
            .collect();
        let a = whole.generate_greedy(&prompt, 24, &[], &mut |_| {});
        let b = split.generate_greedy(&prompt, 24, &[], &mut |_| {});
        assert_eq!(a, b, "prompt {seed}");
    }
}

#[test]
fn unsupported_split_is_refused_naming_the_field() {
    let (config, source) = qwen35_f32();
    let comms: Vec<Box<dyn Communicator<CpuBackend>>> = InProcessGroup::new(4)
        .into_iter()
        .map(|g| Box::new(g) as Box<dyn Communicator<CpuBackend>>)
        .collect();
    let backends = (0..4).map(|_| cpu()).collect();
    let err = load_tensor_parallel(backends, comms, &config, &source, true, &mut |_, _| {})
        .err()
        .expect("2 GDN key heads do not split 4 ways")
        .to_string();
    assert!(
        err.contains("--tp-size 4") && err.contains("`linear_num_key_heads`"),
        "{err}"
    );
}

/// A device error on one rank mid-step (an op panics) fails that step on every rank, and the group
/// is usable again right after: the next steps, on fresh caches, give bit for bit the logits the
/// same split model gave before any failure (and so the whole model's, within the tolerance). The
/// failure is put on rank 0 and on the follower, early in a prefill, in a decode step and in the
/// MTP step, one after another on the same group.
#[test]
fn a_group_whose_rank_failed_mid_step_computes_the_same_logits_after() {
    let (config, source) = qwen35_f32();
    let (faults, backends, comms) = faulty_pair(cpu);
    let split =
        load_tensor_parallel(backends, comms, &config, &source, true, &mut |_, _| {}).unwrap();
    let prompt: Vec<u32> = (0..23u32).map(|i| (i * 37 + 5) % 256).collect();
    let decode = [9u32, 140, 77];

    let whole = run(&load_tp(&config, &source, 1), &prompt, &decode);
    let calls = faults[0].calls();
    let before = run(&split, &prompt, &decode);
    let per_run = faults[0].calls() - calls;
    assert_eq!(faults[1].calls() - calls, per_run, "ranks run the same ops");
    assert_same("qwen35_f32", 2, &whole, &before);

    // Matmul calls of one `run`: early in the prefill, in a decode step, in the MTP step (last).
    for rank in [0, 1] {
        for nth in [3, per_run / 2, per_run - 1] {
            faults[rank].arm(nth);
            let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run(&split, &prompt, &decode)
            }));
            assert!(!faults[rank].armed(), "the fault fired");
            let payload = failed.expect_err("the step with the failing op fails");
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            assert!(
                message.contains(INJECTED),
                "rank {rank}, matmul {nth}: the step fails with the rank's own error, not a \
                 stale one: {message}"
            );
            for _ in 0..2 {
                let after = run(&split, &prompt, &decode);
                assert_eq!(
                    after, before,
                    "rank {rank} failed at matmul {nth}: the next steps differ"
                );
            }
        }
    }
}
