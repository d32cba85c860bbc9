//! The engine's device-sampling path (used with the cuda backend) exercised without a GPU: a
//! wrapper around the reference backend that claims a device sampler and implements it on the host
//! exactly as the device must behave (greedy = argmax; otherwise the host sampler's kept tokens
//! walked in id order with the given uniform number). Greedy replies, with and without MTP
//! speculation, must equal the plain backend's token for token, also under a grammar's mask (which
//! goes to the device with its row); requests that need their logits (logprobs, penalties, sampled
//! speculation) must not reach the device sampler.

mod common;

use common::{collect, config, fixture_model, spec};
use deltaserve_engine::sampler::{processed_distribution, PenaltyHistory};
use deltaserve_engine::*;
use deltaserve_model::config::ModelConfig;
use deltaserve_model::safetensors::SafetensorsSource;
use deltaserve_model::weights::Weights;
use deltaserve_model::Model;
use deltaserve_tensor::reference::{RefMat, ReferenceBackend};
use deltaserve_tensor::{Backend, RowSampling};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The reference backend with a host stand-in for a device sampler; counts the rows it sampled.
#[derive(Default)]
struct HostSampled {
    inner: ReferenceBackend,
    sampled_rows: Arc<AtomicUsize>,
}

/// What a device sampler must return for one row (the contract crates/cuda/tests/sampling.rs
/// checks the cuda kernel against).
fn draw_like_the_device(logits: &[f32], r: &RowSampling) -> u32 {
    let params = SamplingParams {
        temperature: r.temperature,
        top_k: r.top_k as usize,
        top_p: r.top_p,
        min_p: r.min_p,
        ..Default::default()
    };
    let mut kept = processed_distribution(logits, &params, &PenaltyHistory::default());
    kept.sort_by_key(|&(token, _)| token);
    let total: f64 = kept.iter().map(|&(_, p)| p as f64).sum();
    let target = r.uniform * total;
    let mut cumulative = 0.0;
    for &(token, p) in &kept {
        cumulative += p as f64;
        if target < cumulative {
            return token;
        }
    }
    kept.last().map_or(0, |&(token, _)| token)
}

impl Backend for HostSampled {
    type Buf = Vec<f32>;
    type Mat = RefMat;

    fn name(&self) -> &'static str {
        "host-sampled-reference"
    }
    fn samples_on_device(&self) -> bool {
        true
    }
    fn sample_rows(
        &self,
        logits: &Self::Buf,
        vocab: usize,
        rows: &[RowSampling],
    ) -> Option<Vec<u32>> {
        self.sampled_rows.fetch_add(rows.len(), Ordering::Relaxed);
        Some(
            rows.iter()
                .map(|r| {
                    let row = &logits[r.row as usize * vocab..][..vocab];
                    match r.allowed {
                        Some(words) => {
                            let mask = TokenMask {
                                words: words.to_vec(),
                            };
                            draw_like_the_device(&mask.apply(row), r)
                        }
                        None => draw_like_the_device(row, r),
                    }
                })
                .collect(),
        )
    }
    deltaserve_tensor::forward_ops!(inner;
        zeros, scratch, upload, to_host, buf_len, load_mat, load_vec, mat_shape, mat_bytes,
        embedding, matmul, matmul_group, add_rms_norm, rms_norm, gated_rms_norm, add_inplace,
        silu_mul, sigmoid_mul_inplace, rope, concat_cols, gather_rows, scatter_add_rows,
        sigmoid_scale_rows, attention, causal_conv1d, gdn_gates, gated_delta_rule,
        reset_state_slot, copy_state_slot, route_top_k);
}

fn mtp(k: usize) -> Option<SpecConfig> {
    spec(k, DraftFault::None)
}

fn prompt(i: usize) -> Vec<u32> {
    (0..(3 + 7 * i) as u32)
        .map(|t| (t * 37 + i as u32 * 11 + 5) % 256)
        .collect()
}

fn request(i: usize, sampling: SamplingParams) -> GenerationRequest {
    GenerationRequest {
        prompt_ids: prompt(i),
        sampling,
        max_new_tokens: 12,
        stop_token_ids: vec![],
        disable_speculation: false,
    }
}

/// Every request's tokens (and logprobs) on `engine`, all submitted at once.
fn run(engine: &LocalEngine, requests: Vec<GenerationRequest>) -> Vec<Vec<u32>> {
    let receivers: Vec<_> = requests
        .into_iter()
        .map(|r| engine.submit(r).expect("submit").1)
        .collect();
    receivers.into_iter().map(|rx| collect(rx).tokens).collect()
}

