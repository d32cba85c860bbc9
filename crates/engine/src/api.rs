//! What the engine offers the outside world (the HTTP server, the CLI, tests): submit a request, get
//! its tokens as a stream of events, abort it, read pool and queue statistics. No tensors here.

use std::sync::Arc;

/// Sampling parameters of one request, already validated (the API layer rejects bad values).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 1.0 means off.
    pub top_p: f32,
    /// 0 means off.
    pub top_k: usize,
    /// 0.0 means off.
    pub min_p: f32,
    /// OpenAI presence penalty: subtracted once from the logit of every token already generated.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty: subtracted per occurrence in the generated tokens.
    pub frequency_penalty: f32,
    /// HF/vLLM repetition penalty over prompt and generated tokens; 1.0 means off.
    pub repetition_penalty: f32,
    /// Per-request seed: the same seed gives the same tokens whatever else is batched.
    pub seed: Option<u64>,
    /// Number of top alternatives to report per token; `None` = no logprobs at all.
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: None,
            logprobs: None,
        }
    }
}

/// One generation request (one choice: the API layer submits `n` requests for `n` choices).
#[derive(Clone, Debug)]
pub struct GenerationRequest {
    pub prompt_ids: Vec<u32>,
    pub sampling: SamplingParams,
    pub max_new_tokens: usize,
    /// Generation stops after emitting any of these (eos ids, user stop ids). The stop token itself
    /// is emitted as the last `Token` event.
    pub stop_token_ids: Vec<u32>,
    /// Turn speculative decoding off for this request even when the server has it on.
    pub disable_speculation: bool,
}

pub type RequestId = u64;

/// The tokens a constraint allows at the next position: bit `id % 32` of word `id / 32`. Ids past
/// the end of `words` are not allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenMask {
    pub words: Vec<u32>,
}

impl TokenMask {
    pub fn allows(&self, id: u32) -> bool {
        self.words
            .get(id as usize / 32)
            .is_some_and(|w| w >> (id % 32) & 1 == 1)
    }

    /// Whether no token of a `vocab`-sized row is allowed.
    pub fn allows_none(&self, vocab: usize) -> bool {
        let full = vocab / 32;
        let words_clear = self.words.iter().take(full).all(|&w| w == 0);
        let tail = vocab % 32;
        let tail_clear = tail == 0
            || self
                .words
                .get(full)
                .is_none_or(|&w| w & ((1u32 << tail) - 1) == 0);
        words_clear && tail_clear
    }

