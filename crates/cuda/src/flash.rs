//! Launcher of the tensor-core prefill attention (flash_attention.cu): which rows it takes, how they
//! are cut into tiles, and its launch. The paged kernels (attention.rs) keep every other row.

use crate::backend::{device_failure, launch, CudaBackend};
use crate::buffer::CudaBuf;
use crate::options::GemmPrecision;
use crate::upload_cache::table;
use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaSlice, LaunchConfig};
use deltaserve_tensor::{AttnShape, BatchLayout, KvDtype, KvLayerPool};

/// A sequence with at least this many new tokens (a prefill chunk) takes the flash kernel; decode
/// and verify rows stay on the paged kernels, whose f32 products are exact to the reference.
pub const FLASH_MIN_TOKENS: usize = 64;
/// `FLASH_ROWS`, `FLASH_KEYS` and `FLASH_WARPS` of flash_attention.cu.
const FLASH_ROWS: usize = 128;
const FLASH_KEYS: usize = 64;
const FLASH_THREADS: u32 = 256;

/// Dynamic shared memory of the flash kernel for `head_dim`: a tile of query rows and
/// `kv_buffers` pairs of key and value tiles (2 with `FLASH_KV_PIPELINE=1` and a bf16 pool), bf16,
/// rows padded by 8.
fn flash_shared_bytes(head_dim: usize, kv_buffers: usize) -> usize {
    (FLASH_ROWS + 2 * kv_buffers * FLASH_KEYS) * (head_dim + 8) * 2
}

/// Whether a block may have the double-buffered tiles at the family's head dim of 256 (Hopper's
/// 227 KB: yes; an A100's 163 KB: no, it keeps single tiles and flash).
pub(crate) fn kv_pipeline_fits(max_shared: usize) -> bool {
    flash_shared_bytes(256, 2) <= max_shared
}

/// The flash kernel compiled for `head_dim` and a pool of `dtype`.
fn flash_kernel(head_dim: usize, dtype: KvDtype) -> Option<&'static str> {
    Some(match (head_dim, dtype) {
        (32, KvDtype::F32) => "flash_prefill_d32_f32",
        (64, KvDtype::F32) => "flash_prefill_d64_f32",
        (128, KvDtype::F32) => "flash_prefill_d128_f32",
        (256, KvDtype::F32) => "flash_prefill_d256_f32",
        (32, KvDtype::Bf16) => "flash_prefill_d32_bf16",
        (64, KvDtype::Bf16) => "flash_prefill_d64_bf16",
        (128, KvDtype::Bf16) => "flash_prefill_d128_bf16",
        (256, KvDtype::Bf16) => "flash_prefill_d256_bf16",
        _ => return None,
    })
}

/// The flash kernel's share of a batch: its tiles (4 ints each, as flash_attention.cu reads them)
/// and the batch rows they cover.
pub(crate) struct FlashPlan {
    kernel: &'static str,
    /// The kernel's dynamic shared memory (`flash_shared_bytes`).
    shared_bytes: usize,
    tiles: Vec<i32>,
    /// Per tile, the keys its last row sees: its work, which grows down a causal sequence.
    tile_keys: Vec<usize>,
    /// `(first row, rows)` of each sequence the tiles cover.
    pub covered: Vec<(usize, usize)>,
}

