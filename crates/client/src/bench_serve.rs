//! `deltaserve bench serve`: a load generator for any OpenAI-compatible server (deltaserve, SGLang, vLLM,
//! llama.cpp) in the manner of SGLang's bench_serving: random prompts of about `--input-len` words,
//! fixed-length outputs, `--concurrency` requests in flight, then request and token throughput and TTFT /
//! TPOT / ITL / end-to-end latency percentiles (computed in bench_report.rs). Plain HTTP/1.1 over hyper;
//! it never touches the engine.
//!
//! Two modes measure a prefix cache: `--multi-turn N` sends conversations of N chat turns, each turn
//! resending the whole history (the earlier replies' content included), and reports TTFT per turn;
//! `--shared-prefix-len W` starts every prompt with the same W-word system prompt. Both report the
//! prompt tokens the server says it served from its cache (`usage.prompt_tokens_details.cached_tokens`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use serde_json::{json, Value};

pub use crate::bench_report::{BenchServeReport, Distribution};
use crate::http_client::{body_text, drain_sse_payloads, Connection, Target, UrlError};

/// What `bench serve` sends and how (the binary's `bench serve` flags build it).
#[derive(Debug, Clone, PartialEq)]
pub struct BenchServeConfig {
    /// Server root, e.g. http://127.0.0.1:30000 (a trailing /v1 is accepted). Plain HTTP only.
    pub url: String,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Requests sent in total.
    pub num_prompts: usize,
    /// Prompt length in words.
    pub input_len: usize,
    /// Tokens to generate per request (`max_tokens`, with `ignore_eos`).
    pub output_len: usize,
    /// Model name to send; `None`: the first model of GET /v1/models.
    pub model: Option<String>,
    /// Stream responses (needed for TTFT, TPOT and ITL).
    pub stream: bool,
    pub endpoint: BenchEndpoint,
    /// Sampling temperature sent with every request.
    pub temperature: f32,
    /// Also send `min_tokens = output_len`.
    pub min_tokens: bool,
    /// Do not send `ignore_eos: true`.
    pub no_ignore_eos: bool,
    /// Seed of the random prompts.
    pub seed: u64,
    /// Per-request timeout in seconds.
    pub request_timeout: u64,
    /// Turns per conversation (chat endpoint), each resending the history; 1 = single requests.
    pub multi_turn: usize,
    /// Words of the system prompt every prompt starts with; 0 = none.
    pub shared_prefix_len: usize,
    /// Sent as `chat_template_kwargs` with every chat request (e.g. `{"enable_thinking": false}`).
    pub chat_template_kwargs: Option<Value>,
    /// Agent loop (chat endpoint): the requests carry a tool definition, and every turn after the
    /// first answers the previous reply with a tool call and its result instead of a new question.
    pub tool_calls: bool,
    /// Resend each reply's reasoning as the assistant message's `reasoning_content` (clients of
    /// models whose templates keep earlier reasoning do); by default only the content goes back.
    pub resend_reasoning: bool,
}

/// Which API `bench serve` drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchEndpoint {
    /// `/v1/completions`
    Completions,
    /// `/v1/chat/completions`
    Chat,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchServeError {
    #[error(transparent)]
    Url(#[from] UrlError),
    #[error("{flag} must be at least 1")]
    Zero { flag: &'static str },
    #[error("cannot reach {addr}: {message}")]
    Connect { addr: String, message: String },
    #[error("GET /v1/models failed: {0}; pass --model")]
    Models(String),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("{flag} needs --endpoint chat")]
    ChatOnly { flag: &'static str },
}

/// Outcome of one benchmark request.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RequestResult {
    pub(crate) error: Option<String>,
    pub(crate) prompt_tokens: usize,
    pub(crate) output_tokens: usize,
    /// Prompt tokens the server served from its prefix cache, as it reported them.
    pub(crate) cached_tokens: usize,
    /// Turn of its conversation (0-based; 0 outside the multi-turn mode).
    pub(crate) turn: usize,
    /// The reply's content (what a client resends as the assistant message).
    pub(crate) content: String,
    /// The reply's reasoning (`reasoning_content`), resent only with `resend_reasoning`.
    pub(crate) reasoning: String,
    pub(crate) ttft: f64,
    pub(crate) e2e: f64,
    /// Gaps between streamed chunks that carried text, in seconds.
    pub(crate) itl: Vec<f64>,
}

/// A small deterministic PRNG (SplitMix64) for reproducible prompts.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Common English words that most BPE vocabularies encode as one token each (with a leading space).
const WORDS: [&str; 64] = [
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "people", "water",
    "system", "number", "world", "house", "model", "light", "river", "music", "paper", "market",
    "story", "garden", "window",
];

/// Prompt `index`: a distinct numbered opening (so no two prompts share a long prefix) and random words.
fn random_prompt(rng: &mut SplitMix, index: usize, words: usize) -> String {
    let mut prompt = format!("Request {index}:");
    for _ in 0..words.saturating_sub(2) {
        prompt.push(' ');
        prompt.push_str(WORDS[(rng.next() % WORDS.len() as u64) as usize]);
    }
    prompt
}

/// One conversation: an optional shared system prompt and its user turns.
struct Conversation {
    system: Option<String>,
    turns: Vec<String>,
}

/// What a turn's reply left for the next turn to resend.
#[derive(Debug, Clone, Default, PartialEq)]
struct Reply {
    content: String,
    reasoning: String,
}

/// The one tool of the agent loop.
fn lookup_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "lookup",
        "description": "Looks a phrase up and returns what is known about it.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    }})
}

