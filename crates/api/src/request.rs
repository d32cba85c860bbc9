//! Parsing and validation of the OpenAI request bodies (chat and completions) into typed requests, and
//! the merge of request sampling fields with the model's generation_config.json defaults. Errors name
//! the field. Tokenizing and submitting are done by the route handlers.

use deltaserve_engine::SamplingParams;
use deltaserve_grammar::GrammarSpec;
use deltaserve_text::{ChatMessage, GenerationDefaults};
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::fields::{describe, Fields};
use crate::limits::RequestLimits;

/// Fields shared by chat and completions.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerationParams {
    pub model: Option<String>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// `Some(0)` means off (requests may send -1 or 0).
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<u64>,
    pub max_tokens: Option<usize>,
    /// Which field set `max_tokens`, for error messages.
    pub max_tokens_field: &'static str,
    pub n: usize,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    /// vLLM/SGLang extension: do not stop at the model's eos tokens.
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    /// deltaserve extension: decode this request without MTP speculation even when the server has it on.
    pub disable_speculation: bool,
    pub stream: bool,
    pub include_usage: bool,
    /// Alternatives per token; `None` = no logprobs.
    pub logprobs: Option<usize>,
    /// Constrained decoding (`response_format`, `regex`, `ebnf`, or a forced tool call).
    pub grammar: Option<OutputGrammar>,
}

/// A grammar the output must follow, and the request field that asked for it (named in errors).
#[derive(Debug, Clone, PartialEq)]
pub struct OutputGrammar {
    pub spec: GrammarSpec,
    pub field: &'static str,
}

/// `response_format`, SGLang's `regex` and `ebnf`: at most one of them. `{"type": "text"}` asks for
/// nothing.
fn parse_output_grammar(f: &Fields) -> Result<Option<OutputGrammar>, ApiError> {
    let mut found = Vec::new();
    if let Some(spec) = parse_response_format(f)? {
        found.push(OutputGrammar {
            spec,
            field: "response_format",
        });
    }
    if let Some(regex) = f.string("regex")? {
        found.push(OutputGrammar {
            spec: GrammarSpec::Regex(regex.to_string()),
            field: "regex",
        });
    }
    if let Some(ebnf) = f.string("ebnf")? {
        found.push(OutputGrammar {
            spec: GrammarSpec::Ebnf(ebnf.to_string()),
            field: "ebnf",
        });
    }
    if found.len() > 1 {
        return Err(ApiError::invalid(
            found[1].field,
            format!(
                "`{}` and `{}` both constrain the output; give one of them",
                found[0].field, found[1].field
            ),
        ));
    }
    Ok(found.pop())
}

/// OpenAI's `response_format`: `text`, `json_object` or `json_schema` with
/// `{"name", "schema", "strict"}` (the schema is enforced whether `strict` is set or not).
fn parse_response_format(f: &Fields) -> Result<Option<GrammarSpec>, ApiError> {
    let Some(format) = f.get("response_format") else {
        return Ok(None);
    };
    let kind = format.get("type").and_then(Value::as_str);
    match kind {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarSpec::JsonObject)),
        Some("json_schema") => {
            let Some(spec) = format.get("json_schema").and_then(Value::as_object) else {
                return Err(ApiError::invalid(
                    "response_format.json_schema",
                    "`response_format.json_schema` must be an object {\"name\": ..., \"schema\": {...}}",
                ));
            };
            match spec.get("name") {
                None | Some(Value::String(_)) => {}
                Some(other) => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.name",
                        format!(
                            "`response_format.json_schema.name` must be a string, found {}",
                            describe(other)
                        ),
                    ))
                }
            }
            match spec.get("strict") {
                None | Some(Value::Null) | Some(Value::Bool(_)) => {}
                Some(other) => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.strict",
                        format!(
                            "`response_format.json_schema.strict` must be true or false, found {}",
                            describe(other)
                        ),
                    ))
                }
            }
            match spec.get("schema") {
                // OpenAI allows leaving the schema out: any JSON value then.
                None | Some(Value::Null) => Ok(Some(GrammarSpec::JsonSchema(json!({})))),
                Some(schema @ (Value::Object(_) | Value::Bool(_))) => {
                    Ok(Some(GrammarSpec::JsonSchema(schema.clone())))
                }
                Some(other) => Err(ApiError::invalid(
                    "response_format.json_schema.schema",
                    format!(
                        "`response_format.json_schema.schema` must be a JSON schema object, found {}",
                        describe(other)
                    ),
                )),
            }
        }
        _ => Err(ApiError::invalid(
            "response_format",
            format!(
                "`response_format` must be {{\"type\": \"text\"}}, {{\"type\": \"json_object\"}} or \
                 {{\"type\": \"json_schema\", \"json_schema\": {{...}}}}, found {}",
                describe(format)
            ),
        )),
    }
}

