//! The delta rule over long new sequences in chunked form on the tensor cores (gdn_chunked.cu):
//! `gdn_chunk_prepare` computes every chunk's state-independent matrices at once, `gdn_chunk_scan`
//! then walks each sequence's chunks in order with its state in shared memory. The batch is cut into
//! windows of at most `WINDOW_ROWS` rows so that the workspace between the two kernels stays bounded
//! (a sequence longer than a window continues in the next one from the state the previous window
//! left in its slot).

use crate::backend::{device_failure, launch, CudaBackend};
use crate::buffer::CudaBuf;
use crate::upload_cache::table;
use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::LaunchConfig;
use deltaserve_tensor::{BatchLayout, GdnShape, StateLayerPool};

/// `GDN_CHUNK`, `GDN_SLICE`, `GDN_MAX_VALUE_DIM`, `PREP_WARPS` and `SCAN_WARPS` of gdn_chunked.cu.
const CHUNK: usize = 64;
const SLICE: usize = 64;
const MAX_VALUE_DIM: usize = 128;
const PREP_WARPS: usize = 8;
const PREP_THREADS: u32 = PREP_WARPS as u32 * 32;
const SCAN_THREADS: u32 = 16 * 32;

/// Rows of one window: the workspace holds `3 * key_dim + 2 * value_dim` floats per row and value
/// head (~250 MB for the 27B shape's 48 heads of 128 x 128).
const WINDOW_ROWS: usize = 2048;

/// The chunked kernels for this key dim, if compiled.
fn kernels(key_dim: usize) -> Option<(&'static str, &'static str)> {
    Some(match key_dim {
        16 => ("gdn_chunk_prepare_k16", "gdn_chunk_scan_k16"),
        32 => ("gdn_chunk_prepare_k32", "gdn_chunk_scan_k32"),
        64 => ("gdn_chunk_prepare_k64", "gdn_chunk_scan_k64"),
        128 => ("gdn_chunk_prepare_k128", "gdn_chunk_scan_k128"),
        _ => return None,
    })
}

/// Whether the chunked kernels can run this layer's shape on a device whose blocks may have
/// `max_shared` bytes of shared memory (the caller decides whether they pay): the 27B's key dim of
/// 128 needs 166 KB for the prepare kernel and 176 KB for the scan, which Hopper has and the
/// A6000 and the RTX cards (99 KB) do not.
pub(crate) fn supports(shape: GdnShape, scan_pipelined: bool, max_shared: usize) -> bool {
    kernels(shape.key_dim).is_some()
        && shape.value_dim > 0
        && shape.value_dim <= MAX_VALUE_DIM
        && shape.value_dim.is_multiple_of(8)
        && prepare_shared_bytes(shape.key_dim) <= max_shared
        && scan_shared_bytes(shape.key_dim, scan_pipelined) <= max_shared
}

/// Whether a block may have the pipelined scan's second U buffer at the family's key dim of 128.
pub(crate) fn scan_pipeline_fits(max_shared: usize) -> bool {
    scan_shared_bytes(128, true) <= max_shared
}

/// `PREP_SMEM_FLOATS` and `SCAN_SMEM_FLOATS` of gdn_chunked.cu, in bytes.
fn prepare_shared_bytes(key_dim: usize) -> usize {
    4 * (2 * CHUNK * (key_dim + 4)
        + CHUNK * (MAX_VALUE_DIM + 4)
        + 3 * CHUNK * (CHUNK + 4)
        + 3 * CHUNK
        + PREP_WARPS * 16 * 24)
}

/// `pipelined`: `GDN_SCAN_PIPELINE=1`, a second U buffer.
fn scan_shared_bytes(key_dim: usize, pipelined: bool) -> usize {
    let u_buffers = 1 + usize::from(pipelined);
    4 * (key_dim * (SLICE + 8)
        + 2 * CHUNK * (key_dim + 4)
        + CHUNK * (key_dim + 8)
        + (1 + u_buffers) * CHUNK * (SLICE + 8))
}

/// One window of the batch: rows `row0 .. row0 + rows` and the chunks and pieces inside it.
#[derive(Debug, PartialEq)]
struct Window {
    row0: usize,
    rows: usize,
    chunks: std::ops::Range<usize>,
    pieces: std::ops::Range<usize>,
}

/// The chunk table [(first row, tokens)], the piece table [(first chunk, chunks, slot, 0)] and the
/// windows, for sequences without snapshot slots.
#[derive(Debug, Default, PartialEq)]
struct ChunkPlan {
    chunks: Vec<i32>,
    pieces: Vec<i32>,
    windows: Vec<Window>,
}

