//! Real SGLang and vLLM serve command lines for Qwen3.5 / Qwen3.6 / Qwen3-Next start `deltaserve serve`
//! unchanged but for the model (the demo model) and parallel sizes (1, but the seeds' own line keeps
//! its `--tp-size 2`): each server reaches /health
//! 200, answers a chat request, and printed one `compatibility:` line for every flag it accepted but
//! handles its own way (docs/compatibility-flags.md, class 2).

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BINARY: &str = env!("CARGO_BIN_EXE_deltaserve");
const READY_TIMEOUT: Duration = Duration::from_secs(240);

/// One command line: where it comes from, its arguments after `serve`, the model name clients send,
/// the API key it sets, and the flags whose compatibility line must be printed.
struct DropIn {
    source: &'static str,
    args: Vec<String>,
    model: &'static str,
    api_key: Option<&'static str>,
    noted: &'static [&'static str],
}

fn line(source: &'static str, args: &[&str], noted: &'static [&'static str]) -> DropIn {
    DropIn {
        source,
        args: args.iter().map(|a| a.to_string()).collect(),
        model: "demo",
        api_key: None,
        noted,
    }
}

/// The demo model's chat template as a file, as recipes pass `--chat-template FILE.jinja`.
fn template_file() -> PathBuf {
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/demo/tokenizer_config.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let path =
        std::env::temp_dir().join(format!("deltaserve-drop-in-{}.jinja", std::process::id()));
    std::fs::write(&path, config["chat_template"].as_str().unwrap()).unwrap();
    path
}

fn command_lines(template: &str) -> Vec<DropIn> {
    let mut lines = vec![
        // The seeds' SGLang command for Qwen3.6-27B, exactly, tensor parallelism included (two
        // in-process ranks on the cpu backend here; two GPUs over NCCL on cuda).
        line(
            "seeds: sglang.launch_server Qwen3.6-27B",
            &[
                "--model-path",
                "demo",
                "--tp-size",
                "2",
                "--speculative-algorithm",
                "NEXTN",
                "--speculative-num-steps",
                "3",
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                "4",
                "--mem-fraction-static",
                "0.88",
                "--context-length",
                "262144",
                "--reasoning-parser",
                "qwen3",
                "--tool-call-parser",
                "qwen3_coder",
            ],
            &[],
        ),
        // SGLang's Qwen3-Next usage page: `--tp 4`, then MTP with the extra-buffer mamba cache.
        line(
            "sglang docs: Qwen3-Next-80B-A3B with MTP",
            &[
                "--model",
                "demo",
                "--tp",
                "1",
                "--speculative-num-steps",
                "3",
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                "4",
                "--speculative-algo",
                "NEXTN",
                "--mamba-scheduler-strategy",
                "extra_buffer",
            ],
            &["--mamba-scheduler-strategy"],
        ),
        // SGLang cookbook style for Qwen3.5 (MoE, tool calls, AMD-style attention backend).
        line(
            "sglang cookbook: Qwen3.5-397B-A17B",
            &[
                "--model-path",
                "demo",
                "--tp",
                "1",
                "--ep-size",
                "1",
                "--trust-remote-code",
                "--mem-fraction-static",
                "0.8",
                "--context-length",
                "262144",
                "--reasoning-parser",
                "qwen3",
                "--tool-call-parser",
                "qwen3_coder",
                "--attention-backend",
                "triton",
                "--enable-multimodal",
                "--host",
                "0.0.0.0",
            ],
            &[
                "--trust-remote-code",
                "--attention-backend",
                "--enable-multimodal",
            ],
        ),
        // The flags of issue 22 that used to stop start-up.
        line(
            "issue 22: SGLang flags from real Qwen commands",
            &[
                "--model-path",
                "demo",
                "--trust-remote-code",
                "--dtype",
                "bfloat16",
                "--log-level",
                "info",
                "--random-seed",
                "42",
                "--tokenizer-path",
                "demo",
                "--chat-template",
                template,
                "--schedule-policy",
                "fcfs",
                "--skip-server-warmup",
                "--watchdog-timeout",
                "300",
                "--enable-torch-compile",
                "--tensor-parallel-size",
                "1",
                "--dp",
                "1",
                "--attention-backend",
                "fa3",
                "--cuda-graph-max-bs",
                "256",
            ],
            &[
                "--trust-remote-code",
                "--enable-torch-compile",
                "--attention-backend",
            ],
        ),
        line(
            "sglang: flashinfer attention, radix cache off, data-parallel size 1",
            &[
                "--model-path",
                "demo",
                "--dp-size",
                "1",
                "--attention-backend",
                "flashinfer",
                "--disable-radix-cache",
                "--chunked-prefill-size",
                "4096",
                "--max-running-requests",
                "8",
                "--page-size",
                "16",
                // SGLang's default spelled out; `bf16` is honoured on cuda and refused on the
                // host backends (see refused_flags_stop_start_up_naming_the_flag).
                "--kv-cache-dtype",
                "auto",
                "--log-level",
                "warning",
            ],
            &["--attention-backend"],
        ),
        // The vLLM command of issue 22.
        line(
            "issue 22: vllm serve with MTP",
            &[
                "demo",
                "--tensor-parallel-size",
                "1",
                "--gpu-memory-utilization",
                "0.9",
                "--max-model-len",
                "32768",
                "--max-num-seqs",
                "64",
                "--enable-auto-tool-choice",
                "--tool-call-parser",
                "qwen3_coder",
                "--reasoning-parser",
                "qwen3",
                "--speculative-config",
                r#"{"method":"mtp","num_speculative_tokens":2}"#,
            ],
            &[],
        ),
        // vLLM's Qwen3.5 / Qwen3.6 recipe (`-tp`, human-readable length, MTP).
        line(
            "vllm recipe: Qwen3.6-35B-A3B with MTP",
            &[
                "demo",
                "-tp",
                "1",
                "--max-model-len",
                "256K",
                "--reasoning-parser",
                "qwen3",
                "--speculative-config",
                r#"{"method": "mtp", "num_speculative_tokens": 2}"#,
                "--language-model-only",
                "--enable-expert-parallel",
            ],
            &["--enable-expert-parallel"],
        ),
        // vLLM's Qwen3.5-9B recipe, thinking off by default as its troubleshooting section suggests.
        line(
            "vllm recipe: Qwen3.5-9B, thinking off",
            &[
                "demo",
                "--max-model-len",
                "262144",
                "--reasoning-parser",
                "qwen3",
                "--default-chat-template-kwargs",
                r#"{"enable_thinking": false}"#,
            ],
            &[],
        ),
        // vLLM's dotted speculative keys and underscore spellings.
        line(
            "vllm: dotted --speculative-config keys, underscores",
            &[
                "demo",
                "--speculative-config.method",
                "mtp",
                "--speculative-config.num_speculative_tokens",
                "1",
                "--max_num_seqs",
                "16",
                "--enable-prefix-caching",
                "--async-scheduling",
                "--seed",
                "0",
            ],
            &["--async-scheduling"],
        ),
    ];
    // vLLM's Qwen3-Next thinking recipe names the deepseek_r1 reasoning parser.
    lines.push(line(
        "vllm recipe: Qwen3-Next-80B-A3B-Thinking",
        &[
            "demo",
            "--tensor-parallel-size",
            "1",
            "--reasoning-parser",
            "deepseek_r1",
            "--speculative-config",
            r#"{"method":"qwen3_next_mtp","num_speculative_tokens":2}"#,
        ],
        &["--reasoning-parser"],
    ));
    // vLLM's Qwen3-Next recipe, with a served name and an API key as deployments add them.
    lines.push(DropIn {
        model: "qwen3-next",
        api_key: Some("sk-drop-in"),
        ..line(
            "vllm recipe: Qwen3-Next-80B-A3B",
            &[
                "demo",
                "--tensor-parallel-size",
                "1",
                "--served-model-name",
                "qwen3-next",
                "Qwen/Qwen3-Next-80B-A3B-Instruct",
                "--tokenizer-mode",
                "auto",
                "--speculative-config",
                r#"{"method":"qwen3_next_mtp","num_speculative_tokens":2}"#,
                "--api-key",
                "sk-drop-in",
                "--trust-remote-code",
                "--dtype",
                "auto",
                "--kv-cache-dtype",
                "auto",
                "--no-enable-prefix-caching",
                "--enforce-eager",
            ],
            &["--trust-remote-code"],
        )
    });
    lines
}

struct Server {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `deltaserve serve ARGS --port PORT` with a small state pool, collecting its stderr.
fn start(args: &[String], port: u16) -> Server {
    let mut child = Command::new(BINARY)
        .arg("serve")
        .args(args)
        .args(["--port", &port.to_string(), "--max-mamba-cache-size", "4"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("VLLM_API_KEY")
        .env_remove("DELTASERVE_API_KEY")
        .env_remove("VLLM_LOGGING_LEVEL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start deltaserve serve");
    let stderr = Arc::new(Mutex::new(String::new()));
    let pipe = child.stderr.take().unwrap();
    let sink = Arc::clone(&stderr);
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let mut text = sink.lock().unwrap();
            text.push_str(&line);
            text.push('\n');
        }
    });
    Server { child, stderr }
}

/// One HTTP/1.1 request with `Connection: close`; (status, body).
fn http(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
    key: Option<&str>,
) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .ok()?;
    let payload = body.map(Value::to_string).unwrap_or_default();
    let auth = key.map_or(String::new(), |k| format!("authorization: Bearer {k}\r\n"));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\ncontent-type: application/json\r\n{auth}content-length: {}\r\n\r\n{payload}",
        payload.len()
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    Some((
        status,
        if chunked {
            dechunk(body)
        } else {
            body.to_string()
        },
    ))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

fn wait_healthy(server: &mut Server, port: u16, source: &str) {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some((200, _)) = http(port, "GET", "/health", None, None) {
            return;
        }
        if let Ok(Some(status)) = server.child.try_wait() {
            panic!(
                "{source}: deltaserve exited with {status} before /health said 200:\n{}",
                server.stderr.lock().unwrap()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{source}: /health never answered 200:\n{}",
            server.stderr.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn sglang_and_vllm_command_lines_start_deltaserve_unchanged() {
    let template = template_file();
    for drop_in in command_lines(template.to_str().unwrap()) {
        let port = free_port();
        let mut server = start(&drop_in.args, port);
        let source = drop_in.source;
        wait_healthy(&mut server, port, source);
        let body = json!({
            "model": drop_in.model,
            "messages": [{"role": "user", "content": "Compute 47 + 38."}],
            "max_tokens": 64,
            "temperature": 0,
        });
        let (status, text) = http(
            port,
            "POST",
            "/v1/chat/completions",
            Some(&body),
            drop_in.api_key,
        )
        .unwrap_or_else(|| panic!("{source}: no answer to the chat request"));
        assert_eq!(status, 200, "{source}: {text}");
        let reply: Value = serde_json::from_str(&text).unwrap();
        let message = &reply["choices"][0]["message"];
        let said = format!(
            "{}{}",
            message["reasoning_content"].as_str().unwrap_or(""),
            message["content"].as_str().unwrap_or("")
        );
        assert!(!said.is_empty(), "{source}: empty reply {text}");
        if let Some(key) = drop_in.api_key {
            let (status, _) =
                http(port, "POST", "/v1/chat/completions", Some(&body), None).unwrap();
            assert_eq!(
                status, 401,
                "{source}: --api-key {key} must guard the server"
            );
        }
        let stderr = server.stderr.lock().unwrap().clone();
        let noted: Vec<&str> = stderr
            .lines()
            .filter_map(|l| l.strip_prefix("compatibility: "))
            .collect();
        for flag in drop_in.noted {
            let lines: Vec<&&str> = noted
                .iter()
                .filter(|l| {
                    l.starts_with(&format!("{flag} ")) || l.starts_with(&format!("{flag}:"))
                })
                .collect();
            assert_eq!(
                lines.len(),
                1,
                "{source}: {flag} must print exactly one line:\n{stderr}"
            );
        }
        assert_eq!(
            noted.len(),
            drop_in.noted.len(),
            "{source}: unexpected compatibility lines:\n{stderr}"
        );
    }
    let _ = std::fs::remove_file(template);
}

#[test]
fn refused_flags_stop_start_up_naming_the_flag() {
    let cases: [(&[&str], &str); 6] = [
        // Data parallelism is implemented; a size of 0 is refused naming the flag.
        (&["--dp-size", "0"], "--dp-size must be at least 1"),
        // Tensor parallelism is implemented, but the demo model's 4 query heads do not split 8
        // ways: refused at start-up naming the config field.
        (
            &["demo", "--tensor-parallel-size", "8"],
            "config field `num_attention_heads`",
        ),
        (&["--kv-cache-dtype", "fp8_e4m3"], "--kv-cache-dtype"),
        // The host backends store K/V in f32 only: an explicit bf16 cache is refused there.
        (
            &["--backend", "cpu", "--kv-cache-dtype", "bf16"],
            "--kv-cache-dtype bf16: the cpu backend",
        ),
        (&["--quantization", "awq"], "--quantization"),
        (
            &["--context-length", "4096", "--max-model-len", "8192"],
            "--max-model-len 8192",
        ),
    ];
    for (args, expected) in cases {
        let output = Command::new(BINARY)
            .arg("serve")
            .args(args)
            .args(["--port", "0"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("run deltaserve serve");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success(),
            "{args:?} must be refused:\n{stderr}"
        );
        assert!(
            stderr.contains(expected),
            "{args:?}: expected {expected:?} in:\n{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}:\n{stderr}");
    }
}
