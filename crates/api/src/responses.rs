//! POST /v1/responses, a subset of OpenAI's Responses API: the request is translated into a chat
//! completion (instructions and input items into messages, function tools, `text.format` into
//! `response_format`), run through the chat route, and its result turned into a `response` object
//! with reasoning, message and function-call output items; with `stream: true` the same object is
//! built up by the Responses API's events (responses_stream.rs). Nothing is stored: fields that need
//! that (`previous_response_id`, `conversation`, `background`, ...) are 400s naming the field, as
//! are non-function tools and non-text inputs.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::chat::{chat_body, start_chat};
use crate::common::read_json;
use crate::error::ApiError;
use crate::fields::{describe, Fields};
use crate::response::new_id;
use crate::responses_stream::responses_stream;
use crate::state::AppState;

pub async fn responses(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrival = Instant::now();
    match respond(state, body, arrival).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// Fields this subset refuses, and why.
const REFUSED: [(&str, &str); 5] = [
    (
        "previous_response_id",
        "responses are not stored, so there is no previous response to continue; send the whole conversation as `input`",
    ),
    (
        "conversation",
        "conversations are not stored; send the whole conversation as `input`",
    ),
    ("background", "background responses are not supported"),
    ("prompt", "stored prompt templates are not supported; send `instructions` and `input`"),
    (
        "include",
        "`include` is not supported (no stored or encrypted items to include)",
    ),
];

async fn respond(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    arrival: Instant,
) -> Result<Response, ApiError> {
    let body = read_json(body, state.config.max_body_bytes)?;
    let f = Fields::of(&body)?;
    for (field, why) in REFUSED {
        let asked = match f.get(field) {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Array(items)) => !items.is_empty(),
            Some(_) => true,
        };
        if asked {
            return Err(ApiError::unsupported(field, why));
        }
    }
    let stream = f.bool("stream")?.unwrap_or(false);
    let chat = to_chat(&f)?;
    if stream {
        let started = start_chat(&state, &chat, arrival).map_err(responses_error)?;
        return responses_stream(state, started, &f, &chat);
    }
    let completion = chat_body(Arc::clone(&state), &chat, arrival)
        .await
        .map_err(responses_error)?;
    let bytes = axum::body::to_bytes(completion.into_body(), usize::MAX)
        .await
        .map_err(|e| ApiError::internal(format!("reading the completion: {e}")))?;
    let completion: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::internal(format!("reading the completion: {e}")))?;
    Ok(axum::Json(to_response(&f, &chat, &completion)).into_response())
}

/// Chat's field names in an error turned into the Responses API's.
pub(crate) fn responses_error(mut error: ApiError) -> ApiError {
    let rename = |text: &str| {
        text.replace("response_format", "text.format")
            .replace("max_tokens", "max_output_tokens")
            .replace("messages", "input")
    };
    error.param = error.param.as_deref().map(rename);
    error.message = rename(&error.message);
    error
}

/// The text of a message's `content`: a string, or the `text` of its text parts.
fn content_text(content: &Value, param: &str) -> Result<String, ApiError> {
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (i, part) in parts.iter().enumerate() {
                match (
                    part.get("type").and_then(Value::as_str),
                    part.get("text").and_then(Value::as_str),
                ) {
                    (Some("input_text" | "output_text" | "text"), Some(t)) => text.push_str(t),
                    _ => {
                        return Err(ApiError::unsupported(
                            &format!("{param}[{i}]"),
                            format!(
                                "only text content is supported (`input_text`), found {}",
                                describe(part)
                            ),
                        ))
                    }
                }
            }
            Ok(text)
        }
        other => Err(ApiError::invalid(
            param,
            format!(
                "`{param}` must be a string or an array of content parts, found {}",
                describe(other)
            ),
        )),
    }
}

