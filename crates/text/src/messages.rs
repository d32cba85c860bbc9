//! OpenAI-style chat messages as the chat template sees them, and the normalisation applied before
//! rendering (the same as HF's `apply_chat_template` plus vLLM's parsing of tool-call argument strings).
//! Data only; rendering is chat_template.rs.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One chat message. Fields the template does not know are kept in `extra` and passed through.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChatMessage {
    /// A message with plain-text content.
    pub fn text(role: &str, content: &str) -> Self {
        Self {
            role: role.to_string(),
            content: Some(MessageContent::Text(content.to_string())),
            ..Self::default()
        }
    }
}

/// `content` is a string or a list of parts (`{"type": "text", "text": ...}`; other part types are
/// passed to the template, which rejects what it cannot render).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<Value>),
}

/// An assistant tool call in OpenAI form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".to_string()
}

/// `arguments` is a JSON string (OpenAI) or an object (HF); strings holding an object are parsed
/// before rendering so templates can iterate the arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
}

/// Names a message's reasoning may come under; the first is the one templates read. HF fills the first
/// and `thinking` from whichever is set first in this order.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// The JSON object a template receives for `message`: null fields dropped, reasoning aliased to
/// `reasoning_content` and `thinking`, tool-call argument strings that hold a JSON object parsed.
pub(crate) fn template_message(message: &ChatMessage) -> Map<String, Value> {
    // Serialising a derived struct of strings and JSON values into a JSON value cannot fail.
    let value = serde_json::to_value(message).unwrap_or(Value::Null);
    let mut map = match value {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    map.retain(|_, v| !v.is_null());

    let reasoning = REASONING_FIELDS
        .iter()
        .find_map(|key| map.get(*key).cloned());
    if let Some(reasoning) = reasoning {
        let mut aliased = Map::with_capacity(map.len() + 2);
        aliased.insert("thinking".to_string(), reasoning.clone());
        aliased.extend(map);
        aliased.insert("reasoning_content".to_string(), reasoning);
        map = aliased;
    }

    if let Some(Value::Array(calls)) = map.get_mut("tool_calls") {
        for call in calls {
            if let Some(arguments) = call.pointer_mut("/function/arguments") {
                parse_object_string(arguments);
            }
        }
    }
    map
}

fn parse_object_string(arguments: &mut Value) {
    if let Value::String(text) = arguments {
        if let Ok(parsed @ Value::Object(_)) = serde_json::from_str::<Value>(text) {
            *arguments = parsed;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn deserializes_openai_messages() {
        let message: ChatMessage = serde_json::from_value(json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [true]}"}}],
            "custom": 5
        }))
        .unwrap();
        assert_eq!(message.content, None);
        assert_eq!(message.extra.get("custom"), Some(&json!(5)));
        let map = template_message(&message);
        assert!(!map.contains_key("content"));
        let arguments = &map["tool_calls"][0]["function"]["arguments"];
        assert_eq!(arguments, &json!({"b": 1, "a": [true]}));
        // Key order of the arguments is kept.
        let keys: Vec<_> = arguments.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["b", "a"]);
    }

    #[test]
    fn content_parts_and_non_object_arguments() {
        let message: ChatMessage = serde_json::from_value(json!({
            "role": "assistant",
            "content": [{"type": "text", "text": "hi"}],
            "tool_calls": [{"function": {"name": "f", "arguments": "not json"}},
                           {"function": {"name": "g", "arguments": "[1, 2]"}}]
        }))
        .unwrap();
        assert!(matches!(message.content, Some(MessageContent::Parts(ref p)) if p.len() == 1));
        let map = template_message(&message);
        assert_eq!(map["tool_calls"][0]["type"], json!("function"));
        assert_eq!(
            map["tool_calls"][0]["function"]["arguments"],
            json!("not json")
        );
        assert_eq!(
            map["tool_calls"][1]["function"]["arguments"],
            json!("[1, 2]")
        );
    }

    #[test]
    fn reasoning_aliases() {
        let mut message = ChatMessage::text("assistant", "x");
        message.extra.insert("reasoning".into(), json!("why"));
        let map = template_message(&message);
        assert_eq!(map["reasoning_content"], json!("why"));
        assert_eq!(map["thinking"], json!("why"));
        assert_eq!(map.keys().next().map(String::as_str), Some("thinking"));

        let mut both = ChatMessage::text("assistant", "x");
        both.reasoning_content = Some("first".into());
        both.extra.insert("thinking".into(), json!("own"));
        let map = template_message(&both);
        assert_eq!(map["reasoning_content"], json!("first"));
        assert_eq!(map["thinking"], json!("own"));
    }
}
