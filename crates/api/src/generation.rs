//! One choice of one request, from engine events to text: detokenizing, stop strings (across token
//! boundaries, then aborting the engine request), the degeneration watch (stopping the request when
//! told to), logprobs, token counts and timing. Dropping a run before it finished aborts the engine
//! request, which is how a client disconnect frees its slots. Reasoning and tool-call parsing happen
//! above this, in the chat route.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deltaserve_engine::{
    EngineEvent, EventReceiver, FinishReason, GenerationRequest, RequestId, SharedEngine,
    SubmitError, TokenConstraint, TokenLogprob,
};
use deltaserve_health::StreamEnd;
use deltaserve_text::{count_reasoning_tokens, Detokenizer, ThinkTokenIds, Tokenizer};
use futures_util::Stream;

use crate::diagnosis::Acceptance;
use crate::output_watch::{DegenerationReport, OutputWatch, WatchSpec};
use crate::stop::{StopMatcher, StopOutcome};
use crate::token_bytes::{token_bytes, token_display};

/// How long to wait for the engine's `Finished` after aborting a request whose stop string matched or
/// whose output degenerated (its usage carries the speculative-decoding counts).
const ABORT_DRAIN_TIMEOUT: Duration = Duration::from_millis(500);

/// Tags the reasoning and tool-call parsers need to see in the text even when the tokenizer marks
/// them special (real Qwen tokenizers do not; small test tokenizers may).
const PARSER_TAGS: [&str; 4] = ["<think>", "</think>", "<tool_call>", "</tool_call>"];

/// Everything needed to run one choice.
#[derive(Debug, Clone)]
pub struct ChoiceSpec {
    pub request: GenerationRequest,
    pub stop_strings: Vec<String>,
    pub skip_special_tokens: bool,
    /// Counts reasoning tokens by id when set: the tag ids and whether the prompt opened a think block.
    pub reasoning_tags: Option<(ThinkTokenIds, bool)>,
    /// The degeneration watch of the output (`None`: not watched).
    pub watch: Option<WatchSpec>,
    /// `--request-timeout`: the choice is aborted this long after the request arrived.
    pub timeout: Option<Duration>,
    /// Becomes true when the server's shutdown grace period runs out: the choice is aborted and
    /// ends with an error instead of being cut off mid-stream.
    pub cut: tokio::sync::watch::Receiver<bool>,
}

/// One alternative token in logprobs.
#[derive(Debug, Clone, PartialEq)]
pub struct TopLogprob {
    pub id: u32,
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// Logprob information of one generated token, in OpenAI's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenInfo {
    pub id: u32,
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    pub top: Vec<TopLogprob>,
}

/// Why a choice ended, as OpenAI reports it (`tool_calls` is decided by the chat route).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishKind {
    Stop,
    Length,
    /// The engine aborted the request without the client asking (e.g. shutdown).
    Abort,
    Error(String),
    /// `--request-timeout` (the limit it had) expired; the engine request was aborted.
    TimedOut(Duration),
    /// The server's shutdown grace period ran out; the engine request was aborted.
    ShutDown,
}

impl FinishKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishKind::Stop => "stop",
            FinishKind::Length => "length",
            FinishKind::Abort => "abort",
            FinishKind::Error(_) | FinishKind::TimedOut(_) | FinishKind::ShutDown => "error",
        }
    }
}

/// Token counts of one finished choice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChoiceUsage {
    pub prompt_tokens: usize,
    /// Prompt tokens the engine reused from its prefix cache.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub reasoning_tokens: usize,
    pub draft_tokens: usize,
    pub accepted_draft_tokens: usize,
}

impl ChoiceUsage {
    /// Sums choices; prompt tokens are counted once per distinct prompt by the caller.
    pub fn add(&mut self, other: &ChoiceUsage) {
        // Choices of one prompt share it: its cached part is reported once, as its prompt is.
        self.cached_tokens = self.cached_tokens.max(other.cached_tokens);
        self.completion_tokens += other.completion_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
        self.draft_tokens += other.draft_tokens;
        self.accepted_draft_tokens += other.accepted_draft_tokens;
    }
}

