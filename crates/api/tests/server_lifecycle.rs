//! Server behaviour beyond single requests, over real HTTP against the fake engine: client disconnects
//! abort engine requests, /health states and its probe generation, /metrics text, graceful shutdown.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{build, connect, request, tokenizer, FakeEngine, Script, TestServer};
use deltaserve_api::{AppState, HealthStatus, ServeError, ServerConfig, Shutdown};
use deltaserve_engine::GenerationRequest;
use http_body_util::BodyExt;
use serde_json::json;
use tokio::io::AsyncWriteExt;

/// An endless slow generation, so only an abort can end it.
fn endless() -> Arc<FakeEngine> {
    FakeEngine::new(|_: &GenerationRequest| Script {
        delay: Duration::from_millis(20),
        repeat: true,
        ..Script::text("tick ")
    })
}

fn chat_body(stream: bool) -> Vec<u8> {
    json!({"messages": [{"role": "user", "content": "count"}], "stream": stream, "enable_thinking": false})
        .to_string()
        .into_bytes()
}

#[tokio::test]
async fn dropped_stream_aborts_the_engine_request() {
    let server = TestServer::start(endless()).await;
    let (mut sender, task) = connect(server.addr).await;
    let response = sender
        .send_request(build("POST", "/v1/chat/completions", Some(chat_body(true))))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    // Read until some generated text arrived (the role chunk, then content chunks), then hang up.
    let mut content_chunks = 0;
    while content_chunks < 3 {
        let frame = body.frame().await.unwrap().unwrap();
        if String::from_utf8_lossy(frame.data_ref().unwrap()).contains("\"content\":\"ick\"") {
            content_chunks += 1;
        }
    }
    let id = server.engine.ids()[0];
    assert!(!server.engine.aborted().contains(&id));
    // The open stream and the /metrics request itself are in flight.
    let in_flight = |text: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix("deltaserve_http_requests_in_flight "))
            .map(str::to_string)
    };
    assert_eq!(
        in_flight(&server.get("/metrics").await.body).as_deref(),
        Some("2")
    );
    drop(body);
    drop(sender);
    task.abort();
    assert!(
        server.engine.wait_aborted(id).await,
        "the engine request must be aborted after a disconnect"
    );
    assert_eq!(
        in_flight(&server.get("/metrics").await.body).as_deref(),
        Some("1")
    );
}

#[tokio::test]
async fn closed_connection_aborts_a_non_streaming_request() {
    let server = TestServer::start(endless()).await;
    let mut socket = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let body = chat_body(false);
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(&body).await.unwrap();
    for _ in 0..200 {
        if !server.engine.ids().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let id = server.engine.ids()[0];
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(socket);
    assert!(
        server.engine.wait_aborted(id).await,
        "a closed connection must abort its engine request"
    );
}

#[tokio::test]
async fn health_states_and_probe_generation() {
    let engine = FakeEngine::replying("Hi<|im_end|>");
    let mut config = ServerConfig::new("test-model");
    config.health_interval = Duration::from_millis(300);
    let state = Arc::new(AppState::new(config, tokenizer()));
    let server = TestServer::serve(state.clone(), engine.clone()).await;

    // Loading: 503 with the reason, no generation attempted.
    state.health.set(HealthStatus::Loading(
        "loading weights (3/10 shards)".into(),
    ));
    let reply = server.get("/health").await;
    assert_eq!(reply.status, 503);
    assert_eq!(
        reply.json(),
        json!({"status": "loading", "reason": "loading weights (3/10 shards)"})
    );

    // Ready but nothing generated yet: /health runs a one-token greedy probe before answering 200.
    state.attach_engine(engine.clone());
    state.health.set(HealthStatus::Ready);
    let reply = server.get("/health").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json(), json!({"status": "ok", "probed": true}));
    let probes = engine.requests();
    assert_eq!(probes.len(), 1);
    assert_eq!(probes[0].max_new_tokens, 1);
    assert_eq!(probes[0].sampling.temperature, 0.0);
    assert!(probes[0].disable_speculation);

    // A recent success answers at once; the alias behaves the same.
    let reply = server.get("/health_generate").await;
    assert_eq!(reply.json(), json!({"status": "ok", "probed": false}));
    assert_eq!(engine.requests().len(), 1);

    // A real request counts as proof of life.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let chat = json!({"messages": [{"role": "user", "content": "q"}]});
    assert_eq!(server.post("/v1/chat/completions", &chat).await.status, 200);
    assert_eq!(server.get("/health").await.json()["probed"], false);
    assert_eq!(engine.requests().len(), 2);

    // A failed start-up canary: 503 with its reason whatever the generations.
    state.health.set(HealthStatus::Failed(
        "canary answered 'prime prime prime'".into(),
    ));
    let reply = server.get("/health").await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.json()["status"], "failed");
    assert!(reply.json()["reason"].as_str().unwrap().contains("canary"));
}

