//! What keeps one client from holding the server over real HTTP against the fake engine: chat templates
//! that loop or flood are refused with 400, `--request-timeout` aborts a generation that never ends
//! (504, or an error event in a stream), and `--max-concurrent-connections` holds extra connections back.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{build, connect, fixture_dir, FakeEngine, Script, TestServer};
use deltaserve_api::{AppState, HealthStatus, ServerConfig};
use deltaserve_engine::RequestId;

use deltaserve_text::Tokenizer;
use http_body_util::BodyExt;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";

/// The fixture tokenizer with `template` as its chat template.
fn tokenizer_with_template(name: &str, template: &str) -> Arc<Tokenizer> {
    let dir = std::env::temp_dir().join(format!(
        "deltaserve-api-template-{name}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(fixture_dir().join(file), dir.join(file)).unwrap();
    }
    std::fs::write(dir.join("chat_template.jinja"), template).unwrap();
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    Arc::new(tokenizer)
}

async fn server_with_template(name: &str, template: &str) -> TestServer {
    let engine = FakeEngine::replying("hi");
    let state = Arc::new(AppState::new(
        ServerConfig::new("test-model"),
        tokenizer_with_template(name, template),
    ));
    state.attach_engine(engine.clone());
    state.health.set(HealthStatus::Ready);
    TestServer::serve(state, engine).await
}

fn chat_body(stream: bool) -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}], "stream": stream})
}

#[tokio::test]
async fn runaway_and_flooding_templates_are_400() {
    let looping = server_with_template(
        "loop",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% if j < 0 %}x{% endif %}{% endfor %}{% endfor %}",
    )
    .await;
    let reply = looping.post(CHAT, &chat_body(false)).await;
    let error = reply.error(400);
    assert_eq!(error["code"], "limit_exceeded");
    assert_eq!(error["param"], "messages");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("template instructions"), "{message}");
    assert!(
        looping.engine.requests().is_empty(),
        "nothing reaches the engine"
    );

    let flooding = server_with_template(
        "flood",
        "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}",
    )
    .await;
    let reply = flooding.post(CHAT, &chat_body(true)).await;
    let error = reply.error(400);
    assert_eq!(error["code"], "limit_exceeded");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("8388608 bytes"), "{message}");
    assert!(flooding.engine.requests().is_empty());
}

/// An engine whose requests never finish by themselves: one token every 20 ms, forever.
fn endless_engine() -> Arc<FakeEngine> {
    FakeEngine::new(|_| Script {
        delay: Duration::from_millis(20),
        repeat: true,
        ..Script::text("la")
    })
}

async fn timeout_server() -> TestServer {
    TestServer::start_with(endless_engine(), |config| {
        config.request_timeout = Some(Duration::from_millis(300));
    })
    .await
}

async fn assert_only_request_aborted(server: &TestServer) {
    let ids: Vec<RequestId> = server.engine.ids();
    assert_eq!(ids.len(), 1);
    assert!(
        server.engine.wait_aborted(ids[0]).await,
        "the timed-out engine request must be aborted"
    );
}

#[tokio::test]
async fn request_timeout_aborts_a_non_streaming_request_with_504() {
    let server = timeout_server().await;
    let reply = server.post(CHAT, &chat_body(false)).await;
    let error = reply.error(504);
    assert_eq!(error["code"], "request_timeout");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("--request-timeout") && message.contains("0.3 s"),
        "{message}"
    );
    assert_only_request_aborted(&server).await;

    let reply = server
        .post("/v1/completions", &json!({"prompt": "hi"}))
        .await;
    assert_eq!(reply.error(504)["code"], "request_timeout");
}