/// `instructions` and `input` as chat messages.
fn messages(f: &Fields) -> Result<Vec<Value>, ApiError> {
    let mut messages = Vec::new();
    if let Some(instructions) = f.string("instructions")? {
        messages.push(json!({"role": "system", "content": instructions}));
    }
    match f.get("input") {
        None => return Err(ApiError::invalid("input", "`input` is required")),
        Some(Value::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let param = format!("input[{i}]");
                let kind = item
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("message");
                match kind {
                    "message" => {
                        let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                        let content = content_text(
                            item.get("content").unwrap_or(&Value::Null),
                            &format!("{param}.content"),
                        )?;
                        messages.push(json!({"role": role, "content": content}));
                    }
                    "function_call" => {
                        let call = json!({
                            "id": item.get("call_id").cloned().unwrap_or(Value::Null),
                            "type": "function",
                            "function": {
                                "name": item.get("name").cloned().unwrap_or(Value::Null),
                                "arguments": item.get("arguments").cloned().unwrap_or(json!("{}")),
                            }
                        });
                        // Consecutive calls belong to one assistant turn.
                        match messages.last_mut() {
                            Some(last)
                                if last["role"] == "assistant" && last["tool_calls"].is_array() =>
                            {
                                if let Some(calls) = last["tool_calls"].as_array_mut() {
                                    calls.push(call);
                                }
                            }
                            _ => messages.push(
                                json!({"role": "assistant", "content": null, "tool_calls": [call]}),
                            ),
                        }
                    }
                    "function_call_output" => {
                        let output = match item.get("output") {
                            Some(Value::String(text)) => text.clone(),
                            Some(other) => content_text(other, &format!("{param}.output"))?,
                            None => String::new(),
                        };
                        messages.push(json!({
                            "role": "tool",
                            "tool_call_id": item.get("call_id").cloned().unwrap_or(Value::Null),
                            "content": output,
                        }));
                    }
                    // Earlier reasoning is not shown to the model again (the templates drop it).
                    "reasoning" => {}
                    other => {
                        return Err(ApiError::unsupported(
                            &format!("{param}.type"),
                            format!("input items of type {other:?} are not supported"),
                        ))
                    }
                }
            }
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "input",
                format!(
                    "`input` must be a string or an array of items, found {}",
                    describe(other)
                ),
            ))
        }
    }
    Ok(messages)
}

/// Function tools in the chat form.
fn tools(f: &Fields) -> Result<Option<Value>, ApiError> {
    let Some(tools) = f.array("tools")? else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {
                let mut function = Map::new();
                for key in ["name", "description", "parameters"] {
                    if let Some(value) = tool.get(key).filter(|v| !v.is_null()) {
                        function.insert(key.to_string(), value.clone());
                    }
                }
                out.push(json!({"type": "function", "function": function}));
            }
            other => {
                return Err(ApiError::unsupported(
                    &format!("tools[{i}].type"),
                    format!(
                        "only function tools are supported, found {}",
                        other.map_or_else(|| describe(tool), |t| format!("{t:?}"))
                    ),
                ))
            }
        }
    }
    Ok(Some(Value::Array(out)))
}

/// The chat completion request a Responses request asks for.
fn to_chat(f: &Fields) -> Result<Value, ApiError> {
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages(f)?));
    chat.insert("stream".into(), json!(false));
    if let Some(max) = f.get("max_output_tokens") {
        chat.insert("max_tokens".into(), max.clone());
    }
    // Fields with the same meaning (and deltaserve / SGLang extensions) pass through.
    for key in [
        "model",
        "temperature",
        "top_p",
        "seed",
        "parallel_tool_calls",
        "top_k",
        "min_p",
        "repetition_penalty",
        "chat_template_kwargs",
        "regex",
        "ebnf",
        "disable_speculation",
    ] {
        if let Some(value) = f.get(key) {
            chat.insert(key.into(), value.clone());
        }
    }
    if let Some(tools) = tools(f)? {
        chat.insert("tools".into(), tools);
    }
    match f.get("tool_choice") {
        None => {}
        Some(choice @ Value::String(_)) => {
            chat.insert("tool_choice".into(), choice.clone());
        }
        Some(choice) => match (
            choice.get("type").and_then(Value::as_str),
            choice.get("name").and_then(Value::as_str),
        ) {
            (Some("function"), Some(name)) => {
                chat.insert(
                    "tool_choice".into(),
                    json!({"type": "function", "function": {"name": name}}),
                );
            }
            _ => {
                return Err(ApiError::unsupported(
                    "tool_choice",
                    format!(
                        "`tool_choice` must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"name\": ...}}, found {}",
                        describe(choice)
                    ),
                ))
            }
        },
    }
    if let Some(format) = f.get("text").and_then(|t| t.get("format")) {
        let format = match format.get("type").and_then(Value::as_str) {
            Some("json_schema") => json!({"type": "json_schema", "json_schema": {
                "name": format.get("name").cloned().unwrap_or(json!("output")),
                "schema": format.get("schema").cloned().unwrap_or(Value::Null),
                "strict": format.get("strict").cloned().unwrap_or(Value::Null),
            }}),
            _ => format.clone(),
        };
        chat.insert("response_format".into(), format);
    }
    if let Some(effort) = f
        .get("reasoning")
        .and_then(|r| r.get("effort"))
        .and_then(Value::as_str)
    {
        // The models think or do not; there are no levels in between.
        if effort == "none" {
            let kwargs = chat
                .entry("chat_template_kwargs")
                .or_insert_with(|| json!({}));
            if let Some(kwargs) = kwargs.as_object_mut() {
                kwargs.insert("enable_thinking".into(), json!(false));
            }
        }
    }
    Ok(Value::Object(chat))
}