impl GenerationParams {
    fn parse(f: &Fields, limits: &RequestLimits) -> Result<Self, ApiError> {
        let (max_tokens, max_tokens_field) = match f.count("max_completion_tokens", 1)? {
            Some(n) => (Some(n), "max_completion_tokens"),
            None => (f.count("max_tokens", 1)?, "max_tokens"),
        };
        if let Some(requested) = max_tokens {
            limits.check_max_tokens(max_tokens_field, requested)?;
        }
        let n = f.count("n", 1)?.unwrap_or(1);
        limits.check_n(n)?;
        let top_p = f.float("top_p")?;
        if let Some(p) = top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(ApiError::invalid(
                    "top_p",
                    format!("`top_p` must be in (0, 1], found {p}"),
                ));
            }
        }
        let top_k = match f.int("top_k")? {
            None => None,
            Some(-1) | Some(0) => Some(0),
            Some(k) if k > 0 => Some(k as usize),
            Some(k) => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("`top_k` must be -1 or 0 (off) or a positive integer, found {k}"),
                ))
            }
        };
        let repetition_penalty = f.float("repetition_penalty")?;
        if let Some(r) = repetition_penalty {
            if r <= 0.0 {
                return Err(ApiError::invalid(
                    "repetition_penalty",
                    format!("`repetition_penalty` must be greater than 0, found {r}"),
                ));
            }
        }
        let stop = f.string_or_list("stop")?;
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid(
                "stop",
                "`stop` strings must not be empty",
            ));
        }
        limits.check_stop(&stop)?;
        let stream = f.bool("stream")?.unwrap_or(false);
        let include_usage = match f.object("stream_options")? {
            None => false,
            Some(_) if !stream => {
                return Err(ApiError::invalid(
                    "stream_options",
                    "`stream_options` is only allowed when `stream` is true",
                ))
            }
            Some(options) => match options.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(other) => {
                    return Err(ApiError::invalid(
                        "stream_options.include_usage",
                        format!(
                            "`stream_options.include_usage` must be true or false, found {}",
                            describe(other)
                        ),
                    ))
                }
            },
        };
        if let Some(min) = f.int("min_tokens")? {
            if min > 0 {
                return Err(ApiError::unsupported(
                    "min_tokens",
                    format!(
                        "`min_tokens` {min} is not supported (the engine cannot suppress end-of-sequence \
                         tokens); use `ignore_eos: true` with `max_tokens` for fixed-length output"
                    ),
                ));
            }
        }
        let grammar = parse_output_grammar(f)?;
        if grammar.is_some() && f.bool("ignore_eos")? == Some(true) {
            return Err(ApiError::invalid(
                "ignore_eos",
                "`ignore_eos` cannot be combined with a grammar: a constrained output ends with an \
                 end-of-sequence token",
            ));
        }
        Ok(Self {
            model: f.string("model")?.map(str::to_string),
            temperature: f.float("temperature")?.map(|t| t as f32),
            top_p: top_p.map(|p| p as f32),
            top_k,
            min_p: f.float_in("min_p", 0.0, 1.0)?.map(|p| p as f32),
            presence_penalty: f.float_in("presence_penalty", -2.0, 2.0)?.map(|p| p as f32),
            frequency_penalty: f
                .float_in("frequency_penalty", -2.0, 2.0)?
                .map(|p| p as f32),
            repetition_penalty: repetition_penalty.map(|r| r as f32),
            // Negative seeds are accepted (OpenAI's seed is any integer) and used as their bit pattern.
            seed: f.int("seed")?.map(|s| s as u64),
            max_tokens,
            max_tokens_field,
            n,
            stop,
            stop_token_ids: f.token_ids("stop_token_ids")?,
            ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
            skip_special_tokens: f.bool("skip_special_tokens")?.unwrap_or(true),
            disable_speculation: f.bool("disable_speculation")?.unwrap_or(false),
            stream,
            include_usage,
            logprobs: None,
            grammar,
        })
        .and_then(|params| {
            if let Some(t) = params.temperature {
                if t < 0.0 {
                    return Err(ApiError::invalid(
                        "temperature",
                        format!("`temperature` must be at least 0, found {t}"),
                    ));
                }
            }
            Ok(params)
        })
    }

    /// Sampling for choice `index`: request fields win, then generation_config.json, then OpenAI's
    /// defaults. With a seed `s`, choice `i` uses `s + i` so the choices differ but stay reproducible.
    pub fn sampling(&self, defaults: &GenerationDefaults, index: usize) -> SamplingParams {
        let greedy_by_default = defaults.do_sample == Some(false);
        let temperature = self.temperature.unwrap_or(if greedy_by_default {
            0.0
        } else {
            defaults.temperature.unwrap_or(1.0)
        });
        SamplingParams {
            temperature,
            top_p: self.top_p.or(defaults.top_p).unwrap_or(1.0),
            top_k: self
                .top_k
                .or(defaults.top_k.map(|k| k as usize))
                .unwrap_or(0),
            min_p: self.min_p.or(defaults.min_p).unwrap_or(0.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            repetition_penalty: self
                .repetition_penalty
                .or(defaults.repetition_penalty)
                .unwrap_or(1.0),
            seed: self.seed.map(|s| s.wrapping_add(index as u64)),
            logprobs: self.logprobs,
        }
    }

    /// The completion budget: the request's, else generation_config's `max_new_tokens`, else the rest
    /// of the context (at most `--max-tokens-cap`). Errors (400) name both numbers when the prompt is
    /// over `--max-prompt-tokens` or the prompt and budget exceed the context.
    pub fn token_budget(
        &self,
        prompt_tokens: usize,
        context_length: usize,
        limits: &RequestLimits,
        defaults: &GenerationDefaults,
        prompt_field: &str,
    ) -> Result<usize, ApiError> {
        if let Some(limit) = limits.prompt_limit(context_length) {
            if prompt_tokens > limit {
                return Err(ApiError::context_length(format!(
                    "The prompt has {prompt_tokens} tokens, more than this server's limit of {limit} prompt \
                     tokens (set by --max-prompt-tokens; the context length is {context_length})"
                ))
                .with_param(prompt_field));
            }
        }
        if prompt_tokens >= context_length {
            return Err(ApiError::context_length(format!(
                "This model's maximum context length is {context_length} tokens, but the prompt has \
                 {prompt_tokens} tokens, which leaves no room for a completion"
            ))
            .with_param(prompt_field));
        }
        let room = context_length - prompt_tokens;
        match self.max_tokens {
            Some(requested) if requested > room => Err(ApiError::context_length(format!(
                "This model's maximum context length is {context_length} tokens. However, you requested \
                 {} tokens ({prompt_tokens} in the prompt, {requested} for the completion via `{}`). Reduce \
                 the prompt or `{}`",
                prompt_tokens + requested,
                self.max_tokens_field,
                self.max_tokens_field
            ))
            .with_param(self.max_tokens_field)),
            Some(requested) => Ok(requested),
            None => Ok(defaults
                .max_new_tokens
                .map(|n| (n as usize).clamp(1, room))
                .unwrap_or(room)
                .min(limits.max_tokens_cap)),
        }
    }
}