impl FlashPlan {
    /// Tiles of FLASH_ROWS packed (token, q head of the group) rows over every long sequence of the
    /// batch, for a pool of `dtype`; `None` when no sequence is long enough, the head dim has no
    /// kernel, the backend runs its products in f32 (the flash kernel rounds to bf16), or a block
    /// of the kernel needs more shared memory than the device's `max_shared` bytes (head dim 256
    /// needs 135 KB: more than the A6000's or an RTX card's 99 KB; 198 KB with `kv_pipeline`, the
    /// kernel compiled with `FLASH_KV_PIPELINE=1`, which double-buffers a bf16 pool's tiles).
    pub(crate) fn new(
        batch: &BatchLayout,
        shape: AttnShape,
        precision: GemmPrecision,
        dtype: KvDtype,
        max_shared: usize,
        kv_pipeline: bool,
    ) -> Option<Self> {
        let kernel = flash_kernel(shape.head_dim, dtype)?;
        let kv_buffers = if kv_pipeline && dtype == KvDtype::Bf16 {
            2
        } else {
            1
        };
        let shared_bytes = flash_shared_bytes(shape.head_dim, kv_buffers);
        if precision != GemmPrecision::Bf16 || shared_bytes > max_shared {
            return None;
        }
        let group = shape.q_heads / shape.kv_heads;
        let mut tiles = Vec::new();
        let mut tile_keys = Vec::new();
        let mut covered = Vec::new();
        for s in batch.seqs.iter().filter(|s| s.len >= FLASH_MIN_TOKENS) {
            for first in (0..s.len * group).step_by(FLASH_ROWS) {
                tiles.extend([s.start as i32, s.len as i32, first as i32, 0]);
                let last_token = ((first + FLASH_ROWS).min(s.len * group) - 1) / group;
                tile_keys.push(s.pos + last_token + 1);
            }
            covered.push((s.start, s.len));
        }
        (!covered.is_empty()).then_some(Self {
            kernel,
            shared_bytes,
            tiles,
            tile_keys,
            covered,
        })
    }

    /// The tiles reordered so that those with the most keys launch first (stable among equals):
    /// in launch order, the heaviest tiles of a causal prefill would otherwise start last and leave
    /// the other SMs idle at the end. Each tile's rows are its own, so the outputs are bit for bit
    /// the same in any order. (`FLASH_HEAVY_FIRST=1`; opt-in, not yet measured on a GPU.)
    pub(crate) fn heaviest_first(mut self) -> Self {
        let mut order: Vec<usize> = (0..self.tile_keys.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(self.tile_keys[i]));
        self.tiles = order
            .iter()
            .flat_map(|&i| self.tiles[4 * i..4 * i + 4].to_vec())
            .collect();
        self.tile_keys = order.iter().map(|&i| self.tile_keys[i]).collect();
        self
    }

    /// `rows` (`AttentionTable::rows`) with the covered rows' visible counts zeroed, which makes
    /// the paged kernels skip them.
    pub(crate) fn paged_rows(&self, rows: &[i32]) -> Vec<i32> {
        let mut rows = rows.to_vec();
        for &(start, len) in &self.covered {
            for row in start..start + len {
                rows[2 * row] = 0;
            }
        }
        rows
    }
}