fn plan(batch: &BatchLayout, window_rows: usize) -> ChunkPlan {
    let mut plan = ChunkPlan::default();
    let mut open: Option<Window> = None;
    for s in &batch.seqs {
        let (mut row, end) = (s.start, s.start + s.len);
        while row < end {
            let fits = open
                .as_ref()
                .is_some_and(|w| row >= w.row0 + w.rows && row < w.row0 + window_rows);
            if !fits {
                plan.windows.extend(open.take());
                let (chunks, pieces) = (plan.chunks.len() / 2, plan.pieces.len() / 4);
                open = Some(Window {
                    row0: row,
                    rows: 0,
                    chunks: chunks..chunks,
                    pieces: pieces..pieces,
                });
            }
            let window = open.as_mut().expect("a window is open");
            let piece_end = end.min(window.row0 + window_rows);
            let first_chunk = plan.chunks.len() / 2;
            for chunk_start in (row..piece_end).step_by(CHUNK) {
                let tokens = CHUNK.min(piece_end - chunk_start);
                plan.chunks.extend([chunk_start as i32, tokens as i32]);
            }
            let count = plan.chunks.len() / 2 - first_chunk;
            plan.pieces
                .extend([first_chunk as i32, count as i32, s.slot as i32, 0]);
            window.rows = piece_end - window.row0;
            window.chunks.end = plan.chunks.len() / 2;
            window.pieces.end = plan.pieces.len() / 4;
            row = piece_end;
        }
    }
    plan.windows.extend(open);
    plan
}