/// The end of a choice.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceEnd {
    pub finish: FinishKind,
    pub usage: ChoiceUsage,
    pub time_to_first_token: Option<Duration>,
    /// From request arrival to the end.
    pub e2e: Duration,
    /// Set when the output degenerated (boxed: rare and large).
    pub degeneration: Option<Box<DegenerationReport>>,
}

/// What a running choice yields.
#[derive(Debug, Clone, PartialEq)]
pub enum ChoiceItem {
    /// New output text (may be empty while text is held back) and the tokens that arrived with it.
    Text {
        text: String,
        tokens: Vec<TokenInfo>,
    },
    Finished(ChoiceEnd),
}

/// A submitted choice being read. Dropping it unfinished aborts the engine request.
pub struct ChoiceRun {
    engine: SharedEngine,
    tokenizer: Arc<Tokenizer>,
    id: RequestId,
    events: EventReceiver,
    spec: ChoiceSpec,
    stop_ids: HashSet<u32>,
    /// Parser tag ids decoded even when special tokens are skipped.
    kept_special: HashSet<u32>,
    detokenizer: Detokenizer,
    stop: StopMatcher,
    watch: Option<OutputWatch>,
    generated: Vec<u32>,
    arrival: Instant,
    first_token: Option<Duration>,
    queued: VecDeque<ChoiceItem>,
    /// The engine request is over (finished, failed, or aborted by us and drained).
    engine_done: bool,
    /// Prompt tokens the engine reported reused from its prefix cache.
    cached_tokens: usize,
    /// The `Finished` item was handed out.
    ended: bool,
}

impl ChoiceRun {
    /// Submits the request. `arrival` is when the HTTP request arrived (for TTFT and e2e latency).
    pub fn start(
        engine: SharedEngine,
        tokenizer: Arc<Tokenizer>,
        spec: ChoiceSpec,
        constraint: Option<Box<dyn TokenConstraint>>,
        arrival: Instant,
    ) -> Result<Self, SubmitError> {
        let (id, events) = engine.submit_constrained(spec.request.clone(), constraint)?;
        let stop_ids = spec.request.stop_token_ids.iter().copied().collect();
        let kept_special = PARSER_TAGS
            .iter()
            .filter_map(|t| tokenizer.token_to_id(t))
            .collect();
        let stop = StopMatcher::new(&spec.stop_strings);
        let watch = spec
            .watch
            .clone()
            .map(|watch| OutputWatch::new(watch, engine.as_ref(), id));
        Ok(Self {
            engine,
            tokenizer,
            id,
            events,
            spec,
            stop_ids,
            kept_special,
            detokenizer: Detokenizer::new(false),
            stop,
            watch,
            generated: Vec::new(),
            arrival,
            first_token: None,
            queued: VecDeque::new(),
            engine_done: false,
            cached_tokens: 0,
            ended: false,
        })
    }

    pub fn request_id(&self) -> RequestId {
        self.id
    }

    /// The next item; `None` after `Finished` was returned.
    pub async fn next(&mut self) -> Option<ChoiceItem> {
        if let Some(item) = self.queued.pop_front() {
            self.ended |= matches!(item, ChoiceItem::Finished(_));
            return Some(item);
        }
        if self.ended {
            return None;
        }
        let deadline = self
            .spec
            .timeout
            .map(|limit| tokio::time::Instant::from_std(self.arrival + limit));
        let mut cut = self.spec.cut.clone();
        let event = tokio::select! {
            event = self.events.recv() => event,
            () = sleep_until_or_never(deadline) => {
                let limit = self.spec.timeout.unwrap_or_default();
                return Some(self.end_early(FinishKind::TimedOut(limit)));
            }
            Ok(_) = cut.wait_for(|&cut| cut) => {
                return Some(self.end_early(FinishKind::ShutDown));
            }
        };
        let item = match event {
            Some(EngineEvent::Token { id, logprob }) => self.on_token(id, logprob).await,
            Some(EngineEvent::Finished { reason, usage }) => {
                self.engine_done = true;
                self.cached_tokens = usage.cached_tokens;
                let finish = match reason {
                    FinishReason::Stop => FinishKind::Stop,
                    FinishReason::Length => FinishKind::Length,
                    FinishReason::Abort => FinishKind::Abort,
                };
                self.finish(finish, Some(spec_usage(&usage)))
            }
            Some(EngineEvent::Error { message }) => {
                self.engine_done = true;
                self.finish(FinishKind::Error(message), None)
            }
            None => {
                self.engine_done = true;
                let message = "the engine dropped the request without finishing it".to_string();
                self.finish(FinishKind::Error(message), None)
            }
        };
        self.ended |= matches!(item, ChoiceItem::Finished(_));
        Some(item)
    }

