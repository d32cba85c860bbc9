//! The judgements of `deltaserve smoke`: given the suite's chat replies (non-streaming, and a stream
//! merged into the same shape), each check returns one row of the report. No HTTP here (smoke.rs
//! fetches the replies) and nothing specific to one server.

use deltaserve_health::{analyze_chat_completion, Config};
use serde_json::{json, Value};

use crate::smoke_report::{CheckResult, CheckRow};

/// The arithmetic prompt of the founding failure (docs/serving.md, "The founding failure").
pub const ARITHMETIC_PROMPT: &str = "What is 2+2? Answer briefly.";
/// The prime-number prompt of the founding failure (docs/serving.md, "The founding failure").
pub const PRIME_PROMPT: &str = "Write a Python function that checks whether a number is prime.";

/// Finish reasons an OpenAI chat completion may carry.
const VALID_FINISH_REASONS: [&str; 5] = [
    "stop",
    "length",
    "tool_calls",
    "content_filter",
    "function_call",
];

/// Longest quote of model text in a detail.
const QUOTE_CHARS: usize = 80;

/// One chat reply as the checks see it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reply {
    /// Which request of the suite, e.g. `2+2` or `prime (stream)`.
    pub label: String,
    /// Why no usable reply came back (transport, HTTP status, malformed JSON or SSE, error event).
    pub error: Option<String>,
    /// The reply as a `chat.completion` (a stream's deltas merged into `message`).
    pub response: Value,
    /// `message.content`; `None` when null, missing or empty.
    pub content: Option<String>,
    /// `message.reasoning_content` (or vLLM's `reasoning`); `None` when null, missing or empty.
    pub reasoning: Option<String>,
    /// The server sent a reasoning field at all (even null): it splits reasoning.
    pub reasoning_field: bool,
    pub finish_reason: Option<String>,
    /// The `usage` object, when sent.
    pub usage: Option<Value>,
    /// A server-side degeneration report on the choice (deltaserve's `degeneration` field).
    pub server_degeneration: Option<Value>,
    /// For streams: whether `data: [DONE]` ended it; `None` for non-streaming replies.
    pub stream_done: Option<bool>,
}

fn non_empty(value: Option<&Value>) -> Option<String> {
    value
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

impl Reply {
    /// Reads the first choice of a `chat.completion` body.
    pub fn from_completion(label: &str, response: Value) -> Self {
        let choice = response
            .pointer("/choices/0")
            .cloned()
            .unwrap_or(Value::Null);
        let Some(message) = choice.get("message").filter(|m| m.is_object()) else {
            return Self::failed(
                label,
                format!(
                    "no choices[0].message in the response: {}",
                    quote(&response.to_string())
                ),
            );
        };
        Self {
            label: label.to_string(),
            error: None,
            content: non_empty(message.get("content")),
            reasoning: non_empty(message.get("reasoning_content"))
                .or_else(|| non_empty(message.get("reasoning"))),
            reasoning_field: message.get("reasoning_content").is_some()
                || message.get("reasoning").is_some(),
            finish_reason: choice
                .get("finish_reason")
                .and_then(Value::as_str)
                .map(str::to_string),
            usage: response.get("usage").filter(|u| u.is_object()).cloned(),
            server_degeneration: choice.get("degeneration").filter(|d| !d.is_null()).cloned(),
            stream_done: None,
            response,
        }
    }

    pub fn failed(label: &str, error: impl Into<String>) -> Self {
        Self {
            label: label.to_string(),
            error: Some(error.into()),
            ..Self::default()
        }
    }

    fn usage_count(&self, pointer: &str) -> Option<u64> {
        self.usage
            .as_ref()?
            .pointer(pointer)
            .and_then(Value::as_u64)
    }
}

/// Merges a stream's chunks into one reply: deltas concatenated, the last finish reason, the usage
/// chunk, and the degeneration report of the final chunk.
#[derive(Debug, Clone, Default)]
pub struct StreamMerge {
    content: String,
    reasoning: String,
    reasoning_field: bool,
    finish_reason: Option<String>,
    usage: Option<Value>,
    degeneration: Option<Value>,
    done: bool,
}

impl StreamMerge {
    /// Reads one `data:` payload; an error event or unreadable payload is returned as an error.
    pub fn push(&mut self, payload: &str) -> Result<(), String> {
        if payload == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let chunk: Value = serde_json::from_str(payload)
            .map_err(|e| format!("invalid SSE event ({e}): {}", quote(payload)))?;
        if let Some(error) = chunk.get("error") {
            return Err(format!("error event in the stream: {error}"));
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage.clone());
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            return Ok(());
        };
        if let Some(delta) = choice.get("delta") {
            if let Some(text) = delta.get("content").and_then(Value::as_str) {
                self.content.push_str(text);
            }
            for name in ["reasoning_content", "reasoning"] {
                if let Some(field) = delta.get(name) {
                    self.reasoning_field = true;
                    self.reasoning.push_str(field.as_str().unwrap_or_default());
                }
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_string());
        }
        if let Some(report) = choice.get("degeneration").filter(|d| !d.is_null()) {
            self.degeneration = Some(report.clone());
        }
        Ok(())
    }

    /// The merged reply, shaped like a non-streaming one.
    pub fn finish(self, label: &str) -> Reply {
        let mut message = json!({
            "role": "assistant",
            "content": Some(self.content).filter(|c| !c.is_empty()),
        });
        if self.reasoning_field {
            message["reasoning_content"] = json!(Some(self.reasoning).filter(|r| !r.is_empty()));
        }
        let mut choice = json!({
            "index": 0,
            "message": message,
            "finish_reason": self.finish_reason,
        });
        if let Some(report) = self.degeneration {
            choice["degeneration"] = report;
        }
        let mut response = json!({"object": "chat.completion", "choices": [choice]});
        if let Some(usage) = self.usage {
            response["usage"] = usage;
        }
        let mut reply = Reply::from_completion(label, response);
        reply.stream_done = Some(self.done);
        reply
    }
}

