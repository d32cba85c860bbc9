//! Fuzz target: model output through the streaming reasoning splitter and tool-call parser, cut into
//! arbitrary chunks (input layout in chunks.rs). Each parser alone and the chain the chat route runs
//! (reasoning, then tool calls on the content) must stream exactly what the one-shot parse gives.

use deltaserve_text::{
    parse_tool_calls, split_reasoning, ReasoningStream, ToolCallDelta, ToolCallStream, ToolSchemas,
};
use serde_json::json;

use crate::chunks::{chunk_text, shape};

/// Flag bit: the prompt opened the think block.
const STARTS_IN_REASONING: u8 = 1;
/// Flag bit: the request's tools have no parameter schemas (all values stay strings).
const UNTYPED_TOOLS: u8 = 2;

const ID_PREFIX: &str = "call_x_0_";

pub fn run(data: &[u8]) {
    let input = shape(data);
    let text = input.text.as_ref();
    let chunks = chunk_text(text, input.lengths);
    let starts_in_reasoning = input.flags & STARTS_IN_REASONING != 0;
    let schemas = if input.flags & UNTYPED_TOOLS != 0 {
        ToolSchemas::default()
    } else {
        schemas()
    };

    // Reasoning alone.
    let split = split_reasoning(text, starts_in_reasoning);
    let (reasoning, content) = stream_reasoning(&chunks, starts_in_reasoning);
    assert_eq!(
        (reasoning.as_str(), content.as_str()),
        (
            split.reasoning.as_deref().unwrap_or(""),
            split.content.as_deref().unwrap_or("")
        ),
        "streamed reasoning split differs from the one-shot split; chunks {chunks:?}, starts in \
         reasoning {starts_in_reasoning}"
    );

    // Tool calls alone.
    check_tool_stream(text, chunks.iter().map(|c| c.to_string()), &schemas);

    // The chat route's chain: the reasoning stream's content deltas feed the tool-call stream.
    let content_deltas = reasoning_content_deltas(&chunks, starts_in_reasoning);
    check_tool_stream(
        split.content.as_deref().unwrap_or(""),
        content_deltas,
        &schemas,
    );
}

/// Tool schemas of every JSON type, so argument typing is exercised.
fn schemas() -> ToolSchemas {
    ToolSchemas::from_tools(&[
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "detailed": {"type": "boolean"},
            "ratio": {"type": "number"}, "opts": {"type": "object"}, "tags": {"type": "array"},
            "maybe": {"type": ["integer", "null"]},
            "either": {"anyOf": [{"type": "number"}, {"type": "string"}]}
        }}}}),
        json!({"name": "f", "parameters": {"properties": {"n": {"type": "integer"}}}}),
    ])
}

fn stream_reasoning(chunks: &[&str], starts_in_reasoning: bool) -> (String, String) {
    let mut parser = ReasoningStream::new(starts_in_reasoning);
    let (mut reasoning, mut content) = (String::new(), String::new());
    for chunk in chunks {
        let delta = parser.push(chunk);
        reasoning.push_str(&delta.reasoning);
        content.push_str(&delta.content);
    }
    let delta = parser.finish();
    reasoning.push_str(&delta.reasoning);
    content.push_str(&delta.content);
    (reasoning, content)
}

/// The content deltas the reasoning stream hands on, the last one from `finish`.
fn reasoning_content_deltas(chunks: &[&str], starts_in_reasoning: bool) -> Vec<String> {
    let mut parser = ReasoningStream::new(starts_in_reasoning);
    let mut deltas: Vec<String> = chunks.iter().map(|c| parser.push(c).content).collect();
    deltas.push(parser.finish().content);
    deltas
}

/// Streams `chunks` through a tool-call parser, checks the delta protocol (a call opens with its index,
/// id and name, then only appends arguments) and compares the result with `parse_tool_calls(text)`.
fn check_tool_stream(text: &str, chunks: impl IntoIterator<Item = String>, schemas: &ToolSchemas) {
    let mut parser = ToolCallStream::new(schemas.clone(), ID_PREFIX);
    let mut content = String::new();
    let mut calls: Vec<(String, String, String)> = Vec::new();
    let mut apply = |delta: ToolCallDelta| {
        content.push_str(&delta.content);
        for chunk in delta.tool_calls {
            match (chunk.id, chunk.name) {
                (Some(id), Some(name)) => {
                    assert_eq!(
                        chunk.index,
                        calls.len(),
                        "a new call must take the next index"
                    );
                    assert!(
                        chunk.arguments.is_empty(),
                        "a call's first delta carries no arguments"
                    );
                    calls.push((id, name, String::new()));
                }
                (None, None) => {
                    let call = calls
                        .get_mut(chunk.index)
                        .unwrap_or_else(|| panic!("arguments for unopened call {}", chunk.index));
                    call.2.push_str(&chunk.arguments);
                }
                (id, name) => panic!("a delta with id {id:?} but name {name:?}"),
            }
        }
    };
    let mut pushed = Vec::new();
    for chunk in chunks {
        apply(parser.push(&chunk));
        pushed.push(chunk);
    }
    apply(parser.finish());
    assert_eq!(parser.call_count(), calls.len());

    let expected = parse_tool_calls(text, schemas, ID_PREFIX);
    let expected_calls: Vec<(String, String, String)> = expected
        .calls
        .into_iter()
        .map(|c| (c.id, c.name, c.arguments))
        .collect();
    assert_eq!(
        (content.as_str(), &calls),
        (expected.content.as_deref().unwrap_or(""), &expected_calls),
        "streamed tool calls differ from the one-shot parse; chunks {pushed:?}"
    );
    for (_, _, arguments) in &calls {
        let parsed: serde_json::Value = serde_json::from_str(arguments)
            .unwrap_or_else(|e| panic!("arguments {arguments:?} are not JSON: {e}"));
        assert!(
            parsed.is_object(),
            "arguments {arguments:?} are not an object"
        );
    }
}