    /// Ends the choice before the engine did (timeout, shutdown): frees the engine's slots now, not
    /// when the client goes away.
    fn end_early(&mut self, finish: FinishKind) -> ChoiceItem {
        self.engine.abort(self.id);
        self.engine_done = true;
        let item = self.finish(finish, None);
        self.ended |= matches!(item, ChoiceItem::Finished(_));
        item
    }

    async fn on_token(&mut self, id: u32, logprob: Option<TokenLogprob>) -> ChoiceItem {
        if self.first_token.is_none() {
            self.first_token = Some(self.arrival.elapsed());
        }
        self.generated.push(id);
        let tokens = logprob
            .map(|lp| vec![self.token_info(id, &lp)])
            .unwrap_or_default();
        let hidden = self.spec.skip_special_tokens
            && self.tokenizer.is_special(id)
            && !self.kept_special.contains(&id);
        let text = if self.stop_ids.contains(&id) || hidden {
            String::new()
        } else {
            self.detokenizer
                .step(&self.tokenizer, id)
                .unwrap_or_default()
        };
        let degenerated = match &mut self.watch {
            Some(watch) => watch.push(self.engine.as_ref(), id, &text),
            None => false,
        };
        match self.stop.push(&text) {
            StopOutcome::Emit(text) if degenerated => {
                if let Some(watch) = &mut self.watch {
                    watch.mark_stopped();
                }
                self.abort_and_finish(text, tokens).await
            }
            StopOutcome::Emit(text) => ChoiceItem::Text { text, tokens },
            StopOutcome::Stopped(text) => self.abort_and_finish(text, tokens).await,
        }
    }

    /// Ends the request here: aborts it in the engine, queues the last text and finishes with `stop`.
    async fn abort_and_finish(&mut self, text: String, tokens: Vec<TokenInfo>) -> ChoiceItem {
        self.engine.abort(self.id);
        let usage = self.drain_after_abort().await;
        self.engine_done = true;
        self.queued.push_back(ChoiceItem::Text { text, tokens });
        if let Some(usage) = &usage {
            self.cached_tokens = usage.cached_tokens;
        }
        self.finish(FinishKind::Stop, usage.as_ref().map(spec_usage))
    }

    /// Reads events after our abort until the engine confirms; returns its speculative counts
    /// (drafted, accepted), `None` when the engine did not confirm in time.
    async fn drain_after_abort(&mut self) -> Option<deltaserve_engine::Usage> {
        let wait = async {
            while let Some(event) = self.events.recv().await {
                match event {
                    EngineEvent::Finished { usage, .. } => return Some(usage),
                    EngineEvent::Error { .. } => return None,
                    EngineEvent::Token { .. } => {}
                }
            }
            None
        };
        tokio::time::timeout(ABORT_DRAIN_TIMEOUT, wait)
            .await
            .ok()
            .flatten()
    }