/// `text` cut to [`QUOTE_CHARS`] characters, quoted.
fn quote(text: &str) -> String {
    let cut: String = text.chars().take(QUOTE_CHARS).collect();
    if cut.len() < text.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}

/// Whether `text` contains the number `number` on its own (not as part of a longer number).
fn contains_number(text: &str, number: &str) -> bool {
    text.match_indices(number).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + number.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_digit()) && !after.is_some_and(|c| c.is_ascii_digit())
    })
}

/// Why a reply has no answer text, for details.
fn missing_content(reply: &Reply) -> String {
    format!(
        "content is null (reasoning {} chars, finish_reason {})",
        reply.reasoning.as_deref().map_or(0, |r| r.chars().count()),
        reply.finish_reason.as_deref().unwrap_or("missing")
    )
}

/// The verdict of the degeneration detector on a reply's reasoning and content.
fn detector_verdict(reply: &Reply, config: &Config) -> Option<String> {
    analyze_chat_completion(&reply.response, config)
        .ok()?
        .into_iter()
        .find_map(|report| report.verdict)
        .map(|verdict| verdict.to_string())
}

/// "2+2 answer": the content says 4.
pub fn arithmetic(reply: &Reply) -> CheckRow {
    const CHECK: &str = "2+2 answer";
    if let Some(error) = &reply.error {
        return CheckRow::new(CHECK, CheckResult::Fail, format!("no reply: {error}"));
    }
    match &reply.content {
        None => CheckRow::new(CHECK, CheckResult::Fail, missing_content(reply)),
        Some(content) if contains_number(content, "4") => CheckRow::new(
            CHECK,
            CheckResult::Pass,
            format!("content {}", quote(content)),
        ),
        Some(content) => CheckRow::new(
            CHECK,
            CheckResult::Fail,
            format!("expected 4 in the content, found {}", quote(content)),
        ),
    }
}

