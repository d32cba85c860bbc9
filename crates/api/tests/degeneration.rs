//! The degeneration watch over real HTTP against the scripted fake engine: every output is fed to the
//! detector, a verdict is counted in /metrics and reported in a `degeneration` field with its diagnosis
//! (read from the speculative counts), `--degeneration-action stop` ends the request, healthy and
//! closed-reasoning outputs are left alone. Also `smoke` against a correct and a looping fake server.

mod common;

use std::time::Duration;

use common::{ids, tokenizer, FakeEngine, Script, TestServer};
use deltaserve_api::DegenerationAction;
use deltaserve_client::{run_smoke, SmokeConfig};
use deltaserve_engine::GenerationRequest;
use deltaserve_health::DegenerationKind;
use serde_json::{json, Value};

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// An answer that closes its reasoning and then loops on " prime" (no stop token).
fn looping_tokens(repeats: usize) -> Vec<u32> {
    let mut tokens = ids("Primes.</think>\n\nThe primes are");
    for _ in 0..repeats {
        tokens.extend(ids(" prime"));
    }
    tokens
}

fn looping_script(draft_tokens: usize, accepted_draft_tokens: usize) -> Script {
    Script {
        tokens: looping_tokens(400),
        draft_tokens,
        accepted_draft_tokens,
        ..Script::default()
    }
}

#[tokio::test]
async fn a_loop_with_high_acceptance_is_flagged_counted_and_blamed_on_the_target() {
    let server = TestServer::start(FakeEngine::new(|_: &GenerationRequest| {
        looping_script(280, 270)
    }))
    .await;
    let body = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("List primes."), "max_tokens": 300}),
        )
        .await
        .json();
    let choice = &body["choices"][0];
    // `log`: the request runs to its end; the report rides along in an extra field.
    assert_eq!(choice["finish_reason"], "length", "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 300);
    let report = &choice["degeneration"];
    assert_eq!(report["kind"], "periodic_loop", "{report}");
    assert_eq!(report["action"], "log");
    assert_eq!(report["stopped"], false);
    assert_eq!(report["cause"], "target_forward");
    // The repeated unit is " prime", quoted from wherever the exact repetition was first seen.
    let span = report["span"].as_str().unwrap();
    assert!(span.len() == 6 && " prime prime".contains(span), "{report}");
    let period = ids(" prime").len() as u64;
    assert_eq!(report["period_tokens"].as_u64(), Some(period), "{report}");
    let began = report["began_at_token"].as_u64().unwrap();
    let detected = report["detected_at_token"].as_u64().unwrap();
    let prefix = ids("Primes.</think>\n\nThe primes are").len() as u64;
    assert!(began + 1 >= prefix && began <= prefix + period, "{report}");
    assert!(detected > began && detected < 120, "{report}");
    let acceptance = report["draft_acceptance"].as_f64().unwrap();
    assert!((acceptance - 270.0 / 280.0).abs() < 1e-9, "{report}");
    let diagnosis = report["diagnosis"].as_str().unwrap();
    assert!(diagnosis.contains("TARGET forward pass"), "{diagnosis}");
    assert!(
        diagnosis.contains("sampling parameters will not fix it"),
        "{diagnosis}"
    );
    assert!(diagnosis.contains("deltaserve doctor"), "{diagnosis}");

    let metrics = server.get("/metrics").await.body;
    assert!(
        metrics.contains("deltaserve_degenerate_requests_total{kind=\"periodic_loop\"} 1\n"),
        "{metrics}"
    );
    assert!(metrics.contains("deltaserve_degenerate_requests_total{kind=\"ngram_collapse\"} 0\n"));
    assert_eq!(
        server
            .state
            .metrics
            .degenerations_counted(DegenerationKind::PeriodicLoop),
        1
    );

    // The completions route watches its outputs the same way.
    let body = server
        .post(
            "/v1/completions",
            &json!({"prompt": "Primes:", "max_tokens": 300}),
        )
        .await
        .json();
    assert_eq!(
        body["choices"][0]["degeneration"]["kind"], "periodic_loop",
        "{body}"
    );
    let metrics = server.get("/metrics").await.body;
    assert!(metrics.contains("deltaserve_degenerate_requests_total{kind=\"periodic_loop\"} 2\n"));
}

