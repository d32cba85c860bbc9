//! `deltaserve serve` on the demo model over real HTTP with the real engine: 32 concurrent streaming
//! requests through a running batch of 4 (the rest queue) each equal their solo greedy reply (the cpu
//! backend is batch-invariant), and a client that disconnects mid-stream frees its KV blocks and state
//! slot (visible in /metrics).

use deltaserve_api::http_client::{drain_sse_payloads, Connection, Target};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
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
