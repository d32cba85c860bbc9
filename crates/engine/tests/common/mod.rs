//! Helpers shared by the engine's integration tests: loading a fixture model and draining a
//! request's events.
// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use deltaserve_engine::{EngineEvent, EventReceiver, FinishReason, Usage};
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