impl CudaBackend {
    /// Attention of the plan's rows; the new K/V rows are already in the pool. `rows` and
    /// `blocks` are the batch's whole attention table on the device.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn flash_attention(
        &self,
        plan: &FlashPlan,
        q: &CudaBuf,
        pool: &KvLayerPool<Self>,
        shape: AttnShape,
        rows: &CudaSlice<i32>,
        blocks: &CudaSlice<u32>,
        out: &mut CudaBuf,
    ) {
        let tiles = self.upload_cached(table::FLASH_TILES, &plan.tiles);
        let function = self.function(plan.kernel);
        let shared = plan.shared_bytes;
        if let Err(e) = function.set_attribute(
            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            shared as i32,
        ) {
            device_failure(plan.kernel, e);
        }
        let cfg = LaunchConfig {
            grid_dim: ((plan.tiles.len() / 4) as u32, shape.kv_heads as u32, 1),
            block_dim: (FLASH_THREADS, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        let scale_log2 = (std::f64::consts::LOG2_E / (shape.head_dim as f64).sqrt()) as f32;
        let (qh, kvh, bs) = (
            shape.q_heads as i32,
            shape.kv_heads as i32,
            pool.block_size as i32,
        );
        // Contract: the tiles name sequences of this batch (rows within q and out, checked by the
        // caller), `rows` / `blocks` are the batch's attention table, whose block ids lie in the
        // pool; the kernel was compiled for this head dim and the pool's element type (the plan
        // was made for `pool.dtype`), and its shared memory was allowed above.
        launch!(
            self,
            plan.kernel,
            cfg,
            q.data(),
            pool.k.data(),
            pool.v.data(),
            out.data_mut(),
            tiles.as_ref(),
            rows,
            blocks,
            &qh,
            &kvh,
            &bs,
            &scale_log2
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltaserve_tensor::SeqLayout;

    /// A prefill chunk takes the flash kernel only where a block can have its shared memory: head
    /// dim 256 (the Qwen3.5/3.6 attention layers) needs 132 KiB, which Hopper's blocks have and an
    /// A6000's (99 KiB) do not; head dim 128 (68 KiB) fits both.
    #[test]
    fn flash_needs_the_shared_memory_of_its_blocks() {
        let batch = BatchLayout {
            seqs: vec![SeqLayout {
                start: 0,
                len: 512,
                pos: 0,
                blocks: Vec::new(),
                slot: 0,
                snapshot_slots: Vec::new(),
            }],
            block_size: 16,
        };
        let shape = |head_dim| AttnShape {
            q_heads: 24,
            kv_heads: 4,
            head_dim,
        };
        let plan = |head_dim, dtype, max_shared, kv_pipeline| {
            FlashPlan::new(
                &batch,
                shape(head_dim),
                GemmPrecision::Bf16,
                dtype,
                max_shared,
                kv_pipeline,
            )
            .map(|plan| plan.shared_bytes)
        };
        const HOPPER: usize = 232_448;
        const A100: usize = 166_912;
        const A6000: usize = 101_376;
        assert_eq!(plan(256, KvDtype::Bf16, HOPPER, false), Some(135_168));
        assert_eq!(plan(256, KvDtype::Bf16, A6000, false), None);
        assert_eq!(plan(128, KvDtype::Bf16, A6000, false), Some(69_632));
        // Double-buffered K/V tiles (a bf16 pool only): 198 KB at head dim 256, beyond an A100.
        assert_eq!(plan(256, KvDtype::Bf16, HOPPER, true), Some(202_752));
        assert_eq!(plan(256, KvDtype::Bf16, A100, true), None);
        assert_eq!(plan(256, KvDtype::F32, A100, true), Some(135_168));
    }

    /// Heaviest first: the tiles are a permutation of the launch-order ones, their key counts
    /// non-increasing, ties kept in launch order; a tile's keys are those its last row sees.
    #[test]
    fn heaviest_tiles_first_is_a_stable_permutation_by_keys() {
        let seq = |start, len, pos| SeqLayout {
            start,
            len,
            pos,
            blocks: Vec::new(),
            slot: 0,
            snapshot_slots: Vec::new(),
        };
        // Group 6: 128-row tiles end inside a token's heads; the second sequence has 300 cached.
        let batch = BatchLayout {
            seqs: vec![seq(0, 512, 0), seq(512, 1, 40), seq(513, 100, 300)],
            block_size: 16,
        };
        let shape = AttnShape {
            q_heads: 24,
            kv_heads: 4,
            head_dim: 256,
        };
        let plan = FlashPlan::new(
            &batch,
            shape,
            GemmPrecision::Bf16,
            KvDtype::Bf16,
            232_448,
            false,
        )
        .unwrap();
        assert_eq!(
            plan.tiles.len(),
            4 * ((512 * 6usize).div_ceil(128) + (100 * 6usize).div_ceil(128))
        );
        assert_eq!(plan.tile_keys[0], 22); // rows 0..128: tokens 0..21
        assert_eq!(plan.tile_keys[23], 512);
        assert_eq!(plan.tile_keys[24], 300 + 22);
        let launch_order: Vec<[i32; 4]> = plan
            .tiles
            .chunks(4)
            .map(|t| t.try_into().unwrap())
            .collect();
        let keys = plan.tile_keys.clone();
        let heavy = plan.heaviest_first();
        assert!(heavy.tile_keys.windows(2).all(|w| w[0] >= w[1]));
        let reordered: Vec<[i32; 4]> = heavy
            .tiles
            .chunks(4)
            .map(|t| t.try_into().unwrap())
            .collect();
        let mut expected: Vec<usize> = (0..keys.len()).collect();
        expected.sort_by_key(|&i| std::cmp::Reverse(keys[i]));
        let expected: Vec<[i32; 4]> = expected.iter().map(|&i| launch_order[i]).collect();
        assert_eq!(reordered, expected);
        assert_eq!(heavy.covered, vec![(0, 512), (513, 100)]);
    }
}
