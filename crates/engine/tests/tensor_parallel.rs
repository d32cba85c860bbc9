//! The engine over a model split across tensor-parallel ranks (in-process communicator, reference
//! backend per rank): continuous batching with requests joining and leaving, chunked prefill, and
//! MTP speculation with rollback (state-slot copies mirrored to every rank) give the tokens the
//! whole model gives; MTP on equals MTP off under TP 2; and after a step that failed on one rank
//! the group serves the same replies again.

mod common;
#[path = "../../model/tests/support/faulty.rs"]
mod faulty;

use common::{config, spec};
use deltaserve_engine::*;
use deltaserve_model::config::ModelConfig;
use deltaserve_model::safetensors::SafetensorsSource;
use deltaserve_model::{load_tensor_parallel, Model};
use deltaserve_tensor::reference::ReferenceBackend;
use deltaserve_tensor::{Communicator, InProcessGroup};
use faulty::{faulty_pair, Fault, Faulty, INJECTED};
use std::path::Path;
use std::sync::atomic::Ordering;

fn model(fixture: &str, tp: usize) -> Model<ReferenceBackend> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(fixture);
    let config = ModelConfig::from_dir(&dir).unwrap();
    let source = SafetensorsSource::open(&dir).unwrap();
    let comms: Vec<Box<dyn Communicator<ReferenceBackend>>> = InProcessGroup::new(tp)
        .into_iter()
        .map(|g| Box::new(g) as Box<dyn Communicator<ReferenceBackend>>)
        .collect();
    let backends = (0..tp).map(|_| ReferenceBackend).collect();
    load_tensor_parallel(backends, comms, &config, &source, true, &mut |_, _| {}).unwrap()
}

/// `model(fixture, 2)` with each rank's backend behind a `Faulty` wrapper the test can arm.
fn faulty_model(fixture: &str) -> (Model<Faulty<ReferenceBackend>>, [Fault; 2]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(fixture);
    let config = ModelConfig::from_dir(&dir).unwrap();
    let source = SafetensorsSource::open(&dir).unwrap();
    let (faults, backends, comms) = faulty_pair(|| ReferenceBackend);
    let model =
        load_tensor_parallel(backends, comms, &config, &source, true, &mut |_, _| {}).unwrap();
    (model, faults)
}

fn prompt(i: usize) -> Vec<u32> {
    (0..(3 + 9 * i) as u32)
        .map(|t| (t * 53 + i as u32 * 29 + 7) % 256)
        .collect()
}

/// Greedy replies to 6 requests: 3 submitted at once, 3 more after the first finishes.
fn replies(engine: &LocalEngine) -> Vec<Vec<u32>> {
    let request = |i: usize| GenerationRequest {
        prompt_ids: prompt(i),
        sampling: SamplingParams::default(),
        max_new_tokens: 20,
        stop_token_ids: vec![],
        disable_speculation: false,
    };
    let mut results = vec![Vec::new(); 6];
    let mut pending: Vec<(usize, EventReceiver)> = (0..3)
        .map(|i| (i, engine.submit(request(i)).unwrap().1))
        .collect();
    let (first, rx) = pending.remove(0);
    results[first] = common::collect(rx).tokens;
    for i in 3..6 {
        pending.push((i, engine.submit(request(i)).unwrap().1));
    }
    for (i, rx) in pending {
        results[i] = common::collect(rx).tokens;
    }
    results
}

