//! The founding failure (docs/serving.md), end to end with the built `deltaserve` binary on the
//! bundled demo model: with MTP speculation and the diagnostic broken attention backend the output
//! loops while draft acceptance stays high; the detector flags it and the log blames the target
//! forward pass; the canary keeps /health at 503; doctor names the attention op; smoke fails. With
//! the correct backend all of it passes. Servers run on free ports and are killed when a test ends,
//! also on panic.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use deltaserve_api::spec_counters::parse_spec_counters;
use deltaserve_client::http_client::{Connection, Target};
use serde_json::{json, Value};

const BINARY: &str = env!("CARGO_BIN_EXE_deltaserve");
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(240);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);
/// Tokens per request: enough for the broken model to loop into the limit, short enough for a debug
/// build on a small machine.
const MAX_TOKENS: usize = 200;

/// The two tests share a few CPU cores: one server at a time keeps timings and timeouts sane.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh directory for this test's logs.
fn scratch_dir(name: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "deltaserve-founding-{}-{name}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create the scratch directory");
    dir
}

/// A port that was free a moment ago (the server binds it right after).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// A `deltaserve serve` child process, killed on drop; its stderr goes to a file.
struct Server {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Server {
    fn start(extra: &[&str], dir: &Path) -> Self {
        let port = free_port();
        let log = dir.join("serve.stderr");
        let stderr = File::create(&log).expect("create the server log");
        let port_text = port.to_string();
        let mut args = vec![
            "serve",
            "--model-path",
            "models/demo",
            "--port",
            &port_text,
            "--reasoning-parser",
            "qwen3",
            "--speculative-algorithm",
            "NEXTN",
            "--enable-metrics",
        ];
        args.extend_from_slice(extra);
        let child = Command::new(BINARY)
            .args(&args)
            .current_dir(repo_root())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start deltaserve serve");
        Self { child, port, log }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls /health until the server has finished starting (loaded and canary judged); returns the
    /// final status and body.
    fn wait_started(&mut self, rt: &tokio::runtime::Runtime) -> (u16, Value) {
        let deadline = Instant::now() + SERVER_START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "the server exited during start-up ({status}):\n{}",
                    self.log_text()
                );
            }
            if let Ok((status, body)) = http(rt, self.port, "GET", "/health", None) {
                let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                if status == 200 || body["status"] == "failed" {
                    return (status, body);
                }
            }
            assert!(
                Instant::now() < deadline,
                "the server did not finish starting within {SERVER_START_TIMEOUT:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- server log ({}) ---\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

/// One HTTP request with a bounded wait: (status, body).
fn http(
    rt: &tokio::runtime::Runtime,
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, String), String> {
    let target = Target::parse(&format!("http://127.0.0.1:{port}")).map_err(|e| e.to_string())?;
    rt.block_on(async {
        let mut connection = Connection::new(target);
        tokio::time::timeout(REQUEST_TIMEOUT, connection.send_text(method, path, body))
            .await
            .map_err(|_| format!("{method} {path}: no answer within {REQUEST_TIMEOUT:?}"))?
    })
}

fn chat(rt: &tokio::runtime::Runtime, port: u16, prompt: &str, max_tokens: usize) -> Value {
    let body = json!({
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    });
    let (status, text) =
        http(rt, port, "POST", "/v1/chat/completions", Some(&body)).expect("chat request");
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).expect("chat response is JSON")
}

fn metrics(rt: &tokio::runtime::Runtime, port: u16) -> String {
    let (status, text) = http(rt, port, "GET", "/metrics", None).expect("GET /metrics");
    assert_eq!(status, 200, "{text}");
    text
}

/// Value of a Prometheus sample line `name value`.
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in\n{metrics}"))
}

/// Output of a finished `deltaserve` subcommand.
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `deltaserve args` to completion within [`COMMAND_TIMEOUT`] (killed past it).
fn run_command(args: &[&str], dir: &Path, name: &str) -> Finished {
    let (out_path, err_path) = (
        dir.join(format!("{name}.stdout")),
        dir.join(format!("{name}.stderr")),
    );
    let mut child = Command::new(BINARY)
        .args(args)
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).expect("create stdout file"))
        .stderr(File::create(&err_path).expect("create stderr file"))
        .spawn()
        .expect("start deltaserve");
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for deltaserve") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`deltaserve {}` ran past {COMMAND_TIMEOUT:?}",
                args.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Finished {
        status,
        stdout: std::fs::read_to_string(out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(err_path).unwrap_or_default(),
    }
}

