//! `deltaserve smoke`: a fixed suite against any OpenAI-compatible server (deltaserve, SGLang, vLLM,
//! llama.cpp) that proves the model answers correctly, not only that the server is up
//! (docs/serving.md, "Health"): the 2+2 and prime prompts at temperature 0, the same prime prompt
//! streamed, then the checks of smoke_checks.rs on the replies. Plain HTTP/1.1 over hyper; it never
//! touches the engine.

use std::time::{Duration, Instant};

use deltaserve_health::Config;
use http_body_util::BodyExt;
use serde_json::{json, Value};

use crate::http_client::{body_text, drain_sse_payloads, Connection, Target, UrlError};
use crate::smoke_checks::{self, Reply, StreamMerge, ARITHMETIC_PROMPT, PRIME_PROMPT};
pub use crate::smoke_report::{CheckResult, CheckRow, SmokeReport};

/// Where the suite runs and how long it may take (the binary's `smoke` flags build it).
#[derive(Debug, Clone, PartialEq)]
pub struct SmokeConfig {
    /// Server root, e.g. http://127.0.0.1:30000 (a trailing /v1 is accepted). Plain HTTP only.
    pub url: String,
    /// Model name to send; `None`: the first model of GET /v1/models.
    pub model: Option<String>,
    /// `max_tokens` of every request.
    pub max_tokens: usize,
    /// Per-request timeout in seconds.
    pub timeout: u64,
}