/// The `response` object for a finished chat completion.
fn to_response(f: &Fields, chat: &Value, completion: &Value) -> Value {
    let choice = &completion["choices"][0];
    let message = &choice["message"];
    let ids = ItemIds::of_chat(completion["id"].as_str().unwrap_or(""));
    let mut output = Vec::new();
    if let Some(reasoning) = message["reasoning_content"]
        .as_str()
        .filter(|t| !t.is_empty())
    {
        output.push(reasoning_item(&ids.reasoning(), reasoning, "completed"));
    }
    if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
        output.push(message_item(&ids.message(), text, "completed"));
    }
    for (i, call) in message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        output.push(function_call_item(
            &ids.call(i),
            call["id"].as_str().unwrap_or(""),
            call["function"]["name"].as_str().unwrap_or(""),
            call["function"]["arguments"].as_str().unwrap_or(""),
            "completed",
        ));
    }
    let mut response = response_object(
        f,
        chat,
        &new_id("resp"),
        &completion["created"],
        &completion["model"],
    );
    finish_response(
        &mut response,
        choice["finish_reason"].as_str().unwrap_or(""),
        output,
        &completion["usage"],
    );
    response
}

/// The ids of one response's output items, from the chat completion id it runs as.
pub(crate) struct ItemIds {
    suffix: String,
}

impl ItemIds {
    pub fn of_chat(chat_id: &str) -> Self {
        Self {
            suffix: chat_id.trim_start_matches("chatcmpl-").to_string(),
        }
    }

    pub fn reasoning(&self) -> String {
        format!("rs_{}", self.suffix)
    }

    pub fn message(&self) -> String {
        format!("msg_{}", self.suffix)
    }

    /// The item id of the `index`-th function call.
    pub fn call(&self, index: usize) -> String {
        format!("fc_{}_{index}", self.suffix)
    }
}

/// A reasoning output item.
pub(crate) fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "reasoning",
        "id": id,
        "summary": [],
        "content": [reasoning_part(text)],
        "status": status,
    })
}

pub(crate) fn reasoning_part(text: &str) -> Value {
    json!({"type": "reasoning_text", "text": text})
}

/// An assistant message output item with one text part.
pub(crate) fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "message",
        "id": id,
        "status": status,
        "role": "assistant",
        "content": [output_text_part(text)],
    })
}

pub(crate) fn output_text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// A function-call output item.
pub(crate) fn function_call_item(
    id: &str,
    call_id: &str,
    name: &str,
    arguments: &str,
    status: &str,
) -> Value {
    json!({
        "type": "function_call",
        "id": id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    })
}

/// The `response` object of a request as it starts: `in_progress`, no output, no usage.
pub(crate) fn response_object(
    f: &Fields,
    chat: &Value,
    id: &str,
    created: &Value,
    model: &Value,
) -> Value {
    let text_format = f
        .get("text")
        .and_then(|t| t.get("format"))
        .cloned()
        .unwrap_or_else(|| json!({"type": "text"}));
    let tools: Vec<Value> = chat["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            let mut tool = t["function"].clone();
            tool["type"] = json!("function");
            tool
        })
        .collect();
    json!({
        "id": id,
        "object": "response",
        "created_at": created,
        "status": "in_progress",
        "error": null,
        "incomplete_details": null,
        "instructions": f.get("instructions").cloned().unwrap_or(Value::Null),
        "max_output_tokens": f.get("max_output_tokens").cloned().unwrap_or(Value::Null),
        "model": model,
        "output": [],
        "parallel_tool_calls": f.get("parallel_tool_calls").cloned().unwrap_or(json!(true)),
        "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null},
        "store": false,
        "temperature": f.get("temperature").cloned().unwrap_or(Value::Null),
        "text": {"format": text_format},
        "tool_choice": f.get("tool_choice").cloned().unwrap_or(json!("auto")),
        "tools": tools,
        "top_p": f.get("top_p").cloned().unwrap_or(Value::Null),
        "truncation": "disabled",
        "metadata": {},
        "usage": null,
    })
}

/// Completes `response` with the chat finish reason, the output items and the chat `usage`; returns
/// its status (`completed`, `incomplete` at the token limit, `failed` on an error).
pub(crate) fn finish_response(
    response: &mut Value,
    finish_reason: &str,
    output: Vec<Value>,
    chat_usage: &Value,
) -> &'static str {
    let status = match finish_reason {
        "length" => {
            response["incomplete_details"] = json!({"reason": "max_output_tokens"});
            "incomplete"
        }
        "error" => "failed",
        _ => "completed",
    };
    response["status"] = json!(status);
    response["output"] = Value::Array(output);
    response["usage"] = json!({
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": chat_usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0),
        },
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {
            "reasoning_tokens": chat_usage["completion_tokens_details"]["reasoning_tokens"],
        },
        "total_tokens": chat_usage["total_tokens"],
    });
    status
}