/// The assistant message resending `reply`, with the agent loop's call `index` when `call` is set.
fn assistant_message(
    config: &BenchServeConfig,
    reply: &Reply,
    call: Option<(usize, &str)>,
) -> Value {
    let mut message = json!({"role": "assistant", "content": reply.content});
    if config.resend_reasoning && !reply.reasoning.is_empty() {
        message["reasoning_content"] = json!(reply.reasoning);
    }
    if let Some((index, question)) = call {
        let query: Vec<&str> = question.split_whitespace().take(4).collect();
        message["tool_calls"] = json!([{
            "id": format!("call-{index}"),
            "type": "function",
            "function": {"name": "lookup", "arguments": json!({"query": query.join(" ")}).to_string()},
        }]);
    }
    message
}

/// The request of turn `turn`, given the replies so far. In the agent loop the conversation's
/// first text is the question and each later one the result of the call that answers the reply
/// before it, so every turn after the first ends with a tool message.
fn turn_body(
    config: &BenchServeConfig,
    model: &str,
    conversation: &Conversation,
    replies: &[Reply],
) -> Value {
    let turn = replies.len();
    match config.endpoint {
        BenchEndpoint::Completions => {
            let prompt = match &conversation.system {
                Some(system) => format!("{system}\n{}", conversation.turns[turn]),
                None => conversation.turns[turn].clone(),
            };
            request_body(config, model, json!({"prompt": prompt}))
        }
        BenchEndpoint::Chat => {
            let mut messages = Vec::new();
            if let Some(system) = &conversation.system {
                messages.push(json!({"role": "system", "content": system}));
            }
            if config.tool_calls {
                messages.push(json!({"role": "user", "content": conversation.turns[0]}));
                for (index, reply) in replies.iter().enumerate() {
                    let asked = &conversation.turns[index];
                    messages.push(assistant_message(config, reply, Some((index, asked))));
                    messages.push(
                        json!({"role": "tool", "tool_call_id": format!("call-{index}"),
                        "content": conversation.turns[index + 1]}),
                    );
                }
                return request_body(
                    config,
                    model,
                    json!({"messages": messages, "tools": [lookup_tool()]}),
                );
            }
            for (question, reply) in conversation.turns.iter().zip(replies) {
                messages.push(json!({"role": "user", "content": question}));
                messages.push(assistant_message(config, reply, None));
            }
            messages.push(json!({"role": "user", "content": conversation.turns[turn]}));
            request_body(config, model, json!({"messages": messages}))
        }
    }
}

fn request_body(config: &BenchServeConfig, model: &str, input: Value) -> Value {
    let mut body = input;
    body["model"] = json!(model);
    body["max_tokens"] = json!(config.output_len);
    body["temperature"] = json!(config.temperature);
    if !config.no_ignore_eos {
        body["ignore_eos"] = json!(true);
    }
    if config.min_tokens {
        body["min_tokens"] = json!(config.output_len);
    }
    if let Some(kwargs) = &config.chat_template_kwargs {
        body["chat_template_kwargs"] = kwargs.clone();
    }
    if config.stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

fn endpoint_path(endpoint: BenchEndpoint) -> &'static str {
    match endpoint {
        BenchEndpoint::Completions => "/v1/completions",
        BenchEndpoint::Chat => "/v1/chat/completions",
    }
}

