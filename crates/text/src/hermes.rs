//! The JSON-in-`<tool_call>` tool-call parser (SGLang's `qwen`, vLLM's `hermes`): the calls of
//! Qwen3-Next's and Qwen2.5's templates, `<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>`,
//! whole or as streamed deltas. Same content rules as the `qwen3_coder` parser (tool_calls.rs): text
//! outside calls stays content minus the whitespace that separates it from a call, and a block that
//! is not a call stays content verbatim. Works on content text only; it knows nothing of tokens.

use serde_json::Value;

use crate::tag_scan::{partial_tag_len, trailing_whitespace_len};
use crate::tool_calls::{
    ParsedToolCall, ToolCallChunk, ToolCallDelta, ToolCallSplit, TOOL_CALL_END, TOOL_CALL_START,
};

/// The tool-call syntax a model writes, which decides the parser (and the tool-call grammar).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// Qwen3-Coder XML (`<function=NAME><parameter=P>`): Qwen3.5, Qwen3.6, Qwen3-Coder.
    Qwen3Coder,
    /// JSON inside `<tool_call>`: Qwen3-Next, Qwen2.5, Hermes-style templates.
    Hermes,
}

impl ToolCallFormat {
    /// The format of a `--tool-call-parser` name (SGLang's and vLLM's spellings).
    pub fn from_parser_name(name: &str) -> Option<Self> {
        match name {
            "qwen3_coder" => Some(Self::Qwen3Coder),
            "hermes" | "qwen" | "qwen25" => Some(Self::Hermes),
            _ => None,
        }
    }

    /// The format a chat template teaches: XML when it writes `<function=`, JSON when it writes
    /// `<tool_call>` without it, XML (the default of the served models) otherwise.
    pub fn from_template(template: &str) -> Self {
        if !template.contains("<function=") && template.contains(TOOL_CALL_START) {
            Self::Hermes
        } else {
            Self::Qwen3Coder
        }
    }
}

/// The call in the text between `<tool_call>` and `</tool_call>`: a JSON object with a string
/// `name` and an object `arguments` (`parameters` is accepted too; absent arguments are `{}`).
fn parse_body(body: &str, id: String) -> Option<ParsedToolCall> {
    let value: Value = serde_json::from_str(body.trim()).ok()?;
    let name = value.get("name")?.as_str()?.to_string();
    let arguments = match value.get("arguments").or_else(|| value.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(text)) => text.clone(),
        Some(object @ Value::Object(_)) => object.to_string(),
        Some(_) => return None,
    };
    Some(ParsedToolCall {
        id,
        name,
        arguments,
    })
}

