//! POST /v1/chat/completions: messages through the chat template, `n` choices on the engine, output split
//! into reasoning, content and tool calls, answered whole or as `chat.completion.chunk` SSE events.
//! Request validation lives in request.rs, text parsing in chat_output.rs.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use deltaserve_grammar::{GrammarSpec, ToolGrammar, ToolMode};
use deltaserve_text::{prompt_opens_reasoning, RenderOptions, TemplateError, ToolSchemas};
use futures_util::stream::{BoxStream, SelectAll};
use futures_util::StreamExt;
use serde_json::{json, Map, Value};

use crate::chat_output::{MessageDelta, OutputParsing, StreamParser};
use crate::choices::{compile_grammar, start_choices, Prompt};
use crate::common::{account_choice, check_model, choice_error, finish_error, read_json};
use crate::error::ApiError;
use crate::generation::{ChoiceItem, ChoiceRun, ChoiceUsage, FinishKind, TokenInfo};
use crate::request::{ChatRequest, ToolChoice};
use crate::response::{
    chat_logprobs, sse_event, tool_call_chunk_json, tool_call_json, usage_json, ResponseHead,
    SSE_DONE,
};
use crate::sse::sse_response;
use crate::state::AppState;

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrival = Instant::now();
    match chat(state, body, arrival).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

fn template_error(error: TemplateError) -> ApiError {
    match error {
        TemplateError::Raised { .. } | TemplateError::Render { .. } => ApiError::invalid(
            "messages",
            format!("The messages cannot be formatted for this model: {error}"),
        ),
        TemplateError::ReservedKwarg { .. } => {
            ApiError::invalid("chat_template_kwargs", error.to_string())
        }
        TemplateError::OutOfFuel { .. } | TemplateError::OutputTooLarge { .. } => {
            ApiError::over_limit(
                "messages",
                format!("The messages cannot be formatted for this model: {error}"),
            )
        }
        TemplateError::Missing | TemplateError::Syntax { .. } => {
            ApiError::internal(error.to_string())
        }
    }
}

async fn chat(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    arrival: Instant,
) -> Result<Response, ApiError> {
    let body = read_json(body, state.config.max_body_bytes)?;
    chat_body(state, &body, arrival).await
}

/// A chat completion for a parsed JSON body (also how /v1/responses runs its whole requests).
pub(crate) async fn chat_body(
    state: Arc<AppState>,
    body: &Value,
    arrival: Instant,
) -> Result<Response, ApiError> {
    let started = start_chat(&state, body, arrival)?;
    if started.stream {
        let stream = ChatStream::new(
            state,
            started.head,
            started.runs,
            &started.parsing,
            started.logprobs,
            started.include_usage,
            started.prompt_tokens,
        );
        Ok(sse_response(stream.into_stream()))
    } else {
        complete(
            &state,
            started.head,
            started.runs,
            &started.parsing,
            started.logprobs,
            started.prompt_tokens,
        )
        .await
    }
}

/// A validated chat request whose choices run on the engine, with what reading them needs.
pub(crate) struct StartedChat {
    pub head: ResponseHead,
    pub runs: Vec<ChoiceRun>,
    /// How each choice's output splits into reasoning, content and tool calls.
    pub parsing: Vec<OutputParsing>,
    pub stream: bool,
    pub logprobs: bool,
    pub include_usage: bool,
    pub prompt_tokens: usize,
}

/// Validates a chat body, renders and tokenizes its prompt, compiles its grammar and submits its
/// choices (also how /v1/responses streams).
pub(crate) fn start_chat(
    state: &Arc<AppState>,
    body: &Value,
    arrival: Instant,
) -> Result<StartedChat, ApiError> {
    let request = ChatRequest::parse(body, &state.config.limits)?;
    check_model(state, request.params.model.as_deref())?;
    let engine = state.engine()?;
    let with_tools = !request.tools.is_empty();
    let options = RenderOptions {
        tools: with_tools.then(|| request.tools.clone()),
        add_generation_prompt: true,
        kwargs: state
            .config
            .default_template_kwargs
            .clone()
            .into_iter()
            .chain(request.template_kwargs.clone())
            .collect(),
    };
    let prompt_text = state
        .chat_template(with_tools)?
        .render(&request.messages, &options)
        .map_err(template_error)?;
    let ids = state
        .tokenizer
        .encode(&prompt_text, false)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let prompt = Prompt {
        ids,
        opens_reasoning: prompt_opens_reasoning(&prompt_text),
    };
    let grammar = match chat_grammar(state, &request) {
        Some((spec, field)) => Some(compile_grammar(state, &engine, &spec, field)?),
        None => None,
    };
    let runs = start_choices(
        state,
        &engine,
        &request.params,
        &prompt,
        0,
        arrival,
        "messages",
        grammar.as_deref(),
    )?;
    let head = ResponseHead::new("chatcmpl", &state.config.model_name);
    let id_suffix = head.id.trim_start_matches("chatcmpl-").to_string();
    let parsing: Vec<OutputParsing> = (0..runs.len())
        .map(|i| OutputParsing {
            reasoning: (state.config.reasoning_parser && request.separate_reasoning)
                .then_some(prompt.opens_reasoning),
            tools: (state.config.tool_call_parser && with_tools)
                .then(|| ToolSchemas::from_tools(&request.tools)),
            tool_format: state.tool_call_format(),
            call_id_prefix: format!("call_{id_suffix}_{i}_"),
        })
        .collect();
    Ok(StartedChat {
        head,
        runs,
        parsing,
        stream: request.params.stream,
        logprobs: request.params.logprobs.is_some(),
        include_usage: request.params.include_usage,
        prompt_tokens: prompt.ids.len(),
    })
}