#[test]
fn split_engine_with_and_without_mtp_equals_the_whole_model() {
    for fixture in ["qwen35_f32", "qwen35_moe"] {
        let whole = replies(&LocalEngine::spawn(model(fixture, 1), config(None)));
        let split = model(fixture, 2);
        assert_eq!(split.tp_size(), 2);
        let plain = replies(&LocalEngine::spawn(split, config(None)));
        assert_eq!(plain, whole, "{fixture}: tp 2 vs tp 1");
        for fault in [DraftFault::None, DraftFault::WrongTokens] {
            let counts = |engine: &LocalEngine| {
                let m = engine.metrics();
                (
                    m.spec_draft_tokens.load(Ordering::Relaxed),
                    m.spec_accepted_tokens.load(Ordering::Relaxed),
                )
            };
            let whole_spec = LocalEngine::spawn(model(fixture, 1), config(spec(3, fault.clone())));
            assert_eq!(replies(&whole_spec), whole, "{fixture}: tp 1 with MTP");
            let engine = LocalEngine::spawn(model(fixture, 2), config(spec(3, fault.clone())));
            assert_eq!(
                replies(&engine),
                plain,
                "{fixture}: tp 2 with MTP (k = 3, {fault:?}) vs without"
            );
            let (drafted, accepted) = counts(&engine);
            println!("{fixture} tp 2 {fault:?}: {accepted} of {drafted} drafts accepted");
            assert!(drafted > 0, "{fixture}: speculation ran");
            // The split MTP head drafts what the whole one drafts.
            assert_eq!(
                counts(&whole_spec),
                (drafted, accepted),
                "{fixture}: drafts"
            );
        }
    }
}

/// A device error on one rank (an op panics) fails the step on every rank and the engine ends its
/// requests with that error; the group is reset, and the same engine then serves the whole
/// model's replies (continuous batching and MTP speculation with rollback), after failures on rank
/// 0 and on the follower, in a prefill and in the middle of a speculative decode.
#[test]
fn split_engine_serves_the_same_replies_after_a_failed_step() {
    let fixture = "qwen35_f32";
    let whole = replies(&LocalEngine::spawn(
        model(fixture, 1),
        config(spec(3, DraftFault::None)),
    ));
    let (split, faults) = faulty_model(fixture);
    let engine = LocalEngine::spawn(split, config(spec(3, DraftFault::None)));
    let request = || GenerationRequest {
        prompt_ids: prompt(2),
        sampling: SamplingParams::default(),
        max_new_tokens: 20,
        stop_token_ids: vec![],
        disable_speculation: false,
    };
    // Matmuls of one request alone, to put a failure in the middle of its decoding.
    let calls = faults[1].calls();
    assert_eq!(
        common::collect(engine.submit(request()).unwrap().1)
            .tokens
            .len(),
        20
    );
    let per_request = faults[1].calls() - calls;
    for (rank, nth) in [
        (0, 3),
        (1, per_request / 2),
        (0, per_request * 3 / 4),
        (1, 3),
    ] {
        faults[rank].arm(nth);
        let mut rx = engine.submit(request()).unwrap().1;
        let mut tokens = 0;
        let message = loop {
            match rx.blocking_recv().expect("the engine ends every request") {
                EngineEvent::Token { .. } => tokens += 1,
                EngineEvent::Finished { reason, .. } => {
                    panic!("rank {rank}, matmul {nth}: the request finished ({reason:?}) although its step failed")
                }
                EngineEvent::Error { message } => break message,
            }
        };
        assert!(!faults[rank].armed(), "the fault fired");
        // Early matmuls fail the prefill; half-way ones a decode step, after some tokens.
        assert_eq!(
            tokens > 0,
            nth > 3,
            "rank {rank}, matmul {nth}: {tokens} tokens"
        );
        assert!(
            message.contains(INJECTED),
            "rank {rank}, matmul {nth}: {message}"
        );
        assert_eq!(
            replies(&engine),
            whole,
            "rank {rank} failed at matmul {nth}: the replies after differ"
        );
    }
    assert_eq!(engine.metrics().failed_steps.load(Ordering::Relaxed), 4);
}

/// The demo model's held-out prompts used here (every 37th of tests/data/demo/hf_greedy.jsonl, 16
/// prompts across the task groups; crates/engine/tests/demo_model.rs runs them all unsplit).
fn demo_prompts() -> Vec<(String, Vec<u32>, usize, Vec<f64>)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/demo/hf_greedy.jsonl");
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .step_by(37)
        .map(|l| {
            let g: serde_json::Value = serde_json::from_str(l).unwrap();
            let margins = g["margins"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m.as_f64().unwrap())
                .collect();
            (
                g["id"].as_str().unwrap().to_string(),
                ids(&g["prompt_ids"]),
                ids(&g["reply_ids"]).len() + 8,
                margins,
            )
        })
        .collect()
}