/// The suite could not run at all (as opposed to checks that failed).
#[derive(Debug, thiserror::Error)]
pub enum SmokeError {
    #[error(transparent)]
    Url(#[from] UrlError),
    #[error("--max-tokens must be at least 1")]
    ZeroMaxTokens,
    #[error("cannot reach {addr}: {message}")]
    Connect { addr: String, message: String },
    #[error("GET /v1/models at {addr} did not name a model ({reason}); pass --model")]
    Models { addr: String, reason: String },
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// The first model id of GET /v1/models.
async fn discover_model(connection: &mut Connection) -> Result<String, SmokeError> {
    let addr = connection.target.authority.clone();
    let (status, text) = connection
        .send_text("GET", "/v1/models", None)
        .await
        .map_err(|message| SmokeError::Connect {
            addr: addr.clone(),
            message,
        })?;
    if status != 200 {
        return Err(SmokeError::Models {
            addr,
            reason: format!(
                "HTTP {status}: {}",
                text.chars().take(200).collect::<String>()
            ),
        });
    }
    serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| {
            v.pointer("/data/0/id")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .ok_or_else(|| SmokeError::Models {
            addr,
            reason: format!(
                "no data[0].id in {}",
                text.chars().take(200).collect::<String>()
            ),
        })
}

/// "health": GET /health answers 200 (a 404 means the server has no such route).
async fn health_row(connection: &mut Connection) -> CheckRow {
    const CHECK: &str = "health";
    match connection.send_text("GET", "/health", None).await {
        Ok((200, _)) => CheckRow::new(CHECK, CheckResult::Pass, "GET /health: 200"),
        Ok((404, _)) => CheckRow::new(CHECK, CheckResult::Skip, "the server has no /health route"),
        Ok((status, body)) => CheckRow::new(
            CHECK,
            CheckResult::Fail,
            format!(
                "GET /health: {status} {}",
                body.trim().chars().take(300).collect::<String>()
            ),
        ),
        Err(e) => CheckRow::new(CHECK, CheckResult::Fail, format!("GET /health: {e}")),
    }
}

fn chat_body(model: &str, prompt: &str, max_tokens: usize, stream: bool) -> Value {
    let mut body = json!({
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
    });
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

/// One non-streaming chat request.
async fn ask(connection: &mut Connection, label: &str, body: &Value) -> Reply {
    let (status, text) = match connection
        .send_text("POST", "/v1/chat/completions", Some(body))
        .await
    {
        Ok(answer) => answer,
        Err(e) => return Reply::failed(label, e),
    };
    if status != 200 {
        return Reply::failed(
            label,
            format!(
                "HTTP {status}: {}",
                text.chars().take(300).collect::<String>()
            ),
        );
    }
    match serde_json::from_str::<Value>(&text) {
        Ok(response) => Reply::from_completion(label, response),
        Err(e) => Reply::failed(label, format!("the response is not JSON: {e}")),
    }
}

/// One streaming chat request, merged into a reply.
async fn ask_streaming(connection: &mut Connection, label: &str, body: &Value) -> Reply {
    let (status, mut response) = match connection
        .send("POST", "/v1/chat/completions", Some(body))
        .await
    {
        Ok(answer) => answer,
        Err(e) => return Reply::failed(label, e),
    };
    if status != 200 {
        let text = body_text(response).await.unwrap_or_default();
        return Reply::failed(
            label,
            format!(
                "HTTP {status}: {}",
                text.chars().take(300).collect::<String>()
            ),
        );
    }
    let mut merge = StreamMerge::default();
    let mut buffer = String::new();
    while let Some(frame) = response.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => return Reply::failed(label, format!("the stream broke: {e}")),
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buffer.push_str(&String::from_utf8_lossy(&data));
        for payload in drain_sse_payloads(&mut buffer) {
            if let Err(e) = merge.push(&payload) {
                return Reply::failed(label, e);
            }
        }
    }
    merge.finish(label)
}

/// The reply of a request that ran out of time. The connection is re-opened: it may still carry the
/// unfinished response.
fn timed_out(connection: &mut Connection, label: &str, timeout: Duration) -> Reply {
    *connection = Connection::new(connection.target.clone());
    Reply::failed(label, format!("timed out after {} s", timeout.as_secs()))
}

/// Runs the suite against the server at `config.url`.
pub async fn run_smoke(config: &SmokeConfig) -> Result<SmokeReport, SmokeError> {
    if config.max_tokens == 0 {
        return Err(SmokeError::ZeroMaxTokens);
    }
    let started = Instant::now();
    let target = Target::parse(&config.url)?;
    let mut connection = Connection::new(target);
    let mut checks = Vec::new();
    let timeout = Duration::from_secs(config.timeout);
    let model = match &config.model {
        Some(model) => {
            checks.push(CheckRow::new(
                "model",
                CheckResult::Pass,
                format!("{model} (--model)"),
            ));
            model.clone()
        }
        None => {
            let addr = connection.target.authority.clone();
            let model = tokio::time::timeout(timeout, discover_model(&mut connection))
                .await
                .map_err(|_| SmokeError::Connect {
                    addr,
                    message: format!("GET /v1/models: no answer within {} s", timeout.as_secs()),
                })??;
            checks.push(CheckRow::new(
                "model",
                CheckResult::Pass,
                format!("{model} (first of GET /v1/models)"),
            ));
            model
        }
    };
    match tokio::time::timeout(timeout, health_row(&mut connection)).await {
        Ok(row) => checks.push(row),
        Err(_) => {
            connection = Connection::new(connection.target.clone());
            checks.push(CheckRow::new(
                "health",
                CheckResult::Fail,
                format!("GET /health: no answer within {} s", timeout.as_secs()),
            ));
        }
    }
    let arithmetic_body = chat_body(&model, ARITHMETIC_PROMPT, config.max_tokens, false);
    let prime_body = chat_body(&model, PRIME_PROMPT, config.max_tokens, false);
    let stream_body = chat_body(&model, PRIME_PROMPT, config.max_tokens, true);
    let arithmetic =
        match tokio::time::timeout(timeout, ask(&mut connection, "2+2", &arithmetic_body)).await {
            Ok(reply) => reply,
            Err(_) => timed_out(&mut connection, "2+2", timeout),
        };
    let prime =
        match tokio::time::timeout(timeout, ask(&mut connection, "prime", &prime_body)).await {
            Ok(reply) => reply,
            Err(_) => timed_out(&mut connection, "prime", timeout),
        };
    let label = "prime (stream)";
    let streamed =
        match tokio::time::timeout(timeout, ask_streaming(&mut connection, label, &stream_body))
            .await
        {
            Ok(reply) => reply,
            Err(_) => timed_out(&mut connection, label, timeout),
        };
    let detector = Config::default();
    let replies = [arithmetic.clone(), prime.clone(), streamed.clone()];
    checks.extend([
        smoke_checks::arithmetic(&arithmetic),
        smoke_checks::prime_function(&prime, &detector),
        smoke_checks::content_present(&replies),
        smoke_checks::reasoning_split(&replies),
        smoke_checks::finish_reasons(&replies, config.max_tokens),
        smoke_checks::usage_consistency(&replies),
        smoke_checks::stream_matches(&prime, &streamed),
        smoke_checks::degeneration(&replies, &detector),
    ]);
    Ok(SmokeReport {
        url: config.url.clone(),
        model,
        checks,
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}

/// `run_smoke` on its own runtime, for a synchronous caller (the CLI).
pub fn run_smoke_blocking(config: &SmokeConfig) -> Result<SmokeReport, SmokeError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(SmokeError::Runtime)?
        .block_on(run_smoke(config))
}