#[tokio::test]
async fn health_probe_failure_is_503() {
    let engine = FakeEngine::new(|_: &GenerationRequest| Script {
        error: Some("NaN in logits".into()),
        ..Script::default()
    });
    let server = TestServer::start(engine).await;
    let reply = server.get("/health").await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.json()["status"], "unhealthy");
    assert!(reply.json()["reason"]
        .as_str()
        .unwrap()
        .contains("NaN in logits"));
}

#[tokio::test]
async fn metrics_text_format() {
    let server = TestServer::start(FakeEngine::replying("Hello world<|im_end|>")).await;
    server.state.set_engine_metrics(Arc::new(|| {
        "# HELP deltaserve_engine_running Sequences running.\n# TYPE deltaserve_engine_running gauge\ndeltaserve_engine_running 0\n".to_string()
    }));
    let chat = json!({"messages": [{"role": "user", "content": "q"}], "enable_thinking": false});
    assert_eq!(server.post("/v1/chat/completions", &chat).await.status, 200);
    server
        .post("/v1/chat/completions", &json!({"messages": 5}))
        .await
        .error(400);
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    assert_eq!(
        server
            .post("/v1/chat/completions", &streamed)
            .await
            .events()
            .len(),
        6
    );
    let reply = server.get("/metrics").await;
    assert_eq!(reply.status, 200);
    let content_type = reply.headers.get("content-type").unwrap().to_str().unwrap();
    assert!(content_type.starts_with("text/plain; version=0.0.4"));
    let text = &reply.body;
    let expected_lines = [
        "deltaserve_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2",
        "deltaserve_http_requests_total{route=\"/v1/chat/completions\",status=\"400\"} 1",
        // Only the /metrics request itself is in flight: the finished stream was counted out.
        "deltaserve_http_requests_in_flight 1",
        "deltaserve_generation_tokens_total 10",
        "deltaserve_request_finished_total{finish_reason=\"stop\"} 2",
        "deltaserve_time_to_first_token_seconds_count 2",
        "deltaserve_time_per_output_token_seconds_count 2",
        "deltaserve_e2e_request_latency_seconds_bucket{le=\"+Inf\"} 2",
    ];
    for line in expected_lines {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert!(
        text.ends_with("deltaserve_engine_running 0\n"),
        "engine text is appended"
    );
    // Every sample line is `name{labels} value` with a numeric value, and every family is typed.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (name, value) = line.rsplit_once(' ').unwrap();
        assert!(value.parse::<f64>().is_ok(), "{line}");
        let family = name.split('{').next().unwrap();
        assert!(family.starts_with("deltaserve_"), "{line}");
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                family
                    .strip_suffix(s)
                    .filter(|b| text.contains(&format!("# TYPE {b} histogram")))
            })
            .unwrap_or(family);
        assert!(
            text.contains(&format!("# TYPE {base} ")),
            "untyped family {family}"
        );
    }
    let off = TestServer::start_with(FakeEngine::replying("x"), |c| c.enable_metrics = false).await;
    off.get("/metrics").await.error(404);
}

#[tokio::test]
async fn graceful_shutdown_lets_requests_finish() {
    let engine = FakeEngine::new(|_: &GenerationRequest| Script {
        delay: Duration::from_millis(30),
        ..Script::text("one two three four five<|im_end|>")
    });
    let mut server = TestServer::start(engine).await;
    let addr = server.addr;
    let pending = tokio::spawn(async move {
        request(addr, "POST", "/v1/chat/completions", Some(chat_body(false))).await
    });
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(server.stop().await.unwrap(), Shutdown::Graceful);
    let reply = pending.await.unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.json()["choices"][0]["message"]["content"],
        "one two three four five"
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}

