//! Grammars over the tool-call syntax of the model's chat template, for `tool_choice` "required" or a
//! named function and for `parallel_tool_calls: false`. Two syntaxes: Qwen3-Coder XML (Qwen3.5 and
//! Qwen3.6: `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>`)
//! and JSON in `<tool_call>` (Qwen3-Next and other Hermes-style templates:
//! `<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>`). Written in llguidance's Lark
//! syntax; argument values are held to the tool's parameter schema where the syntax allows.

pub use deltaserve_text::ToolCallFormat;
use serde_json::{json, Map, Value};

use crate::{with_json_style, GrammarError};

/// What the output must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolMode {
    /// Tool calls only (`tool_choice: "required"`): one, or several with parallel calls allowed.
    Required,
    /// Exactly one call of this function (a named `tool_choice`).
    Named(String),
    /// Text, then at most one call (`tool_choice: "auto"` with `parallel_tool_calls: false`).
    AtMostOne,
}

/// A tool-call grammar: the request's tools, the syntax and what is required.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolGrammar {
    /// OpenAI tool definitions (`{"type": "function", "function": {"name", "parameters"}}`).
    pub tools: Vec<Value>,
    pub format: ToolCallFormat,
    pub mode: ToolMode,
    pub parallel: bool,
}

fn function(tool: &Value) -> &Value {
    tool.get("function").unwrap_or(tool)
}

fn lark_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

/// A parameter's schema types, e.g. `["string"]` or `["integer", "null"]`; empty when unknown.
fn types(schema: &Value) -> Vec<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

impl ToolGrammar {
    /// The grammar in Lark syntax. `special(name)` says whether the vocabulary has `name` as one
    /// special token (then the grammar names the token, else it spells the text).
    pub fn to_lark(&self, special: &dyn Fn(&str) -> bool) -> Result<String, GrammarError> {
        let tag = |name: &str| {
            if special(name) {
                name.to_string()
            } else {
                lark_string(name)
            }
        };
        let (open, close) = (tag("<tool_call>"), tag("</tool_call>"));
        let functions: Vec<&Value> = match &self.mode {
            ToolMode::Named(name) => {
                let found: Vec<&Value> = self
                    .tools
                    .iter()
                    .map(function)
                    .filter(|f| f.get("name").and_then(Value::as_str) == Some(name.as_str()))
                    .take(1)
                    .collect();
                if found.is_empty() {
                    return Err(GrammarError(format!(
                        "the function {name:?} is not among the request's tools"
                    )));
                }
                found
            }
            _ => self.tools.iter().map(function).collect(),
        };
        if functions.is_empty() {
            return Err(GrammarError(
                "a tool call is required but no tools were given".into(),
            ));
        }
        let mut rules = Vec::new();
        let body = match self.format {
            ToolCallFormat::Qwen3Coder => {
                let mut alternatives = Vec::new();
                for (i, f) in functions.iter().enumerate() {
                    alternatives.push(format!("fn_{i}"));
                    rules.extend(xml_function(i, f)?);
                }
                format!("\"\\n\" ({})", alternatives.join(" | "))
            }
            ToolCallFormat::Hermes => {
                let options: Vec<Value> = functions.iter().map(|f| hermes_call_schema(f)).collect();
                let schema = if options.len() == 1 {
                    options[0].clone()
                } else {
                    json!({"anyOf": options})
                };
                format!(
                    "\"\\n\" %json {} \"\\n\"",
                    serde_json::to_string(&with_json_style(schema)).unwrap_or_default()
                )
            }
        };
        rules.insert(0, format!("call: {open} {body} {close}"));
        let start = match (&self.mode, self.parallel) {
            (ToolMode::Required, true) => "start: call (\"\\n\" call)*".to_string(),
            (ToolMode::Required, false) | (ToolMode::Named(_), _) => "start: call".to_string(),
            (ToolMode::AtMostOne, _) => {
                rules.push(format!(
                    "TEXT: /(?s:.+)/ & ~/(?s:.*){}(?s:.*)/",
                    regex_escape("<tool_call>")
                ));
                "start: TEXT? call?".to_string()
            }
        };
        rules.insert(0, start);
        Ok(rules.join("\n"))
    }
}

