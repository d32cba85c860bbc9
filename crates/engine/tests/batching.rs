//! The engine end to end on a real (tiny, random) checkpoint with the reference backend: continuous
//! batching gives every request exactly its solo greedy output, full pools queue instead of failing,
//! preemption recomputes correctly, aborts and dropped clients free their blocks and slots, and a
//! seed fixes a sampled output whatever else is batched.

mod common;

use common::fixture_model;
use deltaserve_engine::*;
use deltaserve_model::Model;
use deltaserve_tensor::reference::ReferenceBackend;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn model() -> Model<ReferenceBackend> {
    fixture_model("qwen35_f32")
}

fn config(max_running: usize, blocks: usize, slots: usize) -> EngineConfig {
    EngineConfig {
        max_running_requests: max_running,
        num_kv_blocks: blocks,
        block_size: 4,
        state_slots: slots,
        chunked_prefill_size: 64,
        context_length: 256,
        max_queued_requests: 64,
        decode_log_interval: 0,
        speculative: None,
    }
}

fn prompt(i: usize) -> Vec<u32> {
    (0..(5 + 7 * i) as u32)
        .map(|t| (t * 37 + i as u32 * 11) % 256)
        .collect()
}

fn greedy(prompt: Vec<u32>, max_new: usize) -> GenerationRequest {
    GenerationRequest {
        prompt_ids: prompt,
        sampling: SamplingParams::default(),
        max_new_tokens: max_new,
        stop_token_ids: vec![],
        disable_speculation: false,
    }
}

/// A request's tokens and finish reason.
fn collect(rx: EventReceiver) -> (Vec<u32>, FinishReason) {
    let done = common::collect(rx);
    (done.tokens, done.reason)
}

fn wait_until_empty(engine: &LocalEngine) -> EngineStats {
    let start = Instant::now();
    loop {
        let stats = engine.stats();
        if stats.running == 0
            && stats.queued == 0
            && stats.kv_blocks_used == 0
            && stats.state_slots_used == 0
        {
            return stats;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "pools never emptied: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn concurrent_requests_equal_their_solo_greedy_output() {
    let reference = model();
    let solo: Vec<Vec<u32>> = (0..6)
        .map(|i| reference.generate_greedy(&prompt(i), 12, &[], &mut |_| {}))
        .collect();
    let engine = LocalEngine::spawn(model(), config(8, 200, 8));
    let receivers: Vec<_> = (0..6)
        .map(|i| engine.submit(greedy(prompt(i), 12)).unwrap().1)
        .collect();
    for (i, rx) in receivers.into_iter().enumerate() {
        let (tokens, reason) = collect(rx);
        assert_eq!(tokens, solo[i], "request {i} differs from its solo run");
        assert_eq!(reason, FinishReason::Length);
    }
    wait_until_empty(&engine);
}

#[test]
fn full_pools_queue_and_preemption_recomputes() {
    let reference = model();
    let solo: Vec<Vec<u32>> = (0..4)
        .map(|i| reference.generate_greedy(&prompt(i), 20, &[], &mut |_| {}))
        .collect();
    // Two state slots: requests must queue. 14 blocks of 4 hold the last two requests' prompts but
    // not both of them grown by 20 tokens (10 + 12 blocks), so one of them is preempted.
    let engine = LocalEngine::spawn(model(), config(4, 14, 2));
    let receivers: Vec<_> = (0..4)
        .map(|i| engine.submit(greedy(prompt(i), 20)).unwrap().1)
        .collect();
    for (i, rx) in receivers.into_iter().enumerate() {
        assert_eq!(
            collect(rx).0,
            solo[i],
            "request {i} differs from its solo run"
        );
    }
    wait_until_empty(&engine);
    let metrics = engine.prometheus_metrics();
    let preemptions: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("deltaserve_preemptions_total "))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(
        preemptions > 0,
        "the pool was sized to force preemption:\n{metrics}"
    );
}

#[test]
fn stop_tokens_finish_with_stop() {
    let reference = model();
    let solo = reference.generate_greedy(&prompt(1), 10, &[], &mut |_| {});
    let stop = solo[3];
    let first = solo.iter().position(|&t| t == stop).unwrap();
    let engine = LocalEngine::spawn(model(), config(2, 100, 2));
    let mut request = greedy(prompt(1), 10);
    request.stop_token_ids = vec![stop];
    let (tokens, reason) = collect(engine.submit(request).unwrap().1);
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(tokens, solo[..=first].to_vec());
}

#[test]
fn abort_and_dropped_receivers_free_blocks_and_slots() {
    let engine: Arc<LocalEngine> = LocalEngine::spawn(model(), config(4, 100, 4));
    let (id, mut rx) = engine.submit(greedy(prompt(2), 200)).unwrap();
    // Wait for the first token, then abort.
    assert!(matches!(
        rx.blocking_recv(),
        Some(EngineEvent::Token { .. })
    ));
    engine.abort(id);
    let mut reason = None;
    while let Some(event) = rx.blocking_recv() {
        if let EngineEvent::Finished { reason: r, .. } = event {
            reason = Some(r);
        }
    }
    assert_eq!(reason, Some(FinishReason::Abort));
    // A client that goes away: its receiver is dropped mid-generation.
    let (_, rx) = engine.submit(greedy(prompt(3), 200)).unwrap();
    drop(rx);
    wait_until_empty(&engine);
}

#[test]
fn seeded_sampling_is_reproducible_whatever_is_batched() {
    let sampled = |seed| GenerationRequest {
        sampling: SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            seed: Some(seed),
            ..Default::default()
        },
        ..greedy(prompt(4), 16)
    };
    let engine = LocalEngine::spawn(model(), config(8, 200, 8));
    let alone = collect(engine.submit(sampled(7)).unwrap().1).0;
    let others: Vec<_> = (0..3)
        .map(|i| engine.submit(greedy(prompt(i), 16)).unwrap().1)
        .collect();
    let batched = collect(engine.submit(sampled(7)).unwrap().1).0;
    let other_seed = collect(engine.submit(sampled(8)).unwrap().1).0;
    for rx in others {
        collect(rx);
    }
    assert_eq!(alone, batched);
    assert_ne!(
        alone, other_seed,
        "different seeds should give different samples here"
    );
}

#[test]
fn bad_requests_are_refused_at_submit() {
    let engine = LocalEngine::spawn(model(), config(2, 100, 2));
    assert_eq!(
        engine.submit(greedy(vec![], 4)).unwrap_err(),
        SubmitError::EmptyPrompt
    );
    assert_eq!(
        engine.submit(greedy(vec![300], 4)).unwrap_err(),
        SubmitError::BadToken {
            id: 300,
            vocab: 256
        }
    );
    assert!(matches!(
        engine.submit(greedy(prompt(0), 300)).unwrap_err(),
        SubmitError::TooLong { context: 256, .. }
    ));
}
