//! A step that fails mid-way (on a GPU, a device error surfaces as a panic inside an op) ends the
//! requests it ran with an error event and frees what they held; the engine serves the next
//! requests as before. The failure is injected through the test drafter, which panics while a flag
//! is set, so the panic happens inside the engine's step after the forward pass.

mod common;

use common::{collect, config, fixture_model, spec};
use deltaserve_engine::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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
