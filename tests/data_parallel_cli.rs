//! `deltaserve serve --dp-size 2` on the demo model (cpu, one thread per replica) over real HTTP:
//! concurrent greedy requests are spread over both replicas (each replica's own generated-token
//! counter in /metrics grows, and the totals are their sum), every answer equals the one
//! `--dp-size 1` gives, /health is 200 only once both replicas passed the canary, /get_load and
//! /server_info report both replicas, SIGTERM with streams on both replicas lets them finish and
//! exits 0; and bad `--dp-size` values stop the command with an error naming the flag.

use deltaserve_client::http_client::{drain_sse_payloads, Connection, Target};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BINARY: &str = env!("CARGO_BIN_EXE_deltaserve");
const TIMEOUT: Duration = Duration::from_secs(240);
const REQUESTS: usize = 8;

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

/// `deltaserve serve` on the demo model with `--dp-size dp`, one cpu thread per replica.
fn start_server(dp: usize) -> Server {
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
            "--backend",
            "cpu",
            "--threads",
            &dp.to_string(),
            "--dp-size",
            &dp.to_string(),
            "--max-running-requests",
            "4",
            "--max-mamba-cache-size",
            "4",
            "--enable-metrics",
        ])
        .env_remove("DELTASERVE_CPU_LEVEL")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start deltaserve serve");
    Server { child, port }
}

fn connection(port: u16) -> Connection {
    Connection::new(Target::parse(&format!("http://127.0.0.1:{port}")).unwrap())
}

async fn request(port: u16, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    tokio::time::timeout(TIMEOUT, connection(port).send_text(method, path, body))
        .await
        .expect("an answer in time")
        .expect("a response")
}

