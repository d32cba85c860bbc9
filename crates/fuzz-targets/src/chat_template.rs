//! Fuzz target: hostile chat templates and hostile conversations. The input is a template source, a NUL,
//! then the conversation (a JSON object with `messages`/`tools`/`kwargs`, a JSON message array, or plain
//! text put into every field of a fixed conversation). Renders must end in a result or a typed error
//! within the fuel and output bounds: no panic, no hang, no unbounded output.

use deltaserve_text::{ChatMessage, ChatTemplate, MessageContent, RenderOptions, ToolCall};
use serde_json::{json, Value};

use crate::demo::demo;

/// Template instructions a fuzzed template may run: small, so a runaway loop ends within milliseconds.
const FUEL: u64 = 100_000;
/// Output cap of a fuzzed template's render.
const MAX_RENDERED_BYTES: usize = 64 * 1024;
/// Most messages taken from one input (the server's own limit is `--max-messages`).
const MAX_MESSAGES: usize = 64;

pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (source, conversation) = text.split_once('\0').unwrap_or((&text, ""));
    let (messages, options) = conversation_of(conversation);

    if let Ok(template) = ChatTemplate::with_fuel(source, FUEL) {
        let template = template
            .with_special_tokens(demo().tokenizer.special_token_strings())
            .with_max_rendered_bytes(MAX_RENDERED_BYTES);
        if let Ok(rendered) = template.render(&messages, &options) {
            assert!(
                rendered.len() <= MAX_RENDERED_BYTES,
                "a render of {} bytes passed the {MAX_RENDERED_BYTES}-byte cap",
                rendered.len()
            );
        }
    }

    // The real template with arbitrary messages, as the server renders them (its own fuel and cap).
    let with_tools = options.tools.as_ref().is_some_and(|t| !t.is_empty());
    if let Ok(rendered) = demo().template(with_tools).render(&messages, &options) {
        // Every role and the generation prompt open a turn; only an empty conversation renders nothing.
        assert!(
            rendered.is_empty() || rendered.starts_with("<|im_start|>"),
            "the demo template rendered text outside a turn: {rendered:?}"
        );
    }
}

/// The messages and render options an input's conversation part describes.
fn conversation_of(text: &str) -> (Vec<ChatMessage>, RenderOptions) {
    let mut options = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    let messages = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(object)) => {
            if let Some(Value::Array(tools)) = object.get("tools") {
                options.tools = Some(tools.clone());
            }
            if let Some(Value::Object(kwargs)) = object.get("kwargs") {
                options.kwargs = kwargs.clone();
            }
            if let Some(Value::Bool(add)) = object.get("add_generation_prompt") {
                options.add_generation_prompt = *add;
            }
            match object.get("messages") {
                Some(Value::Array(items)) => messages_of(items),
                _ => Vec::new(),
            }
        }
        Ok(Value::Array(items)) => messages_of(&items),
        _ => conversation_around(text),
    };
    (messages, options)
}

/// The items that deserialize as chat messages (any role: the template, not the request parser, is
/// under test here).
fn messages_of(items: &[Value]) -> Vec<ChatMessage> {
    items
        .iter()
        .take(MAX_MESSAGES)
        .filter_map(|item| serde_json::from_value(item.clone()).ok())
        .collect()
}

/// A conversation with `text` in every place a client controls: system, user, assistant content and
/// reasoning, a tool call's name and arguments, a tool result.
fn conversation_around(text: &str) -> Vec<ChatMessage> {
    let mut assistant = ChatMessage::text("assistant", text);
    assistant.reasoning_content = Some(text.to_string());
    let call: Option<ToolCall> = serde_json::from_value(json!({
        "id": text, "type": "function",
        "function": {"name": text, "arguments": {"query": text, "n": 1}}
    }))
    .ok();
    assistant.tool_calls = call.map(|c| vec![c]);
    let mut tool = ChatMessage::text("tool", text);
    tool.tool_call_id = Some(text.to_string());
    let parts = ChatMessage {
        content: Some(MessageContent::Parts(vec![
            Value::String(text.to_string()),
            json!({"type": "text", "text": text}),
        ])),
        ..ChatMessage::text("user", "")
    };
    vec![
        ChatMessage::text("system", text),
        ChatMessage::text("user", text),
        assistant,
        tool,
        parts,
    ]
}
