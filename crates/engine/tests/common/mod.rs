//! Helpers shared by the engine's integration tests: loading a fixture model and draining a
//! request's events.
// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use deltaserve_engine::{
    DraftFault, EngineConfig, EngineEvent, EventReceiver, FinishReason, SpecConfig, Usage,
};
use deltaserve_model::config::ModelConfig;
use deltaserve_model::safetensors::SafetensorsSource;
use deltaserve_model::weights::Weights;
use deltaserve_model::Model;
use deltaserve_tensor::reference::ReferenceBackend;
use std::path::Path;

/// A golden fixture (tests/fixtures/NAME) on the reference backend, with its MTP head when it has one.
pub fn fixture_model(name: &str) -> Model<ReferenceBackend> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name);
    let config = ModelConfig::from_dir(&dir).unwrap();
    let source = SafetensorsSource::open(&dir).unwrap();
    let weights = Weights::load(&ReferenceBackend, &config, &source, true, &mut |_, _| {}).unwrap();
    Model::new(config, ReferenceBackend, weights)
}

/// A small engine for the fixture models: 8 running requests, 400 KV blocks of 4 tokens, 48 state
/// slots, 64-token prefill chunks, 256-token context.
pub fn config(speculative: Option<SpecConfig>) -> EngineConfig {
    EngineConfig {
        max_running_requests: 8,
        num_kv_blocks: 400,
        block_size: 4,
        state_slots: 48,
        chunked_prefill_size: 64,
        context_length: 256,
        max_queued_requests: 256,
        decode_log_interval: 0,
        speculative,
    }
}

/// MTP speculation with `k` draft steps and the given drafter fault.
pub fn spec(k: usize, fault: DraftFault) -> Option<SpecConfig> {
    Some(SpecConfig {
        num_steps: k,
        disable_batch_size: None,
        fault,
    })
}

/// Everything a finished request reported.
pub struct Collected {
    pub tokens: Vec<u32>,
    pub reason: FinishReason,
    pub usage: Usage,
}

/// Drains a request's events until it finishes; panics on an engine error.
pub fn collect(mut rx: EventReceiver) -> Collected {
    let mut tokens = Vec::new();
    loop {
        match rx
            .blocking_recv()
            .expect("the engine finishes every request")
        {
            EngineEvent::Token { id, .. } => tokens.push(id),
            EngineEvent::Finished { reason, usage } => {
                assert_eq!(
                    usage.completion_tokens,
                    tokens.len(),
                    "usage counts every streamed token"
                );
                return Collected {
                    tokens,
                    reason,
                    usage,
                };
            }
            EngineEvent::Error { message } => panic!("engine error: {message}"),
        }
    }
}
