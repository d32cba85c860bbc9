//! A step that fails mid-way (on a GPU, a device error surfaces as a panic inside an op) ends the
//! requests it ran with an error event and frees what they held; the engine serves the next
//! requests as before. The failure is injected through the test drafter, which panics while a flag
//! is set, so the panic happens inside the engine's step after the forward pass. When the backend
//! finds its device lost after the failure (a `Faulty` backend armed to lose it), the queued
//! requests fail too, the engine reports the loss and refuses new requests.

mod common;
#[path = "../../model/tests/support/faulty.rs"]
mod faulty;

use common::{collect, config, fixture_model, spec};
use deltaserve_engine::*;
use deltaserve_model::config::ModelConfig;
use deltaserve_model::safetensors::SafetensorsSource;
use deltaserve_model::weights::Weights;
use deltaserve_model::Model;
use deltaserve_tensor::reference::ReferenceBackend;
use faulty::{Fault, Faulty, DEVICE_LOST, INJECTED};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn request(prompt: Vec<u32>) -> GenerationRequest {
    GenerationRequest {
        prompt_ids: prompt,
        sampling: SamplingParams::default(),
        max_new_tokens: 12,
        stop_token_ids: vec![],
        disable_speculation: false,
    }
}

/// The error message a request ended with; panics if it finished normally.
fn error_of(mut rx: EventReceiver) -> String {
    loop {
        match rx.blocking_recv().expect("the engine ends every request") {
            EngineEvent::Token { .. } => {}
            EngineEvent::Finished { reason, .. } => {
                panic!("the request finished ({reason:?}) although its step failed")
            }
            EngineEvent::Error { message } => return message,
        }
    }
}

#[test]
fn a_failed_step_ends_its_requests_and_the_engine_serves_on() {
    let failing = Arc::new(AtomicBool::new(true));
    let oracle = {
        let failing = failing.clone();
        DraftFault::Scripted(DraftScript(Arc::new(move |so_far: &[u32]| {
            if failing.load(Ordering::SeqCst) {
                panic!("injected device failure");
            }
            so_far.len() as u32 % 7
        })))
    };
    let engine = LocalEngine::spawn(fixture_model("qwen35_f32"), config(spec(2, oracle)));
    let first = engine.submit(request(vec![3, 5, 7, 9])).unwrap().1;
    let second = engine.submit(request(vec![11, 13, 17])).unwrap().1;
    for rx in [first, second] {
        let message = error_of(rx);
        assert!(message.contains("injected device failure"), "{message}");
    }
    assert!(engine.metrics().failed_steps.load(Ordering::Relaxed) >= 1);

    failing.store(false, Ordering::SeqCst);
    let after = collect(engine.submit(request(vec![3, 5, 7, 9])).unwrap().1);
    assert_eq!(
        after.tokens.len(),
        12,
        "the engine serves after the failure"
    );
    // The engine publishes its stats after the step that finished the request: wait for them.
    let freed = |s: &EngineStats| (s.running, s.kv_blocks_used, s.state_slots_used) == (0, 0, 0);
    let mut stats = engine.stats();
    for _ in 0..500 {
        if freed(&stats) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        stats = engine.stats();
    }
    assert!(
        freed(&stats),
        "the failed requests' blocks and slots were not freed: {stats:?}"
    );
}

/// The fixture model on a reference backend behind a `Faulty` wrapper the test can arm.
fn faulty_fixture(name: &str) -> (Model<Faulty<ReferenceBackend>>, Fault) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name);
    let config = ModelConfig::from_dir(&dir).unwrap();
    let source = SafetensorsSource::open(&dir).unwrap();
    let fault = Fault::default();
    let backend = Faulty {
        inner: ReferenceBackend,
        fault: fault.clone(),
    };
    let weights = Weights::load(&backend, &config, &source, true, &mut |_, _| {}).unwrap();
    (Model::new(config, backend, weights), fault)
}

/// Polls `done` every 10 ms for up to 10 s.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn a_lost_device_fails_every_request_and_stops_the_engine() {
    let (model, fault) = faulty_fixture("qwen35_f32");
    let mut one_at_a_time = config(None);
    one_at_a_time.max_running_requests = 1;
    let engine = LocalEngine::spawn(model, one_at_a_time);

    // A healthy engine first: the wrapper alone changes nothing.
    let before = collect(engine.submit(request(vec![3, 5, 7, 9])).unwrap().1);
    assert_eq!(before.tokens.len(), 12);
    assert_eq!(engine.device_lost(), None);

    fault.arm_device_loss(1);
    let running = engine.submit(request(vec![3, 5, 7, 9])).unwrap().1;
    let queued = engine.submit(request(vec![11, 13, 17])).unwrap().1;
    let message = error_of(running);
    assert!(message.contains(INJECTED), "{message}");
    let message = error_of(queued);
    assert!(
        message.contains("the device is lost") && message.contains(DEVICE_LOST),
        "the queued request must fail with the loss: {message}"
    );
    assert!(
        eventually(|| engine.device_lost().is_some()),
        "the engine never reported the loss"
    );
    assert!(engine.device_lost().unwrap().contains(DEVICE_LOST));
    assert!(
        eventually(|| matches!(
            engine.submit(request(vec![3, 5])),
            Err(SubmitError::Stopped)
        )),
        "a stopped engine must refuse new requests"
    );
}