    /// Queues any text still held back and then the `Finished` item; returns the first queued item.
    /// `spec` is the request's (drafted, accepted) draft tokens, `None` when unknown.
    fn finish(&mut self, mut finish: FinishKind, spec: Option<(usize, usize)>) -> ChoiceItem {
        if !self.stop.is_stopped() {
            let mut tail = self.detokenizer.finish(&self.tokenizer).unwrap_or_default();
            tail = match self.stop.push(&tail) {
                StopOutcome::Emit(text) => text + &self.stop.flush(),
                StopOutcome::Stopped(text) => {
                    // The last, held-back characters completed a stop string: that is why it ended.
                    if matches!(finish, FinishKind::Length) {
                        finish = FinishKind::Stop;
                    }
                    text
                }
            };
            if !tail.is_empty() {
                self.queued.push_back(ChoiceItem::Text {
                    text: tail,
                    tokens: Vec::new(),
                });
            }
        }
        let generated = match self.generated.last() {
            Some(last) if self.stop_ids.contains(last) => {
                &self.generated[..self.generated.len() - 1]
            }
            _ => &self.generated[..],
        };
        let reasoning_tokens = self
            .spec
            .reasoning_tags
            .map(|(tags, starts)| count_reasoning_tokens(generated, &tags, starts))
            .unwrap_or(0);
        let (draft_tokens, accepted) = spec.unwrap_or((0, 0));
        let stream_end = match finish {
            FinishKind::Stop => StreamEnd::Stop,
            FinishKind::Length => StreamEnd::Length,
            FinishKind::Abort
            | FinishKind::Error(_)
            | FinishKind::TimedOut(_)
            | FinishKind::ShutDown => StreamEnd::Unknown,
        };
        let request_spec = spec.map(|(d, a)| Acceptance::new(d as u64, a as u64));
        let degeneration = self
            .watch
            .as_mut()
            .and_then(|watch| watch.finish(self.engine.as_ref(), stream_end, request_spec))
            .map(Box::new);
        let end = ChoiceItem::Finished(ChoiceEnd {
            finish,
            usage: ChoiceUsage {
                prompt_tokens: self.spec.request.prompt_ids.len(),
                cached_tokens: self.cached_tokens,
                completion_tokens: self.generated.len(),
                reasoning_tokens,
                draft_tokens,
                accepted_draft_tokens: accepted,
            },
            time_to_first_token: self.first_token,
            e2e: self.arrival.elapsed(),
            degeneration,
        });
        self.queued.push_back(end);
        // Not empty: `end` was just pushed. The fallback keeps this panic-free all the same.
        self.queued.pop_front().unwrap_or(ChoiceItem::Text {
            text: String::new(),
            tokens: Vec::new(),
        })
    }

    fn token_info(&self, id: u32, logprob: &TokenLogprob) -> TokenInfo {
        let describe = |id: u32| {
            let bytes = token_bytes(&self.tokenizer, id);
            (token_display(&bytes), bytes)
        };
        let (token, bytes) = describe(id);
        TokenInfo {
            id,
            token,
            bytes,
            logprob: logprob.logprob,
            top: logprob
                .top
                .iter()
                .map(|&(alt, lp)| {
                    let (token, bytes) = describe(alt);
                    TopLogprob {
                        id: alt,
                        token,
                        bytes,
                        logprob: lp,
                    }
                })
                .collect(),
        }
    }

    /// The run as a stream of items (ends after `Finished`). Dropping the stream aborts the request.
    pub fn into_stream(self) -> impl Stream<Item = ChoiceItem> + Send {
        futures_util::stream::unfold(self, |mut run| async move {
            run.next().await.map(|item| (item, run))
        })
    }

    /// Reads the run to its end: all text, all token infos, and the end.
    pub async fn collect(mut self) -> (String, Vec<TokenInfo>, ChoiceEnd) {
        let mut text = String::new();
        let mut tokens = Vec::new();
        loop {
            match self.next().await {
                Some(ChoiceItem::Text {
                    text: t,
                    tokens: infos,
                }) => {
                    text.push_str(&t);
                    tokens.extend(infos);
                }
                Some(ChoiceItem::Finished(end)) => return (text, tokens, end),
                None => {
                    // `next` hands out `Finished` exactly once before `None`; reaching here means the
                    // run was already consumed, which `collect` (taking `self`) rules out.
                    let end = ChoiceEnd {
                        finish: FinishKind::Error("the choice ended twice".to_string()),
                        usage: ChoiceUsage::default(),
                        time_to_first_token: self.first_token,
                        e2e: self.arrival.elapsed(),
                        degeneration: None,
                    };
                    return (text, tokens, end);
                }
            }
        }
    }
}

/// The (drafted, accepted) draft tokens of an engine usage.
fn spec_usage(usage: &deltaserve_engine::Usage) -> (usize, usize) {
    (usage.draft_tokens, usage.accepted_draft_tokens)
}

impl Drop for ChoiceRun {
    fn drop(&mut self) {
        if !self.engine_done {
            self.engine.abort(self.id);
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until_or_never(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
