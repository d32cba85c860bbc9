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

use crate::attention::split_count;
use crate::backend::CudaBackend;
use crate::buffer::CudaBuf;
use crate::layout::{attention_table, seq_table};
use crate::upload_cache::table;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice};
use deltaserve_tensor::{kv_offset, StepGraph, StepInputs};
use std::hash::{Hash, Hasher};

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
        // The tables the ops of a decode step build (embedding, rope, conv and delta rule,
        // attention, the head's gather), so that every op finds its table in place.
        self.upload_cached(table::TOKEN_IDS, inputs.tokens);
        self.upload_cached(table::POSITIONS, &batch.positions());
        let seqs = seq_table(batch);
        self.upload_cached(table::SEQUENCES, &seqs.seqs);
        self.upload_cached(table::SNAPSHOT_SLOTS, &seqs.snaps);
        let attention = attention_table(batch, |blocks, position| {
            kv_offset(blocks, position, block_size, kv_heads * head_dim)
        });
        self.upload_cached(table::ATTENTION_OFFSETS, &attention.offsets);
        self.upload_cached(table::ATTENTION_ROWS, &attention.rows);
        self.upload_cached(table::ATTENTION_BLOCKS, &attention.blocks);
        self.upload_cached(table::GATHER_ROWS, inputs.logit_rows);
        if !inputs.hidden.is_empty() {
            self.upload_cached(table::STEP_HIDDEN, inputs.hidden);
        }
        let splits = split_count(&attention.rows);
        let generation = self.upload_cache().generation;
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
        let mut cache = self.upload_cache();
        cache.capturing = true;
        cache.capture_missed = false;
        true
    }

    pub(crate) fn end_capture_op(&self) -> Option<StepGraph> {
        let missed = {
            let mut cache = self.upload_cache();
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
    /// would fail. End the recording and drop it. Then ask the device whether it still works: an
    /// out-of-memory error leaves the context usable, while a sticky error (illegal address,
    /// launch failure, ECC, a lost device) makes every later call return it, so a synchronize and
    /// a 4-byte round trip tell the two apart.
    pub(crate) fn recover_after_failure_op(&self) -> Result<(), String> {
        let was_capturing = { std::mem::replace(&mut self.upload_cache().capturing, false) };
        if was_capturing {
            let _ = self.stream.end_capture(
                CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
            );
        }
        let lost =
            |what: &str, e: cudarc::driver::DriverError| format!("{what} after the failure: {e:?}");
        self.stream
            .synchronize()
            .map_err(|e| lost("synchronize", e))?;
        let probe = self
            .stream
            .clone_htod(&[1.0f32])
            .map_err(|e| lost("a 4-byte upload", e))?;
        let back = self
            .stream
            .clone_dtoh(&probe)
            .map_err(|e| lost("a 4-byte download", e))?;
        match back.as_slice() {
            [v] if *v == 1.0 => Ok(()),
            other => Err(format!(
                "a 4-byte round trip after the failure read back {other:?}"
            )),
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
        self.copy_slice(src.data(), src.len)
    }

    /// A copy of the step table of hidden states (filled by `prepare_step_op`; here if it was
    /// not), so that the step's ops own their input as they own an upload, and a recording reads
    /// the table at its fixed address.
    pub(crate) fn step_hidden_op(&self, data: &[f32]) -> CudaBuf {
        let table = self.upload_cached(table::STEP_HIDDEN, data);
        self.copy_slice(&table, data.len())
    }

    fn copy_slice(&self, src: &CudaSlice<f32>, len: usize) -> CudaBuf {
        let mut data = self.alloc_for_overwrite::<f32>("copy", len);
        if len > 0 {
            let mut view = data.slice_mut(0..len);
            if let Err(e) = self.stream.memcpy_dtod(&src.slice(0..len), &mut view) {
                crate::backend::device_failure("copying a buffer", e);
            }
        }
        CudaBuf::new(data, len)
    }
}
