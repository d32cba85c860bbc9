//! `--api-key` and the request limits over real HTTP against the fake engine: 401s with OpenAI error
//! objects and a Bearer challenge, the open /health, /metrics behind the key unless `metrics_no_auth`,
//! and every `--max-*` limit refused with its status and a message naming the limit and the flag.

mod common;

use common::{FakeEngine, Reply, TestServer};
use deltaserve_api::{ApiKey, RequestLimits};
use serde_json::{json, Value};

const KEY: &str = "sk-test-0123456789";
const CHAT: &str = "/v1/chat/completions";

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

fn bearer(key: &str) -> [(&'static str, String); 1] {
    [("authorization", format!("Bearer {key}"))]
}

async fn get_auth(server: &TestServer, path: &str, key: &str) -> Reply {
    let [(name, value)] = bearer(key);
    server.get_with(path, &[(name, &value)]).await
}

async fn post_auth(server: &TestServer, path: &str, body: &Value, key: &str) -> Reply {
    let [(name, value)] = bearer(key);
    server.post_with(path, body, &[(name, &value)]).await
}

/// Asserts the 401: OpenAI error object, `invalid_api_key`, a Bearer challenge, the key not echoed.
fn assert_unauthorized(reply: &Reply, presented: &str) {
    let error = reply.error(401);
    assert_eq!(error["type"], "invalid_request_error");
    assert_eq!(error["code"], "invalid_api_key");
    assert_eq!(error["param"], Value::Null);
    assert_eq!(
        reply.headers.get("www-authenticate").map(|v| v.as_bytes()),
        Some(&b"Bearer"[..]),
        "{:?}",
        reply.headers
    );
    assert!(
        presented.is_empty() || !reply.body.contains(presented),
        "{}",
        reply.body
    );
    assert!(!reply.body.contains(KEY), "{}", reply.body);
}

async fn keyed_server(metrics_no_auth: bool) -> TestServer {
    TestServer::start_with(FakeEngine::replying("Paris.<|im_end|>"), |config| {
        config.api_key = Some(ApiKey::new(KEY));
        config.metrics_no_auth = metrics_no_auth;
    })
    .await
}

#[tokio::test]
async fn api_key_guards_every_route_but_health() {
    let server = keyed_server(false).await;
    let body = json!({"messages": user("Capital of France?"), "enable_thinking": false});

    assert_unauthorized(&server.post(CHAT, &body).await, "");
    assert_unauthorized(
        &post_auth(&server, CHAT, &body, "sk-wrong-key").await,
        "sk-wrong-key",
    );
    let prefix = &KEY[..KEY.len() - 1];
    assert_unauthorized(&post_auth(&server, CHAT, &body, prefix).await, "");
    let longer = format!("{KEY}x");
    assert_unauthorized(&post_auth(&server, CHAT, &body, &longer).await, &longer);
    let basic = server
        .post_with(CHAT, &body, &[("authorization", &format!("Basic {KEY}"))])
        .await;
    assert_unauthorized(&basic, "");
    assert_unauthorized(
        &server
            .post("/v1/completions", &json!({"prompt": "x"}))
            .await,
        "",
    );
    assert_unauthorized(&server.get("/v1/models").await, "");
    assert_unauthorized(&server.get("/v1/models/test-model").await, "");
    assert_unauthorized(&server.get("/metrics").await, "");
    // Unknown routes do not reveal themselves to unauthenticated clients.
    assert_unauthorized(&server.get("/v1/nothing").await, "");
    assert!(
        server.engine.requests().is_empty(),
        "no unauthenticated request reached the engine"
    );

    let reply = post_auth(&server, CHAT, &body, KEY).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["choices"][0]["message"]["content"], "Paris.");
    assert_eq!(server.engine.requests().len(), 1);
    let reply = server
        .post_with(CHAT, &body, &[("authorization", &format!("bearer {KEY}"))])
        .await;
    assert_eq!(
        reply.status, 200,
        "the scheme is case-insensitive: {}",
        reply.body
    );
    assert_eq!(get_auth(&server, "/v1/models", KEY).await.status, 200);
    let metrics = get_auth(&server, "/metrics", KEY).await;
    assert_eq!(metrics.status, 200);
    assert!(
        metrics.body.contains("status=\"401\""),
        "401s are counted: {}",
        metrics.body
    );

    for path in ["/health", "/health_generate"] {
        let reply = server.get(path).await;
        assert_eq!(reply.status, 200, "{path} is open: {}", reply.body);
        assert_eq!(reply.json()["status"], "ok");
    }
}

