//! One request inside the engine: its tokens (prompt then generated), how many of them the cache
//! already holds, the KV blocks and state slot it owns, its sampler state and its event channel.

use crate::api::{EngineEvent, GenerationRequest, RequestId, TokenConstraint, TokenMask, Usage};
use crate::rng::Rng;
use crate::sampler::PenaltyHistory;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

pub struct Sequence {
    pub id: RequestId,
    pub request: GenerationRequest,
    /// Prompt followed by every generated token.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Tokens whose KV and GDN state are in the cache; `tokens[computed..]` still have to run.
    pub computed: usize,
    pub blocks: Vec<u32>,
    pub slot: Option<u32>,
    pub rng: Rng,
    pub history: PenaltyHistory,
    pub sender: UnboundedSender<EngineEvent>,
    pub arrival: Instant,
    pub first_token_at: Option<Instant>,
    pub usage: Usage,
    /// Times this sequence was preempted (its cache dropped and recomputed).
    pub preemptions: usize,
    /// Present when this sequence decodes speculatively with the MTP head.
    pub spec: Option<SpecState>,
    /// Constrained decoding: the grammar that decides which tokens may come next. It has seen every
    /// generated token (it survives preemption, which recomputes the cache, not the tokens).
    pub constraint: Option<Box<dyn TokenConstraint>>,
    /// Whether the request was submitted with a constraint (it is then sampled on the host).
    pub constrained: bool,
    /// The constraint's mask for the position this step samples, computed while the forward pass
    /// ran; taken by the sampler.
    pub mask_ahead: Option<Result<Option<TokenMask>, String>>,
    /// Prompt positions after which its GDN state is snapshotted into the prefix cache (prefill is
    /// cut there); set at admission, empty without the cache.
    pub snapshot_points: Vec<usize>,
}

/// A speculating sequence's extra state.
#[derive(Clone, Debug, Default)]
pub struct SpecState {
    /// One state slot per verified position (the committed token and each draft), to roll back to.
    pub snapshot_slots: Vec<u32>,
    /// Drafts proposed for the next verify step, and the distributions they were drawn from.
    pub drafts: Vec<u32>,
    pub draft_dists: Vec<Vec<(u32, f32)>>,
}

impl Sequence {
    pub fn new(
        id: RequestId,
        request: GenerationRequest,
        seed: u64,
        sender: UnboundedSender<EngineEvent>,
    ) -> Self {
        let history = PenaltyHistory::new(&request.prompt_ids);
        let tokens = request.prompt_ids.clone();
        let prompt_len = tokens.len();
        Self {
            id,
            request,
            tokens,
            prompt_len,
            computed: 0,
            blocks: Vec::new(),
            slot: None,
            rng: Rng::new(seed),
            history,
            sender,
            arrival: Instant::now(),
            first_token_at: None,
            usage: Usage {
                prompt_tokens: prompt_len,
                ..Usage::default()
            },
            preemptions: 0,
            spec: None,
            constraint: None,
            constrained: false,
            mask_ahead: None,
            snapshot_points: Vec::new(),
        }
    }

    /// State slots this sequence holds while running.
    pub fn slots_needed(&self, snapshots: usize) -> usize {
        1 + if self.spec.is_some() { snapshots } else { 0 }
    }

    pub fn draft_count(&self) -> usize {
        self.spec.as_ref().map_or(0, |s| s.drafts.len())
    }

    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Tokens still to run through the model before the next token can be sampled.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.computed
    }

    /// Sends an event; false when the receiver is gone (the client disconnected).
    pub fn send(&self, event: EngineEvent) -> bool {
        self.sender.send(event).is_ok()
    }
}
