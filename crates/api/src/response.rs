//! JSON shapes of OpenAI responses shared by the routes: ids, usage (with reasoning tokens and the
//! speculative-decoding extra), chat and completion logprobs, tool calls, SSE framing. Shapes only; what
//! goes into them is the routes' business.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use deltaserve_text::{ParsedToolCall, ToolCallChunk};
use serde_json::{json, Map, Value};

use crate::generation::{ChoiceUsage, TokenInfo};

/// A response id such as `chatcmpl-1a2b...`: time-based plus a process-wide counter, so unique per
/// process and hard to guess across restarts.
pub fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    // SplitMix64 of the time and counter: a well-spread 64-bit id.
    let mut z = nanos ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    format!("{prefix}-{z:016x}{n:04x}")
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// OpenAI `usage` plus `completion_tokens_details.reasoning_tokens`, and `spec_decoding` when any
/// tokens were drafted (an extra field OpenAI clients tolerate).
/// Identity of one response, repeated in its body and in every chunk of its stream.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseHead {
    /// A fresh id (`{id_prefix}-...`) created now, for `model`.
    pub fn new(id_prefix: &str, model: &str) -> Self {
        Self {
            id: new_id(id_prefix),
            created: unix_now(),
            model: model.to_string(),
        }
    }

    /// The fields every response body and chunk starts with, around `choices`.
    pub fn body(&self, object: &str, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// One stream chunk; with `include_usage` it carries `usage: null` until the final usage chunk.
    pub fn chunk(&self, object: &str, choices: Vec<Value>, include_usage: bool) -> Value {
        let mut chunk = self.body(object, choices);
        if include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }
}

pub fn usage_json(usage: &ChoiceUsage) -> Value {
    let mut object = Map::new();
    object.insert("prompt_tokens".into(), json!(usage.prompt_tokens));
    object.insert("completion_tokens".into(), json!(usage.completion_tokens));
    object.insert(
        "total_tokens".into(),
        json!(usage.prompt_tokens + usage.completion_tokens),
    );
    object.insert(
        "prompt_tokens_details".into(),
        json!({ "cached_tokens": usage.cached_tokens }),
    );
    object.insert(
        "completion_tokens_details".into(),
        json!({ "reasoning_tokens": usage.reasoning_tokens }),
    );
    if usage.draft_tokens > 0 {
        object.insert(
            "spec_decoding".into(),
            json!({
                "draft_tokens": usage.draft_tokens,
                "accepted_tokens": usage.accepted_draft_tokens,
            }),
        );
    }
    Value::Object(object)
}

/// One token in chat logprobs: `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`.
fn chat_token_logprob(info: &TokenInfo) -> Value {
    json!({
        "token": info.token,
        "logprob": info.logprob,
        "bytes": info.bytes,
        "top_logprobs": info.top.iter().map(|alt| json!({
            "token": alt.token,
            "logprob": alt.logprob,
            "bytes": alt.bytes,
        })).collect::<Vec<_>>(),
    })
}

/// Chat `logprobs`: `{"content": [...]}`, or `null` when not requested.
pub fn chat_logprobs(requested: bool, tokens: &[TokenInfo]) -> Value {
    if !requested {
        return Value::Null;
    }
    json!({ "content": tokens.iter().map(chat_token_logprob).collect::<Vec<_>>(), "refusal": null })
}

/// Completions `logprobs`: parallel lists, `text_offset` counted in bytes from `offset`.
pub fn completion_logprobs(requested: bool, tokens: &[TokenInfo], offset: usize) -> Value {
    if !requested {
        return Value::Null;
    }
    let mut text_offset = Vec::with_capacity(tokens.len());
    let mut position = offset;
    for info in tokens {
        text_offset.push(position);
        position += info.bytes.len();
    }
    json!({
        "tokens": tokens.iter().map(|t| t.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": tokens.iter().map(|t| {
            let mut alternatives = Map::new();
            for alt in &t.top {
                alternatives.entry(alt.token.clone()).or_insert(json!(alt.logprob));
            }
            Value::Object(alternatives)
        }).collect::<Vec<_>>(),
        "text_offset": text_offset,
    })
}

/// A complete tool call in a chat message.
pub fn tool_call_json(call: &ParsedToolCall) -> Value {
    json!({
        "id": call.id,
        "type": "function",
        "function": { "name": call.name, "arguments": call.arguments },
    })
}

/// A streamed tool-call delta: the first one of a call carries id, type and name.
pub fn tool_call_chunk_json(chunk: &ToolCallChunk) -> Value {
    let mut object = Map::new();
    object.insert("index".into(), json!(chunk.index));
    if let Some(id) = &chunk.id {
        object.insert("id".into(), json!(id));
        object.insert("type".into(), json!("function"));
    }
    let mut function = Map::new();
    if let Some(name) = &chunk.name {
        function.insert("name".into(), json!(name));
    }
    function.insert("arguments".into(), json!(chunk.arguments));
    object.insert("function".into(), Value::Object(function));
    Value::Object(object)
}

/// One SSE event `data: <json>\n\n`.
pub fn sse_event(value: &Value) -> String {
    format!("data: {value}\n\n")
}

/// The end of an OpenAI stream.
pub const SSE_DONE: &str = "data: [DONE]\n\n";

pub fn sse_bytes(text: String) -> Result<Bytes, std::convert::Infallible> {
    Ok(Bytes::from(text))
}