/// Parses every well-formed call out of `text`; ids are `{id_prefix}{index}`. A last call cut off
/// before `</tool_call>` still counts when its JSON is complete.
pub fn parse_hermes_tool_calls(text: &str, id_prefix: &str) -> ToolCallSplit {
    let mut content = String::new();
    let mut calls: Vec<ParsedToolCall> = Vec::new();
    let mut segment_start = 0;
    let mut search_from = 0;
    while let Some(found) = text[search_from..].find(TOOL_CALL_START) {
        let tag = search_from + found;
        let after_tag = tag + TOOL_CALL_START.len();
        let (body, end) = match text[after_tag..].find(TOOL_CALL_END) {
            Some(n) => (
                &text[after_tag..after_tag + n],
                after_tag + n + TOOL_CALL_END.len(),
            ),
            None => (&text[after_tag..], text.len()),
        };
        match parse_body(body, format!("{id_prefix}{}", calls.len())) {
            Some(call) => {
                let mut segment = &text[segment_start..tag];
                if !calls.is_empty() {
                    segment = segment.trim_start();
                }
                content.push_str(segment.trim_end());
                calls.push(call);
                segment_start = end;
                search_from = end;
            }
            None => search_from = after_tag,
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

/// Streaming form of [`parse_hermes_tool_calls`]: the concatenated deltas equal the whole parse. A
/// call goes out in one delta (id, name and all its arguments) once its `</tool_call>` arrives.
#[derive(Debug, Clone)]
pub struct HermesToolCallStream {
    id_prefix: String,
    pending: String,
    /// Inside a `<tool_call>` block; the whitespace before the tag, given back if it is no call.
    in_call: Option<String>,
    /// Directly after a call, where leading whitespace is dropped.
    after_call: bool,
    calls: usize,
}

impl HermesToolCallStream {
    pub fn new(id_prefix: &str) -> Self {
        Self {
            id_prefix: id_prefix.to_string(),
            pending: String::new(),
            in_call: None,
            after_call: false,
            calls: 0,
        }
    }

    pub fn call_count(&self) -> usize {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> ToolCallDelta {
        self.pending.push_str(text);
        let mut delta = ToolCallDelta::default();
        while self.step(&mut delta, false) {}
        delta
    }

    /// Flushes held-back text; a block without `</tool_call>` is a call if its JSON is complete,
    /// else content.
    pub fn finish(&mut self) -> ToolCallDelta {
        let mut delta = ToolCallDelta::default();
        loop {
            while self.step(&mut delta, true) {}
            let Some(held) = self.in_call.take() else {
                break;
            };
            let body = std::mem::take(&mut self.pending);
            if !self.emit_call(&body, &mut delta) {
                delta.content.push_str(&held);
                delta.content.push_str(TOOL_CALL_START);
                self.pending = body;
                self.after_call = false;
            }
        }
        if self.after_call {
            let start = self.pending.len() - self.pending.trim_start().len();
            self.pending.drain(..start);
        }
        delta.content.push_str(&std::mem::take(&mut self.pending));
        delta
    }

    fn emit_call(&mut self, body: &str, delta: &mut ToolCallDelta) -> bool {
        let Some(call) = parse_body(body, format!("{}{}", self.id_prefix, self.calls)) else {
            return false;
        };
        delta.tool_calls.push(ToolCallChunk {
            index: self.calls,
            id: Some(call.id),
            name: Some(call.name),
            arguments: call.arguments,
        });
        self.calls += 1;
        self.after_call = true;
        true
    }

    /// One move of the parser; false when nothing more can be decided now.
    fn step(&mut self, delta: &mut ToolCallDelta, at_end: bool) -> bool {
        if let Some(held) = self.in_call.clone() {
            let Some(end) = self.pending.find(TOOL_CALL_END) else {
                return false;
            };
            let body = self.pending[..end].to_string();
            self.in_call = None;
            if self.emit_call(&body, delta) {
                self.pending.drain(..end + TOOL_CALL_END.len());
            } else {
                // Not a call: the tag is content and scanning goes on right after it.
                delta.content.push_str(&held);
                delta.content.push_str(TOOL_CALL_START);
                self.after_call = false;
            }
            return true;
        }
        if self.after_call {
            let start = self.pending.len() - self.pending.trim_start().len();
            self.pending.drain(..start);
            if self.pending.is_empty() {
                return false;
            }
            self.after_call = false;
        }
        if let Some(tag) = self.pending.find(TOOL_CALL_START) {
            let text_end = tag - trailing_whitespace_len(&self.pending[..tag]);
            delta.content.push_str(&self.pending[..text_end]);
            self.in_call = Some(self.pending[text_end..tag].to_string());
            self.pending.drain(..tag + TOOL_CALL_START.len());
            return true;
        }
        if at_end {
            return false;
        }
        let text_end = self.pending.len() - partial_tag_len(&self.pending, &[TOOL_CALL_START]);
        let hold_from = text_end - trailing_whitespace_len(&self.pending[..text_end]);
        if hold_from > 0 {
            delta.content.extend(self.pending.drain(..hold_from));
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL: &str =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

    #[test]
    fn whole_output_calls_and_content() {
        let text = format!("Let me check.\n{CALL}\n{CALL}\n");
        let split = parse_hermes_tool_calls(&text, "call_");
        assert_eq!(split.content.as_deref(), Some("Let me check."));
        assert_eq!(split.calls.len(), 2);
        assert_eq!(split.calls[1].id, "call_1");
        assert_eq!(split.calls[0].name, "get_weather");
        assert_eq!(split.calls[0].arguments, r#"{"city":"Paris"}"#);
        let broken = "<tool_call>\n{\"name\": 3}\n</tool_call> done";
        let split = parse_hermes_tool_calls(broken, "c");
        assert!(split.calls.is_empty());
        assert_eq!(split.content.as_deref(), Some(broken));
        let cut = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}";
        assert_eq!(parse_hermes_tool_calls(cut, "c").calls.len(), 1);
        assert_eq!(
            ToolCallFormat::from_parser_name("qwen"),
            Some(ToolCallFormat::Hermes)
        );
        assert_eq!(
            ToolCallFormat::from_template("{{ '<tool_call>\\n' }}{{ tool_call | tojson }}"),
            ToolCallFormat::Hermes
        );
        assert_eq!(
            ToolCallFormat::from_template("<tool_call>\n<function={{ name }}>"),
            ToolCallFormat::Qwen3Coder
        );
    }

    #[test]
    fn streaming_equals_whole_at_every_split() {
        let texts = [
            format!("Let me check.\n{CALL}\n{CALL}\nDone."),
            CALL.to_string(),
            "<tool_call>\n{\"name\": 3}\n</tool_call> and <tool_call>".to_string(),
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}".to_string(),
            "plain text <tool_ca".to_string(),
        ];
        for text in &texts {
            let whole = parse_hermes_tool_calls(text, "c");
            for step in 1..=7 {
                let mut stream = HermesToolCallStream::new("c");
                let mut content = String::new();
                let mut calls = Vec::new();
                let chars: Vec<char> = text.chars().collect();
                for chunk in chars.chunks(step) {
                    let delta = stream.push(&chunk.iter().collect::<String>());
                    content.push_str(&delta.content);
                    calls.extend(delta.tool_calls);
                }
                let delta = stream.finish();
                content.push_str(&delta.content);
                calls.extend(delta.tool_calls);
                assert_eq!(
                    (!content.is_empty()).then_some(content.clone()),
                    whole.content,
                    "{text:?} in steps of {step}"
                );
                let names: Vec<_> = calls.iter().map(|c| c.name.clone().unwrap()).collect();
                let want: Vec<_> = whole.calls.iter().map(|c| c.name.clone()).collect();
                assert_eq!(names, want, "{text:?} in steps of {step}");
                assert_eq!(stream.call_count(), whole.calls.len());
            }
        }
    }
}