#[tokio::test]
async fn stop_action_ends_a_looping_stream_early_with_finish_reason_stop() {
    let engine = FakeEngine::new(|_: &GenerationRequest| Script {
        tokens: ids(" prime"),
        repeat: true,
        ..Script::default()
    });
    let server = TestServer::start_with(engine, |config| {
        config.degeneration_action = DegenerationAction::Stop;
    })
    .await;
    let reply = server
        .post(
            "/v1/chat/completions",
            &json!({
                "messages": user("List primes."),
                "max_tokens": 2000,
                "stream": true,
                "stream_options": {"include_usage": true},
            }),
        )
        .await;
    let events = reply.events();
    let finals: Vec<&Value> = events
        .iter()
        .filter(|e| e["choices"][0]["finish_reason"].is_string())
        .collect();
    assert_eq!(finals.len(), 1, "{}", reply.body);
    let choice = &finals[0]["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    let report = &choice["degeneration"];
    assert_eq!(report["stopped"], true, "{report}");
    assert_eq!(report["action"], "stop");
    assert_eq!(report["kind"], "periodic_loop");
    // No speculation in this script: the diagnosis cannot compare drafter and target.
    assert_eq!(report["cause"], "target_or_model");
    assert!(report["diagnosis"]
        .as_str()
        .unwrap()
        .contains("no speculative decoding"));
    // Only the last chunk carries the report.
    assert_eq!(
        events
            .iter()
            .filter(|e| e["choices"][0].get("degeneration").is_some())
            .count(),
        1
    );
    let usage = &events.last().unwrap()["usage"];
    let generated = usage["completion_tokens"].as_u64().unwrap();
    assert!(
        generated < 120,
        "stopped at the verdict, not at max_tokens: {usage}"
    );
    let id = server.engine.ids()[0];
    assert!(
        server.engine.wait_aborted(id).await,
        "the engine request was aborted"
    );
}

#[tokio::test]
async fn acceptance_that_collapses_mid_request_points_at_the_recurrent_state() {
    // Drafts are all accepted for the first 100 tokens, then none: what a state corrupted by
    // speculative rollback looks like from outside.
    let engine = FakeEngine::new(|_: &GenerationRequest| Script {
        tokens: looping_tokens(400),
        delay: Duration::from_millis(2),
        accept: Some(|i| i < 100),
        ..Script::default()
    });
    let server = TestServer::start(engine).await;
    let body = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("List primes."), "max_tokens": 200}),
        )
        .await
        .json();
    let report = &body["choices"][0]["degeneration"];
    assert_eq!(report["cause"], "recurrent_state", "{report}");
    let diagnosis = report["diagnosis"].as_str().unwrap();
    assert!(diagnosis.contains("collapsed"), "{diagnosis}");
    assert!(diagnosis.contains("rollback"), "{diagnosis}");
    assert_eq!(
        body["usage"]["spec_decoding"],
        json!({"draft_tokens": 200, "accepted_tokens": 100})
    );
}

#[tokio::test]
async fn healthy_output_has_no_report_and_counts_nothing() {
    let reply = "Let me add 2 and 2.</think>\n\nThe answer is 4.<|im_end|>";
    let server = TestServer::start(FakeEngine::replying(reply)).await;
    for stream in [false, true] {
        let answer = server
            .post(
                "/v1/chat/completions",
                &json!({"messages": user("What is 2+2?"), "stream": stream}),
            )
            .await;
        assert!(!answer.body.contains("degeneration"), "{}", answer.body);
    }
    let metrics = server.get("/metrics").await.body;
    for kind in ["periodic_loop", "ngram_collapse", "unclosed_reasoning"] {
        assert!(
            metrics.contains(&format!(
                "deltaserve_degenerate_requests_total{{kind=\"{kind}\"}} 0\n"
            )),
            "{metrics}"
        );
    }
}