/// A fixture on the wrapper, with the counter of rows its "device" sampled.
fn wrapped_fixture(name: &str) -> (Model<HostSampled>, Arc<AtomicUsize>) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name);
    let config = ModelConfig::from_dir(&dir).unwrap();
    let source = SafetensorsSource::open(&dir).unwrap();
    let backend = HostSampled::default();
    let counter = backend.sampled_rows.clone();
    let weights = Weights::load(&backend, &config, &source, true, &mut |_, _| {}).unwrap();
    (Model::new(config, backend, weights), counter)
}

const FIXTURE: &str = "qwen35_f32";

#[test]
fn greedy_on_the_device_path_equals_the_host_path_with_and_without_mtp() {
    let greedy = SamplingParams::default();
    let requests = || {
        (0..6)
            .map(|i| request(i, greedy.clone()))
            .collect::<Vec<_>>()
    };
    let want = run(
        &LocalEngine::spawn(fixture_model(FIXTURE), config(None)),
        requests(),
    );
    for speculative in [None, mtp(1), mtp(3)] {
        let (model, sampled) = wrapped_fixture(FIXTURE);
        let label = format!("{speculative:?}");
        let got = run(&LocalEngine::spawn(model, config(speculative)), requests());
        assert_eq!(got, want, "device-path greedy replies ({label})");
        assert!(
            sampled.load(Ordering::Relaxed) > 0,
            "the device sampler was never used ({label})"
        );
    }
}

#[test]
fn requests_that_need_their_logits_stay_on_the_host_path() {
    let needs_logits = [
        SamplingParams {
            logprobs: Some(2),
            ..Default::default()
        },
        SamplingParams {
            repetition_penalty: 1.3,
            ..Default::default()
        },
    ];
    for (i, params) in needs_logits.iter().enumerate() {
        let (model, sampled) = wrapped_fixture(FIXTURE);
        let got = run(
            &LocalEngine::spawn(model, config(mtp(2))),
            vec![request(i, params.clone())],
        );
        let want = run(
            &LocalEngine::spawn(fixture_model(FIXTURE), config(mtp(2))),
            vec![request(i, params.clone())],
        );
        assert_eq!(
            got, want,
            "{params:?}: the host path decides, as on the cpu backends"
        );
        assert_eq!(
            sampled.load(Ordering::Relaxed),
            0,
            "{params:?} reached the device sampler"
        );
    }
}

#[test]
fn sampled_speculation_verifies_and_drafts_on_the_host() {
    let params = SamplingParams {
        temperature: 0.8,
        seed: Some(7),
        ..Default::default()
    };
    let (model, sampled) = wrapped_fixture(FIXTURE);
    let replies = run(
        &LocalEngine::spawn(model, config(mtp(2))),
        vec![request(1, params)],
    );
    assert_eq!(replies[0].len(), 12);
    // Only the token after the prompt is a plain sampling step; every later one comes out of a
    // verify step, which compares distributions on the host.
    assert_eq!(sampled.load(Ordering::Relaxed), 1);
}

#[test]
fn sampled_requests_use_the_device_sampler_and_stay_seed_reproducible() {
    let params = SamplingParams {
        temperature: 0.9,
        top_k: 20,
        top_p: 0.9,
        seed: Some(11),
        ..Default::default()
    };
    let mut replies = Vec::new();
    for _ in 0..2 {
        let (model, sampled) = wrapped_fixture(FIXTURE);
        replies.push(run(
            &LocalEngine::spawn(model, config(None)),
            (0..4).map(|i| request(i, params.clone())).collect(),
        ));
        assert!(
            sampled.load(Ordering::Relaxed) >= 4 * 12,
            "every sampled token went through the device sampler"
        );
    }
    assert_eq!(
        replies[0], replies[1],
        "the same seeds give the same replies"
    );
}

/// Allows the tokens congruent to the output position modulo 5 (many tokens, so sampling has a
/// choice); fails at `fail_at` when set. Records every committed token.
struct EveryFifth {
    committed: Arc<Mutex<Vec<u32>>>,
    fail_at: Option<usize>,
}