/// "prime function": the content has a Python `def` and the output does not loop.
pub fn prime_function(reply: &Reply, config: &Config) -> CheckRow {
    const CHECK: &str = "prime function";
    if let Some(error) = &reply.error {
        return CheckRow::new(CHECK, CheckResult::Fail, format!("no reply: {error}"));
    }
    let Some(content) = &reply.content else {
        return CheckRow::new(CHECK, CheckResult::Fail, missing_content(reply));
    };
    if let Some(verdict) = detector_verdict(reply, config) {
        return CheckRow::new(
            CHECK,
            CheckResult::Fail,
            format!("the output degenerates: {verdict}"),
        );
    }
    if content.contains("def ") {
        let line = content
            .lines()
            .find(|l| l.contains("def "))
            .unwrap_or_default();
        CheckRow::new(
            CHECK,
            CheckResult::Pass,
            format!("{}, no loop", quote(line.trim())),
        )
    } else {
        CheckRow::new(
            CHECK,
            CheckResult::Fail,
            format!("expected `def ` in the content, found {}", quote(content)),
        )
    }
}

/// "content present": no reply has `content: null` (the founding failure's symptom).
pub fn content_present(replies: &[Reply]) -> CheckRow {
    const CHECK: &str = "content present";
    let missing: Vec<String> = replies
        .iter()
        .filter(|r| r.error.is_none() && r.content.is_none())
        .map(|r| format!("{}: {}", r.label, missing_content(r)))
        .collect();
    let answered = replies.iter().filter(|r| r.error.is_none()).count();
    if answered == 0 {
        CheckRow::new(CHECK, CheckResult::Fail, "no reply came back")
    } else if missing.is_empty() {
        CheckRow::new(
            CHECK,
            CheckResult::Pass,
            format!("{answered} of {answered} replies have content"),
        )
    } else {
        CheckRow::new(CHECK, CheckResult::Fail, missing.join("; "))
    }
}

/// "reasoning split": reasoning text arrives in `reasoning_content` when the server splits it.
pub fn reasoning_split(replies: &[Reply]) -> CheckRow {
    const CHECK: &str = "reasoning split";
    let answered: Vec<&Reply> = replies.iter().filter(|r| r.error.is_none()).collect();
    let split = answered.iter().filter(|r| r.reasoning.is_some()).count();
    let leaked: Vec<&str> = answered
        .iter()
        .filter(|r| {
            r.content
                .as_deref()
                .is_some_and(|c| c.contains("</think>") || c.contains("<think>"))
        })
        .map(|r| r.label.as_str())
        .collect();
    let splits = answered.iter().any(|r| r.reasoning_field);
    match (split, leaked.is_empty(), splits) {
        (_, false, true) => CheckRow::new(
            CHECK,
            CheckResult::Fail,
            format!(
                "the server splits reasoning, yet think tags reached the content of {}",
                leaked.join(", ")
            ),
        ),
        (_, false, false) => CheckRow::new(
            CHECK,
            CheckResult::Warn,
            format!(
                "reasoning is not split: think tags in the content of {}; start the server with a \
                 reasoning parser (e.g. --reasoning-parser qwen3)",
                leaked.join(", ")
            ),
        ),
        (0, true, _) => CheckRow::new(
            CHECK,
            CheckResult::Skip,
            "no reasoning in the replies (a model without thinking, or thinking off)",
        ),
        (n, true, _) => CheckRow::new(
            CHECK,
            CheckResult::Pass,
            format!(
                "reasoning_content in {n} of {} replies, no think tags in content",
                answered.len()
            ),
        ),
    }
}

/// "finish reasons": every reply ends with a valid OpenAI finish reason, and none is cut by
/// `max_tokens` (a looping model runs into it: `finish_reason: "length"`).
pub fn finish_reasons(replies: &[Reply], max_tokens: usize) -> CheckRow {
    const CHECK: &str = "finish reasons";
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    for reply in replies.iter().filter(|r| r.error.is_none()) {
        match reply.finish_reason.as_deref() {
            None => problems.push(format!("{}: no finish_reason", reply.label)),
            Some(reason) if !VALID_FINISH_REASONS.contains(&reason) => problems.push(format!(
                "{}: {reason:?} is not an OpenAI finish reason",
                reply.label
            )),
            Some("length") => problems.push(format!(
                "{}: cut by max_tokens ({max_tokens}): finish_reason \"length\" (raise --max-tokens if the \
                 model really needs more)",
                reply.label
            )),
            Some(reason) => seen.push(format!("{}: {reason}", reply.label)),
        }
    }
    if replies.iter().all(|r| r.error.is_some()) {
        CheckRow::new(CHECK, CheckResult::Fail, "no reply came back")
    } else if problems.is_empty() {
        CheckRow::new(CHECK, CheckResult::Pass, seen.join(", "))
    } else {
        CheckRow::new(CHECK, CheckResult::Fail, problems.join("; "))
    }
}

