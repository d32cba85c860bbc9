//! Decode steps recorded once per shape and replayed (CUDA graphs, on backends that can record).
//!
//! A step qualifies when every sequence decodes one token without snapshots (plain decode, not a
//! speculative verify), the batch has at most `max_batch` rows, every row's logits are wanted and
//! the model has no MoE layer (routing reads the router's choices on the host mid-step). A shape
//! (rows, the backend's shape key, the cache) is run plainly the first time it appears (lazy
//! initialisation stays out of the recording), recorded the second time and replayed from then on;
//! the outputs are copied out of the recording's buffers after each replay. Recording failures fall
//! back to the plain step for that shape, with the reason on stderr.

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
    /// Records and replays plain decode steps of up to `max_batch` sequences (SGLang's
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

    /// Whether `input` is a plain decode step a recording can stand for.
    fn step_qualifies(&self, input: &ForwardInput<'_>, cache: &HybridCache<B>, max: usize) -> bool {
        let rows = input.tokens.len();
        rows > 0
            && rows <= max
            && self.weights.moe_stays_on_device()
            && !cache.kv.is_empty()
            && input
                .batch
                .seqs
                .iter()
                .all(|s| s.len == 1 && s.snapshot_slots.is_empty())
            && input.logit_rows.iter().copied().eq(0..rows as u32)
            && (input.hidden_rows.is_empty() || input.hidden_rows == input.logit_rows)
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
        if !self.step_qualifies(input, cache, recordings.max_batch) {
            return None;
        }
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
