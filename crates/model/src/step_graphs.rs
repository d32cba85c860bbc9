//! Decode, verify and MTP draft steps recorded once per shape and replayed (CUDA graphs, on
//! backends that can record).
//!
//! A trunk step qualifies when every sequence runs the same number of tokens, either one (plain
//! decode) or a speculative verify's k + 1 with a snapshot slot for each, the batch has at most
//! `max_batch` rows, every row's logits are wanted and the model's MoE routing (if any) stays on
//! the device. An MTP step (one draft step of every drafting sequence, `Model::mtp_forward`)
//! qualifies on the same terms, with its logit rows any rows (the last of each sequence when it
//! extends by several) and its input hidden states read from a device table
//! (`Backend::step_hidden`). A shape (kind, rows, tokens a sequence, logit rows, the backend's
//! shape key, the cache) is run plainly the first time it appears (lazy initialisation stays out
//! of the recording), recorded the second time and replayed from then on; the outputs are copied
//! out of the recording's buffers after each replay. Recording failures fall back to the plain
//! step for that shape, with the reason on stderr.

use crate::cache::HybridCache;
use crate::forward::{ForwardInput, ForwardOutput, Model};
use crate::mtp::{HiddenInput, MtpInput};
use crate::weights::MtpWeights;
use deltaserve_tensor::{Backend, BatchLayout, KvLayerPool, StepGraph, StepInputs};
use std::collections::HashMap;
use std::sync::Mutex;

/// What a step puts in the device tables, and what its recording is keyed on.
struct RecordedStep<'a> {
    kind: StepKind,
    tokens: &'a [u32],
    hidden: &'a [f32],
    batch: &'a BatchLayout,
    logit_rows: &'a [u32],
    /// Whether the step returns hidden states (part of the recording's outputs).
    hidden_wanted: bool,
}

/// Recordings of one kind (trunk or MTP) kept at most; past it all of that kind are dropped and
/// their shapes are recorded anew.
const MAX_RECORDINGS: usize = 96;

/// Which forward a recording stands for: the trunk's or the MTP head's.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum StepKind {
    Trunk = 0,
    Mtp = 1,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct ShapeKey {
    kind: StepKind,
    rows: usize,
    tokens_per_seq: usize,
    logit_rows: usize,
    hidden: bool,
    backend_shape: u64,
}

enum Recording<B: Backend> {
    SeenOnce,
    Recorded {
        graph: StepGraph,
        output: ForwardOutput<B>,
    },
    Failed,
}

struct Recordings<B: Backend> {
    max_batch: usize,
    cache_id: u64,
    shapes: HashMap<ShapeKey, Recording<B>>,
    /// Indexed by `StepKind`.
    counts: [StepGraphCounts; 2],
}

/// How often steps were replayed, and recordings made or failed, since enabling (trunk steps and
/// MTP steps are counted apart).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepGraphCounts {
    pub recorded: u64,
    pub replayed: u64,
    pub failed: u64,
}

/// The model's recorded decode steps; off until `Model::enable_step_graphs`.
pub struct StepGraphs<B: Backend> {
    state: Mutex<Option<Recordings<B>>>,
}

impl<B: Backend> Default for StepGraphs<B> {
    fn default() -> Self {
        Self {
            state: Mutex::new(None),
        }
    }
}

impl<B: Backend> Model<B> {
    /// Records and replays decode and verify steps of up to `max_batch` rows (SGLang's
    /// `--cuda-graph-max-bs`); 0 turns it off.
    pub fn enable_step_graphs(&self, max_batch: usize) {
        let mut state = self
            .step_graphs
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *state = (max_batch > 0).then(|| Recordings {
            max_batch,
            cache_id: 0,
            shapes: HashMap::new(),
            counts: Default::default(),
        });
    }

    /// The trunk steps' recording counts; `None` when recording is off.
    pub fn step_graph_counts(&self) -> Option<StepGraphCounts> {
        self.recording_counts(StepKind::Trunk)
    }

