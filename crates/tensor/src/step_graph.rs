//! What a backend needs to record a step's ops once and replay them (CUDA graphs): the step's
//! inputs, which the backend puts in place on the device before the ops (or their replay) read
//! them, and an opaque handle to the recording. The model decides which steps are recorded
//! (`deltaserve_model::StepGraphs`); backends that cannot record keep the defaults of `Backend`.

use crate::batch::BatchLayout;
use std::any::Any;

/// The inputs of one step that its ops read from device tables: token ids, the batch layout, the
/// logit rows, the hidden states an MTP step starts from and the geometry of the KV pools the
/// attention layers use.
pub struct StepInputs<'a> {
    pub tokens: &'a [u32],
    /// `[T, hidden]` f32 rows read through `Backend::step_hidden` (an MTP step's input); empty
    /// for a trunk step.
    pub hidden: &'a [f32],
    pub batch: &'a BatchLayout,
    pub logit_rows: &'a [u32],
    /// `(block_size, kv_heads, head_dim)` of the KV pools the step's attention reads (the
    /// trunk's, or the MTP head's for an MTP step).
    pub kv_geometry: (usize, usize, usize),
}

/// A recorded step, replayable on the backend that recorded it. Only that backend knows what is
/// inside.
pub struct StepGraph(pub Box<dyn Any + Send + Sync>);
