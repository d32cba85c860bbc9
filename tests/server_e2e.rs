//! `deltaserve serve` on the demo model over real HTTP with the real engine: 32 concurrent streaming
//! requests through a running batch of 4 (the rest queue) each equal their solo greedy reply (the cpu
//! backend is batch-invariant), a client that disconnects mid-stream frees its KV blocks and state
//! slot (visible in /metrics), SIGTERM with streams in flight ends every stream and exits 0, and the
//! prefix cache reports cached tokens without changing a reply and empties on /flush_cache.

use deltaserve_client::http_client::{drain_sse_payloads, Connection, Target};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

const BINARY: &str = env!("CARGO_BIN_EXE_deltaserve");
const TIMEOUT: Duration = Duration::from_secs(240);

struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server() -> Server {
    start_server_with(&[])
}

/// `deltaserve serve` on the demo model with a running batch of 4 and `extra` flags.
fn start_server_with(extra: &[&str]) -> Server {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(BINARY)
        .args([
            "serve",
            "--port",
            &port.to_string(),
            "--max-running-requests",
            "4",
            "--max-mamba-cache-size",
            "4",
            "--enable-metrics",
        ])
        .args(extra)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start deltaserve serve");
    Server { child, port }
}

async fn request(port: u16, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let mut connection =
        Connection::new(Target::parse(&format!("http://127.0.0.1:{port}")).unwrap());
    tokio::time::timeout(TIMEOUT, connection.send_text(method, path, body))
        .await
        .expect("an answer in time")
        .expect("a response")
}

async fn wait_ready(port: u16) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut connection =
            Connection::new(Target::parse(&format!("http://127.0.0.1:{port}")).unwrap());
        if let Ok(Ok((200, _))) = tokio::time::timeout(
            Duration::from_secs(30),
            connection.send_text("GET", "/health", None),
        )
        .await
        {
            return;
        }
        assert!(Instant::now() < deadline, "the server never became healthy");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn question(i: usize) -> String {
    format!("Compute {} + {}.", 11 + 2 * i, 20 + i)
}

fn chat_body(i: usize, stream: bool) -> Value {
    json!({"model": "demo", "messages": [{"role": "user", "content": question(i)}], "max_tokens": 200, "temperature": 0, "stream": stream})
}