    /// The MTP steps' recording counts; `None` when recording is off.
    pub fn mtp_step_graph_counts(&self) -> Option<StepGraphCounts> {
        self.recording_counts(StepKind::Mtp)
    }

    fn recording_counts(&self, kind: StepKind) -> Option<StepGraphCounts> {
        self.step_graphs
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .as_ref()
            .map(|r| r.counts[kind as usize])
    }

    /// The tokens every sequence of `input` runs, when a recording can stand for the trunk step: a
    /// plain decode (one token each) or a speculative verify (the same tokens each, a snapshot slot
    /// for every token), of at most `max` rows (a verify of k + 1 tokens a sequence records up to
    /// `max / (k + 1)` sequences: each recording keeps its own logits), with every row's logits
    /// wanted.
    fn step_qualifies(
        &self,
        input: &ForwardInput<'_>,
        cache: &HybridCache<B>,
        max: usize,
    ) -> Option<usize> {
        let seqs = &input.batch.seqs;
        let tokens_per_seq = seqs.first()?.len;
        // A verify snapshots every token; a one-token step with snapshots is no verify.
        let snapshots_wanted = if tokens_per_seq == 1 {
            0
        } else {
            tokens_per_seq
        };
        let uniform = seqs
            .iter()
            .all(|s| s.len == tokens_per_seq && s.snapshot_slots.len() == snapshots_wanted);
        let rows = input.tokens.len();
        let qualifies = tokens_per_seq > 0
            && rows <= max
            && rows == seqs.len() * tokens_per_seq
            && uniform
            && self.weights.moe_stays_on_device()
            && !cache.kv.is_empty()
            && input.logit_rows.iter().copied().eq(0..rows as u32)
            && (input.hidden_rows.is_empty() || input.hidden_rows == input.logit_rows);
        qualifies.then_some(tokens_per_seq)
    }

    /// The tokens every sequence of an MTP step runs, when a recording can stand for it: the same
    /// number each (one for a draft step, the new pairs of an extend), no snapshots, at most `max`
    /// rows, the hidden states wanted for exactly the logit rows (one gather table serves both).
    fn mtp_step_qualifies(input: &MtpInput<'_>, max: usize) -> Option<usize> {
        let seqs = &input.batch.seqs;
        let tokens_per_seq = seqs.first()?.len;
        let rows = input.next_tokens.len();
        let qualifies = tokens_per_seq > 0
            && rows <= max
            && rows == seqs.len() * tokens_per_seq
            && seqs
                .iter()
                .all(|s| s.len == tokens_per_seq && s.snapshot_slots.is_empty())
            && !input.logit_rows.is_empty()
            && input.hidden_rows == input.logit_rows;
        qualifies.then_some(tokens_per_seq)
    }

    /// The trunk step through a recording, or `None` when it runs plainly.
    pub(crate) fn forward_recorded(
        &self,
        input: &ForwardInput<'_>,
        cache: &mut HybridCache<B>,
    ) -> Option<ForwardOutput<B>> {
        let step = RecordedStep {
            kind: StepKind::Trunk,
            tokens: input.tokens,
            hidden: &[],
            batch: input.batch,
            logit_rows: input.logit_rows,
            hidden_wanted: !input.hidden_rows.is_empty(),
        };
        self.through_recording(
            &step,
            |cache, max| self.step_qualifies(input, cache, max),
            |cache| cache.kv.first(),
            cache,
            |cache| self.forward_plain(input, cache),
        )
    }

    /// The MTP step through a recording, or `None` when it runs plainly.
    pub(crate) fn mtp_recorded(
        &self,
        mtp: &MtpWeights<B>,
        input: &MtpInput<'_>,
        cache: &mut HybridCache<B>,
    ) -> Option<ForwardOutput<B>> {
        if !self.weights.moe_stays_on_device() {
            return None;
        }
        let step = RecordedStep {
            kind: StepKind::Mtp,
            tokens: input.next_tokens,
            hidden: input.hidden,
            batch: input.batch,
            logit_rows: input.logit_rows,
            hidden_wanted: true,
        };
        self.through_recording(
            &step,
            |_, max| Self::mtp_step_qualifies(input, max),
            |cache| cache.mtp_kv.as_ref(),
            cache,
            |cache| {
                self.backend
                    .run_step(|| self.mtp_rank(mtp, input, cache, HiddenInput::StepTable))
            },
        )
    }

