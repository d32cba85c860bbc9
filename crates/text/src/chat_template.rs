//! Renders HF chat templates with minijinja configured the way transformers' jinja2 environment is
//! (trim/lstrip blocks, Python string methods, `tojson`, `raise_exception`, `strftime_now`, Python value
//! printing), with bounded work (fuel) and output size so no template can hang or flood the server.
//! Owns template compilation and rendering; message types live in messages.rs.

use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, UndefinedBehavior};
use serde_json::{Map, Value as Json};

use crate::messages::{template_message, ChatMessage};
use crate::pyformat::{json_dumps, python_str, JsonOptions};
use crate::strftime::{strftime, CivilTime};
use crate::tokenizer::{SpecialTokenStrings, Tokenizer};

const TEMPLATE_NAME: &str = "chat_template";
/// Variables the renderer sets itself; template kwargs may not replace them (HF raises a TypeError).
pub const RESERVED_VARIABLES: [&str; 4] =
    ["messages", "tools", "documents", "add_generation_prompt"];

/// Template instructions one render may execute. Qwen's template over 1021 messages (reasoning, tool
/// calls, tool results) and 16 tools uses about 103k, under 1/100 of this (the
/// `real_template_fuel_headroom` test holds that), so only a runaway loop reaches it.
pub const DEFAULT_TEMPLATE_FUEL: u64 = 20_000_000;
/// Largest rendered prompt in bytes: 8 MiB of text is about two million tokens, beyond any context
/// length this server supports, so only a template gone wrong reaches it.
pub const DEFAULT_MAX_RENDERED_BYTES: usize = 8 * 1024 * 1024;

/// Errors from compiling or rendering a chat template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("the tokenizer has no chat_template (neither in tokenizer_config.json nor chat_template.jinja)")]
    Missing,
    #[error("chat template does not compile: {message}")]
    Syntax { message: String },
    /// The template called `raise_exception(message)`, usually to reject the conversation.
    #[error("chat template rejected the request: {message}")]
    Raised { message: String },
    #[error("rendering the chat template failed: {message}")]
    Render { message: String },
    #[error("chat_template_kwargs may not set `{name}`; it is set from the request itself")]
    ReservedKwarg { name: String },
    #[error(
        "rendering the chat template took more than {fuel} template instructions (a runaway loop?); \
         the render was stopped"
    )]
    OutOfFuel { fuel: u64 },
    #[error(
        "the rendered chat template grew beyond {limit} bytes; the render was stopped (the \
         conversation or the template is too large)"
    )]
    OutputTooLarge { limit: usize },
}

/// What to render besides the messages.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderOptions {
    /// OpenAI tool definitions (`{"type": "function", "function": {...}}`), passed as `tools`.
    pub tools: Option<Vec<Json>>,
    pub add_generation_prompt: bool,
    /// Extra template variables (`chat_template_kwargs`, e.g. `enable_thinking`).
    pub kwargs: Map<String, Json>,
}

/// A compiled chat template, ready to render conversations.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    special_tokens: Vec<(String, String)>,
    max_rendered_bytes: usize,
}

impl ChatTemplate {
    /// Compiles `source` in an HF-compatible environment.
    pub fn new(source: &str) -> Result<Self, TemplateError> {
        Self::with_fuel(source, DEFAULT_TEMPLATE_FUEL)
    }