/// (reasoning, content) of a non-streaming reply.
async fn solo(port: u16, i: usize) -> (String, String) {
    let (status, text) = request(
        port,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body(i, false)),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let message = &v["choices"][0]["message"];
    (
        message["reasoning_content"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        message["content"].as_str().unwrap_or("").to_string(),
    )
}

/// (reasoning, content) assembled from a streamed reply.
async fn streamed(port: u16, i: usize) -> (String, String) {
    let (status, mut text) = request(
        port,
        "POST",
        "/v1/chat/completions",
        Some(&chat_body(i, true)),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let payloads = drain_sse_payloads(&mut text);
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    let (mut reasoning, mut content) = (String::new(), String::new());
    for p in &payloads[..payloads.len() - 1] {
        let v: Value = serde_json::from_str(p).unwrap();
        if let Some(delta) = v["choices"].get(0).map(|c| &c["delta"]) {
            reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
            content.push_str(delta["content"].as_str().unwrap_or(""));
        }
    }
    (reasoning, content)
}

fn gauge(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

#[test]
fn concurrent_streams_equal_solo_replies_and_disconnects_free_their_slots() {
    let server = start_server();
    let port = server.port;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        wait_ready(port).await;
        let mut alone = Vec::new();
        for i in 0..32 {
            alone.push(solo(port, i).await);
        }
        let tasks: Vec<_> = (0..32).map(|i| tokio::spawn(streamed(port, i))).collect();
        for (i, task) in tasks.into_iter().enumerate() {
            let together = task.await.unwrap();
            assert_eq!(together, alone[i], "request {i}: streamed among 32 differs from its solo reply");
            assert!(together.1.contains(&format!("{}", 31 + 3 * i)), "request {i}: wrong sum in {:?}", together.1);
        }

        // A client that goes away mid-stream: its request must be aborted and its slots freed.
        let mut connection = Connection::new(Target::parse(&format!("http://127.0.0.1:{port}")).unwrap());
        let long = json!({"model": "demo", "messages": [{"role": "user", "content": question(0)}], "max_tokens": 3000, "ignore_eos": true, "stream": true});
        let (status, mut body) = connection.send("POST", "/v1/chat/completions", Some(&long)).await.unwrap();
        assert_eq!(status, 200);
        // A few chunks in, tokens are flowing (the first chunk only carries the role).
        for _ in 0..10 {
            let frame = tokio::time::timeout(TIMEOUT, body.frame()).await.unwrap();
            assert!(frame.is_some(), "the stream ended early");
        }
        let (_, busy) = request(port, "GET", "/metrics", None).await;
        assert!(gauge(&busy, "deltaserve_state_slots_used") >= 1.0, "the long request holds a state slot");
        drop(body);
        drop(connection);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, metrics) = request(port, "GET", "/metrics", None).await;
            if gauge(&metrics, "deltaserve_state_slots_used") == 0.0 && gauge(&metrics, "deltaserve_kv_blocks_used") == 0.0 && gauge(&metrics, "deltaserve_running_requests") == 0.0 {
                break;
            }
            assert!(Instant::now() < deadline, "the disconnected request still holds its slots:\n{metrics}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    drop(server);
}

/// How one stream ended.
#[derive(Debug, Clone, PartialEq)]
enum StreamEnd {
    /// A chunk with a `finish_reason`, then `[DONE]`.
    Finished(String),
    /// An error event (`{"error": ...}`).
    ErrorEvent(String),
    /// The connection was cut (the body ended in a transport error or without `[DONE]`).
    Cut(String),
}

/// One stream of a SIGTERM test.
#[derive(Debug)]
struct StreamReport {
    end: StreamEnd,
    /// SSE events that arrived after SIGTERM was sent (proof the stream was in flight).
    events_after_signal: usize,
    /// When the stream ended, counted from SIGTERM.
    ended_after_signal: Duration,
}

/// Streams a long chat request; reports on `flowing` once a few events arrived, then reads to the end.
/// `signalled` holds the moment SIGTERM was sent. Every read is bounded by TIMEOUT, so a hanging stream
/// fails the test.
async fn long_stream(
    port: u16,
    i: usize,
    max_tokens: usize,
    flowing: tokio::sync::mpsc::Sender<usize>,
    signalled: Arc<OnceLock<Instant>>,
) -> StreamReport {
    let body = json!({"model": "demo", "messages": [{"role": "user", "content": question(i)}],
        "max_tokens": max_tokens, "ignore_eos": true, "temperature": 0, "stream": true});
    let mut connection =
        Connection::new(Target::parse(&format!("http://127.0.0.1:{port}")).unwrap());
    let (status, mut response) = tokio::time::timeout(
        TIMEOUT,
        connection.send("POST", "/v1/chat/completions", Some(&body)),
    )
    .await
    .expect("response headers in time")
    .expect("a response");
    assert_eq!(status, 200);
    let (mut buffer, mut events, mut events_after_signal) = (String::new(), 0usize, 0usize);
    let mut finish_reason = None;
    let end = 'read: loop {
        let frame = tokio::time::timeout(TIMEOUT, response.frame())
            .await
            .unwrap_or_else(|_| panic!("stream {i} hangs: no frame in {TIMEOUT:?}"));
        let data = match frame {
            None => break 'read StreamEnd::Cut("the body ended without [DONE]".into()),
            Some(Err(e)) => break 'read StreamEnd::Cut(e.to_string()),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue,
            },
        };
        buffer.push_str(&String::from_utf8_lossy(&data));
        for payload in drain_sse_payloads(&mut buffer) {
            if signalled.get().is_some() {
                events_after_signal += 1;
            }
            if payload == "[DONE]" {
                break 'read match finish_reason.take() {
                    Some(reason) => StreamEnd::Finished(reason),
                    None => StreamEnd::Cut("[DONE] without a finish_reason".into()),
                };
            }
            let event: Value = serde_json::from_str(&payload).unwrap();
            if let Some(error) = event.get("error") {
                break 'read StreamEnd::ErrorEvent(error.to_string());
            }
            if let Some(reason) = event["choices"][0]["finish_reason"].as_str() {
                finish_reason = Some(reason.to_string());
            }
            events += 1;
            if events == 4 {
                let _ = flowing.send(i).await;
            }
        }
    };
    let signal_at = *signalled
        .get()
        .unwrap_or_else(|| panic!("stream {i} ended before SIGTERM was sent: {end:?}"));
    StreamReport {
        end,
        events_after_signal,
        ended_after_signal: signal_at.elapsed(),
    }
}