/// Text carried by one response object (completions `text`, chat `content` or `reasoning_content`).
fn chunk_text_len(value: &Value) -> usize {
    let Some(choices) = value.get("choices").and_then(Value::as_array) else {
        return 0;
    };
    choices
        .iter()
        .map(|choice| {
            let field = |v: Option<&Value>| v.and_then(Value::as_str).map_or(0, str::len);
            field(choice.get("text"))
                + choice.get("delta").map_or(0, |d| {
                    field(d.get("content"))
                        + field(d.get("reasoning_content"))
                        + field(d.get("reasoning"))
                })
                + choice.get("message").map_or(0, |m| {
                    field(m.get("content"))
                        + field(m.get("reasoning_content"))
                        + field(m.get("reasoning"))
                })
        })
        .sum()
}

fn read_usage(value: &Value, result: &mut RequestResult) {
    if let Some(usage) = value.get("usage").filter(|u| u.is_object()) {
        let count = |name: &str| usage.get(name).and_then(Value::as_u64).map(|n| n as usize);
        result.prompt_tokens = count("prompt_tokens").unwrap_or(result.prompt_tokens);
        result.output_tokens = count("completion_tokens").unwrap_or(result.output_tokens);
        if let Some(cached) = usage
            .pointer("/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64)
        {
            result.cached_tokens = cached as usize;
        }
    }
}

/// Appends the content and the reasoning of the first choice of a response object (message or
/// delta) to the result's.
fn push_content(value: &Value, result: &mut RequestResult) {
    let Some(choice) = value.pointer("/choices/0") else {
        return;
    };
    let text = |path: &str| choice.pointer(path).and_then(Value::as_str);
    for path in ["/message/content", "/delta/content", "/text"] {
        if let Some(text) = text(path) {
            result.content.push_str(text);
        }
    }
    for path in ["/message/reasoning_content", "/delta/reasoning_content"] {
        if let Some(text) = text(path) {
            result.reasoning.push_str(text);
        }
    }
}

async fn run_one(
    connection: &mut Connection,
    config: &BenchServeConfig,
    body: &Value,
) -> RequestResult {
    let started = Instant::now();
    let mut result = RequestResult::default();
    let (status, mut response) = match connection
        .send("POST", endpoint_path(config.endpoint), Some(body))
        .await
    {
        Ok(answer) => answer,
        Err(e) => {
            result.error = Some(e);
            return result;
        }
    };
    if status != 200 {
        let text = body_text(response).await.unwrap_or_default();
        result.error = Some(format!(
            "HTTP {status}: {}",
            text.chars().take(300).collect::<String>()
        ));
        return result;
    }
    if !config.stream {
        match body_text(response)
            .await
            .map(|t| serde_json::from_str::<Value>(&t))
        {
            Ok(Ok(value)) => {
                read_usage(&value, &mut result);
                push_content(&value, &mut result);
                result.e2e = started.elapsed().as_secs_f64();
                result.ttft = result.e2e;
            }
            Ok(Err(e)) => result.error = Some(format!("invalid JSON response: {e}")),
            Err(e) => result.error = Some(e),
        }
        return result;
    }
    let mut buffer = String::new();
    let mut last_text_at: Option<Instant> = None;
    let mut text_chunks = 0;
    while let Some(frame) = response.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => {
                result.error = Some(format!("stream broke: {e}"));
                return result;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buffer.push_str(&String::from_utf8_lossy(&data));
        for payload in drain_sse_payloads(&mut buffer) {
            if payload == "[DONE]" {
                continue;
            }
            let Ok(value) = serde_json::from_str::<Value>(&payload) else {
                result.error = Some(format!("invalid SSE event: {payload}"));
                return result;
            };
            if let Some(error) = value.get("error") {
                result.error = Some(format!("server error in stream: {error}"));
                return result;
            }
            read_usage(&value, &mut result);
            push_content(&value, &mut result);
            if chunk_text_len(&value) > 0 {
                let now = Instant::now();
                match last_text_at {
                    None => result.ttft = (now - started).as_secs_f64(),
                    Some(previous) => result.itl.push((now - previous).as_secs_f64()),
                }
                last_text_at = Some(now);
                text_chunks += 1;
            }
        }
    }
    result.e2e = started.elapsed().as_secs_f64();
    if result.output_tokens == 0 {
        // The server sent no usage: count text chunks as tokens (one token per chunk for most servers).
        result.output_tokens = text_chunks;
    }
    if last_text_at.is_none() {
        result.ttft = result.e2e;
    }
    result
}

async fn first_model(target: &Target) -> Result<String, BenchServeError> {
    let mut connection = Connection::new(target.clone());
    let (status, body) = connection
        .send("GET", "/v1/models", None)
        .await
        .map_err(|message| BenchServeError::Connect {
            addr: target.authority.clone(),
            message,
        })?;
    let text = body_text(body).await.map_err(BenchServeError::Models)?;
    if status != 200 {
        return Err(BenchServeError::Models(format!("HTTP {status}: {text}")));
    }
    serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| {
            v.pointer("/data/0/id")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .ok_or_else(|| BenchServeError::Models(format!("no model id in {text}")))
}

/// Runs the benchmark described by `config` against a running server.
pub async fn run_bench_serve(
    config: &BenchServeConfig,
) -> Result<BenchServeReport, BenchServeError> {
    if config.concurrency == 0 {
        return Err(BenchServeError::Zero {
            flag: "--concurrency",
        });
    }
    if config.num_prompts == 0 {
        return Err(BenchServeError::Zero {
            flag: "--num-prompts",
        });
    }
    if config.output_len == 0 {
        return Err(BenchServeError::Zero {
            flag: "--output-len",
        });
    }
    if config.multi_turn == 0 {
        return Err(BenchServeError::Zero {
            flag: "--multi-turn",
        });
    }
    if config.endpoint != BenchEndpoint::Chat {
        let chat_only = [
            ("--multi-turn", config.multi_turn > 1),
            ("--tool-calls", config.tool_calls),
            (
                "--chat-template-kwargs",
                config.chat_template_kwargs.is_some(),
            ),
            ("--resend-reasoning", config.resend_reasoning),
        ];
        if let Some((flag, _)) = chat_only.into_iter().find(|(_, set)| *set) {
            return Err(BenchServeError::ChatOnly { flag });
        }
    }
    let target = Target::parse(&config.url)?;
    let model = match &config.model {
        Some(model) => model.clone(),
        None => first_model(&target).await?,
    };
    let mut rng = SplitMix(config.seed);
    let system = (config.shared_prefix_len > 0).then(|| {
        let mut shared = SplitMix(config.seed ^ 0x5EED);
        random_prompt(&mut shared, usize::MAX, config.shared_prefix_len).replacen(
            &format!("Request {}:", usize::MAX),
            "Shared context:",
            1,
        )
    });
    let conversations: Arc<Vec<Conversation>> = Arc::new(
        (0..config.num_prompts)
            .map(|i| Conversation {
                system: system.clone(),
                turns: (0..config.multi_turn)
                    .map(|t| {
                        let prompt = random_prompt(&mut rng, i, config.input_len);
                        if config.multi_turn > 1 {
                            prompt.replacen(
                                &format!("Request {i}:"),
                                &format!("Conversation {i}, turn {}:", t + 1),
                                1,
                            )
                        } else {
                            prompt
                        }
                    })
                    .collect(),
            })
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let results = Arc::new(Mutex::new(Vec::with_capacity(
        config.num_prompts * config.multi_turn,
    )));
    let started = Instant::now();
    let workers: Vec<_> = (0..config.concurrency.min(config.num_prompts))
        .map(|_| {
            let (conversations, next, results, target, config, model) = (
                Arc::clone(&conversations),
                Arc::clone(&next),
                Arc::clone(&results),
                target.clone(),
                config.clone(),
                model.clone(),
            );
            tokio::spawn(async move {
                let mut connection = Connection::new(target);
                let timeout = Duration::from_secs(config.request_timeout);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(conversation) = conversations.get(i) else {
                        break;
                    };
                    let mut replies = Vec::new();
                    for turn in 0..conversation.turns.len() {
                        let body = turn_body(&config, &model, conversation, &replies);
                        let mut result = match tokio::time::timeout(
                            timeout,
                            run_one(&mut connection, &config, &body),
                        )
                        .await
                        {
                            Ok(result) => result,
                            Err(_) => {
                                // The connection may still carry the unfinished response: start afresh.
                                connection = Connection::new(connection.target.clone());
                                RequestResult {
                                    error: Some(format!("timed out after {} s", timeout.as_secs())),
                                    ..RequestResult::default()
                                }
                            }
                        };
                        result.turn = turn;
                        let failed = result.error.is_some();
                        replies.push(Reply {
                            content: std::mem::take(&mut result.content),
                            reasoning: std::mem::take(&mut result.reasoning),
                        });
                        results
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(result);
                        if failed {
                            break;
                        }
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        // A worker that panicked lost its in-flight result; the others' results still count.
        let _ = worker.await;
    }
    let duration = started.elapsed();
    let results = results.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(BenchServeReport::from_results(
        config, model, &results, duration,
    ))
}

/// `run_bench_serve` on its own runtime, for a synchronous caller (the CLI).
pub fn run_bench_serve_blocking(
    config: &BenchServeConfig,
) -> Result<BenchServeReport, BenchServeError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(BenchServeError::Runtime)?
        .block_on(run_bench_serve(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_config() -> BenchServeConfig {
        BenchServeConfig {
            url: "http://h:1".to_string(),
            concurrency: 1,
            num_prompts: 1,
            input_len: 8,
            output_len: 4,
            model: None,
            stream: false,
            endpoint: BenchEndpoint::Chat,
            temperature: 0.0,
            min_tokens: false,
            no_ignore_eos: false,
            seed: 0,
            request_timeout: 1,
            multi_turn: 3,
            shared_prefix_len: 0,
            chat_template_kwargs: None,
            tool_calls: false,
            resend_reasoning: false,
        }
    }

    fn three_turns() -> (Conversation, Vec<Reply>) {
        let conversation = Conversation {
            system: Some("sys".to_string()),
            turns: vec![
                "q one two three four five".into(),
                "result 1".into(),
                "result 2".into(),
            ],
        };
        let replies = vec![
            Reply {
                content: "a1".into(),
                reasoning: "r1".into(),
            },
            Reply {
                content: "a2".into(),
                reasoning: String::new(),
            },
        ];
        (conversation, replies)
    }

    fn roles(body: &Value) -> Vec<&str> {
        body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn the_agent_loop_resends_each_reply_as_a_call_and_its_result() {
        let config = BenchServeConfig {
            tool_calls: true,
            resend_reasoning: true,
            chat_template_kwargs: Some(json!({"enable_thinking": false})),
            ..chat_config()
        };
        let (conversation, replies) = three_turns();
        let body = turn_body(&config, "m", &conversation, &replies);
        assert_eq!(
            roles(&body),
            ["system", "user", "assistant", "tool", "assistant", "tool"]
        );
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages[1]["content"], "q one two three four five");
        assert_eq!(messages[2]["content"], "a1");
        assert_eq!(messages[2]["reasoning_content"], "r1");
        assert!(
            messages[4].get("reasoning_content").is_none(),
            "no reasoning, none resent"
        );
        let call = &messages[2]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "lookup");
        assert_eq!(
            call["function"]["arguments"],
            r#"{"query":"q one two three"}"#
        );
        assert_eq!(messages[3]["tool_call_id"], call["id"]);
        assert_eq!(
            (
                messages[3]["content"].as_str(),
                messages[5]["content"].as_str()
            ),
            (Some("result 1"), Some("result 2"))
        );
        assert_eq!(body["tools"][0]["function"]["name"], "lookup");
        assert_eq!(
            body["chat_template_kwargs"],
            json!({"enable_thinking": false})
        );
        assert_eq!(
            roles(&turn_body(&config, "m", &conversation, &[])),
            ["system", "user"]
        );
    }

    #[test]
    fn chat_turns_resend_content_and_only_optionally_reasoning() {
        let (conversation, replies) = three_turns();
        let body = turn_body(&chat_config(), "m", &conversation, &replies);
        assert_eq!(
            roles(&body),
            ["system", "user", "assistant", "user", "assistant", "user"]
        );
        assert!(body.get("tools").is_none() && body.get("chat_template_kwargs").is_none());
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages[2], json!({"role": "assistant", "content": "a1"}));
        let config = BenchServeConfig {
            resend_reasoning: true,
            ..chat_config()
        };
        let body = turn_body(&config, "m", &conversation, &replies);
        assert_eq!(body["messages"][2]["reasoning_content"], "r1");
    }

    #[test]
    fn prompts_have_the_requested_length_and_differ() {
        let mut rng = SplitMix(1);
        let a = random_prompt(&mut rng, 0, 50);
        let b = random_prompt(&mut rng, 1, 50);
        assert_eq!(a.split_whitespace().count(), 50);
        assert_ne!(a, b);
    }
}