impl CudaBackend {
    /// The delta rule of `batch` in chunked form; the caller checked the shapes and lengths (as for
    /// the recurrent kernels), that `supports` holds and that no sequence has snapshot slots.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn chunked_delta_rule(
        &self,
        mixed: &CudaBuf,
        g: &CudaBuf,
        beta: &CudaBuf,
        pool: &mut StateLayerPool<Self>,
        batch: &BatchLayout,
        shape: GdnShape,
        out: &mut CudaBuf,
    ) {
        let (prepare, scan) = kernels(shape.key_dim).expect("the caller checked supports()");
        let plan = plan(batch, WINDOW_ROWS);
        let chunks = self.upload_cached(table::GDN_CHUNKS, &plan.chunks);
        let pieces = self.upload_cached(table::GDN_PIECES, &plan.pieces);
        let (kd, vd, vh) = (shape.key_dim, shape.value_dim, shape.value_heads);
        let rows = plan.windows.iter().map(|w| w.rows).max().unwrap_or(0);
        // Every element a kernel reads from these is written first by `gdn_chunk_prepare` (the rows
        // of the window's chunks; the scan zero-fills rows past a chunk's end instead of reading).
        let record = |width: usize| {
            self.alloc_for_overwrite::<f32>("gdn chunk workspace", rows * vh * width)
        };
        let (w_ws, q_ws, k_ws) = (record(kd), record(kd), record(kd));
        let (u_ws, o_ws) = (record(vd), record(vd));
        let last_decay =
            self.alloc_for_overwrite::<f32>("gdn chunk decays", plan.chunks.len() / 2 * vh);
        for (name, bytes) in [
            (prepare, prepare_shared_bytes(kd)),
            (scan, scan_shared_bytes(kd, self.gdn_scan_pipeline)),
        ] {
            if let Err(e) = self.function(name).set_attribute(
                CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            ) {
                device_failure(name, e);
            }
        }
        let (hk, hv, dv) = (shape.key_heads as i32, vh as i32, vd as i32);
        for window in &plan.windows {
            let (chunk_base, piece_base, row0) = (
                window.chunks.start as i32,
                window.pieces.start as i32,
                window.row0 as i32,
            );
            let cfg = LaunchConfig {
                grid_dim: (window.chunks.len() as u32, vh as u32, 1),
                block_dim: (PREP_THREADS, 1, 1),
                shared_mem_bytes: prepare_shared_bytes(kd) as u32,
            };
            // Contract: the chunks of this window lie in rows row0 .. row0 + rows of the batch
            // (within mixed, g and beta, checked by the caller) and in the workspace's `rows`
            // records per head; the kernel was compiled for this key dim and value_dim <=
            // GDN_MAX_VALUE_DIM, a multiple of 8 (`supports`); its shared memory was allowed above.
            launch!(
                self,
                prepare,
                cfg,
                mixed.data(),
                g.data(),
                beta.data(),
                chunks.as_ref(),
                &w_ws,
                &q_ws,
                &k_ws,
                &u_ws,
                &o_ws,
                &last_decay,
                &chunk_base,
                &row0,
                &hk,
                &hv,
                &dv
            );
            let cfg = LaunchConfig {
                grid_dim: (
                    vh as u32,
                    window.pieces.len() as u32,
                    vd.div_ceil(SLICE) as u32,
                ),
                block_dim: (SCAN_THREADS, 1, 1),
                shared_mem_bytes: scan_shared_bytes(kd, self.gdn_scan_pipeline) as u32,
            };
            // Contract: as above; the pieces' slots are within the pool (checked by the caller) and
            // no slot appears twice in a window (a sequence is one piece per window).
            launch!(
                self,
                scan,
                cfg,
                &w_ws,
                &q_ws,
                &k_ws,
                &u_ws,
                &o_ws,
                &last_decay,
                chunks.as_ref(),
                pieces.as_ref(),
                pool.ssm.data(),
                out.data_mut(),
                &piece_base,
                &row0,
                &hv,
                &dv
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltaserve_tensor::SeqLayout;

    /// Hopper lets a block opt in to 227 KB of shared memory (232,448 bytes); the scan's second U
    /// buffer must keep within it for the largest key dim.
    #[test]
    fn scan_shared_memory_fits_a_block_pipelined_or_not() {
        for pipelined in [false, true] {
            let bytes = scan_shared_bytes(128, pipelined);
            assert!(bytes <= 232_448, "{bytes} bytes (pipelined: {pipelined})");
        }
        assert_eq!(
            scan_shared_bytes(128, true) - scan_shared_bytes(128, false),
            4 * CHUNK * (SLICE + 8)
        );
    }

    /// Devices whose blocks cannot have the chunked kernels' shared memory keep the recurrent
    /// kernels: the 27B's shape fits Hopper (227 KB), not an A100 (163 KB: the scan needs 172 KB)
    /// nor an A6000 (99 KB: the prepare kernel alone needs 107 KB with any key dim); a key dim of
    /// 32 fits the A100.
    #[test]
    fn chunked_form_needs_the_shared_memory_of_its_blocks() {
        let shape = GdnShape {
            key_heads: 16,
            value_heads: 48,
            key_dim: 128,
            value_dim: 128,
        };
        const HOPPER: usize = 232_448;
        const A100: usize = 166_912;
        const A6000: usize = 101_376;
        assert!(supports(shape, false, HOPPER));
        assert!(supports(shape, true, HOPPER));
        assert!(!supports(shape, false, A100));
        assert!(!supports(shape, false, A6000));
        let small = GdnShape {
            key_dim: 32,
            value_dim: 32,
            ..shape
        };
        assert!(supports(small, false, A100));
        assert!(!supports(small, false, A6000));
    }

    fn batch(lens: &[usize]) -> BatchLayout {
        let mut start = 0;
        let seqs = lens
            .iter()
            .enumerate()
            .map(|(slot, &len)| {
                let s = SeqLayout {
                    start,
                    len,
                    pos: 0,
                    blocks: Vec::new(),
                    slot,
                    snapshot_slots: Vec::new(),
                };
                start += len;
                s
            })
            .collect();
        BatchLayout {
            seqs,
            block_size: 16,
        }
    }

    #[test]
    fn sequences_split_into_chunks_and_windows() {
        // Windows of 128 rows: 150 = 128 + 22 (the second piece opens the next window), then 1, 40
        // and the first 65 of 70 fill that window; the last 5 open a third.
        let plan = plan(&batch(&[150, 1, 40, 70]), 128);
        assert_eq!(
            plan.chunks,
            vec![
                0, 64, 64, 64, // seq 0, window 0
                128, 22, // seq 0, window 1
                150, 1, // seq 1
                151, 40, // seq 2
                191, 64, 255, 1, // seq 3, window 1 (rows 191 .. 256)
                256, 5 // seq 3, window 2
            ]
        );
        assert_eq!(
            plan.pieces,
            vec![0, 2, 0, 0, 2, 1, 0, 0, 3, 1, 1, 0, 4, 1, 2, 0, 5, 2, 3, 0, 7, 1, 3, 0]
        );
        assert_eq!(
            plan.windows,
            vec![
                Window {
                    row0: 0,
                    rows: 128,
                    chunks: 0..2,
                    pieces: 0..1
                },
                Window {
                    row0: 128,
                    rows: 128,
                    chunks: 2..7,
                    pieces: 1..5
                },
                Window {
                    row0: 256,
                    rows: 5,
                    chunks: 7..8,
                    pieces: 5..6
                },
            ]
        );
    }

    #[test]
    fn an_empty_batch_has_no_windows() {
        assert_eq!(plan(&batch(&[]), 128), ChunkPlan::default());
    }
}