/// The grammar a chat request's output follows, and the field that asked for it: a forced tool call
/// (`tool_choice` "required" or a named function), at most one call (`parallel_tool_calls: false`),
/// or `response_format` / `regex` / `ebnf`.
fn chat_grammar(state: &AppState, request: &ChatRequest) -> Option<(GrammarSpec, &'static str)> {
    let tools = |mode| {
        GrammarSpec::Tools(ToolGrammar {
            tools: request.tools.clone(),
            format: state.tool_call_format(),
            mode,
            parallel: request.parallel_tool_calls,
        })
    };
    match &request.tool_choice {
        ToolChoice::Required => Some((tools(ToolMode::Required), "tool_choice")),
        ToolChoice::Function(name) => Some((tools(ToolMode::Named(name.clone())), "tool_choice")),
        _ => match &request.params.grammar {
            Some(g) => Some((g.spec.clone(), g.field)),
            None if !request.parallel_tool_calls
                && !request.tools.is_empty()
                && state.config.tool_call_parser =>
            {
                Some((tools(ToolMode::AtMostOne), "parallel_tool_calls"))
            }
            None => None,
        },
    }
}

/// Non-streaming: waits for every choice, then answers one `chat.completion`.
async fn complete(
    state: &AppState,
    head: ResponseHead,
    runs: Vec<ChoiceRun>,
    parsing: &[OutputParsing],
    logprobs: bool,
    prompt_tokens: usize,
) -> Result<Response, ApiError> {
    let results = futures_util::future::join_all(runs.into_iter().map(ChoiceRun::collect)).await;
    if let Some(error) = choice_error(&results.iter().map(|(_, _, end)| end).collect::<Vec<_>>()) {
        return Err(error);
    }
    let mut usage = ChoiceUsage {
        prompt_tokens,
        ..ChoiceUsage::default()
    };
    let mut choices = Vec::with_capacity(results.len());
    for (index, (text, tokens, end)) in results.iter().enumerate() {
        let message = parsing[index].parse(text);
        let finish_reason = if !message.tool_calls.is_empty() && end.finish == FinishKind::Stop {
            "tool_calls"
        } else {
            end.finish.as_str()
        };
        account_choice(state, end, finish_reason, &head.id, index);
        usage.add(&end.usage);
        let mut body = Map::new();
        body.insert("role".into(), json!("assistant"));
        body.insert("content".into(), json!(message.content));
        body.insert("reasoning_content".into(), json!(message.reasoning));
        if !message.tool_calls.is_empty() {
            body.insert(
                "tool_calls".into(),
                Value::Array(message.tool_calls.iter().map(tool_call_json).collect()),
            );
        }
        let mut choice = json!({
            "index": index,
            "message": body,
            "logprobs": chat_logprobs(logprobs, tokens),
            "finish_reason": finish_reason,
        });
        if let Some(report) = &end.degeneration {
            choice["degeneration"] = report.to_json();
        }
        choices.push(choice);
    }
    let mut body = head.body("chat.completion", choices);
    body["usage"] = usage_json(&usage);
    Ok(axum::Json(body).into_response())
}

/// Streaming: the choices' items merged as they come, turned into SSE chunks.
struct ChatStream {
    state: Arc<AppState>,
    head: ResponseHead,
    merged: SelectAll<BoxStream<'static, (usize, ChoiceItem)>>,
    parsers: Vec<StreamParser>,
    /// Logprob entries not yet sent, per choice (sent with the next chunk that has text).
    pending_tokens: Vec<Vec<TokenInfo>>,
    logprobs: bool,
    include_usage: bool,
    usage: ChoiceUsage,
    /// The role chunks, sent before anything is generated.
    opening: Option<String>,
    done: bool,
}

