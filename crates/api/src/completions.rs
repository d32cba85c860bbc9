//! POST /v1/completions: raw prompts (text or token ids, one or many) continued by `n` choices each,
//! answered as one `text_completion` or as SSE chunks. No chat template, no reasoning or tool parsing.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use deltaserve_text::{prompt_ids_open_reasoning, ThinkTokenIds};
use futures_util::stream::{BoxStream, SelectAll};
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::choices::{compile_grammar, start_choices, Prompt};
use crate::common::{account_choice, check_model, choice_error, finish_error, read_json};
use crate::error::ApiError;
use crate::generation::{ChoiceItem, ChoiceRun, ChoiceUsage};
use crate::request::{CompletionRequest, PromptInput};
use crate::response::{completion_logprobs, sse_event, usage_json, ResponseHead, SSE_DONE};
use crate::sse::sse_response;
use crate::state::AppState;

pub async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrival = Instant::now();
    match complete(state, body, arrival).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// One choice to run: which prompt it continues and the text echoed before its output.
struct ChoicePlan {
    echo: String,
}

async fn complete(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    arrival: Instant,
) -> Result<Response, ApiError> {
    let body = read_json(body, state.config.max_body_bytes)?;
    let request = CompletionRequest::parse(&body, &state.config.limits)?;
    check_model(&state, request.params.model.as_deref())?;
    let engine = state.engine()?;
    let tags = ThinkTokenIds::from_tokenizer(&state.tokenizer);
    let grammar = match &request.params.grammar {
        Some(g) => Some(compile_grammar(&state, &engine, &g.spec, g.field)?),
        None => None,
    };
    let mut runs = Vec::new();
    let mut plans = Vec::new();
    let mut prompt_tokens = 0;
    for (p, input) in request.prompts.iter().enumerate() {
        let (ids, text) = match input {
            PromptInput::Text(text) => {
                let ids = state
                    .tokenizer
                    .encode(text, true)
                    .map_err(|e| ApiError::invalid("prompt", e.to_string()))?;
                (ids, text.clone())
            }
            PromptInput::Ids(ids) => {
                let text = if request.echo {
                    state.tokenizer.decode(ids, false).unwrap_or_default()
                } else {
                    String::new()
                };
                (ids.clone(), text)
            }
        };
        let prompt = Prompt {
            opens_reasoning: tags.is_some_and(|tags| prompt_ids_open_reasoning(&ids, &tags)),
            ids,
        };
        prompt_tokens += prompt.ids.len();
        let first_index = p * request.params.n;
        runs.extend(start_choices(
            &state,
            &engine,
            &request.params,
            &prompt,
            first_index,
            arrival,
            "prompt",
            grammar.as_deref(),
        )?);
        for _ in 0..request.params.n {
            plans.push(ChoicePlan {
                echo: if request.echo {
                    text.clone()
                } else {
                    String::new()
                },
            });
        }
    }
    let head = ResponseHead::new("cmpl", &state.config.model_name);
    let logprobs = request.params.logprobs.is_some();
    if request.params.stream {
        let stream = CompletionStream::new(
            state,
            head,
            runs,
            plans,
            logprobs,
            request.params.include_usage,
            prompt_tokens,
        );
        return Ok(sse_response(stream.into_stream()));
    }
    let results = futures_util::future::join_all(runs.into_iter().map(ChoiceRun::collect)).await;
    if let Some(error) = choice_error(&results.iter().map(|(_, _, end)| end).collect::<Vec<_>>()) {
        return Err(error);
    }
    let mut usage = ChoiceUsage {
        prompt_tokens,
        ..ChoiceUsage::default()
    };
    let choices: Vec<Value> = results
        .iter()
        .zip(&plans)
        .enumerate()
        .map(|(index, ((text, tokens, end), plan))| {
            account_choice(&state, end, end.finish.as_str(), &head.id, index);
            usage.add(&end.usage);
            let mut choice = json!({
                "index": index,
                "text": format!("{}{text}", plan.echo),
                "logprobs": completion_logprobs(logprobs, tokens, plan.echo.len()),
                "finish_reason": end.finish.as_str(),
            });
            if let Some(report) = &end.degeneration {
                choice["degeneration"] = report.to_json();
            }
            choice
        })
        .collect();
    let mut body = head.body("text_completion", choices);
    body["usage"] = usage_json(&usage);
    Ok(axum::Json(body).into_response())
}