    /// Compiles `source`; one render may execute at most `fuel` template instructions.
    pub fn with_fuel(source: &str, fuel: u64) -> Result<Self, TemplateError> {
        let mut env = hf_environment();
        env.set_fuel(Some(fuel));
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| TemplateError::Syntax {
                message: e.to_string(),
            })?;
        Ok(Self {
            env: Arc::new(env),
            special_tokens: Vec::new(),
            max_rendered_bytes: DEFAULT_MAX_RENDERED_BYTES,
        })
    }

    /// The tokenizer's template (the "tool_use" one when tools are given and it exists), with the
    /// tokenizer's special tokens (`eos_token`, ...) as template variables, as HF passes them.
    pub fn from_tokenizer(tokenizer: &Tokenizer, with_tools: bool) -> Result<Self, TemplateError> {
        let source = tokenizer
            .chat_template_for(with_tools)
            .ok_or(TemplateError::Missing)?;
        Ok(Self::new(source)?.with_special_tokens(tokenizer.special_token_strings()))
    }

    /// Sets `bos_token`, `eos_token`, ... variables (request kwargs still override them).
    pub fn with_special_tokens(mut self, tokens: &SpecialTokenStrings) -> Self {
        self.special_tokens = tokens
            .template_variables()
            .into_iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        self
    }

    /// Renders stop with `OutputTooLarge` once the prompt text exceeds `limit` bytes.
    pub fn with_max_rendered_bytes(mut self, limit: usize) -> Self {
        self.max_rendered_bytes = limit;
        self
    }

    /// Renders the conversation to the prompt text.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions,
    ) -> Result<String, TemplateError> {
        self.render_measured(messages, options)
            .map(|(text, _)| text)
    }

    /// Renders and reports the fuel (template instructions) the render consumed.
    fn render_measured(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions,
    ) -> Result<(String, u64), TemplateError> {
        if let Some(name) = RESERVED_VARIABLES
            .iter()
            .find(|n| options.kwargs.contains_key(**n))
        {
            return Err(TemplateError::ReservedKwarg {
                name: name.to_string(),
            });
        }
        let mut context = Map::new();
        for (name, value) in &self.special_tokens {
            context.insert(name.clone(), Json::String(value.clone()));
        }
        for (name, value) in &options.kwargs {
            context.insert(name.clone(), value.clone());
        }
        let messages: Vec<Json> = messages
            .iter()
            .map(|m| Json::Object(template_message(m)))
            .collect();
        context.insert("messages".into(), Json::Array(messages));
        context.insert(
            "tools".into(),
            options.tools.clone().map(Json::Array).unwrap_or(Json::Null),
        );
        context.insert("documents".into(), Json::Null);
        context.insert(
            "add_generation_prompt".into(),
            Json::Bool(options.add_generation_prompt),
        );

        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TemplateError::Render {
                message: e.to_string(),
            })?;
        let mut out = BoundedOutput {
            bytes: Vec::new(),
            limit: self.max_rendered_bytes,
            overflowed: false,
        };
        // minijinja can panic on some inputs (2.24 indexes out of bounds reversing an empty string or
        // list, `''[::-1]`, found by fuzzing); a template must fail the render, not the request's task.
        let rendered = panic::catch_unwind(AssertUnwindSafe(|| {
            template.render_captured_to(Value::from_serialize(&context), &mut out)
        }))
        .map_err(|payload| TemplateError::Render {
            message: format!("the template engine failed: {}", panic_text(&*payload)),
        })?;
        let consumed = match rendered {
            Ok(captured) => captured.state().fuel_levels().map_or(0, |(used, _)| used),
            Err(_) if out.overflowed => {
                return Err(TemplateError::OutputTooLarge {
                    limit: self.max_rendered_bytes,
                })
            }
            Err(e) if e.kind() == ErrorKind::OutOfFuel => {
                return Err(TemplateError::OutOfFuel {
                    fuel: self.env.fuel().unwrap_or(0),
                })
            }
            Err(e) => {
                return Err(match raised_message(&e) {
                    Some(message) => TemplateError::Raised { message },
                    None => TemplateError::Render {
                        message: error_text(&e),
                    },
                })
            }
        };
        let text = String::from_utf8(out.bytes).map_err(|e| TemplateError::Render {
            message: format!("the rendered text is not UTF-8: {e}"),
        })?;
        Ok((text, consumed))
    }
}

/// Collects rendered text and fails the render once it passes `limit` bytes.
struct BoundedOutput {
    bytes: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl io::Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.bytes.len() + buf.len() > self.limit {
            self.overflowed = true;
            return Err(io::Error::other(format!(
                "rendered output over {} bytes",
                self.limit
            )));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The message of a caught panic.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// The marker a `raise_exception` error carries, so it can be told apart from engine errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Raised(String);

fn raised_message(error: &Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<Raised>() {
            return Some(raised.0.clone());
        }
        source = e.source();
    }
    None
}

fn error_text(error: &Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// An environment that renders like transformers' `ImmutableSandboxedEnvironment(trim_blocks=True,
/// lstrip_blocks=True, extensions=[loopcontrols])` with its `tojson`, `raise_exception` and `strftime_now`.
fn hf_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(python_formatter);
    env.add_filter("tojson", tojson);
    env.add_filter("string", |value: &Value| Value::from(python_str(value)));
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", |format: &str| {
        strftime(format, &CivilTime::now_utc())
    });
    env
}