/// When the grace period runs out, a stream still running ends with an OpenAI error event
/// (`server_shutdown`) and `[DONE]`, not a cut connection, and its engine request is aborted.
#[tokio::test]
async fn grace_period_expiry_ends_streams_with_an_error_and_aborts() {
    let mut server =
        TestServer::start_with(endless(), |c| c.grace_period = Duration::from_millis(200)).await;
    let addr = server.addr;
    let pending = tokio::spawn(async move {
        let (mut sender, _task) = connect(addr).await;
        let response = sender
            .send_request(build("POST", "/v1/chat/completions", Some(chat_body(true))))
            .await
            .unwrap();
        let body = response.into_body().collect().await.map(|b| b.to_bytes());
        body.map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let id = server.engine.ids()[0];
    assert_eq!(server.stop().await.unwrap(), Shutdown::GracePeriodExpired);
    assert!(server.engine.wait_aborted(id).await);
    let body = pending
        .await
        .unwrap()
        .expect("the stream ends normally, not cut");
    let tail: String = body
        .chars()
        .rev()
        .take(400)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    assert!(
        tail.contains("server_shutdown"),
        "no shutdown error event: {tail}"
    );
    assert!(
        tail.trim_end().ends_with("data: [DONE]"),
        "no [DONE]: {tail}"
    );
}

/// Runs tests/openai_client.py (the official `openai` package) against this server and the fake engine.
/// Ignored by default because it needs Python with `openai`: `cargo test -p deltaserve-api -- --ignored`
/// (interpreter from DELTASERVE_PYTHON, default the repository's .venv).
#[tokio::test]
#[ignore]
async fn official_openai_client_against_fake_engine() {
    let engine = FakeEngine::new(|request: &GenerationRequest| {
        let prompt = tokenizer().decode(&request.prompt_ids, false).unwrap();
        if prompt.ends_with("</think>\n\n") {
            Script::text("The answer is 4.<|im_end|>")
        } else if prompt.ends_with("<think>\n") {
            Script::text("Two plus two.</think>\n\nThe answer is 4.<|im_end|>")
        } else {
            Script::text(" Paris.<|im_end|>")
        }
    });
    let server = TestServer::start(engine).await;
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap();
    let python = std::env::var("DELTASERVE_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| root.join(".venv/bin/python"));
    let script = root.join("tests/openai_client.py");
    let base_url = format!("http://{}", server.addr);
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(script)
            .args(["--base-url", &base_url, "--expect", "4"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("8 passed, 0 failed"), "{stdout}");
}

#[tokio::test]
async fn bench_serve_drives_the_server() {
    use deltaserve_client::{run_bench_serve, BenchEndpoint, BenchServeConfig};
    let engine = FakeEngine::new(|_: &GenerationRequest| Script {
        delay: Duration::from_millis(2),
        repeat: true,
        ..Script::text("word ")
    });
    let server = TestServer::start(engine).await;
    for (endpoint, stream) in [
        (BenchEndpoint::Completions, true),
        (BenchEndpoint::Chat, false),
    ] {
        let args = BenchServeConfig {
            url: format!("http://{}/v1", server.addr),
            concurrency: 3,
            num_prompts: 7,
            input_len: 20,
            output_len: 6,
            model: None,
            stream,
            endpoint,
            temperature: 0.0,
            min_tokens: false,
            no_ignore_eos: false,
            seed: 3,
            request_timeout: 30,
            multi_turn: 1,
            shared_prefix_len: 0,
            chat_template_kwargs: None,
            tool_calls: false,
            resend_reasoning: false,
        };
        let report = run_bench_serve(&args).await.unwrap();
        assert_eq!(report.model, "test-model");
        assert_eq!(
            (report.completed, report.failed),
            (7, 0),
            "{:?}",
            report.errors
        );
        assert_eq!(
            report.output_tokens,
            7 * 6,
            "ignore_eos + max_tokens give fixed-length outputs"
        );
        assert!(report.prompt_tokens >= 7 * 20, "{}", report.prompt_tokens);
        assert!(report.request_throughput > 0.0 && report.output_throughput > 0.0);
        assert!(report.e2e.p50 > 0.0 && report.e2e.p99 >= report.e2e.p50);
        if stream {
            // Six 2 ms tokens: TTFT, TPOT and ITL are all measured.
            assert!(report.ttft.p50 > 0.0 && report.ttft.p50 <= report.e2e.p50);
            assert!(report.tpot.mean >= 0.001, "{:?}", report.tpot);
            assert!(report.itl.p50 > 0.0);
        }
        let text = report.render();
        assert!(
            text.contains("Successful requests:") && text.contains("P99 E2E (ms):"),
            "{text}"
        );
    }
    // Every request reached the engine with ignore_eos (no stop ids) and the requested budget.
    let requests = server.engine.requests();
    assert_eq!(requests.len(), 14);
    assert!(requests
        .iter()
        .all(|r| r.stop_token_ids.is_empty() && r.max_new_tokens == 6));
}

#[tokio::test]
async fn bench_serve_multi_turn_resends_the_history() {
    use deltaserve_client::{run_bench_serve, BenchEndpoint, BenchServeConfig};
    let engine = FakeEngine::new(|_: &GenerationRequest| Script {
        delay: Duration::from_millis(1),
        repeat: true,
        ..Script::text("reply ")
    });
    let server = TestServer::start(engine).await;
    let args = BenchServeConfig {
        url: format!("http://{}", server.addr),
        concurrency: 2,
        num_prompts: 3,
        input_len: 10,
        output_len: 4,
        model: None,
        stream: true,
        endpoint: BenchEndpoint::Chat,
        temperature: 0.0,
        min_tokens: false,
        no_ignore_eos: false,
        seed: 1,
        request_timeout: 30,
        multi_turn: 3,
        shared_prefix_len: 40,
        chat_template_kwargs: None,
        tool_calls: false,
        resend_reasoning: false,
    };
    let report = run_bench_serve(&args).await.unwrap();
    assert_eq!(
        (report.completed, report.failed),
        (9, 0),
        "{:?}",
        report.errors
    );
    assert_eq!(report.ttft_by_turn.len(), 3);
    assert!(report.ttft_by_turn.iter().all(|d| d.p50 > 0.0));
    assert!(report.render().contains("Turn 3 mean / P50 TTFT (ms):"));
    let json = report.to_json();
    assert_eq!(json["ttft_by_turn_s"].as_array().unwrap().len(), 3);
    assert_eq!(json["cached_tokens"], 0, "the fake engine caches nothing");
    // Each turn resends the shared system prompt, the earlier turns and their replies.
    let mut lengths: Vec<usize> = server
        .engine
        .requests()
        .iter()
        .map(|r| r.prompt_ids.len())
        .collect();
    lengths.sort_unstable();
    assert!(lengths[0] >= 40, "{lengths:?}");
    assert!(lengths[8] > lengths[0] + 2 * 10, "{lengths:?}");
    assert!(args.multi_turn > 1);
    let chat_only = run_bench_serve(&BenchServeConfig {
        endpoint: BenchEndpoint::Completions,
        ..args.clone()
    })
    .await;
    assert!(chat_only.is_err());

    // The agent loop: the server takes the tool definition, the resent calls and their results
    // (a tool message ends every turn after the first) and chat_template_kwargs, and each turn's
    // prompt extends the one before.
    let before = server.engine.requests().len();
    let agent = BenchServeConfig {
        num_prompts: 2,
        concurrency: 1,
        tool_calls: true,
        resend_reasoning: true,
        chat_template_kwargs: Some(serde_json::json!({"enable_thinking": false})),
        ..args
    };
    let report = run_bench_serve(&agent).await.unwrap();
    assert_eq!(
        (report.completed, report.failed),
        (6, 0),
        "{:?}",
        report.errors
    );
    let lengths: Vec<usize> = server.engine.requests()[before..]
        .iter()
        .map(|r| r.prompt_ids.len())
        .collect();
    assert!(
        lengths
            .chunks(3)
            .all(|turns| turns[0] < turns[1] && turns[1] < turns[2]),
        "{lengths:?}"
    );
}

/// When the engine reports its device lost, /health answers 503 with the cause and the server
/// drains and returns `DeviceLost`, so `serve` exits non-zero for its supervisor to restart it.
#[tokio::test]
async fn a_lost_device_turns_health_503_and_stops_the_server() {
    let mut server = TestServer::start(FakeEngine::replying("fine<|im_end|>")).await;
    assert_eq!(server.get("/health").await.status, 200);
    *server.engine.lost.lock().unwrap() = Some("CUDA_ERROR_ILLEGAL_ADDRESS".into());
    let reply = server.get("/health").await;
    assert_eq!(reply.status, 503);
    assert!(
        reply.json()["reason"]
            .as_str()
            .unwrap()
            .contains("CUDA_ERROR_ILLEGAL_ADDRESS"),
        "{:?}",
        reply.json()
    );
    let ended = tokio::time::timeout(Duration::from_secs(10), server.handle.take().unwrap())
        .await
        .expect("the server stops by itself")
        .unwrap();
    match ended {
        Err(ServeError::DeviceLost(cause)) => assert!(cause.contains("ILLEGAL_ADDRESS")),
        other => panic!("expected DeviceLost, got {other:?}"),
    }
}