/// Escapes `text` for a Lark `/regex/`.
fn regex_escape(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if "\\.+*?()|[]{}^$/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `{"name": NAME, "arguments": PARAMETERS}` for the JSON-in-`<tool_call>` syntax. The arguments
/// hold the declared parameters only (`additionalProperties: false` unless the schema says
/// otherwise), as in the XML syntax, where only declared names can be written.
fn hermes_call_schema(f: &Value) -> Value {
    let name = f.get("name").cloned().unwrap_or(Value::Null);
    let mut parameters = f
        .get("parameters")
        .cloned()
        .unwrap_or_else(|| json!({"type": "object"}));
    if let Value::Object(map) = &mut parameters {
        map.entry("additionalProperties")
            .or_insert(Value::Bool(false));
    }
    json!({
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": false
    })
}

/// The rules of one function's XML call (`fn_{i}` and its parameters): the parameters in schema
/// order, required ones always present. String values are free text up to `</parameter>` (within
/// `minLength` / `maxLength`), string enums one of their values; values of other types are JSON
/// under the parameter's schema.
fn xml_function(i: usize, f: &Value) -> Result<Vec<String>, GrammarError> {
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| GrammarError("a tool has no function name".into()))?;
    if name.contains(['>', '\n']) {
        return Err(GrammarError(format!(
            "the function name {name:?} cannot be written in the XML tool-call syntax"
        )));
    }
    let empty = Map::new();
    let parameters = f.get("parameters");
    let properties = parameters
        .and_then(|p| p.get("properties"))
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let required: Vec<&str> = parameters
        .and_then(|p| p.get("required"))
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut rules = Vec::new();
    let mut sequence = Vec::new();
    for (j, (parameter, schema)) in properties.iter().enumerate() {
        if parameter.contains(['>', '\n']) {
            return Err(GrammarError(format!(
                "the parameter name {parameter:?} cannot be written in the XML tool-call syntax"
            )));
        }
        let rule = format!("p_{i}_{j}");
        let head = lark_string(&format!("<parameter={parameter}>\n"));
        let kinds = types(schema);
        let choices: Option<Vec<&str>> = schema
            .get("enum")
            .and_then(Value::as_array)
            .and_then(|values| values.iter().map(Value::as_str).collect());
        if let Some(choices) = choices.filter(|c| !c.is_empty()) {
            // String enums are written bare, as their text.
            let alternatives: Vec<String> = choices.iter().map(|c| lark_string(c)).collect();
            rules.push(format!(
                "{rule}: {head} ({}) {}",
                alternatives.join(" | "),
                lark_string("\n</parameter>\n")
            ));
        } else if kinds.is_empty() || kinds.contains(&"string") {
            // Free text, as long as `minLength` / `maxLength` allow.
            let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0);
            let length = match schema.get("maxLength").and_then(Value::as_u64) {
                Some(max) => format!("{{{min},{max}}}"),
                None if min > 0 => format!("{{{min},}}"),
                None => "*".to_string(),
            };
            rules.push(format!("{rule}: {head} v_{i}_{j}"));
            rules.push(format!(
                "v_{i}_{j}[suffix={}]: /(?s:.{length})/",
                lark_string("\n</parameter>\n")
            ));
        } else {
            let schema =
                serde_json::to_string(&with_json_style(schema.clone())).unwrap_or_default();
            rules.push(format!(
                "{rule}: {head} %json {schema} {}",
                lark_string("\n</parameter>\n")
            ));
        }
        sequence.push(if required.contains(&parameter.as_str()) {
            rule
        } else {
            format!("{rule}?")
        });
    }
    rules.insert(
        0,
        format!(
            "fn_{i}: {} {} {}",
            lark_string(&format!("<function={name}>\n")),
            sequence.join(" "),
            lark_string("</function>\n")
        ),
    );
    Ok(rules)
}