fn smoke(server: &Server, dir: &Path) -> (Finished, Value) {
    let url = server.url();
    let max_tokens = MAX_TOKENS.to_string();
    let finished = run_command(
        &[
            "smoke",
            "--url",
            &url,
            "--json",
            "--max-tokens",
            &max_tokens,
            "--timeout",
            "120",
        ],
        dir,
        "smoke",
    );
    let report: Value = serde_json::from_str(&finished.stdout).unwrap_or_else(|e| {
        panic!(
            "smoke --json printed no JSON ({e}): {}\n{}",
            finished.stdout, finished.stderr
        )
    });
    (finished, report)
}

fn smoke_result<'a>(report: &'a Value, check: &str) -> &'a str {
    report["checks"]
        .as_array()
        .and_then(|checks| checks.iter().find(|c| c["check"] == check))
        .and_then(|c| c["result"].as_str())
        .unwrap_or_else(|| panic!("no {check:?} row in {report}"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

#[test]
fn broken_attention_with_mtp_loops_at_high_acceptance_and_every_guard_catches_it() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let rt = runtime();
    let dir = scratch_dir("broken");
    // The canary stays on (no --skip-canary); `stop` also ends looping requests early.
    let mut server = Server::start(
        &[
            "--attention-backend",
            "diagnostic-broken-attention",
            "--degeneration-action",
            "stop",
        ],
        &dir,
    );

    // (3) The canary failed: /health is 503 and says why.
    let (status, health) = server.wait_started(&rt);
    assert_eq!(status, 503, "{health}");
    assert_eq!(health["status"], "failed", "{health}");
    assert!(
        health["reason"].as_str().unwrap().contains("canary"),
        "{health}"
    );

    // Requests are still served while /health is 503 (the founding incident: "server up").
    let before = parse_spec_counters(&metrics(&rt, server.port)).expect("spec counters exported");
    let reply = chat(&rt, server.port, "What is 2+2? Answer briefly.", MAX_TOKENS);
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{reply}");
    let content = choice["message"]["content"].as_str().unwrap_or_default();

    // (1) The output loops while draft acceptance stays high: per request and in /metrics.
    let spec = &reply["usage"]["spec_decoding"];
    let drafted = spec["draft_tokens"].as_f64().expect("MTP drafted tokens");
    let accepted = spec["accepted_tokens"].as_f64().unwrap();
    assert!(drafted >= 50.0, "{reply}");
    assert!(
        accepted / drafted >= 0.6,
        "acceptance {accepted}/{drafted}: {reply}"
    );
    let after = parse_spec_counters(&metrics(&rt, server.port)).unwrap();
    let window = after.since(before);
    assert!(
        window.accepted as f64 / window.drafted as f64 >= 0.6,
        "server-wide acceptance {window:?}"
    );

    // (2) The detector flagged it; the report and the log blame the target forward pass.
    let report = &choice["degeneration"];
    assert_eq!(report["kind"], "periodic_loop", "{reply}");
    assert_eq!(report["cause"], "target_forward", "{report}");
    assert!(report["diagnosis"]
        .as_str()
        .unwrap()
        .contains("TARGET forward pass"));
    let span = report["span"].as_str().unwrap();
    assert!(
        !span.is_empty() && content.ends_with(&span.repeat(4)),
        "the content ends in the reported loop {span:?}: {content:?}"
    );
    let log = server.log_text();
    let warning = log
        .lines()
        .find(|l| l.starts_with("WARNING degenerate output"))
        .unwrap_or_else(|| panic!("no degeneration warning in the log:\n{log}"));
    assert!(warning.contains(reply["id"].as_str().unwrap()), "{warning}");
    assert!(warning.contains("TARGET forward pass"), "{warning}");
    assert!(warning.contains("deltaserve doctor"), "{warning}");

    // `--degeneration-action stop`: a longer request is ended at the verdict, OpenAI-valid.
    let stopped = chat(
        &rt,
        server.port,
        "What is 2+2? Answer briefly.",
        3 * MAX_TOKENS,
    );
    let choice = &stopped["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{stopped}");
    assert_eq!(choice["degeneration"]["stopped"], true, "{stopped}");
    let generated = stopped["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(generated < 3 * MAX_TOKENS as u64, "{stopped}");

    let text = metrics(&rt, server.port);
    let flagged = sample(
        &text,
        "deltaserve_degenerate_requests_total{kind=\"periodic_loop\"}",
    );
    assert!(flagged >= 2.0, "{text}");

    // (5) smoke fails against it, on the answers and on the detector, not only on /health.
    let (finished, smoke_report) = smoke(&server, &dir);
    assert_eq!(finished.status.code(), Some(1), "{}", finished.stdout);
    assert_eq!(smoke_report["passed"], false);
    for check in ["health", "2+2 answer", "prime function", "degeneration"] {
        assert_eq!(smoke_result(&smoke_report, check), "fail", "{smoke_report}");
    }

    // (3) After all that traffic the canary still keeps /health at 503 (degenerate replies do not
    // count as proof of health).
    let (status, _) = http(&rt, server.port, "GET", "/health", None).unwrap();
    assert_eq!(status, 503);
    drop(server);

    // (4) doctor exits non-zero and names the attention op of the full-attention layers.
    let doctor = run_command(
        &[
            "doctor",
            "--model-path",
            "models/demo",
            "--attention-backend",
            "diagnostic-broken-attention",
        ],
        &dir,
        "doctor",
    );
    assert_eq!(doctor.status.code(), Some(1), "{}", doctor.stdout);
    let verdict = doctor
        .stderr
        .lines()
        .chain(doctor.stdout.lines())
        .find(|l| l.contains("first diverging op"))
        .unwrap_or_else(|| {
            panic!(
                "no diverging op named:\n{}\n{}",
                doctor.stdout, doctor.stderr
            )
        });
    assert!(
        verdict.contains("attention (") && verdict.contains("full_attention"),
        "{verdict}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_correct_backend_passes_every_guard() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let rt = runtime();
    let dir = scratch_dir("correct");
    let mut server = Server::start(&[], &dir);

    let (status, health) = server.wait_started(&rt);
    assert_eq!(status, 200, "{health}");

    let reply = chat(&rt, server.port, "What is 2+2? Answer briefly.", MAX_TOKENS);
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{reply}");
    assert!(
        choice["message"]["content"].as_str().unwrap().contains('4'),
        "{reply}"
    );
    assert!(choice.get("degeneration").is_none(), "{reply}");
    let spec = &reply["usage"]["spec_decoding"];
    assert!(
        spec["draft_tokens"].as_u64().unwrap() > 0,
        "MTP is on: {reply}"
    );

    let (finished, smoke_report) = smoke(&server, &dir);
    assert!(
        finished.status.success(),
        "smoke failed against the correct backend: {smoke_report}"
    );
    assert_eq!(smoke_report["passed"], true);
    assert_eq!(smoke_result(&smoke_report, "stream = non-stream"), "pass");

    let text = metrics(&rt, server.port);
    for kind in ["periodic_loop", "ngram_collapse", "unclosed_reasoning"] {
        let name = format!("deltaserve_degenerate_requests_total{{kind=\"{kind}\"}}");
        assert_eq!(sample(&text, &name), 0.0, "{text}");
    }
    assert!(
        !server.log_text().contains("WARNING degenerate"),
        "{}",
        server.log_text()
    );
    let (status, _) = http(&rt, server.port, "GET", "/health", None).unwrap();
    assert_eq!(status, 200);
    drop(server);

    let doctor = run_command(&["doctor", "--model-path", "models/demo"], &dir, "doctor");
    assert!(
        doctor.status.success(),
        "doctor failed on the correct backend:\n{}\n{}",
        doctor.stdout,
        doctor.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
}