/// How a chat request wants tools handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model may call a tool (the default when tools are given).
    Auto,
    /// Tools are not shown to the model and output is never parsed as a call.
    None,
    /// The output is tool calls only (enforced by a grammar).
    Required,
    /// The output is one call of this function (enforced by a grammar).
    Function(String),
}

/// A validated /v1/chat/completions request.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub params: GenerationParams,
    pub messages: Vec<ChatMessage>,
    /// Tool definitions passed to the template; empty when none or `tool_choice` is "none".
    pub tools: Vec<Value>,
    pub tool_choice: ToolChoice,
    /// `parallel_tool_calls` (default true): false allows at most one call.
    pub parallel_tool_calls: bool,
    /// `chat_template_kwargs` with a top-level `enable_thinking` merged in.
    pub template_kwargs: Map<String, Value>,
    /// SGLang's `separate_reasoning` (default true): false keeps reasoning inside `content`.
    pub separate_reasoning: bool,
}

impl ChatRequest {
    pub fn parse(body: &Value, limits: &RequestLimits) -> Result<Self, ApiError> {
        let f = Fields::of(body)?;
        let mut params = GenerationParams::parse(&f, limits)?;
        let logprobs = f.bool("logprobs")?.unwrap_or(false);
        let top_logprobs = f.count("top_logprobs", 0)?;
        if let Some(k) = top_logprobs {
            limits.check_top_logprobs("top_logprobs", k)?;
        }
        params.logprobs = match (logprobs, top_logprobs) {
            (true, k) => Some(k.unwrap_or(0)),
            (false, Some(k)) if k > 0 => {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "`logprobs` must be true when `top_logprobs` is used",
                ))
            }
            (false, _) => None,
        };
        let messages = parse_messages(&f, limits)?;
        let tool_choice = parse_tool_choice(&f)?;
        let tools = match (f.array("tools")?, &tool_choice) {
            (None, _) | (Some(_), ToolChoice::None) => Vec::new(),
            (Some(tools), _) => validate_tools(tools)?,
        };
        let parallel_tool_calls = f.bool("parallel_tool_calls")?.unwrap_or(true);
        match &tool_choice {
            ToolChoice::Required | ToolChoice::Function(_) if tools.is_empty() => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "`tool_choice` requires a tool call but `tools` is empty or missing",
                ))
            }
            ToolChoice::Function(name)
                if !tools
                    .iter()
                    .any(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name)) =>
            {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("`tool_choice` names the function {name:?}, which is not in `tools`"),
                ))
            }
            ToolChoice::Required | ToolChoice::Function(_) if params.grammar.is_some() => {
                let field = params
                    .grammar
                    .as_ref()
                    .map_or("response_format", |g| g.field);
                return Err(ApiError::unsupported(
                    field,
                    format!(
                        "`{field}` cannot be combined with a `tool_choice` that forces a tool call"
                    ),
                ));
            }
            _ => {}
        }
        let mut template_kwargs = f
            .object("chat_template_kwargs")?
            .cloned()
            .unwrap_or_default();
        if let Some(enable) = f.bool("enable_thinking")? {
            template_kwargs
                .entry("enable_thinking")
                .or_insert(Value::Bool(enable));
        }
        Ok(Self {
            params,
            messages,
            tools,
            tool_choice,
            parallel_tool_calls,
            template_kwargs,
            separate_reasoning: f.bool("separate_reasoning")?.unwrap_or(true),
        })
    }
}