#[tokio::test]
async fn metrics_no_auth_opens_only_metrics() {
    let server = keyed_server(true).await;
    let metrics = server.get("/metrics").await;
    assert_eq!(metrics.status, 200, "{}", metrics.body);
    assert!(metrics.body.contains("# TYPE"), "{}", metrics.body);
    assert_unauthorized(&server.get("/v1/models").await, "");
    assert_unauthorized(
        &server.post(CHAT, &json!({"messages": user("q")})).await,
        "",
    );
}

#[tokio::test]
async fn without_a_key_everything_is_open() {
    let server = TestServer::start(FakeEngine::replying("ok<|im_end|>")).await;
    assert_eq!(server.get("/v1/models").await.status, 200);
    assert_eq!(server.get("/metrics").await.status, 200);
    // A client that sends a key anyway is not refused.
    assert_eq!(
        get_auth(&server, "/v1/models", "anything").await.status,
        200
    );
}

/// Asserts a 400 for `param` whose message names every one of `needles`.
fn assert_over(reply: &Reply, param: &str, needles: &[&str]) {
    let error = reply.error(400);
    assert_eq!(error["param"], param, "{}", reply.body);
    let message = error["message"].as_str().unwrap();
    for needle in needles {
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    }
}

#[tokio::test]
async fn default_limits_are_enforced_and_documented_numbers_hold() {
    // Room for 1024 one-word messages in the context.
    let engine = FakeEngine::with_context(|_| common::Script::text("ok<|im_end|>"), 8192);
    let server = TestServer::start(engine).await;
    let limits = RequestLimits::default();
    assert_eq!(
        (
            limits.max_messages,
            limits.max_prompt_tokens,
            limits.max_tokens_cap,
            limits.max_n,
            limits.max_top_logprobs,
            limits.max_stop_strings
        ),
        (1024, None, 32768, 16, 20, 16)
    );

    let many: Vec<Value> = (0..1025)
        .map(|_| json!({"role": "user", "content": "x"}))
        .collect();
    let reply = server.post(CHAT, &json!({"messages": many})).await;
    assert_over(&reply, "messages", &["1025", "1024", "--max-messages"]);

    let reply = server
        .post(CHAT, &json!({"messages": user("q"), "max_tokens": 32769}))
        .await;
    assert_over(
        &reply,
        "max_tokens",
        &["32769", "32768", "--max-tokens-cap"],
    );
    let reply = server
        .post(
            "/v1/completions",
            &json!({"prompt": "q", "max_completion_tokens": 40000}),
        )
        .await;
    assert_over(
        &reply,
        "max_completion_tokens",
        &["40000", "--max-tokens-cap"],
    );

    let reply = server
        .post(CHAT, &json!({"messages": user("q"), "n": 17}))
        .await;
    assert_over(&reply, "n", &["17", "16", "--max-n"]);

    let reply = server
        .post(
            CHAT,
            &json!({"messages": user("q"), "logprobs": true, "top_logprobs": 21}),
        )
        .await;
    assert_over(&reply, "top_logprobs", &["21", "20", "--max-top-logprobs"]);
    let reply = server
        .post("/v1/completions", &json!({"prompt": "q", "logprobs": 21}))
        .await;
    assert_over(&reply, "logprobs", &["21", "20", "--max-top-logprobs"]);

    let stops: Vec<String> = (0..17).map(|i| format!("STOP{i}")).collect();
    let reply = server
        .post(CHAT, &json!({"messages": user("q"), "stop": stops}))
        .await;
    assert_over(&reply, "stop", &["17", "16", "--max-stop-strings"]);
    let reply = server
        .post(
            CHAT,
            &json!({"messages": user("q"), "stop": ["ok", "y".repeat(257)]}),
        )
        .await;
    assert_over(&reply, "stop", &["stop[1]", "257", "256 bytes"]);

    assert!(
        server.engine.requests().is_empty(),
        "no request over a limit reached the engine"
    );

    // At the limits the requests go through.
    let at_limit: Vec<Value> = (0..1024)
        .map(|_| json!({"role": "user", "content": "x"}))
        .collect();
    let stops: Vec<String> = (0..16).map(|i| format!("STOP{i}")).collect();
    let body = json!({
        "messages": at_limit, "n": 16, "logprobs": true, "top_logprobs": 20,
        "stop": stops, "max_tokens": 8,
    });
    let reply = server.post(CHAT, &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["choices"].as_array().unwrap().len(), 16);
    let reply = server
        .post(
            CHAT,
            &json!({"messages": user("q"), "stop": ["z".repeat(256)], "max_tokens": 32768}),
        )
        .await;
    // 32768 passes the cap and is then refused by the 8192-token context, naming the numbers.
    let error = reply.error(400);
    assert_eq!(error["code"], "context_length_exceeded");
    assert!(error["message"].as_str().unwrap().contains("8192"));
}