    /// Runs `plain` through the recording of `step`'s shape (replayed, or recorded now), or returns
    /// `None` when the step is to run plainly: recording off, the step not qualifying (`qualifies`
    /// gives the tokens a sequence of a qualifying step, with the recordings' row limit), no KV
    /// pool for its attention (`kv_pool`), a shape seen for the first time or failed before.
    fn through_recording(
        &self,
        step: &RecordedStep<'_>,
        qualifies: impl FnOnce(&HybridCache<B>, usize) -> Option<usize>,
        kv_pool: impl FnOnce(&HybridCache<B>) -> Option<&KvLayerPool<B>>,
        cache: &mut HybridCache<B>,
        plain: impl FnOnce(&mut HybridCache<B>) -> ForwardOutput<B>,
    ) -> Option<ForwardOutput<B>> {
        let be = &self.backend;
        let mut guard = self
            .step_graphs
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let recordings = guard.as_mut()?;
        let tokens_per_seq = qualifies(cache, recordings.max_batch)?;
        let kv = kv_pool(cache)?;
        let backend_shape = be.prepare_step(&StepInputs {
            tokens: step.tokens,
            hidden: step.hidden,
            batch: step.batch,
            logit_rows: step.logit_rows,
            kv_geometry: (kv.block_size, kv.kv_heads, kv.head_dim),
        })?;
        if recordings.cache_id != cache.id {
            // Recordings read the pools of the cache they were made with.
            recordings.shapes.clear();
            recordings.cache_id = cache.id;
        }
        let key = ShapeKey {
            kind: step.kind,
            rows: step.tokens.len(),
            tokens_per_seq,
            logit_rows: step.logit_rows.len(),
            hidden: step.hidden_wanted,
            backend_shape,
        };
        match recordings.shapes.get(&key) {
            Some(Recording::Recorded { graph, output }) => {
                be.replay(graph);
                recordings.counts[step.kind as usize].replayed += 1;
                return Some(self.copy_output(output));
            }
            Some(Recording::Failed) => return None,
            Some(Recording::SeenOnce) => {}
            None => {
                // Only a new shape can take a kind past its limit.
                let of_kind = recordings.shapes.keys().filter(|k| k.kind == step.kind);
                if of_kind.count() >= MAX_RECORDINGS {
                    recordings.shapes.retain(|k, _| k.kind != step.kind);
                }
                recordings.shapes.insert(key, Recording::SeenOnce);
                return None;
            }
        }
        if !be.begin_capture() {
            recordings.counts[step.kind as usize].failed += 1;
            recordings.shapes.insert(key, Recording::Failed);
            return None;
        }
        let output = plain(cache);
        match be.end_capture() {
            Some(graph) => {
                // A recording does not run: run it once for this step.
                be.replay(&graph);
                recordings.counts[step.kind as usize].recorded += 1;
                let copy = self.copy_output(&output);
                recordings
                    .shapes
                    .insert(key, Recording::Recorded { graph, output });
                Some(copy)
            }
            None => {
                // The recorded buffers never existed on the device: freeing them would be an
                // error, so they are left to the discarded recording.
                std::mem::forget(output);
                recordings.counts[step.kind as usize].failed += 1;
                recordings.shapes.insert(key, Recording::Failed);
                None
            }
        }
    }

    fn copy_output(&self, output: &ForwardOutput<B>) -> ForwardOutput<B> {
        ForwardOutput {
            logits: self.backend.copy_buf(&output.logits),
            hidden: self.backend.copy_buf(&output.hidden),
        }
    }
}