/// What a SIGTERM test observed.
struct ShutdownRun {
    streams: Vec<StreamReport>,
    /// Whether new connections were refused after the signal.
    refused: bool,
    status: std::process::ExitStatus,
    /// From SIGTERM to the process's exit.
    exited_after_signal: Duration,
}

/// Starts `count` streams of `max_tokens` on a server with `grace_seconds`, waits until events flow on
/// all of them, sends SIGTERM, and waits (at most `exit_within`) for the streams and the process.
fn sigterm_with_streams_in_flight(
    grace_seconds: u64,
    count: usize,
    max_tokens: usize,
    exit_within: Duration,
) -> ShutdownRun {
    let grace = grace_seconds.to_string();
    let mut server = start_server_with(&["--shutdown-grace-period", &grace]);
    let port = server.port;
    let pid = server.child.id();
    let signalled: Arc<OnceLock<Instant>> = Arc::default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let signal_time = signalled.clone();
    let (streams, refused) = rt.block_on(async move {
        wait_ready(port).await;
        let (flowing_tx, mut flowing) = tokio::sync::mpsc::channel(count);
        let streams: Vec<_> = (0..count)
            .map(|i| {
                tokio::spawn(long_stream(
                    port,
                    i,
                    max_tokens,
                    flowing_tx.clone(),
                    signal_time.clone(),
                ))
            })
            .collect();
        for _ in 0..count {
            tokio::time::timeout(TIMEOUT, flowing.recv())
                .await
                .expect("events flow on every stream in time");
        }
        // libc is not a dependency; the `kill` utility sends the signal.
        signal_time.get_or_init(Instant::now);
        let killed = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(killed.success(), "kill -TERM {pid} failed");
        // Once the signal is handled the listener closes: new connections are refused.
        let deadline = Instant::now() + TIMEOUT;
        let refused = loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err()
            {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut reports = Vec::new();
        for stream in streams {
            reports.push(stream.await.expect("stream task"));
        }
        (reports, refused)
    });
    let signal_at = *signalled.get().expect("SIGTERM was sent");
    let deadline = signal_at + exit_within;
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "deltaserve did not exit within {exit_within:?} of SIGTERM (grace period {grace_seconds} s)"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let run = ShutdownRun {
        streams,
        refused,
        status,
        exited_after_signal: signal_at.elapsed(),
    };
    for (i, stream) in run.streams.iter().enumerate() {
        eprintln!("stream {i}: {stream:?}");
    }
    eprintln!(
        "exit {} {:?} after SIGTERM",
        run.status, run.exited_after_signal
    );
    run
}

/// SIGTERM while streams run, with a grace period long enough for them: every stream was still
/// receiving events after the signal, gets its final chunk (`finish_reason` "length") and `[DONE]`;
/// nothing new is accepted; the process exits 0.
#[test]
fn sigterm_lets_in_flight_streams_finish_then_exits_zero() {
    let run = sigterm_with_streams_in_flight(200, 4, 1500, Duration::from_secs(260));
    for (i, stream) in run.streams.iter().enumerate() {
        assert_eq!(
            stream.end,
            StreamEnd::Finished("length".into()),
            "stream {i} did not finish within the grace period"
        );
        assert!(
            stream.events_after_signal > 0,
            "stream {i} had finished before SIGTERM, so the test proved nothing; raise max_tokens"
        );
    }
    assert!(run.refused, "the listener stayed open after SIGTERM");
    assert_eq!(run.status.code(), Some(0), "exit status {}", run.status);
}

/// SIGTERM while streams too long for a 2 s grace period run: no stream hangs and none is ended before
/// the grace period is over; each still running then ends with an error event (code
/// `server_shutdown`), never a cut connection (or, on a fast machine, finishes); the process exits 0.
#[test]
fn sigterm_grace_period_expiry_ends_every_stream_and_exits_zero() {
    let grace = Duration::from_secs(2);
    let run = sigterm_with_streams_in_flight(grace.as_secs(), 4, 8000, Duration::from_secs(120));
    for (i, stream) in run.streams.iter().enumerate() {
        match &stream.end {
            StreamEnd::Finished(_) => {}
            StreamEnd::ErrorEvent(error) => assert!(
                error.contains("server_shutdown"),
                "stream {i} ended with another error: {error}"
            ),
            StreamEnd::Cut(why) => {
                panic!("stream {i} was cut without a final chunk or error: {why}")
            }
        }
        if !matches!(stream.end, StreamEnd::Finished(_)) {
            assert!(
                stream.ended_after_signal + Duration::from_millis(100) >= grace,
                "stream {i} was ended {:?} after SIGTERM, before the {grace:?} grace period was over: \
                 {:?}",
                stream.ended_after_signal,
                stream.end
            );
        }
    }
    assert!(run.refused, "the listener stayed open after SIGTERM");
    assert_eq!(run.status.code(), Some(0), "exit status {}", run.status);
}

/// The prefix cache over HTTP: a repeated long prompt reports cached tokens and gets the same reply,
/// `/metrics` shows what the cache holds, `/flush_cache` empties both pools, and afterwards the prompt
/// is computed in full again, still with the same reply.
#[test]
fn prefix_cache_hits_report_cached_tokens_and_flush_empties_the_pools() {
    let server = start_server();
    let port = server.port;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        wait_ready(port).await;
        let system = (0..40)
            .map(|i| format!("Fact {i}: {} + {} is noted.", i, 2 * i))
            .collect::<Vec<_>>()
            .join(" ");
        let body = json!({"model": "demo", "messages": [{"role": "system", "content": system}, {"role": "user", "content": question(3)}], "max_tokens": 40, "temperature": 0});
        let ask = || async {
            let (status, text) = request(port, "POST", "/v1/chat/completions", Some(&body)).await;
            assert_eq!(status, 200, "{text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            (
                v["choices"][0]["message"].clone(),
                v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
                v["usage"]["prompt_tokens"].as_u64().unwrap(),
            )
        };
        let (first, cached, prompt) = ask().await;
        assert_eq!(cached, 0);
        let (second, cached, _) = ask().await;
        assert_eq!(second, first, "a cached hit changed the reply");
        assert!(cached >= 64 && cached < prompt, "cached {cached} of {prompt}");
        let (_, metrics) = request(port, "GET", "/metrics", None).await;
        assert!(gauge(&metrics, "deltaserve_prefix_cache_kv_blocks") > 0.0, "{metrics}");
        assert!(gauge(&metrics, "deltaserve_cache_hit_rate") > 0.0, "{metrics}");
        let (status, text) = request(port, "POST", "/flush_cache", Some(&json!({}))).await;
        assert_eq!(status, 200, "{text}");
        assert!(text.contains("flushed"), "{text}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, metrics) = request(port, "GET", "/metrics", None).await;
            if gauge(&metrics, "deltaserve_kv_blocks_used") == 0.0
                && gauge(&metrics, "deltaserve_state_slots_used") == 0.0
            {
                break;
            }
            assert!(Instant::now() < deadline, "the flush left pages or slots:\n{metrics}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (third, cached, _) = ask().await;
        assert_eq!((third, cached), (first, 0));
    });
    drop(server);
}
