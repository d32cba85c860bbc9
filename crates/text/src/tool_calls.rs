//! The `qwen3_coder` tool-call parser: Qwen3-Coder XML calls (`<tool_call><function=NAME><parameter=P>`)
//! in the content become OpenAI tool calls with JSON arguments typed by the tool's schema, whole or as
//! streamed deltas. Works on content text only (after reasoning.rs); it knows nothing of tokens or HTTP.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::tag_scan::{partial_tag_len, trailing_whitespace_len};

pub const TOOL_CALL_START: &str = "<tool_call>";
pub const TOOL_CALL_END: &str = "</tool_call>";
const FUNCTION_START: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAMETER_START: &str = "<parameter=";
const PARAMETER_END: &str = "</parameter>";

/// Parameter schemas of the request's tools, by tool name, for typing argument values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolSchemas {
    /// tool name -> `parameters.properties`
    properties: HashMap<String, Map<String, Value>>,
}

impl ToolSchemas {
    /// From OpenAI tool definitions (`{"type": "function", "function": {"name", "parameters"}}`; the bare
    /// `{"name", "parameters"}` form is accepted too). Entries without a name are ignored.
    pub fn from_tools(tools: &[Value]) -> Self {
        let properties = tools
            .iter()
            .filter_map(|tool| {
                let function = tool.get("function").unwrap_or(tool);
                let name = function.get("name")?.as_str()?;
                let props = function
                    .pointer("/parameters/properties")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                Some((name.to_string(), props))
            })
            .collect();
        Self { properties }
    }

    fn parameter(&self, tool: &str, parameter: &str) -> Option<&Value> {
        self.properties.get(tool)?.get(parameter)
    }
}

/// A complete tool call: `arguments` is a JSON object in text form (OpenAI's `function.arguments`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// Content with the tool calls taken out. `content` is `None` when no text is left.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCallSplit {
    pub content: Option<String>,
    pub calls: Vec<ParsedToolCall>,
}

/// Parses every well-formed call out of `text`. Text outside calls stays content, minus the whitespace
/// that separates it from a call; a malformed or unterminated call stays content verbatim. Call ids are
/// `{id_prefix}{index}`.
pub fn parse_tool_calls(text: &str, schemas: &ToolSchemas, id_prefix: &str) -> ToolCallSplit {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut segment_start = 0;
    let mut search_from = 0;
    while let Some(found) = text[search_from..].find(TOOL_CALL_START) {
        let tag = search_from + found;
        let after_tag = tag + TOOL_CALL_START.len();
        match parse_call_block(&text[after_tag..]) {
            BlockParse::Complete { call, consumed } => {
                let mut segment = &text[segment_start..tag];
                if !calls.is_empty() {
                    segment = segment.trim_start();
                }
                content.push_str(segment.trim_end());
                calls.push(call.finish(schemas, format!("{id_prefix}{}", calls.len())));
                let end = after_tag + consumed;
                let rest = &text[end..];
                let closing = rest.trim_start().strip_prefix(TOOL_CALL_END);
                segment_start = closing.map_or(end, |after| text.len() - after.len());
                search_from = segment_start;
            }
            BlockParse::Malformed | BlockParse::Incomplete => search_from = after_tag,
        }
    }
    let mut last = &text[segment_start..];
    if !calls.is_empty() {
        last = last.trim_start();
    }
    content.push_str(last);
    ToolCallSplit {
        content: (!content.is_empty()).then_some(content),
        calls,
    }
}

/// A call block as written by the model, before typing its values.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RawCall {
    name: String,
    parameters: Vec<(String, String)>,
}