/// Varied text without `</think>`: reasoning that never ends, but never repeats either.
fn endless_reasoning() -> Vec<u32> {
    let text: String = (1..=60)
        .map(|i| format!("Step {i}: add {i} to the sum. "))
        .collect();
    ids(&text)
}

#[tokio::test]
async fn reasoning_is_watched_from_the_prompt_that_opens_it() {
    let engine = FakeEngine::new(|_: &GenerationRequest| Script {
        tokens: endless_reasoning(),
        ..Script::default()
    });
    let server = TestServer::start_with(engine, |config| {
        config.degeneration.reasoning_budget_tokens = Some(40);
    })
    .await;
    // The fixture template opens `<think>`: the output starts inside the block.
    let body = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("Sum it."), "max_tokens": 150}),
        )
        .await
        .json();
    let report = &body["choices"][0]["degeneration"];
    assert_eq!(report["kind"], "unclosed_reasoning", "{body}");
    assert_eq!(report["cause"], "reasoning_budget");
    assert_eq!(report["began_at_token"], 0);
    // Thinking off: the prompt closes the block, the same text is plain content.
    let body = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("Sum it."), "max_tokens": 150, "enable_thinking": false}),
        )
        .await
        .json();
    assert!(body["choices"][0].get("degeneration").is_none(), "{body}");
}

/// A fake engine answering the smoke prompts like the demo model does, or looping.
fn smoke_engine(correct: bool) -> std::sync::Arc<FakeEngine> {
    FakeEngine::new(move |request: &GenerationRequest| {
        let prompt = tokenizer().decode(&request.prompt_ids, false).unwrap();
        let reply = if !correct {
            "The user asks about the weather.</think>\n\n".to_string() + &"5".repeat(300)
        } else if prompt.contains("2+2") {
            "2 + 2 = 4.</think>\n\n4<|im_end|>".to_string()
        } else {
            "Try every divisor up to the square root.</think>\n\n```python\ndef is_prime(n):\n    \
             return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n```<|im_end|>"
                .to_string()
        };
        Script {
            draft_tokens: 30,
            accepted_draft_tokens: 27,
            ..Script::text(&reply)
        }
    })
}

fn smoke_args(server: &TestServer) -> SmokeConfig {
    SmokeConfig {
        url: format!("http://{}/v1", server.addr),
        model: None,
        max_tokens: 200,
        timeout: 30,
    }
}

#[tokio::test]
async fn smoke_passes_a_correct_server_and_fails_a_looping_one() {
    let good = TestServer::start(smoke_engine(true)).await;
    let report = run_smoke(&smoke_args(&good)).await.unwrap();
    assert_eq!(report.model, "test-model");
    assert!(report.passed(), "{}", report.table());
    let names: Vec<&str> = report.checks.iter().map(|c| c.check.as_str()).collect();
    assert_eq!(
        names,
        [
            "model",
            "health",
            "2+2 answer",
            "prime function",
            "content present",
            "reasoning split",
            "finish reasons",
            "usage",
            "stream = non-stream",
            "degeneration"
        ]
    );
    let table = report.table();
    assert!(table.contains("PASSED"), "{table}");

    let bad = TestServer::start(smoke_engine(false)).await;
    let report = run_smoke(&smoke_args(&bad)).await.unwrap();
    assert!(!report.passed(), "{}", report.table());
    let result = |name: &str| {
        report
            .checks
            .iter()
            .find(|c| c.check == name)
            .map(|c| c.result.as_str())
            .unwrap()
    };
    for failing in [
        "2+2 answer",
        "prime function",
        "finish reasons",
        "degeneration",
    ] {
        assert_eq!(result(failing), "FAIL", "{}", report.table());
    }
    let json = report.to_json();
    assert_eq!(json["passed"], false);
    let degeneration = json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "degeneration")
        .unwrap();
    assert!(
        degeneration["detail"]
            .as_str()
            .unwrap()
            .contains("TARGET forward pass"),
        "{degeneration}"
    );
}