#[tokio::test]
async fn configured_limits_name_their_flags() {
    let server = TestServer::start_with(FakeEngine::replying("ok<|im_end|>"), |config| {
        config.limits = RequestLimits {
            max_messages: 2,
            max_prompt_tokens: Some(5),
            max_tokens_cap: 10,
            max_n: 2,
            max_top_logprobs: 3,
            max_stop_strings: 1,
        };
        config.max_body_bytes = 2048;
    })
    .await;
    let three = json!([
        {"role": "system", "content": "s"},
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
    ]);
    let reply = server.post(CHAT, &json!({"messages": three})).await;
    assert_over(&reply, "messages", &["3", "2", "--max-messages"]);
    assert_eq!(reply.json()["error"]["code"], "limit_exceeded");

    let prompt = "p";
    let reply = server
        .post(
            "/v1/completions",
            &json!({"prompt": [1, 2, 3, 4, 5, 6], "max_tokens": 1}),
        )
        .await;
    assert_over(&reply, "prompt", &["6", "5", "--max-prompt-tokens"]);
    // The chat template alone makes the prompt longer than 5 tokens.
    let reply = server
        .post(CHAT, &json!({"messages": user(prompt), "max_tokens": 1}))
        .await;
    assert_over(&reply, "messages", &["5", "--max-prompt-tokens", "4096"]);

    let reply = server
        .post(
            "/v1/completions",
            &json!({"prompt": [1, 2], "max_tokens": 11}),
        )
        .await;
    assert_over(&reply, "max_tokens", &["11", "10", "--max-tokens-cap"]);
    let reply = server
        .post("/v1/completions", &json!({"prompt": [1, 2], "n": 3}))
        .await;
    assert_over(&reply, "n", &["3", "2", "--max-n"]);
    let reply = server
        .post("/v1/completions", &json!({"prompt": [1, 2], "logprobs": 4}))
        .await;
    assert_over(&reply, "logprobs", &["4", "3", "--max-top-logprobs"]);
    let reply = server
        .post(
            "/v1/completions",
            &json!({"prompt": [1, 2], "stop": ["a", "b"]}),
        )
        .await;
    assert_over(&reply, "stop", &["2", "1", "--max-stop-strings"]);

    let big = json!({"prompt": "x".repeat(3000)});
    let error = server.post("/v1/completions", &big).await.error(413);
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("2048") && message.contains("--max-body-bytes"),
        "{message}"
    );
    assert!(server.engine.requests().is_empty());

    // Within every limit: accepted, and a request without max_tokens gets the cap as its budget.
    let reply = server
        .post(
            "/v1/completions",
            &json!({"prompt": [1, 2, 3, 4, 5], "n": 2, "logprobs": 3, "stop": ["a"]}),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let requests = server.engine.requests();
    assert_eq!(requests.len(), 2);
    assert!(requests.iter().all(|r| r.max_new_tokens == 10));
}

/// A client that only announces a huge body gets its 413 at once; the server never waits for the bytes.
#[tokio::test]
async fn oversized_content_length_is_refused_before_the_body_arrives() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = TestServer::start(FakeEngine::replying("hi")).await;
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 40000000\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut buffer = vec![0u8; 4096];
    let read = tokio::time::timeout(std::time::Duration::from_secs(30), stream.read(&mut buffer))
        .await
        .expect("the server answers without waiting for the body")
        .unwrap();
    let text = String::from_utf8_lossy(&buffer[..read]);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("--max-body-bytes"), "{text}");
}