impl ChatStream {
    fn new(
        state: Arc<AppState>,
        head: ResponseHead,
        runs: Vec<ChoiceRun>,
        parsing: &[OutputParsing],
        logprobs: bool,
        include_usage: bool,
        prompt_tokens: usize,
    ) -> Self {
        let choices = runs.len();
        let merged = futures_util::stream::select_all(
            runs.into_iter()
                .enumerate()
                .map(|(i, run)| run.into_stream().map(move |item| (i, item)).boxed()),
        );
        let mut stream = Self {
            state,
            head,
            merged,
            parsers: parsing.iter().map(OutputParsing::stream).collect(),
            pending_tokens: vec![Vec::new(); choices],
            logprobs,
            include_usage,
            usage: ChoiceUsage {
                prompt_tokens,
                ..ChoiceUsage::default()
            },
            opening: None,
            done: false,
        };
        let opening: String = (0..choices)
            .map(|i| {
                let choice = json!({
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": null,
                    "finish_reason": null,
                });
                sse_event(&stream.chunk(vec![choice]))
            })
            .collect();
        stream.opening = Some(opening);
        stream
    }

    fn into_stream(self) -> impl futures_util::Stream<Item = String> + Send {
        futures_util::stream::unfold(self, |mut stream| async move {
            stream.next_events().await.map(|events| (events, stream))
        })
    }

    fn chunk(&self, choices: Vec<Value>) -> Value {
        self.head
            .chunk("chat.completion.chunk", choices, self.include_usage)
    }

    /// The next non-empty batch of SSE events; `None` after `[DONE]`.
    async fn next_events(&mut self) -> Option<String> {
        if let Some(opening) = self.opening.take() {
            return Some(opening);
        }
        loop {
            if self.done {
                return None;
            }
            match self.merged.next().await {
                Some((index, item)) => {
                    let events = self.on_item(index, item);
                    if !events.is_empty() {
                        return Some(events);
                    }
                }
                None => {
                    self.done = true;
                    let mut events = String::new();
                    if self.include_usage {
                        let mut chunk = self.chunk(Vec::new());
                        chunk["usage"] = usage_json(&self.usage);
                        events.push_str(&sse_event(&chunk));
                    }
                    events.push_str(SSE_DONE);
                    return Some(events);
                }
            }
        }
    }

    fn on_item(&mut self, index: usize, item: ChoiceItem) -> String {
        match item {
            ChoiceItem::Text { text, tokens } => {
                if self.logprobs {
                    self.pending_tokens[index].extend(tokens);
                }
                let delta = self.parsers[index].push(&text);
                self.delta_event(index, &delta, None, None)
            }
            ChoiceItem::Finished(end) => {
                let delta = self.parsers[index].finish();
                let mut events = String::new();
                if let Some(error) = finish_error(&end.finish) {
                    events.push_str(&sse_event(&error.body()));
                }
                let finish_reason =
                    if self.parsers[index].call_count() > 0 && end.finish == FinishKind::Stop {
                        "tool_calls"
                    } else {
                        end.finish.as_str()
                    };
                account_choice(&self.state, &end, finish_reason, &self.head.id, index);
                self.usage.add(&end.usage);
                let degeneration = end.degeneration.as_ref().map(|r| r.to_json());
                events.push_str(&self.delta_event(
                    index,
                    &delta,
                    Some(finish_reason),
                    degeneration,
                ));
                events
            }
        }
    }

    /// A chunk for `delta` (and finish reason, and on the final chunk the degeneration report);
    /// empty when there is nothing to say.
    fn delta_event(
        &mut self,
        index: usize,
        delta: &MessageDelta,
        finish_reason: Option<&str>,
        degeneration: Option<Value>,
    ) -> String {
        if delta.is_empty() && finish_reason.is_none() {
            return String::new();
        }
        let mut body = Map::new();
        if !delta.content.is_empty() {
            body.insert("content".into(), json!(delta.content));
        }
        if !delta.reasoning.is_empty() {
            body.insert("reasoning_content".into(), json!(delta.reasoning));
        }
        if !delta.tool_calls.is_empty() {
            body.insert(
                "tool_calls".into(),
                Value::Array(delta.tool_calls.iter().map(tool_call_chunk_json).collect()),
            );
        }
        let tokens = std::mem::take(&mut self.pending_tokens[index]);
        let logprobs = if self.logprobs && !tokens.is_empty() {
            chat_logprobs(true, &tokens)
        } else {
            Value::Null
        };
        let mut choice = json!({
            "index": index,
            "delta": body,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        });
        if let Some(report) = degeneration {
            choice["degeneration"] = report;
        }
        sse_event(&self.chunk(vec![choice]))
    }
}
