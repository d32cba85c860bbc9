//! Constrained decoding inside the engine, with scripted constraints (no grammar library): the
//! sampled token is always one the constraint allows (greedy and sampled, with and without MTP
//! speculation, where a forbidden draft must be rejected), every emitted token is committed to the
//! constraint once and in order, and a failing constraint ends only its own request with an error.

mod common;

use common::{config, fixture_model, spec};
use deltaserve_engine::*;
use std::sync::{Arc, Mutex};

/// Allows exactly one token at each position: `script[i]` at output position `i`. Records every
/// committed token.
struct Forced {
    script: Vec<u32>,
    committed: Arc<Mutex<Vec<u32>>>,
    fail_at: Option<usize>,
}

impl TokenConstraint for Forced {
    fn allowed(&mut self) -> Result<Option<TokenMask>, String> {
        let position = self.committed.lock().unwrap().len();
        if Some(position) == self.fail_at {
            return Err("scripted failure".into());
        }
        Ok(Some(self.mask_at(position)))
    }

    fn commit(&mut self, token: u32) -> Result<(), String> {
        let mut committed = self.committed.lock().unwrap();
        let want = self.script[committed.len() % self.script.len()];
        if token != want {
            return Err(format!(
                "token {token} committed where only {want} was allowed"
            ));
        }
        committed.push(token);
        Ok(())
    }

    fn allows_after(&mut self, drafts: &[u32], token: u32) -> Result<bool, String> {
        let position = self.committed.lock().unwrap().len() + drafts.len();
        Ok(token == self.script[position % self.script.len()])
    }

    fn allowed_after(&mut self, drafts: &[u32]) -> Result<Option<TokenMask>, String> {
        let position = self.committed.lock().unwrap().len() + drafts.len();
        Ok(Some(self.mask_at(position)))
    }
}

impl Forced {
    /// Only the script's token at output `position`.
    fn mask_at(&self, position: usize) -> TokenMask {
        let token = self.script[position % self.script.len()];
        let mut words = vec![0u32; 256 / 32 + 1];
        words[token as usize / 32] |= 1 << (token % 32);
        TokenMask { words }
    }
}

fn request(max_new: usize, temperature: f32) -> GenerationRequest {
    GenerationRequest {
        prompt_ids: (0..12).map(|t| (t * 37 + 5) % 256).collect(),
        sampling: SamplingParams {
            temperature,
            seed: Some(7),
            ..Default::default()
        },
        max_new_tokens: max_new,
        stop_token_ids: vec![],
        disable_speculation: false,
    }
}

fn events(rx: EventReceiver) -> (Vec<u32>, Option<String>) {
    let (tokens, end) = events_and_usage(rx);
    (tokens, end.err())
}

/// The tokens of a request, and its usage or its error.
fn events_and_usage(mut rx: EventReceiver) -> (Vec<u32>, Result<Usage, String>) {
    let mut tokens = Vec::new();
    loop {
        match rx.blocking_recv().expect("the engine ends every request") {
            EngineEvent::Token { id, .. } => tokens.push(id),
            EngineEvent::Finished { usage, .. } => return (tokens, Ok(usage)),
            EngineEvent::Error { message } => return (tokens, Err(message)),
        }
    }
}

#[test]
fn outputs_follow_the_constraint_with_and_without_speculation() {
    // A script the model would not write by itself. Drafting follows the constraint; the faulty
    // drafter then spoils every draft, so verification must reject forbidden drafts too.
    let script = vec![3, 250, 17, 17, 99, 4, 200, 31];
    for speculative in [
        None,
        spec(3, DraftFault::None),
        spec(3, DraftFault::WrongTokens),
    ] {
        let engine = LocalEngine::spawn(fixture_model("qwen35_f32"), config(speculative.clone()));
        for temperature in [0.0, 1.0] {
            let committed = Arc::new(Mutex::new(Vec::new()));
            let constraint = Forced {
                script: script.clone(),
                committed: Arc::clone(&committed),
                fail_at: None,
            };
            let (_, rx) = engine
                .submit_constrained(request(20, temperature), Some(Box::new(constraint)))
                .unwrap();
            let (tokens, error) = events(rx);
            assert_eq!(error, None);
            let want: Vec<u32> = script.iter().copied().cycle().take(20).collect();
            assert_eq!(tokens, want, "speculative {}", speculative.is_some());
            assert_eq!(*committed.lock().unwrap(), want, "committed once, in order");
        }
    }
}

#[test]
fn a_failing_constraint_ends_only_its_request() {
    let engine = LocalEngine::spawn(fixture_model("qwen35_f32"), config(None));
    let failing = Forced {
        script: vec![5],
        committed: Arc::new(Mutex::new(Vec::new())),
        fail_at: Some(3),
    };
    let (_, bad) = engine
        .submit_constrained(request(10, 0.0), Some(Box::new(failing)))
        .unwrap();
    let (_, good) = engine.submit(request(10, 0.0)).unwrap();
    let (tokens, error) = events(bad);
    assert_eq!(tokens, vec![5, 5, 5]);
    assert!(error.is_some_and(|e| e.contains("scripted failure")));
    let (tokens, error) = events(good);
    assert_eq!((tokens.len(), error), (10, None));
}

#[test]
fn drafts_follow_the_constraint_so_none_is_rejected() {
    // The model would never draft this script by itself; constrained drafting proposes only what the
    // constraint allows after the drafts before it, so with one allowed token per position every
    // draft is the token verification emits, greedy and sampled.
    let script = vec![3, 250, 17, 17, 99, 4, 200, 31];
    let engine = LocalEngine::spawn(
        fixture_model("qwen35_f32"),
        config(spec(3, DraftFault::None)),
    );
    for temperature in [0.0, 1.0] {
        let constraint = Forced {
            script: script.clone(),
            committed: Arc::new(Mutex::new(Vec::new())),
            fail_at: None,
        };
        let (_, rx) = engine
            .submit_constrained(request(20, temperature), Some(Box::new(constraint)))
            .unwrap();
        let (tokens, usage) = events_and_usage(rx);
        let usage = usage.unwrap();
        let want: Vec<u32> = script.iter().copied().cycle().take(20).collect();
        assert_eq!(tokens, want);
        assert!(
            usage.draft_tokens > 0,
            "temperature {temperature}: nothing drafted"
        );
        assert_eq!(
            usage.accepted_draft_tokens, usage.draft_tokens,
            "temperature {temperature}: a draft the constraint allowed was rejected"
        );
    }
}