/// Streaming completions: every text piece becomes one `text_completion` chunk.
struct CompletionStream {
    state: Arc<AppState>,
    head: ResponseHead,
    merged: SelectAll<BoxStream<'static, (usize, ChoiceItem)>>,
    /// Per choice: text still to echo before its first piece, and the byte offset for logprobs.
    echo: Vec<Option<String>>,
    offsets: Vec<usize>,
    logprobs: bool,
    include_usage: bool,
    usage: ChoiceUsage,
    done: bool,
}

impl CompletionStream {
    fn new(
        state: Arc<AppState>,
        head: ResponseHead,
        runs: Vec<ChoiceRun>,
        plans: Vec<ChoicePlan>,
        logprobs: bool,
        include_usage: bool,
        prompt_tokens: usize,
    ) -> Self {
        let merged = futures_util::stream::select_all(
            runs.into_iter()
                .enumerate()
                .map(|(i, run)| run.into_stream().map(move |item| (i, item)).boxed()),
        );
        Self {
            state,
            head,
            merged,
            offsets: plans.iter().map(|p| p.echo.len()).collect(),
            echo: plans
                .into_iter()
                .map(|p| Some(p.echo).filter(|e| !e.is_empty()))
                .collect(),
            logprobs,
            include_usage,
            usage: ChoiceUsage {
                prompt_tokens,
                ..ChoiceUsage::default()
            },
            done: false,
        }
    }

    fn into_stream(self) -> impl futures_util::Stream<Item = String> + Send {
        futures_util::stream::unfold(self, |mut stream| async move {
            stream.next_events().await.map(|events| (events, stream))
        })
    }

    fn chunk(&self, choices: Vec<Value>) -> Value {
        self.head
            .chunk("text_completion", choices, self.include_usage)
    }

    async fn next_events(&mut self) -> Option<String> {
        loop {
            if self.done {
                return None;
            }
            let Some((index, item)) = self.merged.next().await else {
                self.done = true;
                let mut events = String::new();
                if self.include_usage {
                    let mut chunk = self.chunk(Vec::new());
                    chunk["usage"] = usage_json(&self.usage);
                    events.push_str(&sse_event(&chunk));
                }
                events.push_str(SSE_DONE);
                return Some(events);
            };
            let echo = self.echo[index].take().unwrap_or_default();
            let (text, tokens, finish_reason, degeneration) = match item {
                ChoiceItem::Text { text, tokens } => (text, tokens, None, None),
                ChoiceItem::Finished(end) => {
                    account_choice(&self.state, &end, end.finish.as_str(), &self.head.id, index);
                    self.usage.add(&end.usage);
                    if let Some(error) = finish_error(&end.finish) {
                        return Some(sse_event(&error.body()));
                    }
                    let degeneration = end.degeneration.as_ref().map(|r| r.to_json());
                    (
                        String::new(),
                        Vec::new(),
                        Some(end.finish.as_str()),
                        degeneration,
                    )
                }
            };
            let text = echo + &text;
            if text.is_empty() && finish_reason.is_none() && tokens.is_empty() {
                continue;
            }
            let logprobs = if self.logprobs && !tokens.is_empty() {
                let value = completion_logprobs(true, &tokens, self.offsets[index]);
                self.offsets[index] += tokens.iter().map(|t| t.bytes.len()).sum::<usize>();
                value
            } else {
                Value::Null
            };
            let mut choice = json!({
                "index": index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            });
            if let Some(report) = degeneration {
                choice["degeneration"] = report;
            }
            return Some(sse_event(&self.chunk(vec![choice])));
        }
    }
}
