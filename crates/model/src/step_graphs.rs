//! Decode and verify steps recorded once per shape and replayed (CUDA graphs, on backends that can
//! record).
//!
//! A step qualifies when every sequence runs the same number of tokens, either one (plain decode)
//! or a speculative verify's k + 1 with a snapshot slot for each, the batch has at most `max_batch`
//! rows, every row's logits are wanted and the model's MoE routing (if any) stays on the device. A
//! shape (rows, tokens a sequence, the backend's shape key, the cache) is run plainly the first
//! time it appears (lazy initialisation stays out of the recording), recorded the second time and
//! replayed from then on; the outputs are copied out of the recording's buffers after each replay.
//! Recording failures fall back to the plain step for that shape, with the reason on stderr.

use crate::cache::HybridCache;
use crate::forward::{ForwardInput, ForwardOutput, Model};
use deltaserve_tensor::{Backend, StepGraph, StepInputs};
use std::collections::HashMap;
use std::sync::Mutex;

/// Recordings kept at most; past it all are dropped and shapes are recorded anew.
const MAX_RECORDINGS: usize = 96;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct ShapeKey {
    rows: usize,
    tokens_per_seq: usize,
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
    counts: StepGraphCounts,
}

/// How often steps were replayed, and recordings made or failed, since enabling.
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
            counts: StepGraphCounts::default(),
        });
    }

    /// The recording counts; `None` when recording is off.
    pub fn step_graph_counts(&self) -> Option<StepGraphCounts> {
        self.step_graphs
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .as_ref()
            .map(|r| r.counts)
    }

    /// The tokens every sequence of `input` runs, when a recording can stand for the step: a
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

    /// The step through a recording, or `None` when it runs plainly.
    pub(crate) fn forward_recorded(
        &self,
        input: &ForwardInput<'_>,
        cache: &mut HybridCache<B>,
    ) -> Option<ForwardOutput<B>> {
        let be = &self.backend;
        let mut guard = self
            .step_graphs
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let recordings = guard.as_mut()?;
        let tokens_per_seq = self.step_qualifies(input, cache, recordings.max_batch)?;
        let kv = &cache.kv[0];
        let backend_shape = be.prepare_step(&StepInputs {
            tokens: input.tokens,
            batch: input.batch,
            logit_rows: input.logit_rows,
            kv_geometry: (kv.block_size, kv.kv_heads, kv.head_dim),
        })?;
        if recordings.cache_id != cache.id || recordings.shapes.len() >= MAX_RECORDINGS {
            // Recordings read the pools of the cache they were made with.
            recordings.shapes.clear();
            recordings.cache_id = cache.id;
        }
        let key = ShapeKey {
            rows: input.tokens.len(),
            tokens_per_seq,
            hidden: !input.hidden_rows.is_empty(),
            backend_shape,
        };
        match recordings.shapes.get(&key) {
            Some(Recording::Recorded { graph, output }) => {
                be.replay(graph);
                recordings.counts.replayed += 1;
                return Some(self.copy_output(output));
            }
            Some(Recording::Failed) => return None,
            Some(Recording::SeenOnce) => {}
            None => {
                recordings.shapes.insert(key, Recording::SeenOnce);
                return None;
            }
        }
        if !be.begin_capture() {
            recordings.counts.failed += 1;
            recordings.shapes.insert(key, Recording::Failed);
            return None;
        }
        let output = self.forward_plain(input, cache);
        match be.end_capture() {
            Some(graph) => {
                // A recording does not run: run it once for this step.
                be.replay(&graph);
                recordings.counts.recorded += 1;
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
                recordings.counts.failed += 1;
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