fn parse_messages(f: &Fields, limits: &RequestLimits) -> Result<Vec<ChatMessage>, ApiError> {
    let Some(items) = f.array("messages")? else {
        return Err(ApiError::invalid("messages", "`messages` is required"));
    };
    if items.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must contain at least one message",
        ));
    }
    limits.check_messages(items.len())?;
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let param = format!("messages[{i}]");
            let Some(object) = item.as_object() else {
                return Err(ApiError::invalid(
                    &param,
                    format!("`{param}` must be an object, found {}", describe(item)),
                ));
            };
            match object.get("role") {
                Some(Value::String(role))
                    if matches!(role.as_str(), "system" | "developer" | "user" | "assistant" | "tool") => {}
                Some(Value::String(role)) => {
                    return Err(ApiError::invalid(
                        &format!("{param}.role"),
                        format!(
                            "`{param}.role` must be one of system, developer, user, assistant, tool; found {role:?}"
                        ),
                    ))
                }
                other => {
                    return Err(ApiError::invalid(
                        &format!("{param}.role"),
                        format!(
                            "`{param}.role` must be a string, found {}",
                            other.map(describe).unwrap_or_else(|| "nothing".into())
                        ),
                    ))
                }
            }
            let mut message: ChatMessage = serde_json::from_value(item.clone())
                .map_err(|e| ApiError::invalid(&param, format!("`{param}` is not a valid chat message: {e}")))?;
            // OpenAI's "developer" role is the system role of newer models; templates know "system".
            if message.role == "developer" {
                message.role = "system".to_string();
            }
            Ok(message)
        })
        .collect()
}