#[tokio::test]
async fn request_timeout_ends_a_stream_with_an_error_event_then_done() {
    let server = timeout_server().await;
    let reply = server.post(CHAT, &chat_body(true)).await;
    assert_eq!(reply.status, 200);
    let events = reply.events(); // asserts the final [DONE]
    let error_at = events
        .iter()
        .position(|e| e.get("error").is_some())
        .unwrap_or_else(|| panic!("no error event: {}", reply.body));
    let error = &events[error_at]["error"];
    assert_eq!(error["code"], "request_timeout");
    assert!(error["message"]
        .as_str()
        .unwrap()
        .contains("--request-timeout"));
    assert!(
        events[..error_at]
            .iter()
            .any(|e| e["choices"][0]["delta"]["content"].is_string()),
        "tokens streamed before the timeout"
    );
    let last = events.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "error");
    assert_only_request_aborted(&server).await;

    let reply = server
        .post("/v1/completions", &json!({"prompt": "hi", "stream": true}))
        .await;
    let events = reply.events();
    assert!(events
        .iter()
        .any(|e| e["error"]["code"] == "request_timeout"));
}

/// A Responses API generation that fails (here: `--request-timeout` expires) ends its stream with
/// `response.failed`, whose response has status `failed` and the error, after the text streamed so
/// far (reasoning text, with the fixture's thinking template); a non-streaming one answers 504 as the chat endpoints do. Either way the engine request is
/// aborted.
#[tokio::test]
async fn request_timeout_fails_a_response_with_response_failed() {
    let server = timeout_server().await;
    let reply = server
        .post("/v1/responses", &json!({"input": "hi", "stream": true}))
        .await;
    let events = reply.named_events();
    let data = events.last().expect("no events");
    assert_eq!(data["type"], "response.failed", "{}", reply.body);
    assert_eq!(data["response"]["status"], "failed");
    assert_eq!(data["response"]["error"]["code"], "request_timeout");
    assert!(data["response"]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--request-timeout"));
    assert!(
        events
            .iter()
            .any(|e| e["type"].as_str().unwrap().ends_with("_text.delta")),
        "text streamed before the timeout: {}",
        reply.body
    );
    assert!(
        !events.iter().any(|e| e["type"] == "response.completed"),
        "{}",
        reply.body
    );
    assert_only_request_aborted(&server).await;

    let server = timeout_server().await;
    let reply = server.post("/v1/responses", &json!({"input": "hi"})).await;
    assert_eq!(
        reply.error(504)["code"],
        "request_timeout",
        "{}",
        reply.body
    );
    assert_only_request_aborted(&server).await;
}

#[tokio::test]
async fn zero_request_timeout_means_none() {
    let server = TestServer::start_with(
        FakeEngine::new(|_| Script {
            delay: Duration::from_millis(100),
            ..Script::text("la la la la")
        }),
        |config| config.request_timeout = None,
    )
    .await;
    let reply = server.post(CHAT, &chat_body(false)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(server.engine.aborted().is_empty());
}

#[tokio::test]
async fn connections_over_the_limit_wait_without_disturbing_open_ones() {
    let server = TestServer::start_with(FakeEngine::replying("hi"), |config| {
        config.max_connections = 2;
    })
    .await;
    let (mut first, _first_task) = connect(server.addr).await;
    let (mut second, second_task) = connect(server.addr).await;
    for sender in [&mut first, &mut second] {
        let response = sender
            .send_request(build("GET", "/v1/models", None))
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.into_body().collect().await.unwrap();
    }

    // The third connection is not served while two are open.
    let addr = server.addr;
    let mut third = tokio::spawn(async move {
        let (mut sender, _task) = connect(addr).await;
        let response = sender
            .send_request(build("GET", "/v1/models", None))
            .await
            .unwrap();
        response.status().as_u16()
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut third)
            .await
            .is_err(),
        "a connection over the limit must wait"
    );

    // The open ones keep working.
    let response = first
        .send_request(build("GET", "/v1/models", None))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.unwrap();

    // Closing one lets the waiting connection in.
    drop(second);
    second_task.abort();
    let status = tokio::time::timeout(Duration::from_secs(10), third)
        .await
        .expect("the waiting connection is served once a slot frees")
        .unwrap();
    assert_eq!(status, 200);
}