/// "usage": token counts are present and consistent with the text.
pub fn usage_consistency(replies: &[Reply]) -> CheckRow {
    const CHECK: &str = "usage";
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let mut counts = Vec::new();
    for reply in replies.iter().filter(|r| r.error.is_none()) {
        let label = &reply.label;
        if reply.usage.is_none() {
            if reply.stream_done.is_some() {
                notes.push(format!(
                    "{label}: no usage chunk (stream_options.include_usage ignored)"
                ));
            } else {
                problems.push(format!("{label}: no usage object"));
            }
            continue;
        }
        let prompt = reply.usage_count("/prompt_tokens");
        let completion = reply.usage_count("/completion_tokens");
        let total = reply.usage_count("/total_tokens");
        let reasoning = reply.usage_count("/completion_tokens_details/reasoning_tokens");
        if prompt.is_none_or(|p| p == 0) {
            problems.push(format!("{label}: prompt_tokens {prompt:?}, expected > 0"));
        }
        if completion.is_none_or(|c| c == 0) {
            problems.push(format!(
                "{label}: completion_tokens {completion:?}, expected > 0"
            ));
        }
        if let (Some(p), Some(c), Some(t)) = (prompt, completion, total) {
            if t != p + c {
                problems.push(format!(
                    "{label}: total_tokens {t} != prompt_tokens {p} + completion_tokens {c}"
                ));
            }
        }
        let reasoning_chars = reply.reasoning.as_deref().map_or(0, |r| r.chars().count());
        match reasoning {
            Some(0) if reasoning_chars > 0 => problems.push(format!(
                "{label}: {reasoning_chars} chars of reasoning but reasoning_tokens 0"
            )),
            Some(r) if completion.is_some_and(|c| r > c) => problems.push(format!(
                "{label}: reasoning_tokens {r} > completion_tokens {}",
                completion.unwrap_or(0)
            )),
            None if reasoning_chars > 0 => notes.push(format!(
                "{label}: no completion_tokens_details.reasoning_tokens reported"
            )),
            _ => {}
        }
        counts.push(format!(
            "{label}: {} completion / {} reasoning tokens",
            completion.unwrap_or(0),
            reasoning.map_or("?".to_string(), |r| r.to_string())
        ));
    }
    if !problems.is_empty() {
        CheckRow::new(CHECK, CheckResult::Fail, problems.join("; "))
    } else if counts.is_empty() && notes.is_empty() {
        CheckRow::new(CHECK, CheckResult::Fail, "no reply came back")
    } else if !notes.is_empty() {
        CheckRow::new(CHECK, CheckResult::Warn, notes.join("; "))
    } else {
        CheckRow::new(CHECK, CheckResult::Pass, counts.join(", "))
    }
}

/// Where two texts first differ, quoted around that place.
fn first_difference(name: &str, a: &str, b: &str) -> Option<String> {
    if a == b {
        return None;
    }
    let at = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    let around = |s: &str| quote(&s.chars().skip(at.saturating_sub(10)).collect::<String>());
    Some(format!(
        "{name} differs at char {at}: non-streaming {} vs streaming {}",
        around(a),
        around(b)
    ))
}