fn parse_tool_choice(f: &Fields) -> Result<ToolChoice, ApiError> {
    match f.get("tool_choice") {
        None => Ok(ToolChoice::Auto),
        Some(Value::String(choice)) if choice == "auto" => Ok(ToolChoice::Auto),
        Some(Value::String(choice)) if choice == "none" => Ok(ToolChoice::None),
        Some(Value::String(choice)) if choice == "required" => Ok(ToolChoice::Required),
        Some(object @ Value::Object(_)) => {
            match object.pointer("/function/name").and_then(Value::as_str) {
                Some(name) if object.get("type").and_then(Value::as_str) == Some("function") => {
                    Ok(ToolChoice::Function(name.to_string()))
                }
                _ => Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "a named `tool_choice` must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, \
                         found {}",
                        describe(object)
                    ),
                )),
            }
        }
        Some(other) => Err(ApiError::invalid(
            "tool_choice",
            format!("`tool_choice` must be \"auto\", \"none\", \"required\" or a named function, found {}", describe(other)),
        )),
    }
}

fn validate_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    for (i, tool) in tools.iter().enumerate() {
        let param = format!("tools[{i}]");
        let kind = tool.get("type").and_then(Value::as_str);
        let name = tool
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str);
        match (kind, name) {
            (Some("function"), Some(name)) if !name.is_empty() => {}
            (Some(other), _) if other != "function" => {
                return Err(ApiError::invalid(
                    &format!("{param}.type"),
                    format!("`{param}.type` must be \"function\", found {other:?}"),
                ))
            }
            _ => {
                return Err(ApiError::invalid(
                    &param,
                    format!(
                        "`{param}` must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": \
                         ...}}}}, found {}",
                        describe(tool)
                    ),
                ))
            }
        }
    }
    Ok(tools.to_vec())
}

/// One prompt of a /v1/completions request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

/// A validated /v1/completions request.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    pub params: GenerationParams,
    pub prompts: Vec<PromptInput>,
    pub echo: bool,
}

impl CompletionRequest {
    pub fn parse(body: &Value, limits: &RequestLimits) -> Result<Self, ApiError> {
        let f = Fields::of(body)?;
        let mut params = GenerationParams::parse(&f, limits)?;
        params.logprobs = f.count("logprobs", 0)?;
        if let Some(k) = params.logprobs {
            limits.check_top_logprobs("logprobs", k)?;
        }
        if f.get("suffix").is_some_and(|s| s.as_str() != Some("")) {
            return Err(ApiError::unsupported(
                "suffix",
                "`suffix` (fill-in-the-middle) is not supported",
            ));
        }
        if let Some(best_of) = f.count("best_of", 1)? {
            if best_of != params.n {
                return Err(ApiError::unsupported(
                    "best_of",
                    format!(
                        "`best_of` {best_of} different from `n` {} is not supported",
                        params.n
                    ),
                ));
            }
        }
        let echo = f.bool("echo")?.unwrap_or(false);
        if echo && params.logprobs.is_some() {
            return Err(ApiError::unsupported(
                "echo",
                "`echo` together with `logprobs` (prompt logprobs) is not supported",
            ));
        }
        Ok(Self {
            params,
            prompts: parse_prompts(f.get("prompt"))?,
            echo,
        })
    }
}