async fn get_json(port: u16, path: &str) -> Value {
    let (status, text) = request(port, "GET", path, None).await;
    assert_eq!(status, 200, "{path}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// Waits for /health 200; every answer before it must be 503 (loading, or the canary running).
async fn wait_ready(port: u16) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Ok(Ok((status, text))) = tokio::time::timeout(
            Duration::from_secs(30),
            connection(port).send_text("GET", "/health", None),
        )
        .await
        {
            if status == 200 {
                return;
            }
            assert_eq!(status, 503, "/health before ready: {text}");
        }
        assert!(Instant::now() < deadline, "the server never became healthy");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn chat_body(i: usize) -> Value {
    json!({"model": "demo", "messages": [{"role": "user", "content": format!("Compute {} + {}.", 11 + 2 * i, 20 + i)}],
        "max_tokens": 64, "temperature": 0})
}

/// The whole message (reasoning and content) of a greedy reply.
async fn reply(port: u16, i: usize) -> String {
    let (status, text) = request(port, "POST", "/v1/chat/completions", Some(&chat_body(i))).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    v["choices"][0]["message"].to_string()
}

/// A counter's sample with exactly the labels `labels` (`""` for none).
fn sample(metrics: &str, name: &str, labels: &str) -> f64 {
    let prefix = format!("{name}{labels} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name}{labels} in /metrics:\n{metrics}"))
}

fn generated(metrics: &str, labels: &str) -> f64 {
    sample(metrics, "deltaserve_engine_generated_tokens_total", labels)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn two_replicas_share_the_requests_and_answer_as_one_engine() {
    let rt = runtime();
    let solo: Vec<String> = {
        let server = start_server(1);
        let port = server.port;
        rt.block_on(async move {
            wait_ready(port).await;
            let info = get_json(port, "/server_info").await;
            assert_eq!(info["dp_size"], 1);
            let metrics = request(port, "GET", "/metrics", None).await.1;
            assert!(
                !metrics.contains("replica=\""),
                "one engine has no replica label"
            );
            let mut replies = Vec::new();
            for i in 0..REQUESTS {
                replies.push(reply(port, i).await);
            }
            replies
        })
    };

    let mut server = start_server(2);
    let port = server.port;
    rt.block_on(async move {
        wait_ready(port).await;
        let info = get_json(port, "/server_info").await;
        assert_eq!(info["dp_size"], 2);
        let load = get_json(port, "/get_load").await;
        let ranks: Vec<&Value> = load
            .as_array()
            .unwrap()
            .iter()
            .map(|e| &e["dp_rank"])
            .collect();
        assert_eq!(ranks, [&json!(0), &json!(1)], "{load}");

        // The canary ran on both replicas before /health said 200.
        let before = request(port, "GET", "/metrics", None).await.1;
        for replica in ["0", "1"] {
            let labels = format!("{{replica=\"{replica}\"}}");
            assert!(
                generated(&before, &labels) > 0.0,
                "the canary ran on replica {replica}"
            );
        }

        let tasks: Vec<_> = (0..REQUESTS)
            .map(|i| tokio::spawn(async move { reply(port, i).await }))
            .collect();
        let mut replies = Vec::new();
        for task in tasks {
            replies.push(task.await.unwrap());
        }
        for (i, (two, one)) in replies.iter().zip(&solo).enumerate() {
            assert_eq!(
                two, one,
                "request {i}: --dp-size 2 answered differently from --dp-size 1"
            );
        }

        let after = request(port, "GET", "/metrics", None).await.1;
        let mut sum = 0.0;
        for replica in ["0", "1"] {
            let labels = format!("{{replica=\"{replica}\"}}");
            let grew = generated(&after, &labels) - generated(&before, &labels);
            println!("replica {replica}: {grew} tokens generated for the {REQUESTS} requests");
            assert!(grew > 0.0, "replica {replica} served none of the requests");
            sum += generated(&after, &labels);
        }
        assert_eq!(
            generated(&after, ""),
            sum,
            "the unlabelled total is the replicas' sum"
        );
        let running = sample(&after, "deltaserve_kv_blocks_total", "");
        let each = sample(&after, "deltaserve_kv_blocks_total", "{replica=\"0\"}");
        assert_eq!(running, 2.0 * each, "pool totals add both replicas' pools");
    });

    // SIGTERM with a stream running on each replica: both finish, the process exits 0.
    let pid = server.child.id();
    let finishes = rt.block_on(async move {
        let (started_tx, mut started) = tokio::sync::mpsc::channel(2);
        let streams: Vec<_> = (0..2)
            .map(|i| {
                let started = started_tx.clone();
                tokio::spawn(async move { long_stream(port, i, started).await })
            })
            .collect();
        for _ in 0..2 {
            tokio::time::timeout(TIMEOUT, started.recv())
                .await
                .expect("both streams deliver tokens in time");
        }
        let killed = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(killed.success(), "kill -TERM {pid} failed");
        let mut finishes = Vec::new();
        for stream in streams {
            finishes.push(stream.await.unwrap());
        }
        finishes
    });
    assert_eq!(
        finishes,
        ["length", "length"],
        "both streams ran to max_tokens"
    );
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "deltaserve did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status after SIGTERM: {status}");
}

/// A streamed request of 96 tokens; says so on `started` once tokens flow, returns its finish
/// reason (the stream must end with `[DONE]`).
async fn long_stream(port: u16, i: usize, started: tokio::sync::mpsc::Sender<()>) -> String {
    let body = json!({"model": "demo", "messages": [{"role": "user", "content": format!("Count to {}.", 40 + i)}],
        "max_tokens": 96, "ignore_eos": true, "temperature": 0, "stream": true});
    let mut connection = connection(port);
    let (status, mut response) = tokio::time::timeout(
        TIMEOUT,
        connection.send("POST", "/v1/chat/completions", Some(&body)),
    )
    .await
    .expect("response headers in time")
    .expect("a response");
    assert_eq!(status, 200);
    let (mut buffer, mut events, mut finish) = (String::new(), 0, None);
    loop {
        let frame = tokio::time::timeout(TIMEOUT, response.frame())
            .await
            .expect("a frame in time")
            .unwrap_or_else(|| panic!("stream {i} ended without [DONE]"))
            .expect("a body frame");
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buffer.push_str(&String::from_utf8_lossy(&data));
        for payload in drain_sse_payloads(&mut buffer) {
            if payload == "[DONE]" {
                return finish
                    .unwrap_or_else(|| panic!("stream {i}: [DONE] without a finish_reason"));
            }
            let event: Value = serde_json::from_str(&payload).unwrap();
            assert!(event.get("error").is_none(), "stream {i}: {event}");
            if let Some(reason) = event["choices"][0]["finish_reason"].as_str() {
                finish = Some(reason.to_string());
            }
            events += 1;
            if events == 3 {
                let _ = started.send(()).await;
            }
        }
    }
}

#[test]
fn bad_dp_sizes_stop_the_command_naming_the_flag() {
    for (flags, expected) in [
        (
            &["--dp-size", "0"][..],
            "--dp-size must be at least 1, found 0",
        ),
        (&["--dp-size", "two"][..], "--dp-size"),
        (&["--dp-size", "-1"][..], "--dp-size"),
        (&["--data-parallel-size", "x"][..], "--data-parallel-size"),
        (&["--dp", "2", "--dp-size", "3"][..], "--dp 2"),
    ] {
        let out = Command::new(BINARY)
            .arg("serve")
            .args(flags)
            .output()
            .expect("run deltaserve serve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} was accepted");
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{flags:?}: {stderr}");
    }
}
