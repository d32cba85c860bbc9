//! The engine over a model split across tensor-parallel ranks (in-process communicator, reference
//! backend per rank): continuous batching with requests joining and leaving, chunked prefill, and
//! MTP speculation with rollback (state-slot copies mirrored to every rank) give the tokens the
//! whole model gives; MTP on equals MTP off under TP 2.

mod common;

use common::{config, spec};
use deltaserve_engine::*;
use deltaserve_model::config::ModelConfig;
use deltaserve_model::safetensors::SafetensorsSource;
use deltaserve_model::{load_tensor_parallel, Model};
use deltaserve_tensor::reference::ReferenceBackend;
use deltaserve_tensor::{Communicator, InProcessGroup};
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