fn parse_prompts(value: Option<&Value>) -> Result<Vec<PromptInput>, ApiError> {
    let expected =
        "a string, an array of strings, an array of token ids or an array of token-id arrays";
    let wrong = |found: &Value| {
        ApiError::invalid(
            "prompt",
            format!("`prompt` must be {expected}, found {}", describe(found)),
        )
    };
    let ids = |items: &[Value]| -> Option<Vec<u32>> {
        items
            .iter()
            .map(|v| v.as_u64().and_then(|id| u32::try_from(id).ok()))
            .collect()
    };
    let prompts = match value {
        None => return Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(Value::String(text)) => vec![PromptInput::Text(text.clone())],
        Some(array @ Value::Array(items)) => match items.first() {
            None => {
                return Err(ApiError::invalid(
                    "prompt",
                    "`prompt` must not be an empty array",
                ))
            }
            Some(Value::String(_)) => items
                .iter()
                .map(|item| {
                    item.as_str()
                        .map(|s| PromptInput::Text(s.to_string()))
                        .ok_or_else(|| wrong(array))
                })
                .collect::<Result<_, _>>()?,
            Some(Value::Number(_)) => {
                vec![PromptInput::Ids(ids(items).ok_or_else(|| wrong(array))?)]
            }
            Some(Value::Array(_)) => items
                .iter()
                .map(|item| {
                    item.as_array()
                        .and_then(|inner| ids(inner))
                        .map(PromptInput::Ids)
                        .ok_or_else(|| wrong(array))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(wrong(array)),
        },
        Some(other) => return Err(wrong(other)),
    };
    Ok(prompts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(body: Value) -> Result<ChatRequest, ApiError> {
        ChatRequest::parse(&body, &RequestLimits::default())
    }

    fn user() -> Value {
        json!([{"role": "user", "content": "hi"}])
    }

    #[test]
    fn out_of_range_values_name_their_field() {
        let cases = [
            (
                json!({"messages": user(), "temperature": -0.1}),
                "temperature",
            ),
            (json!({"messages": user(), "top_p": 0}), "top_p"),
            (json!({"messages": user(), "top_p": 1.5}), "top_p"),
            (json!({"messages": user(), "n": 0}), "n"),
            (json!({"messages": user(), "max_tokens": 0}), "max_tokens"),
            (
                json!({"messages": user(), "max_completion_tokens": -3}),
                "max_completion_tokens",
            ),
            (
                json!({"messages": user(), "top_logprobs": 21, "logprobs": true}),
                "top_logprobs",
            ),
            (
                json!({"messages": user(), "top_logprobs": 2}),
                "top_logprobs",
            ),
            (
                json!({"messages": user(), "presence_penalty": 3}),
                "presence_penalty",
            ),
            (json!({"messages": user(), "top_k": -2}), "top_k"),
            (json!({"messages": user(), "stop": [1]}), "stop"),
            (
                json!({"messages": user(), "stream_options": {"include_usage": true}}),
                "stream_options",
            ),
            (json!({"messages": []}), "messages"),
            (
                json!({"messages": [{"role": "wizard", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"messages": user(), "tool_choice": "required"}),
                "tool_choice",
            ),
            (
                json!({"messages": user(), "response_format": {"type": "json"}}),
                "response_format",
            ),
            (
                json!({"messages": user(), "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"messages": user(), "regex": "a+", "ebnf": "root ::= \"a\""}),
                "ebnf",
            ),
            (
                json!({"messages": user(), "regex": "a+", "ignore_eos": true}),
                "ignore_eos",
            ),
            (
                json!({"messages": user(), "tool_choice": {"type": "function", "function": {"name": "g"}},
                       "tools": [{"type": "function", "function": {"name": "f"}}]}),
                "tool_choice",
            ),
            (
                json!({"messages": user(), "temperature": "hot"}),
                "temperature",
            ),
            (
                json!({"messages": user(), "tools": [{"type": "function"}]}),
                "tools[0]",
            ),
        ];
        for (body, param) in cases {
            let err = chat(body.clone()).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {err:?}");
            assert_eq!(err.status, 400);
        }
    }

    #[test]
    fn chat_fields_are_read() {
        let request = chat(json!({
            "model": "m", "messages": user(), "max_tokens": 5, "max_completion_tokens": 7, "n": 2,
            "stop": "END", "seed": 10, "logprobs": true, "top_logprobs": 3, "stream": true,
            "stream_options": {"include_usage": true}, "enable_thinking": false,
            "chat_template_kwargs": {"custom": 1}, "unknown_field": {"x": 1}, "top_k": -1,
            "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"
        }))
        .unwrap();
        assert_eq!(request.params.max_tokens, Some(7));
        assert_eq!(request.params.max_tokens_field, "max_completion_tokens");
        assert_eq!(request.params.stop, vec!["END".to_string()]);
        assert_eq!(request.params.logprobs, Some(3));
        assert_eq!(request.params.top_k, Some(0));
        assert!(request.params.include_usage);
        assert_eq!(
            request.template_kwargs.get("enable_thinking"),
            Some(&json!(false))
        );
        assert_eq!(request.template_kwargs.get("custom"), Some(&json!(1)));
        assert!(request.tools.is_empty());
        assert_eq!(request.tool_choice, ToolChoice::None);
        let defaults = GenerationDefaults::default();
        assert_eq!(request.params.sampling(&defaults, 0).seed, Some(10));
        assert_eq!(request.params.sampling(&defaults, 3).seed, Some(13));
    }

    #[test]
    fn generation_config_fills_absent_sampling_fields() {
        let defaults = GenerationDefaults {
            do_sample: Some(true),
            temperature: Some(0.6),
            top_p: Some(0.95),
            top_k: Some(20),
            ..GenerationDefaults::default()
        };
        let request = chat(json!({"messages": user(), "top_p": 0.5})).unwrap();
        let sampling = request.params.sampling(&defaults, 0);
        assert_eq!(
            (sampling.temperature, sampling.top_p, sampling.top_k),
            (0.6, 0.5, 20)
        );
        let greedy = GenerationDefaults {
            do_sample: Some(false),
            temperature: Some(0.6),
            ..GenerationDefaults::default()
        };
        assert_eq!(request.params.sampling(&greedy, 0).temperature, 0.0);
        assert_eq!(
            request
                .params
                .sampling(&GenerationDefaults::default(), 0)
                .temperature,
            1.0
        );
    }

    #[test]
    fn budget_names_both_numbers() {
        let request = chat(json!({"messages": user(), "max_tokens": 100})).unwrap();
        let defaults = GenerationDefaults::default();
        let err = request
            .params
            .token_budget(30, 120, &RequestLimits::default(), &defaults, "messages")
            .unwrap_err();
        assert!(
            err.message.contains("30")
                && err.message.contains("100")
                && err.message.contains("120")
        );
        assert_eq!(
            request
                .params
                .token_budget(20, 120, &RequestLimits::default(), &defaults, "messages")
                .unwrap(),
            100
        );
        let open = chat(json!({"messages": user()})).unwrap();
        assert_eq!(
            open.params
                .token_budget(20, 120, &RequestLimits::default(), &defaults, "messages")
                .unwrap(),
            100
        );
        assert!(open
            .params
            .token_budget(120, 120, &RequestLimits::default(), &defaults, "messages")
            .is_err());
        let limits = RequestLimits {
            max_prompt_tokens: Some(25),
            max_tokens_cap: 60,
            ..RequestLimits::default()
        };
        let err = open
            .params
            .token_budget(30, 120, &limits, &defaults, "prompt")
            .unwrap_err();
        assert!(
            err.message.contains("30")
                && err.message.contains("25")
                && err.message.contains("--max-prompt-tokens"),
            "{}",
            err.message
        );
        assert_eq!(err.param.as_deref(), Some("prompt"));
        assert_eq!(
            open.params
                .token_budget(20, 120, &limits, &defaults, "messages")
                .unwrap(),
            60,
            "the default budget is capped by --max-tokens-cap"
        );
    }

    #[test]
    fn completion_prompts() {
        let limits = RequestLimits::default();
        let parse = |prompt: Value| CompletionRequest::parse(&json!({"prompt": prompt}), &limits);
        assert_eq!(
            parse(json!("a")).unwrap().prompts,
            vec![PromptInput::Text("a".into())]
        );
        assert_eq!(
            parse(json!([1, 2])).unwrap().prompts,
            vec![PromptInput::Ids(vec![1, 2])]
        );
        assert_eq!(parse(json!([[1], [2, 3]])).unwrap().prompts.len(), 2);
        assert_eq!(parse(json!(["a", "b"])).unwrap().prompts.len(), 2);
        assert!(parse(json!([])).is_err());
        assert!(parse(json!(["a", 1])).is_err());
        assert!(parse(json!(5)).is_err());
        assert!(
            CompletionRequest::parse(&json!({"prompt": "a", "logprobs": 21}), &limits).is_err()
        );
    }
}