    /// A copy of `logits` with every token the mask forbids at negative infinity.
    pub fn apply(&self, logits: &[f32]) -> Vec<f32> {
        logits
            .iter()
            .enumerate()
            .map(|(id, &l)| {
                if self.allows(id as u32) {
                    l
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect()
    }
}

/// Constrained decoding: decides which tokens one request may generate next (a compiled grammar
/// such as a JSON schema). The engine asks for the mask before every position it samples for the
/// request and reports every token it commits, in order; drafts are never committed, only the tokens
/// verification keeps (drafting asks what the grammar allows after them, on the side). Errors end
/// the request with an error event.
pub trait TokenConstraint: Send {
    /// Tokens allowed at the next position; `None` when any token is (e.g. while the model is still
    /// reasoning and the grammar has not started).
    fn allowed(&mut self) -> Result<Option<TokenMask>, String>;
    /// The request committed `token`.
    fn commit(&mut self, token: u32) -> Result<(), String>;
    /// Whether `token` may follow the committed tokens and then `drafts` (speculative drafts this
    /// constraint allowed), answered without changing the constraint. A cheap check of one token,
    /// asked of every draft before it is proposed; `false` may also mean "not sure" (the caller then
    /// asks for the whole mask with `allowed_after`).
    fn allows_after(&mut self, drafts: &[u32], token: u32) -> Result<bool, String>;
    /// `allowed` after the committed tokens and then `drafts`, without changing the constraint.
    fn allowed_after(&mut self, drafts: &[u32]) -> Result<Option<TokenMask>, String>;
}

/// Log-probability information of one generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub logprob: f32,
    /// `(token id, logprob)` of the top alternatives, best first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was generated.
    Stop,
    /// `max_new_tokens` reached, or the context length.
    Length,
    /// Aborted by the caller (client disconnect, stop string matched outside the engine, ...).
    Abort,
}

/// Token counts of a finished request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens reused from the prefix cache (OpenAI's `prompt_tokens_details.cached_tokens`).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Speculative decoding: tokens drafted and accepted for this request (0 when off).
    pub draft_tokens: usize,
    pub accepted_draft_tokens: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    Token {
        id: u32,
        logprob: Option<TokenLogprob>,
    },
    Finished {
        reason: FinishReason,
        usage: Usage,
    },
    /// The request failed inside the engine; no further events follow.
    Error {
        message: String,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubmitError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens and max_tokens is {max_new}: {total} exceeds the context length {context}")]
    TooLong {
        prompt: usize,
        max_new: usize,
        total: usize,
        context: usize,
    },
    #[error("token id {id} is outside the vocabulary ({vocab} tokens)")]
    BadToken { id: u32, vocab: usize },
    #[error("the request queue is full ({0} waiting)")]
    QueueFull(usize),
    #[error("the engine has stopped")]
    Stopped,
    #[error("this engine cannot constrain decoding (no grammar support)")]
    ConstraintUnsupported,
}

/// A snapshot of the engine's occupancy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineStats {
    pub running: usize,
    pub queued: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    pub state_slots_used: usize,
    pub state_slots_total: usize,
    /// KV blocks only the prefix cache holds (no running request shares them) and state slots
    /// holding its snapshots: counted in the `_used` figures too, and yielded whenever a request
    /// needs them.
    pub cached_kv_blocks: usize,
    pub cached_snapshots: usize,
}

/// The receiving end of one request's events.
pub type EventReceiver = tokio::sync::mpsc::UnboundedReceiver<EngineEvent>;

/// The engine as the outside sees it. Cloneable and usable from any thread.
pub trait EngineHandle: Send + Sync {
    fn submit(&self, request: GenerationRequest)
        -> Result<(RequestId, EventReceiver), SubmitError>;
    /// Submits a request whose tokens `constraint` decides (constrained decoding). Engines that
    /// cannot constrain refuse a constraint rather than ignore it.
    fn submit_constrained(
        &self,
        request: GenerationRequest,
        constraint: Option<Box<dyn TokenConstraint>>,
    ) -> Result<(RequestId, EventReceiver), SubmitError> {
        match constraint {
            None => self.submit(request),
            Some(_) => Err(SubmitError::ConstraintUnsupported),
        }
    }
    /// Stops a request; its receiver gets `Finished { reason: Abort }` unless it already finished.
    /// Frees its KV blocks and state slot. Unknown or finished ids are ignored.
    fn abort(&self, id: RequestId);
    fn stats(&self) -> EngineStats;
    fn context_length(&self) -> usize;
    fn vocab_size(&self) -> usize;
    /// The engine's own metrics in Prometheus text format (pools, queue, speculative decoding).
    fn prometheus_metrics(&self) -> String {
        String::new()
    }
    /// Empties the prefix cache before the engine's next step (pages and snapshots in use by
    /// running requests stay theirs). False when there is no prefix cache.
    fn flush_cache(&self) -> bool {
        false
    }
    /// The data-parallel replicas behind this handle (`--dp-size`), each a whole engine of its
    /// own; empty when the handle is one engine. Health checks prove every replica separately.
    fn replicas(&self) -> Vec<SharedEngine> {
        Vec::new()
    }
    /// Tokens generated since start; while it grows the engine is making progress. Engines that
    /// do not count report 0.
    fn generated_tokens(&self) -> u64 {
        0
    }
    /// Why the engine stopped for good, when its device was lost (a failed step after which the
    /// device could run nothing more): every request from then on fails, so the server should
    /// report unhealthy and exit for its supervisor to restart it. `None` while it can serve.
    fn device_lost(&self) -> Option<String> {
        None
    }
}

pub type SharedEngine = Arc<dyn EngineHandle>;

#[cfg(test)]
mod tests {
    use super::TokenMask;

    #[test]
    fn masks_allow_their_bits_only() {
        let mask = TokenMask {
            words: vec![0, 1 << 3],
        };
        assert!(mask.allows(35) && !mask.allows(34) && !mask.allows(99));
        assert!(!mask.allows_none(36));
        assert!(mask.allows_none(35), "token 35 is outside a 35-token row");
        assert!(mask.allows_none(10));
        assert_eq!(mask.apply(&[1.0; 36])[35], 1.0);
        assert_eq!(mask.apply(&[1.0; 36])[3], f32::NEG_INFINITY);
    }
}