/// Prints values the way Python's `str()` does (`None`, `True`, `1e+20`, `['a']`), strings unchanged.
fn python_formatter(
    out: &mut minijinja::Output,
    state: &State,
    value: &Value,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Number | ValueKind::Seq | ValueKind::Map => {
            out.write_str(&python_str(value))?;
            Ok(())
        }
        _ => minijinja::escape_formatter(out, state, value),
    }
}

fn raise_exception(message: Value) -> Result<Value, Error> {
    let message = python_str(&message);
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, which is
/// Python's `json.dumps` with those arguments (no HTML escaping, unlike jinja2's own `tojson`).
fn tojson(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let ensure_ascii = match kwargs
        .get::<Option<Value>>("ensure_ascii")?
        .or(ensure_ascii)
    {
        Some(v) => v.is_true(),
        None => false,
    };
    let indent = match kwargs.get::<Option<Value>>("indent")?.or(indent) {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => {
            Some(v.as_str().unwrap_or_default().to_string())
        }
        Some(v) => match i64::try_from(v.clone()) {
            Ok(n) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: indent must be an integer or a string, found {v}"),
                ))
            }
        },
    };
    let mut options = JsonOptions::python_defaults(ensure_ascii, indent);
    if let Some(separators) = kwargs.get::<Option<Value>>("separators")? {
        if !separators.is_none() {
            let parts: Vec<Value> = separators.try_iter()?.collect();
            match parts.as_slice() {
                [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                    options.item_separator = item.as_str().unwrap_or_default().to_string();
                    options.key_separator = key.as_str().unwrap_or_default().to_string();
                }
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson: separators must be two strings, found {separators}"),
                    ))
                }
            }
        }
    }
    if let Some(sort_keys) = kwargs.get::<Option<Value>>("sort_keys")? {
        options.sort_keys = sort_keys.is_true();
    }
    kwargs.assert_all_used()?;
    json_dumps(value, &options)
        .map(Value::from_safe_string)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render_str(source: &str, context: Json) -> Result<String, TemplateError> {
        let template = ChatTemplate::new(source)?;
        let kwargs = context.as_object().cloned().unwrap_or_default();
        template.render(
            &[],
            &RenderOptions {
                kwargs,
                ..RenderOptions::default()
            },
        )
    }

    #[test]
    fn trim_and_lstrip_blocks_like_hf() {
        let source = "  {% if true %}\n    a\n  {% endif %}\nb\n";
        // jinja2 with trim_blocks + lstrip_blocks, keep_trailing_newline off: "    a\nb"
        assert_eq!(render_str(source, json!({})).unwrap(), "    a\nb");
    }

    #[test]
    fn python_string_methods() {
        let source = "{{ s.strip() }}|{{ s.lstrip('\\n ') }}|{{ s.split('b')[0] }}|{{ s.strip().startswith('a') }}|{{ '-'.join(['x', 'y']) }}";
        assert_eq!(
            render_str(source, json!({"s": "\n  abc  "})).unwrap(),
            "abc|abc  |\n  a|True|x-y"
        );
    }

    #[test]
    fn python_value_printing() {
        let source = "{{ n }} {{ t }} {{ f }} {{ x }} {{ big }} {{ l }} {{ d }} {{ t|string }}|{{ missing }}|";
        let context = json!({"n": null, "t": true, "f": 2.0, "x": 7, "big": 1e20, "l": [1, "a"], "d": {"k": null}});
        assert_eq!(
            render_str(source, context).unwrap(),
            "None True 2.0 7 1e+20 [1, 'a'] {'k': None} True||"
        );
    }

    #[test]
    fn tojson_like_hf() {
        let context = json!({"v": {"b": "é<>&'", "a": [1, 2.5, null, true]}});
        assert_eq!(
            render_str("{{ v | tojson }}", context.clone()).unwrap(),
            "{\"b\": \"é<>&'\", \"a\": [1, 2.5, null, true]}"
        );
        assert_eq!(
            render_str("{{ v | tojson(indent=2) }}", context.clone()).unwrap(),
            "{\n  \"b\": \"é<>&'\",\n  \"a\": [\n    1,\n    2.5,\n    null,\n    true\n  ]\n}"
        );
        assert_eq!(
            render_str(
                "{{ v | tojson(ensure_ascii=true, sort_keys=true, separators=(',', ':')) }}",
                context
            )
            .unwrap(),
            "{\"a\":[1,2.5,null,true],\"b\":\"\\u00e9<>&'\"}"
        );
        assert!(matches!(
            render_str("{{ v | tojson(bogus=1) }}", json!({"v": 1})),
            Err(TemplateError::Render { .. })
        ));
    }

    #[test]
    fn raise_exception_is_a_typed_error() {
        let err = render_str(
            "ok {{ raise_exception('Bad role: ' ~ r) }}",
            json!({"r": "x"}),
        )
        .unwrap_err();
        assert_eq!(
            err,
            TemplateError::Raised {
                message: "Bad role: x".into()
            }
        );
        let err = render_str(
            "{% macro m() %}{{ raise_exception('deep') }}{% endmacro %}{{ m() }}",
            json!({}),
        )
        .unwrap_err();
        assert_eq!(
            err,
            TemplateError::Raised {
                message: "deep".into()
            }
        );
    }

    #[test]
    fn template_engine_panics_are_render_errors() {
        // minijinja 2.24 panics reversing an empty string or list; the fuzzer found it.
        for empty in [json!(""), json!([])] {
            let err = render_str("{{ v[::-1] }}", json!({ "v": empty })).unwrap_err();
            assert!(
                matches!(&err, TemplateError::Render { message } if message.contains("template engine failed")),
                "{err:?}"
            );
        }
        assert_eq!(
            render_str("{{ v[::-1] }}", json!({"v": "abc"})).unwrap(),
            "cba"
        );
    }

    #[test]
    fn syntax_and_runtime_errors() {
        assert!(matches!(
            ChatTemplate::new("{% if %}"),
            Err(TemplateError::Syntax { .. })
        ));
        // Attribute of an undefined value fails, as with jinja2's default Undefined.
        assert!(matches!(
            render_str("{{ nothing.field }}", json!({})),
            Err(TemplateError::Render { .. })
        ));
    }

    #[test]
    fn loop_controls_namespace_and_strftime() {
        let source = "{% set ns = namespace(n=0) %}{% for i in range(10) %}{% if i == 3 %}{% break %}{% endif %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }} {{ strftime_now('%Y')|length }}";
        assert_eq!(render_str(source, json!({})).unwrap(), "3 4");
    }

    #[test]
    fn reserved_kwargs_are_refused() {
        let template = ChatTemplate::new("{{ messages|length }}").unwrap();
        let mut kwargs = Map::new();
        kwargs.insert("messages".into(), json!([]));
        let err = template
            .render(
                &[],
                &RenderOptions {
                    kwargs,
                    ..RenderOptions::default()
                },
            )
            .unwrap_err();
        assert_eq!(
            err,
            TemplateError::ReservedKwarg {
                name: "messages".into()
            }
        );
    }

    #[test]
    fn special_tokens_are_variables_and_kwargs_override_them() {
        let tokens = SpecialTokenStrings {
            eos_token: Some("<eos>".into()),
            ..SpecialTokenStrings::default()
        };
        let template = ChatTemplate::new("{{ eos_token }}{{ bos_token }}")
            .unwrap()
            .with_special_tokens(&tokens);
        assert_eq!(
            template.render(&[], &RenderOptions::default()).unwrap(),
            "<eos>"
        );
        let mut kwargs = Map::new();
        kwargs.insert("eos_token".into(), json!("<end>"));
        let options = RenderOptions {
            kwargs,
            ..RenderOptions::default()
        };
        assert_eq!(template.render(&[], &options).unwrap(), "<end>");
    }

    #[test]
    fn runaway_loops_run_out_of_fuel() {
        // minijinja refuses ranges over 100000 items by itself; nested ones need the fuel.
        let err = render_str("{% for i in range(10**9) %}x{% endfor %}", json!({})).unwrap_err();
        assert!(matches!(err, TemplateError::Render { .. }), "{err}");
        let nested = "{% for i in range(100000) %}{% for j in range(100000) %}{% if j < 0 %}x{% endif %}{% endfor %}{% endfor %}";
        let err = render_str(nested, json!({})).unwrap_err();
        assert_eq!(
            err,
            TemplateError::OutOfFuel {
                fuel: DEFAULT_TEMPLATE_FUEL
            }
        );
        assert!(err.to_string().contains("20000000 template instructions"));
        let err = ChatTemplate::with_fuel(nested, 1000)
            .unwrap()
            .render(&[], &RenderOptions::default())
            .unwrap_err();
        assert_eq!(err, TemplateError::OutOfFuel { fuel: 1000 });
    }

    #[test]
    fn huge_output_is_refused() {
        let huge = "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}";
        let err = render_str(huge, json!({})).unwrap_err();
        assert_eq!(
            err,
            TemplateError::OutputTooLarge {
                limit: DEFAULT_MAX_RENDERED_BYTES
            }
        );
        let template = ChatTemplate::new("{{ 'ab' * n }}")
            .unwrap()
            .with_max_rendered_bytes(10);
        let render = |n: u32| {
            let mut kwargs = Map::new();
            kwargs.insert("n".into(), json!(n));
            template.render(
                &[],
                &RenderOptions {
                    kwargs,
                    ..RenderOptions::default()
                },
            )
        };
        assert_eq!(render(5).unwrap(), "ababababab");
        assert_eq!(
            render(6).unwrap_err(),
            TemplateError::OutputTooLarge { limit: 10 }
        );
    }

    /// A long agentic conversation (1021 messages, near the default `--max-messages`, with reasoning, tool
    /// calls and tool results, 16 tools) through the real Qwen template must stay 100x under the fuel.
    #[test]
    fn real_template_fuel_headroom() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/chat_template.jinja"
        );
        let source = std::fs::read_to_string(path).unwrap();
        let template = ChatTemplate::new(&source).unwrap();
        let mut messages = vec![ChatMessage::text("system", "You are a helpful agent.")];
        while messages.len() + 4 <= 1024 {
            let turn = messages.len();
            messages.push(ChatMessage::text("user", &format!("Step {turn}: go on.")));
            let mut call: ChatMessage = serde_json::from_value(json!({
                "role": "assistant",
                "content": "Calling a tool.",
                "reasoning_content": "I should look this up before answering.",
                "tool_calls": [{"id": format!("c{turn}"), "type": "function", "function":
                    {"name": "lookup", "arguments": {"query": "weather", "days": 3}}}]
            }))
            .unwrap();
            call.name = None;
            messages.push(call);
            let mut result = ChatMessage::text("tool", "{\"temp\": 21}");
            result.tool_call_id = Some(format!("c{turn}"));
            messages.push(result);
            messages.push(ChatMessage::text("assistant", "It is 21 degrees."));
        }
        let tools: Vec<Json> = (0..16)
            .map(|i| {
                json!({"type": "function", "function": {"name": format!("tool_{i}"),
                    "description": "Looks something up.", "parameters": {"type": "object",
                    "properties": {"query": {"type": "string"}, "days": {"type": "integer"}},
                    "required": ["query"]}}})
            })
            .collect();
        let options = RenderOptions {
            tools: Some(tools),
            add_generation_prompt: true,
            kwargs: Map::new(),
        };
        let (text, consumed) = template.render_measured(&messages, &options).unwrap();
        eprintln!(
            "Qwen template, {} messages + 16 tools: {consumed} fuel, {} bytes",
            messages.len(),
            text.len()
        );
        assert!(text.contains("<tool_call>") && text.contains("tool_15"));
        assert!(consumed > 1000, "fuel was not counted: {consumed}");
        assert!(
            consumed * 100 <= DEFAULT_TEMPLATE_FUEL,
            "{consumed} fuel leaves less than 100x headroom under {DEFAULT_TEMPLATE_FUEL}"
        );
    }
}
