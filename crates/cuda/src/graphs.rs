//! Recording a step's ops as a CUDA graph and replaying it (`Backend::prepare_step`,
//! `begin_capture`, `end_capture`, `replay`). A decode step is ~600 small launches; replayed as
//! one graph, the GPU no longer waits for the host between them.
//!
//! What makes a replay compute the new step: every table the ops read (token ids, positions,
//! sequence and attention tables, logit rows) lives at a fixed address in the upload cache, and
//! `prepare_step` copies the new step's values there before the replay; intermediates are graph
//! allocations, whose addresses are fixed for the graph's life; the launch grids depend only on the
//! batch's shape and the attention split count, which the shape key returned by `prepare_step`
//! covers together with the tables' generation.

use crate::backend::CudaBackend;
use crate::buffer::CudaBuf;
use crate::layout::{attention_table, seq_table};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;
use deltaserve_tensor::{StepGraph, StepInputs};
use std::hash::{Hash, Hasher};

/// Positions per attention split (`ATTENTION_SPLIT` of attention.cu).
const SPLIT_POSITIONS: usize = 64;

/// A CUDA graph with the stream it replays on.
struct RecordedStep(CudaGraph);

// SAFETY: a graph is only launched under the model's lock on its recordings (one thread at a time),
// on the backend's one stream; the handles themselves are plain pointers owned by `CudaGraph`.
unsafe impl Send for RecordedStep {}
unsafe impl Sync for RecordedStep {}

impl CudaBackend {
    pub(crate) fn prepare_step_op(&self, inputs: &StepInputs<'_>) -> u64 {
        let batch = inputs.batch;
        let (block_size, kv_heads, head_dim) = inputs.kv_geometry;
        // The same tables, under the same names, as the ops build them (embedding, rope, conv,
        // delta rule, attention, the head's gather), so that every op finds its table in place.
        self.upload_cached("embedding ids", inputs.tokens);
        self.upload_cached("rope positions", &batch.positions());
        let seqs = seq_table(batch);
        self.upload_cached("conv sequences", &seqs.seqs);
        self.upload_cached("conv snapshot slots", &seqs.snaps);
        self.upload_cached("delta rule sequences", &seqs.seqs);
        self.upload_cached("delta rule snapshot slots", &seqs.snaps);
        let table = attention_table(batch, |blocks, position| {
            let block = blocks[position / block_size] as usize;
            (block * block_size + position % block_size) * kv_heads * head_dim
        });
        self.upload_cached("attention offsets", &table.offsets);
        self.upload_cached("attention rows", &table.rows);
        self.upload_cached("attention block tables", &table.blocks);
        self.upload_cached("gather_rows rows", inputs.logit_rows);
        let max_visible = table.rows.iter().step_by(2).copied().max().unwrap_or(0) as usize;
        let splits = max_visible
            .div_ceil(SPLIT_POSITIONS)
            .max(1)
            .next_power_of_two();
        let generation = self
            .upload_cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .generation;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (splits, generation).hash(&mut hasher);
        hasher.finish()
    }

    pub(crate) fn begin_capture_op(&self) -> bool {
        if self.profiler_on() {
            return false;
        }
        // Relaxed: the allocations of the step's intermediates are recorded as graph allocations
        // (stream-ordered), which the global mode would refuse from other threads' activity.
        if let Err(e) = self
            .stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        {
            eprintln!("cuda graph: capture could not start ({e:?}); running uncaptured");
            return false;
        }
        let mut cache = self
            .upload_cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        cache.capturing = true;
        cache.capture_missed = false;
        true
    }

    pub(crate) fn end_capture_op(&self) -> Option<StepGraph> {
        let missed = {
            let mut cache = self
                .upload_cache
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            cache.capturing = false;
            cache.capture_missed
        };
        // Outputs of the step stay allocated after a replay: freeing them at the next launch
        // keeps one live copy, at the same address (the caller copies them out after each replay).
        let graph = self
            .stream
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
        match graph {
            Ok(Some(graph)) if !missed => Some(StepGraph(Box::new(RecordedStep(graph)))),
            Ok(_) if missed => {
                eprintln!(
                    "cuda graph: a table was not prepared before the capture; running uncaptured"
                );
                None
            }
            Ok(_) => None,
            Err(e) => {
                eprintln!("cuda graph: capture failed ({e:?}); running uncaptured");
                None
            }
        }
    }

    /// A step that panicked while being recorded leaves the stream capturing: every later launch
    /// would fail. End the recording and drop it.
    pub(crate) fn recover_after_failure_op(&self) {
        let was_capturing = {
            let mut cache = self
                .upload_cache
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            std::mem::replace(&mut cache.capturing, false)
        };
        if was_capturing {
            let _ = self.stream.end_capture(
                CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
            );
        }
    }

    pub(crate) fn replay_op(&self, graph: &StepGraph) -> bool {
        let Some(RecordedStep(graph)) = graph.0.downcast_ref::<RecordedStep>() else {
            return false;
        };
        match graph.launch() {
            Ok(()) => true,
            Err(e) => crate::backend::device_failure("replaying a cuda graph", e),
        }
    }

    pub(crate) fn copy_buf_op(&self, src: &CudaBuf) -> CudaBuf {
        let mut data = self.alloc_for_overwrite::<f32>("copy", src.len);
        if src.len > 0 {
            let mut view = data.slice_mut(0..src.len);
            if let Err(e) = self
                .stream
                .memcpy_dtod(&src.data.slice(0..src.len), &mut view)
            {
                crate::backend::device_failure("copying a buffer", e);
            }
        }
        CudaBuf { data, len: src.len }
    }
}