impl EveryFifth {
    fn mask_at(position: usize) -> TokenMask {
        let mut words = vec![0u32; 256 / 32];
        for id in (position % 5..256).step_by(5) {
            words[id / 32] |= 1 << (id % 32);
        }
        TokenMask { words }
    }
}

impl TokenConstraint for EveryFifth {
    fn allowed(&mut self) -> Result<Option<TokenMask>, String> {
        let position = self.committed.lock().unwrap().len();
        if Some(position) == self.fail_at {
            return Err("scripted failure".into());
        }
        Ok(Some(Self::mask_at(position)))
    }
    fn commit(&mut self, token: u32) -> Result<(), String> {
        let mut committed = self.committed.lock().unwrap();
        if token as usize % 5 != committed.len() % 5 {
            return Err(format!("token {token} at position {}", committed.len()));
        }
        committed.push(token);
        Ok(())
    }
    fn allows_after(&mut self, drafts: &[u32], token: u32) -> Result<bool, String> {
        let position = self.committed.lock().unwrap().len() + drafts.len();
        Ok(token as usize % 5 == position % 5)
    }
    fn allowed_after(&mut self, drafts: &[u32]) -> Result<Option<TokenMask>, String> {
        let position = self.committed.lock().unwrap().len() + drafts.len();
        Ok(Some(Self::mask_at(position)))
    }
}

/// Submits `request(i, params)` under an `EveryFifth` constraint; its tokens or error, and what the
/// constraint was told.
fn run_constrained(
    engine: &LocalEngine,
    i: usize,
    params: &SamplingParams,
    fail_at: Option<usize>,
) -> (Vec<u32>, Option<String>, Vec<u32>) {
    let committed = Arc::new(Mutex::new(Vec::new()));
    let constraint = EveryFifth {
        committed: Arc::clone(&committed),
        fail_at,
    };
    let (_, mut rx) = engine
        .submit_constrained(request(i, params.clone()), Some(Box::new(constraint)))
        .expect("submit");
    let mut tokens = Vec::new();
    let error = loop {
        match rx.blocking_recv().expect("the engine ends every request") {
            EngineEvent::Token { id, .. } => tokens.push(id),
            EngineEvent::Finished { .. } => break None,
            EngineEvent::Error { message } => break Some(message),
        }
    };
    let committed = committed.lock().unwrap().clone();
    (tokens, error, committed)
}

#[test]
fn constrained_rows_are_masked_on_the_device_path_as_on_the_host() {
    let greedy = SamplingParams::default();
    let sampled = SamplingParams {
        temperature: 0.9,
        top_k: 20,
        seed: Some(3),
        ..Default::default()
    };
    for speculative in [None, mtp(2)] {
        let label = format!("{speculative:?}");
        let host = LocalEngine::spawn(fixture_model(FIXTURE), config(speculative.clone()));
        let (model, device_rows) = wrapped_fixture(FIXTURE);
        let device = LocalEngine::spawn(model, config(speculative.clone()));
        for i in 0..3 {
            let (want, error, _) = run_constrained(&host, i, &greedy, None);
            assert_eq!(error, None, "{label}");
            let (got, error, committed) = run_constrained(&device, i, &greedy, None);
            assert_eq!(error, None, "{label}");
            assert_eq!(got, want, "greedy under the mask, device path ({label})");
            assert_eq!(
                committed, got,
                "every token committed once, in order ({label})"
            );
            let (tokens, error, committed) = run_constrained(&device, i, &sampled, None);
            assert_eq!(error, None, "{label}");
            assert_eq!(tokens.len(), 12, "{label}");
            assert_eq!(committed, tokens, "sampled tokens committed ({label})");
            for (position, &token) in tokens.iter().enumerate() {
                assert_eq!(token as usize % 5, position % 5, "{label}: forbidden token");
            }
        }
        let used = device_rows.load(Ordering::Relaxed);
        // Without speculation every constrained token is sampled on the device; with it, the
        // token after each prompt (verify steps mask on the host).
        let least = if speculative.is_none() {
            2 * 3 * 12
        } else {
            2 * 3
        };
        assert!(
            used >= least,
            "{label}: {used} device rows, expected {least}+"
        );
        // A constraint that fails mid-request ends it with its message on the device path too.
        let (tokens, error, _) = run_constrained(&device, 0, &greedy, Some(4));
        assert_eq!(tokens.len(), 4, "{label}");
        assert!(
            error.is_some_and(|e| e.contains("scripted failure")),
            "{label}"
        );
    }
}