fn demo_model(tp: usize) -> Model<deltaserve_tensor::CpuBackend> {
    use deltaserve_tensor::cpu::{CpuBackend, CpuOptions};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
    let config = ModelConfig::from_dir(&dir).unwrap();
    let source = SafetensorsSource::open(&dir).unwrap();
    let comms: Vec<Box<dyn Communicator<CpuBackend>>> = InProcessGroup::new(tp)
        .into_iter()
        .map(|g| Box::new(g) as Box<dyn Communicator<CpuBackend>>)
        .collect();
    let backends = (0..tp)
        .map(|_| {
            CpuBackend::with_options(CpuOptions {
                threads: 1,
                ..CpuOptions::default()
            })
            .unwrap()
        })
        .collect();
    load_tensor_parallel(backends, comms, &config, &source, true, &mut |_, _| {}).unwrap()
}

/// Greedy replies of the demo model to `prompts`, all submitted at once, and the speculative
/// usage totals (drafted, accepted).
fn demo_replies(
    model: Model<deltaserve_tensor::CpuBackend>,
    prompts: &[(String, Vec<u32>, usize, Vec<f64>)],
    speculative: Option<SpecConfig>,
) -> (Vec<Vec<u32>>, (u64, u64)) {
    let config = EngineConfig {
        max_running_requests: 16,
        num_kv_blocks: 16 * 512 / 16,
        block_size: 16,
        state_slots: 16 * 5,
        chunked_prefill_size: 512,
        context_length: 1024,
        max_queued_requests: 64,
        decode_log_interval: 0,
        speculative,
    };
    let engine = LocalEngine::spawn(model, config);
    let receivers: Vec<_> = prompts
        .iter()
        .map(|(_, prompt, max_new, _)| {
            let request = GenerationRequest {
                prompt_ids: prompt.clone(),
                sampling: SamplingParams::default(),
                max_new_tokens: *max_new,
                stop_token_ids: vec![0, 2],
                disable_speculation: false,
            };
            engine.submit(request).unwrap().1
        })
        .collect();
    let mut usage = (0u64, 0u64);
    let replies = receivers
        .into_iter()
        .map(|rx| {
            let done = common::collect(rx);
            usage.0 += done.usage.draft_tokens as u64;
            usage.1 += done.usage.accepted_draft_tokens as u64;
            done.tokens
        })
        .collect();
    (replies, usage)
}

/// Split 2 ways, the demo model's greedy replies equal the whole model's except where a reply
/// meets a near-tie (the tiny summation-order noise of the split can flip only a top-two margin
/// far below transformers' own near-tie threshold; the demo tests use 0.05), and with MTP k = 3
/// they equal the split model's plain replies exactly (the cpu backend is batch-invariant), with
/// the trained MTP head accepted most of the time.
#[test]
fn demo_model_split_two_ways_greedy_and_mtp() {
    const NEAR_TIE: f64 = 0.05;
    let prompts = demo_prompts();
    let (whole, _) = demo_replies(demo_model(1), &prompts, None);
    let (split, _) = demo_replies(demo_model(2), &prompts, None);
    let mut near_ties = 0;
    for ((id, _, _, margins), (a, b)) in prompts.iter().zip(whole.iter().zip(&split)) {
        if let Some(at) = a.iter().zip(b).position(|(x, y)| x != y) {
            let margin = margins.get(at).copied().unwrap_or(f64::INFINITY);
            assert!(
                margin < NEAR_TIE,
                "{id}: tp 2 diverges from tp 1 at token {at}, where transformers' top-2 margin is {margin}"
            );
            near_ties += 1;
        } else {
            assert_eq!(a, b, "{id}: tp 2 vs tp 1");
        }
    }
    println!(
        "demo, tp 2 vs tp 1: {} of {} replies identical, {near_ties} diverge at a near-tie",
        prompts.len() - near_ties,
        prompts.len()
    );
    let (spec, (drafted, accepted)) = demo_replies(
        demo_model(2),
        &prompts,
        spec(3, DraftFault::None).map(|s| SpecConfig {
            disable_batch_size: None,
            ..s
        }),
    );
    println!("demo, tp 2, MTP k = 3: {accepted} of {drafted} drafts accepted");
    assert_eq!(spec, split, "tp 2: MTP on vs off");
    assert!(
        accepted * 2 > drafted,
        "the trained MTP head, split, should be accepted most of the time"
    );
}