impl RawCall {
    fn finish(self, schemas: &ToolSchemas, id: String) -> ParsedToolCall {
        let mut arguments = String::from("{");
        for (i, (name, raw)) in self.parameters.iter().enumerate() {
            if i > 0 {
                arguments.push(',');
            }
            let value = typed_value(raw, schemas.parameter(&self.name, name));
            // Serialising a string or a parsed JSON value cannot fail.
            arguments.push_str(&serde_json::to_string(name).unwrap_or_default());
            arguments.push(':');
            arguments.push_str(&serde_json::to_string(&value).unwrap_or_default());
        }
        arguments.push('}');
        ParsedToolCall {
            id,
            name: self.name,
            arguments,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum BlockParse {
    /// More text could still make it a call.
    Incomplete,
    /// No text appended later can make it a call.
    Malformed,
    /// `consumed`: bytes up to and including `</function>`.
    Complete { call: RawCall, consumed: usize },
}

/// Parses the text after `<tool_call>`: whitespace, `<function=NAME>`, body, `</function>`. Decisions only
/// depend on text that is already final, so a longer text never changes an earlier verdict other than
/// `Incomplete`.
fn parse_call_block(after_tag: &str) -> BlockParse {
    match parse_call_header(after_tag) {
        Header::Incomplete => BlockParse::Incomplete,
        Header::Malformed => BlockParse::Malformed,
        Header::Complete { name, body_start } => {
            match find_call_end(after_tag, name, body_start, body_start) {
                Some((call, consumed)) => BlockParse::Complete { call, consumed },
                None => BlockParse::Incomplete,
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Header {
    Incomplete,
    Malformed,
    /// `body_start`: byte offset of the function body in the text after `<tool_call>`.
    Complete {
        name: String,
        body_start: usize,
    },
}

/// Whitespace then `<function=NAME>`; a name running into a newline or `<` is malformed.
fn parse_call_header(after_tag: &str) -> Header {
    let trimmed = after_tag.trim_start();
    let Some(after_function) = trimmed.strip_prefix(FUNCTION_START) else {
        return if FUNCTION_START.starts_with(trimmed) {
            Header::Incomplete
        } else {
            Header::Malformed
        };
    };
    let Some(name_end) = after_function.find(['>', '\n', '<']) else {
        return Header::Incomplete;
    };
    let name = after_function[..name_end].trim();
    if !after_function[name_end..].starts_with('>') || name.is_empty() {
        return Header::Malformed;
    }
    Header::Complete {
        name: name.to_string(),
        body_start: after_tag.len() - after_function.len() + name_end + 1,
    }
}

/// The call whose body starts at `body_start`, once `</function>` is in the text. `search_from` lets a
/// stream skip text it already searched.
fn find_call_end(
    after_tag: &str,
    name: String,
    body_start: usize,
    search_from: usize,
) -> Option<(RawCall, usize)> {
    let body_end = search_from + after_tag[search_from..].find(FUNCTION_END)?;
    let call = RawCall {
        name,
        parameters: parse_parameters(&after_tag[body_start..body_end]),
    };
    Some((call, body_end + FUNCTION_END.len()))
}

/// `<parameter=NAME>\nVALUE\n</parameter>` pairs of a function body. Lenient like the reference parsers:
/// a missing `</parameter>` ends the value at the next `<parameter=` or at the end of the body.
fn parse_parameters(body: &str) -> Vec<(String, String)> {
    let mut parameters = Vec::new();
    let mut rest = body;
    while let Some(start) = rest.find(PARAMETER_START) {
        let after = &rest[start + PARAMETER_START.len()..];
        let Some(name_end) = after.find('>') else {
            break;
        };
        let name = after[..name_end].trim().to_string();
        let value_and_rest = &after[name_end + 1..];
        let end = value_and_rest.find(PARAMETER_END);
        let next_start = value_and_rest.find(PARAMETER_START);
        let (value, next) = match (end, next_start) {
            (Some(end), next) if next.is_none_or(|n| end < n) => (
                &value_and_rest[..end],
                &value_and_rest[end + PARAMETER_END.len()..],
            ),
            (_, Some(n)) => (&value_and_rest[..n], &value_and_rest[n..]),
            _ => (value_and_rest, ""),
        };
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        parameters.push((name, value.to_string()));
        rest = next;
    }
    parameters
}

/// The JSON value of a parameter written as text: typed by the schema's `type` (also inside `anyOf` /
/// `oneOf`); strings and values that do not parse as their type stay strings.
fn typed_value(raw: &str, schema: Option<&Value>) -> Value {
    let types = schema.map(schema_types).unwrap_or_default();
    let text = raw.trim();
    for kind in &types {
        let parsed = match kind.as_str() {
            "integer" => serde_json::from_str::<Value>(text)
                .ok()
                .filter(|v| v.is_i64() || v.is_u64()),
            "number" => serde_json::from_str::<Value>(text)
                .ok()
                .filter(Value::is_number),
            "boolean" => match text.to_ascii_lowercase().as_str() {
                "true" => Some(Value::Bool(true)),
                "false" => Some(Value::Bool(false)),
                _ => None,
            },
            "object" => serde_json::from_str::<Value>(text)
                .ok()
                .filter(Value::is_object),
            "array" => serde_json::from_str::<Value>(text)
                .ok()
                .filter(Value::is_array),
            "null" => (text == "null").then_some(Value::Null),
            _ => None,
        };
        if let Some(value) = parsed {
            return value;
        }
    }
    Value::String(raw.to_string())
}

fn schema_types(schema: &Value) -> Vec<String> {
    let mut types = Vec::new();
    let mut add = |t: &Value| match t {
        Value::String(s) => types.push(s.clone()),
        Value::Array(items) => {
            types.extend(items.iter().filter_map(Value::as_str).map(String::from))
        }
        _ => {}
    };
    if let Some(t) = schema.get("type") {
        add(t);
    }
    for key in ["anyOf", "oneOf"] {
        for option in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(t) = option.get("type") {
                add(t);
            }
        }
    }
    types
}

/// One OpenAI streaming tool-call delta. The first delta of a call carries `id` and `name` (with empty
/// `arguments`); later ones carry argument text to append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallChunk {
    pub index: usize,
    pub id: Option<String>,
    pub name: Option<String>,
    pub arguments: String,
}

/// New content text and tool-call deltas from one streamed chunk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCallDelta {
    pub content: String,
    pub tool_calls: Vec<ToolCallChunk>,
}

impl ToolCallDelta {
    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.tool_calls.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Plain text. `after_call`: directly after a call, where leading whitespace is dropped.
    Outside { after_call: bool },
    /// Inside `<tool_call>`; `pending` holds the text after the tag. `held_whitespace` preceded the tag
    /// and goes back into the content if the call turns out malformed. Once the header is parsed,
    /// `pending[..searched]` is known to hold no `</function>` start, so long bodies are scanned once.
    InCall {
        held_whitespace: String,
        header: Option<(String, usize)>,
        searched: usize,
    },
    /// After `</function>`: an optional `</tool_call>` (after whitespace) is consumed.
    AfterCall,
}

/// Streaming form of [`parse_tool_calls`]: feed content deltas, get content and tool-call deltas whose
/// concatenations equal the non-streaming result. A call is emitted once its `</function>` arrives, so a
/// malformed or cut-off call can still go out as plain content.
#[derive(Debug, Clone)]
pub struct ToolCallStream {
    schemas: ToolSchemas,
    id_prefix: String,
    phase: Phase,
    pending: String,
    calls: usize,
}

impl ToolCallStream {
    pub fn new(schemas: ToolSchemas, id_prefix: &str) -> Self {
        Self {
            schemas,
            id_prefix: id_prefix.to_string(),
            phase: Phase::Outside { after_call: false },
            pending: String::new(),
            calls: 0,
        }
    }

    /// Number of calls emitted so far (a finished response with calls has finish_reason `tool_calls`).
    pub fn call_count(&self) -> usize {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> ToolCallDelta {
        self.pending.push_str(text);
        let mut delta = ToolCallDelta::default();
        self.run(&mut delta, false);
        delta
    }

    /// Flushes held-back text; an unterminated call becomes content.
    pub fn finish(&mut self) -> ToolCallDelta {
        let mut delta = ToolCallDelta::default();
        self.run(&mut delta, true);
        delta.content.push_str(&std::mem::take(&mut self.pending));
        self.phase = Phase::Outside { after_call: false };
        delta
    }

    fn run(&mut self, delta: &mut ToolCallDelta, at_end: bool) {
        loop {
            let before = (self.phase.clone(), self.pending.len());
            self.advance(delta, at_end);
            if (self.phase.clone(), self.pending.len()) == before {
                return;
            }
        }
    }

    fn advance(&mut self, delta: &mut ToolCallDelta, at_end: bool) {
        match &mut self.phase {
            Phase::Outside { after_call } => {
                if *after_call {
                    let start = self.pending.len() - self.pending.trim_start().len();
                    self.pending.drain(..start);
                    if self.pending.is_empty() {
                        return;
                    }
                    *after_call = false;
                }
                if let Some(tag) = self.pending.find(TOOL_CALL_START) {
                    let text_end = tag - trailing_whitespace_len(&self.pending[..tag]);
                    delta.content.push_str(&self.pending[..text_end]);
                    let held_whitespace = self.pending[text_end..tag].to_string();
                    self.pending.drain(..tag + TOOL_CALL_START.len());
                    self.phase = Phase::InCall {
                        held_whitespace,
                        header: None,
                        searched: 0,
                    };
                    return;
                }
                if at_end {
                    return;
                }
                let text_end =
                    self.pending.len() - partial_tag_len(&self.pending, &[TOOL_CALL_START]);
                let hold_from = text_end - trailing_whitespace_len(&self.pending[..text_end]);
                delta.content.extend(self.pending.drain(..hold_from));
            }
            Phase::InCall {
                held_whitespace,
                header,
                searched,
            } => {
                let verdict = match header {
                    None => match parse_call_header(&self.pending) {
                        Header::Complete { name, body_start } => {
                            *header = Some((name, body_start));
                            *searched = body_start;
                            return;
                        }
                        Header::Incomplete => BlockParse::Incomplete,
                        Header::Malformed => BlockParse::Malformed,
                    },
                    Some((name, body_start)) => {
                        // A `</function>` may straddle the previous end of the text.
                        let from = searched
                            .saturating_sub(FUNCTION_END.len() - 1)
                            .max(*body_start);
                        let from = (0..=from)
                            .rev()
                            .find(|&i| self.pending.is_char_boundary(i))
                            .unwrap_or(0);
                        match find_call_end(&self.pending, name.clone(), *body_start, from) {
                            Some((call, consumed)) => BlockParse::Complete { call, consumed },
                            None => {
                                *searched = self.pending.len();
                                BlockParse::Incomplete
                            }
                        }
                    }
                };
                match verdict {
                    BlockParse::Complete { call, consumed } => {
                        let index = self.calls;
                        let call = call.finish(&self.schemas, format!("{}{index}", self.id_prefix));
                        self.calls += 1;
                        delta.tool_calls.push(ToolCallChunk {
                            index,
                            id: Some(call.id),
                            name: Some(call.name),
                            arguments: String::new(),
                        });
                        delta.tool_calls.push(ToolCallChunk {
                            index,
                            id: None,
                            name: None,
                            arguments: call.arguments,
                        });
                        self.pending.drain(..consumed);
                        self.phase = Phase::AfterCall;
                    }
                    BlockParse::Incomplete if !at_end => {}
                    BlockParse::Malformed | BlockParse::Incomplete => {
                        // Not a call: the tag and the whitespace before it are plain text again.
                        let restored = format!("{held_whitespace}{TOOL_CALL_START}");
                        self.pending.insert_str(0, &restored);
                        delta.content.extend(self.pending.drain(..restored.len()));
                        self.phase = Phase::Outside { after_call: false };
                    }
                }
            }
            Phase::AfterCall => {
                let trimmed = self.pending.trim_start();
                if let Some(rest) = trimmed.strip_prefix(TOOL_CALL_END) {
                    let consumed = self.pending.len() - rest.len();
                    self.pending.drain(..consumed);
                    self.phase = Phase::Outside { after_call: true };
                } else if at_end || !TOOL_CALL_END.starts_with(trimmed) {
                    self.phase = Phase::Outside { after_call: true };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schemas() -> ToolSchemas {
        ToolSchemas::from_tools(&[
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"}, "detailed": {"type": "boolean"},
                "ratio": {"type": "number"}, "opts": {"type": "object"}, "tags": {"type": "array"},
                "maybe": {"type": ["integer", "null"]}, "either": {"anyOf": [{"type": "number"}, {"type": "string"}]}
            }}}}),
            json!({"name": "bare", "parameters": {"properties": {"n": {"type": "integer"}}}}),
        ])
    }

    fn call(name: &str, arguments: &str) -> (String, String) {
        (name.to_string(), arguments.to_string())
    }

    fn parse(text: &str) -> (Option<String>, Vec<(String, String)>) {
        let split = parse_tool_calls(text, &schemas(), "call_");
        for (i, c) in split.calls.iter().enumerate() {
            assert_eq!(c.id, format!("call_{i}"));
        }
        (
            split.content,
            split
                .calls
                .into_iter()
                .map(|c| (c.name, c.arguments))
                .collect(),
        )
    }

    const WEATHER: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>";

    /// (output, expected content, expected calls as (name, arguments))
    type Case = (String, Option<&'static str>, Vec<(String, String)>);

    fn cases() -> Vec<Case> {
        let weather = call("get_weather", r#"{"city":"Paris","days":2}"#);
        vec![
            (WEATHER.to_string(), None, vec![weather.clone()]),
            (format!("Let me check.\n\n{WEATHER}"), Some("Let me check."), vec![weather.clone()]),
            (format!("{WEATHER}\n{WEATHER}"), None, vec![weather.clone(), weather.clone()]),
            (format!("A {WEATHER}\n\nB\n"), Some("AB\n"), vec![weather.clone()]),
            ("No calls here.\n".to_string(), Some("No calls here.\n"), vec![]),
            (String::new(), None, vec![]),
            // Typed by schema: every JSON type, strings kept verbatim (inner newlines too).
            (
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork \n</parameter>\n<parameter=detailed>\nTrue\n</parameter>\n<parameter=ratio>\n2.50\n</parameter>\n<parameter=opts>\n{\"a\": [1, null]}\n</parameter>\n<parameter=tags>\n[\"x\"]\n</parameter>\n<parameter=maybe>\nnull\n</parameter>\n<parameter=either>\nabc\n</parameter>\n<parameter=unknown>\n5\n</parameter>\n</function>\n</tool_call>".to_string(),
                None,
                vec![call("get_weather", r#"{"city":"New\nYork ","detailed":true,"ratio":2.5,"opts":{"a":[1,null]},"tags":["x"],"maybe":null,"either":"abc","unknown":"5"}"#)],
            ),
            // Values that do not parse as their type stay strings; unknown tools keep strings.
            (
                "<tool_call>\n<function=get_weather>\n<parameter=days>\ntwo\n</parameter>\n</function>\n</tool_call><tool_call><function=other><parameter=n>\n1\n</parameter></function></tool_call>".to_string(),
                None,
                vec![call("get_weather", r#"{"days":"two"}"#), call("other", r#"{"n":"1"}"#)],
            ),
            // Bare tool form of the schema list, no parameters, missing </parameter> and </tool_call>.
            (
                "<tool_call>\n<function=bare>\n<parameter=n>\n7\n<parameter=m>\nx\n</function>".to_string(),
                None,
                vec![call("bare", r#"{"n":7,"m":"x"}"#)],
            ),
            ("<tool_call>\n<function=bare>\n</function>\n</tool_call>".to_string(), None, vec![call("bare", "{}")]),
            // Malformed: not a function block -> plain content, later valid call still parsed.
            (
                format!("x <tool_call>oops</tool_call> y\n{WEATHER}"),
                Some("x <tool_call>oops</tool_call> y"),
                vec![weather.clone()],
            ),
            ("<tool_call>\n<function=a\nb>\n</function>".to_string(), Some("<tool_call>\n<function=a\nb>\n</function>"), vec![]),
            ("<tool_call><function=>x</function>".to_string(), Some("<tool_call><function=>x</function>"), vec![]),
            // Unterminated (cut by max_tokens): the whole call stays content.
            (
                "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar".to_string(),
                Some("Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"),
                vec![],
            ),
            ("<tool_call>\n<func".to_string(), Some("<tool_call>\n<func"), vec![]),
            ("ends with <tool_ca".to_string(), Some("ends with <tool_ca"), vec![]),
            // Text after </function> without </tool_call> is content.
            (
                "<tool_call>\n<function=bare>\n</function>\nand more".to_string(),
                Some("and more"),
                vec![call("bare", "{}")],
            ),
            // Multi-byte text in values and around calls.
            (
                "日本 😀\n<tool_call>\n<function=get_weather>\n<parameter=city>\n東京 🗼\n</parameter>\n</function>\n</tool_call>".to_string(),
                Some("日本 😀"),
                vec![call("get_weather", r#"{"city":"東京 🗼"}"#)],
            ),
        ]
    }

    #[test]
    fn non_streaming_cases() {
        for (text, content, calls) in cases() {
            assert_eq!(
                parse(&text),
                (content.map(String::from), calls),
                "text {text:?}"
            );
        }
    }

    /// Streams `chunks`; returns (content, calls as (name, arguments)) and checks the delta protocol.
    fn stream(chunks: &[&str]) -> (String, Vec<(String, String)>) {
        let mut parser = ToolCallStream::new(schemas(), "call_");
        let mut content = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        let mut apply = |d: ToolCallDelta| {
            content.push_str(&d.content);
            for chunk in d.tool_calls {
                if let Some(name) = chunk.name {
                    assert_eq!(chunk.index, calls.len(), "new call index");
                    assert_eq!(chunk.id, Some(format!("call_{}", chunk.index)));
                    assert!(chunk.arguments.is_empty(), "name comes first");
                    calls.push((name, String::new()));
                } else {
                    assert!(chunk.id.is_none());
                    calls[chunk.index].1.push_str(&chunk.arguments);
                }
            }
        };
        for chunk in chunks {
            apply(parser.push(chunk));
        }
        apply(parser.finish());
        assert_eq!(parser.call_count(), calls.len());
        (content, calls)
    }

    fn chunkings(text: &str, max_cuts: usize, mut each: impl FnMut(&[&str])) {
        let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).skip(1).collect();
        let positions: Vec<usize> = if bounds.len() <= max_cuts {
            bounds
        } else {
            (0..max_cuts)
                .map(|k| bounds[k * bounds.len() / max_cuts])
                .collect()
        };
        for mask in 0u32..(1 << positions.len()) {
            let mut chunks = Vec::new();
            let mut last = 0;
            for (bit, &pos) in positions.iter().enumerate() {
                if mask & (1 << bit) != 0 {
                    chunks.push(&text[last..pos]);
                    last = pos;
                }
            }
            chunks.push(&text[last..]);
            each(&chunks);
        }
    }

    #[test]
    fn streaming_equals_non_streaming_for_every_chunking() {
        let mut checked = 0usize;
        for (text, content, calls) in cases() {
            let expected = (content.unwrap_or("").to_string(), calls);
            chunkings(&text, 12, |chunks| {
                assert_eq!(stream(chunks), expected, "chunks {chunks:?}");
                checked += 1;
            });
            let chars: Vec<String> = text.chars().map(String::from).collect();
            let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
            assert_eq!(stream(&chars), expected, "char by char {text:?}");
            // Every split into two pieces at any char boundary.
            for (i, _) in text.char_indices() {
                assert_eq!(
                    stream(&[&text[..i], &text[i..]]),
                    expected,
                    "split at {i} of {text:?}"
                );
            }
        }
        assert!(checked > 40_000, "only {checked} chunkings checked");
    }

    #[test]
    fn half_a_million_chunkings_of_a_short_call() {
        // 2^19 chunkings, cut points spread over the 34 boundaries of the sample.
        let sample = "x <tool_call><function=f></function>";
        let expected = ("x".to_string(), vec![call("f", "{}")]);
        assert_eq!(parse(sample), (Some("x".into()), vec![call("f", "{}")]));
        let mut n = 0u64;
        chunkings(sample, 19, |chunks| {
            assert_eq!(stream(chunks), expected, "{chunks:?}");
            n += 1;
        });
        assert_eq!(n, 1 << 19);
    }

    #[test]
    fn call_is_emitted_when_its_function_block_closes() {
        let mut parser = ToolCallStream::new(schemas(), "id-");
        assert_eq!(parser.push("Hi <tool").content, "Hi");
        assert!(parser
            .push("_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n")
            .is_empty());
        let delta = parser.push("</function>");
        assert_eq!(
            delta.tool_calls,
            vec![
                ToolCallChunk {
                    index: 0,
                    id: Some("id-0".into()),
                    name: Some("get_weather".into()),
                    arguments: String::new()
                },
                ToolCallChunk {
                    index: 0,
                    id: None,
                    name: None,
                    arguments: r#"{"days":3}"#.into()
                },
            ]
        );
        assert!(parser.push("\n</tool_call>").is_empty());
        assert!(parser.finish().is_empty());
    }

    #[test]
    fn long_call_body_streamed_in_small_chunks() {
        let body: String = (0..20_000).map(|i| format!("line {i} </func\n")).collect();
        let text = format!("<tool_call>\n<function=write>\n<parameter=content>\n{body}\n</parameter>\n</function>\n</tool_call>");
        let expected_arguments =
            serde_json::to_string(&serde_json::json!({ "content": body })).unwrap();
        let chunks: Vec<&str> = text
            .as_bytes()
            .chunks(7)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        let (content, calls) = stream(&chunks);
        assert_eq!(content, "");
        assert_eq!(calls, vec![("write".to_string(), expected_arguments)]);
    }

    #[test]
    fn parameter_parsing_edge_cases() {
        assert_eq!(
            parse_parameters(
                "<parameter=a>\n\n1\n\n</parameter><parameter= b >x</parameter>junk<parameter=c"
            ),
            vec![
                ("a".to_string(), "\n1\n".to_string()),
                ("b".to_string(), "x".to_string())
            ]
        );
        assert_eq!(parse_call_block("  "), BlockParse::Incomplete);
        assert_eq!(parse_call_block("\n<function=abc"), BlockParse::Incomplete);
        assert_eq!(parse_call_block("\n<funky"), BlockParse::Malformed);
        assert_eq!(parse_call_block("<function=a>body"), BlockParse::Incomplete);
    }
}