/// "stream = non-stream": at temperature 0 the streamed reply equals the non-streaming one.
pub fn stream_matches(whole: &Reply, streamed: &Reply) -> CheckRow {
    const CHECK: &str = "stream = non-stream";
    for reply in [whole, streamed] {
        if let Some(error) = &reply.error {
            return CheckRow::new(
                CHECK,
                CheckResult::Fail,
                format!("{}: no reply: {error}", reply.label),
            );
        }
    }
    if streamed.stream_done == Some(false) {
        return CheckRow::new(
            CHECK,
            CheckResult::Fail,
            "the stream did not end with data: [DONE]",
        );
    }
    let text = |r: Option<&String>| r.cloned().unwrap_or_default();
    let mut problems: Vec<String> = [
        first_difference(
            "content",
            &text(whole.content.as_ref()),
            &text(streamed.content.as_ref()),
        ),
        first_difference(
            "reasoning",
            &text(whole.reasoning.as_ref()),
            &text(streamed.reasoning.as_ref()),
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    if whole.finish_reason != streamed.finish_reason {
        problems.push(format!(
            "finish_reason {:?} vs {:?}",
            whole.finish_reason, streamed.finish_reason
        ));
    }
    let tokens = (
        whole.usage_count("/completion_tokens"),
        streamed.usage_count("/completion_tokens"),
    );
    if let (Some(a), Some(b)) = tokens {
        if a != b {
            problems.push(format!("completion_tokens {a} vs {b}"));
        }
    }
    if problems.is_empty() {
        CheckRow::new(
            CHECK,
            CheckResult::Pass,
            format!(
                "identical: {} chars of content, {} of reasoning, finish_reason {}, {} tokens",
                text(whole.content.as_ref()).chars().count(),
                text(whole.reasoning.as_ref()).chars().count(),
                whole.finish_reason.as_deref().unwrap_or("missing"),
                tokens.0.map_or("?".to_string(), |t| t.to_string())
            ),
        )
    } else {
        CheckRow::new(CHECK, CheckResult::Fail, problems.join("; "))
    }
}

/// "degeneration": the detector on every reply, and any degeneration the server reported itself.
pub fn degeneration(replies: &[Reply], config: &Config) -> CheckRow {
    const CHECK: &str = "degeneration";
    let mut problems = Vec::new();
    let mut read = 0;
    for reply in replies.iter().filter(|r| r.error.is_none()) {
        read += 1;
        if let Some(verdict) = detector_verdict(reply, config) {
            problems.push(format!("{}: {verdict}", reply.label));
        }
        if let Some(report) = &reply.server_degeneration {
            let field = |name: &str| {
                report
                    .get(name)
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .to_string()
            };
            problems.push(format!(
                "{}: the server flagged {}: {}",
                reply.label,
                field("kind"),
                field("diagnosis")
            ));
        }
    }
    if read == 0 {
        CheckRow::new(CHECK, CheckResult::Fail, "no reply came back")
    } else if problems.is_empty() {
        CheckRow::new(
            CHECK,
            CheckResult::Pass,
            format!("no loop, collapse or unclosed reasoning in {read} replies"),
        )
    } else {
        CheckRow::new(CHECK, CheckResult::Fail, problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(label: &str, reasoning: Option<&str>, content: Option<&str>, finish: &str) -> Reply {
        let completion = 12;
        Reply::from_completion(
            label,
            json!({
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "reasoning_content": reasoning},
                    "finish_reason": finish,
                }],
                "usage": {
                    "prompt_tokens": 20, "completion_tokens": completion, "total_tokens": 20 + completion,
                    "completion_tokens_details": {"reasoning_tokens": if reasoning.is_some() { 8 } else { 0 }},
                },
            }),
        )
    }

    fn founding_failure() -> Reply {
        let looping = format!(
            "We are tasked with a simple arithmetic problem: {}",
            "2 + 2 = 2.".repeat(60)
        );
        let mut r = reply("2+2", Some(&looping), None, "length");
        r.usage.as_mut().unwrap()["completion_tokens_details"]["reasoning_tokens"] = json!(0);
        r
    }

    #[test]
    fn a_healthy_set_of_replies_passes_every_check() {
        let config = Config::default();
        let arithmetic_reply = reply("2+2", Some("2 + 2 = 4."), Some("4"), "stop");
        let prime = reply(
            "prime",
            Some("Try divisors up to the square root."),
            Some("```python\ndef is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n```"),
            "stop",
        );
        let mut merge = StreamMerge::default();
        for payload in [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":"Try divisors up to the square root."},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"```python\ndef is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n```"},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":12,"total_tokens":32,"completion_tokens_details":{"reasoning_tokens":8}}}"#,
            "[DONE]",
        ] {
            merge.push(payload).unwrap();
        }
        let streamed = merge.finish("prime (stream)");
        let replies = [arithmetic_reply.clone(), prime.clone(), streamed.clone()];
        let rows = [
            arithmetic(&arithmetic_reply),
            prime_function(&prime, &config),
            content_present(&replies),
            reasoning_split(&replies),
            finish_reasons(&replies, 200),
            usage_consistency(&replies),
            stream_matches(&prime, &streamed),
            degeneration(&replies, &config),
        ];
        for row in &rows {
            assert_eq!(row.result, CheckResult::Pass, "{row:?}");
        }
    }

    #[test]
    fn the_founding_failure_fails_the_checks_it_should() {
        let config = Config::default();
        let broken = founding_failure();
        let replies = [broken.clone()];
        let arithmetic_row = arithmetic(&broken);
        assert_eq!(arithmetic_row.result, CheckResult::Fail);
        assert!(
            arithmetic_row.detail.contains("content is null"),
            "{arithmetic_row:?}"
        );
        assert_eq!(content_present(&replies).result, CheckResult::Fail);
        let finish = finish_reasons(&replies, 200);
        assert_eq!(finish.result, CheckResult::Fail);
        assert!(finish.detail.contains("max_tokens (200)"), "{finish:?}");
        let usage = usage_consistency(&replies);
        assert_eq!(usage.result, CheckResult::Fail);
        assert!(usage.detail.contains("reasoning_tokens 0"), "{usage:?}");
        let degenerate = degeneration(&replies, &config);
        assert_eq!(degenerate.result, CheckResult::Fail);
        assert!(
            degenerate.detail.contains("periodic_loop"),
            "{degenerate:?}"
        );
        // "prime prime prime ...": `def` is missing and the output loops.
        let prime = reply("prime", None, Some(&"prime ".repeat(80)), "length");
        let row = prime_function(&prime, &config);
        assert_eq!(row.result, CheckResult::Fail);
        assert!(row.detail.contains("degenerates"), "{row:?}");
    }

    #[test]
    fn answers_are_matched_as_numbers_and_code() {
        assert!(contains_number("2 + 2 = 4.", "4"));
        assert!(contains_number("4", "4"));
        assert!(!contains_number("It is 14 or 42.", "4"));
        let wrong = reply("2+2", None, Some("five"), "stop");
        assert_eq!(arithmetic(&wrong).result, CheckResult::Fail);
        let no_code = reply("prime", None, Some("Check divisors up to sqrt(n)."), "stop");
        assert_eq!(
            prime_function(&no_code, &Config::default()).result,
            CheckResult::Fail
        );
    }

    #[test]
    fn reasoning_split_distinguishes_leaks_from_servers_without_a_parser() {
        let leaked = reply("2+2", None, Some("<think>\nsum\n</think>\n\n4"), "stop");
        assert_eq!(
            reasoning_split(std::slice::from_ref(&leaked)).result,
            CheckResult::Fail
        );
        let mut no_parser = leaked;
        no_parser.reasoning_field = false;
        assert_eq!(reasoning_split(&[no_parser]).result, CheckResult::Warn);
        let plain = reply("2+2", None, Some("4"), "stop");
        assert_eq!(reasoning_split(&[plain]).result, CheckResult::Skip);
    }

    #[test]
    fn stream_differences_and_server_reports_are_failures() {
        let whole = reply("prime", Some("think"), Some("def f(): pass"), "stop");
        let mut streamed = reply(
            "prime (stream)",
            Some("think"),
            Some("def g(): pass"),
            "stop",
        );
        streamed.stream_done = Some(true);
        let row = stream_matches(&whole, &streamed);
        assert_eq!(row.result, CheckResult::Fail);
        assert!(row.detail.contains("content differs at char 4"), "{row:?}");
        streamed.stream_done = Some(false);
        assert!(stream_matches(&whole, &streamed).detail.contains("[DONE]"));
        let mut flagged = reply("2+2", None, Some("4"), "stop");
        flagged.server_degeneration =
            Some(json!({"kind": "periodic_loop", "diagnosis": "TARGET forward pass"}));
        let row = degeneration(&[flagged], &Config::default());
        assert_eq!(row.result, CheckResult::Fail);
        assert!(row.detail.contains("TARGET forward pass"), "{row:?}");
        let mut merge = StreamMerge::default();
        assert!(merge.push(r#"{"error":{"message":"boom"}}"#).is_err());
        assert!(merge.push("not json").is_err());
    }
}
