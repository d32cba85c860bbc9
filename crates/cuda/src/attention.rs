//! Launcher of paged attention: writes the new K/V rows into the pool (`kv_write`), then attends over
//! each row's positions (attention.cu): warp-per-position blocks split over the context for head dims
//! of 32, 64, 128 and 256 (`paged_attention_d*`, then `attention_combine`), one block per (token,
//! q head) otherwise (`paged_attention`). Prefill chunks of bf16 backends go to the tensor-core
//! flash kernel instead (flash.rs); the paged kernels keep the other rows of the batch. Every kernel
//! exists once per pool element type (`_f32`, `_bf16`), chosen by the pool's `KvDtype`.

use crate::backend::{launch, CudaBackend};
use crate::buffer::CudaBuf;
use crate::flash::FlashPlan;
use crate::layout::{attention_table, check_kv};
use crate::upload_cache::table;
use cudarc::driver::{CudaSlice, LaunchConfig};
use deltaserve_tensor::{AttnShape, BatchLayout, KvDtype, KvLayerPool};

/// Positions scored per tile (threads per block) of the general kernel.
const ATTENTION_THREADS: u32 = 128;

/// `ATTENTION_WARPS` and `ATTENTION_SPLIT` of attention.cu: warps per block of the warp-per-position
/// kernels, and positions per block (a longer context is split over blocks and combined).
const WARPS: u32 = 4;
const SPLIT_POSITIONS: usize = 64;
/// Bound on the split partials' workspace (a decode step of 32 rows at 256k context needs 200 MiB).
const MAX_PARTIAL_BYTES: usize = 256 << 20;

/// The kernel that stores new K/V rows into a pool of `dtype`.
fn kv_write_kernel(dtype: KvDtype) -> &'static str {
    match dtype {
        KvDtype::F32 => "kv_write_f32",
        KvDtype::Bf16 => "kv_write_bf16",
    }
}

/// The general (any head dim) paged kernel for a pool of `dtype`.
fn general_kernel(dtype: KvDtype) -> &'static str {
    match dtype {
        KvDtype::F32 => "paged_attention_f32",
        KvDtype::Bf16 => "paged_attention_bf16",
    }
}

/// The warp-per-position kernel for `head_dim` (32 x dims per lane) and a pool of `dtype`, if
/// compiled for it.
fn warp_kernel(head_dim: usize, dtype: KvDtype) -> Option<&'static str> {
    Some(match (head_dim, dtype) {
        (32, KvDtype::F32) => "paged_attention_d1_f32",
        (64, KvDtype::F32) => "paged_attention_d2_f32",
        (128, KvDtype::F32) => "paged_attention_d4_f32",
        (256, KvDtype::F32) => "paged_attention_d8_f32",
        (32, KvDtype::Bf16) => "paged_attention_d1_bf16",
        (64, KvDtype::Bf16) => "paged_attention_d2_bf16",
        (128, KvDtype::Bf16) => "paged_attention_d4_bf16",
        (256, KvDtype::Bf16) => "paged_attention_d8_bf16",
        _ => return None,
    })
}

/// Rows (tokens) from which decode attention groups a kv head's query heads in one block. Measured
/// on the H200 (27B shape, 2048-token contexts, grouped / one head a block): batch 64 step 30.87 /
/// 33.60 ms, batch 16 20.16 / 20.58 ms; one-row decode 66.5-66.8 / 66.7 tok/s and the four-row MTP
/// verify 18.06 / 17.78 ms at 512 positions, where the grouped grid has a sixth of the blocks. The
/// two give bitwise the same output, so the choice is speed alone.
const GROUPED_ATTENTION_MIN_ROWS: usize = 8;

/// Query heads a block of the warp-per-position kernels takes together for `rows` rows: the largest
/// compiled group (8, 6, 4, 2) that divides the heads sharing a kv head, for the head dims compiled
/// grouped (128, 256) and batches of `GROUPED_ATTENTION_MIN_ROWS` rows or more; else 1.
/// `ATTENTION_GQA=0` (a define of `CudaOptions`) keeps one head a block, to measure.
fn head_group(shape: AttnShape, rows: usize, grouped: bool) -> usize {
    let ratio = shape.q_heads / shape.kv_heads.max(1);
    if !grouped
        || rows < GROUPED_ATTENTION_MIN_ROWS
        || !matches!(shape.head_dim, 128 | 256)
        || ratio == 0
    {
        return 1;
    }
    [8, 6, 4, 2]
        .into_iter()
        .find(|g| ratio.is_multiple_of(*g))
        .unwrap_or(1)
}

/// The grouped warp-per-position kernel for `head_dim`, `group` heads a block and a pool of
/// `dtype` (`head_group` picked a compiled one).
fn grouped_warp_kernel(head_dim: usize, group: usize, dtype: KvDtype) -> &'static str {
    match (head_dim, group, dtype) {
        (128, 2, KvDtype::F32) => "paged_attention_d4_g2_f32",
        (128, 4, KvDtype::F32) => "paged_attention_d4_g4_f32",
        (128, 6, KvDtype::F32) => "paged_attention_d4_g6_f32",
        (128, 8, KvDtype::F32) => "paged_attention_d4_g8_f32",
        (256, 2, KvDtype::F32) => "paged_attention_d8_g2_f32",
        (256, 4, KvDtype::F32) => "paged_attention_d8_g4_f32",
        (256, 6, KvDtype::F32) => "paged_attention_d8_g6_f32",
        (256, 8, KvDtype::F32) => "paged_attention_d8_g8_f32",
        (128, 2, KvDtype::Bf16) => "paged_attention_d4_g2_bf16",
        (128, 4, KvDtype::Bf16) => "paged_attention_d4_g4_bf16",
        (128, 6, KvDtype::Bf16) => "paged_attention_d4_g6_bf16",
        (128, 8, KvDtype::Bf16) => "paged_attention_d4_g8_bf16",
        (256, 2, KvDtype::Bf16) => "paged_attention_d8_g2_bf16",
        (256, 4, KvDtype::Bf16) => "paged_attention_d8_g4_bf16",
        (256, 6, KvDtype::Bf16) => "paged_attention_d8_g6_bf16",
        (256, 8, KvDtype::Bf16) => "paged_attention_d8_g8_bf16",
        _ => unreachable!("head_group picks compiled groups of head dims 128 and 256 only"),
    }
}

/// Splits of the warp-per-position kernels for the rows of an attention table (`rows` as
/// `AttentionTable::rows`): a power of two covering the longest row, so the launch grid (and a
/// recorded step) stays the same while the context grows; blocks past a row's positions return at
/// once, and the combine reads only the splits a row used, so the result is the same for any count
/// that covers it.
pub(crate) fn split_count(rows: &[i32]) -> usize {
    let max_visible = rows.iter().step_by(2).copied().max().unwrap_or(0) as usize;
    max_visible
        .div_ceil(SPLIT_POSITIONS)
        .max(1)
        .next_power_of_two()
}

impl CudaBackend {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_op(
        &self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        pool: &mut KvLayerPool<Self>,
        batch: &BatchLayout,
        shape: AttnShape,
        out: &mut CudaBuf,
    ) {
        let AttnShape {
            q_heads,
            kv_heads,
            head_dim,
        } = shape;
        assert!(
            pool.kv_heads == kv_heads && pool.head_dim == head_dim,
            "attention: the pool holds {} kv heads of {}, the layer has {kv_heads} of {head_dim}",
            pool.kv_heads,
            pool.head_dim
        );
        assert!(
            kv_heads > 0 && q_heads % kv_heads == 0,
            "attention: {q_heads} q heads are not a multiple of {kv_heads} kv heads"
        );
        check_kv("attention", batch, pool.num_blocks);
        let pool_words = pool.dtype.storage_words(pool.elements());
        assert!(
            pool.k.len >= pool_words && pool.v.len >= pool_words,
            "attention: k pool {} / v pool {} words hold fewer than {} {} values",
            pool.k.len,
            pool.v.len,
            pool.elements(),
            pool.dtype.name()
        );
        let tokens = batch.total_tokens();
        let kv_row = kv_heads * head_dim;
        assert!(
            q.len >= tokens * q_heads * head_dim && out.len >= tokens * q_heads * head_dim,
            "attention: q {} / out {} too short for {tokens} tokens x {q_heads} heads x {head_dim}",
            q.len,
            out.len
        );
        assert!(
            k.len >= tokens * kv_row && v.len >= tokens * kv_row,
            "attention: k {} / v {} too short for {tokens} tokens x {kv_row}",
            k.len,
            v.len
        );
        if tokens == 0 || head_dim == 0 {
            return;
        }
        let table = attention_table(batch, |blocks, position| pool.offset(blocks, position));
        let offsets = self.upload_cached(table::ATTENTION_OFFSETS, &table.offsets);
        let rows = self.upload_cached(table::ATTENTION_ROWS, &table.rows);
        let blocks = self.upload_cached(table::ATTENTION_BLOCKS, &table.blocks);

        let (t64, kv_row32) = (tokens as i64, kv_row as i32);
        // Contract: every offset + kv_row lies in the pool (the layout was checked against
        // num_blocks, the buffers hold num_blocks' elements of the pool's dtype, checked), k and v
        // hold tokens x kv_row (checked); the kernel's element type is the pool's.
        launch!(
            self,
            kv_write_kernel(pool.dtype),
            Self::elementwise_config(tokens * kv_row),
            k.data(),
            v.data(),
            pool.k.data_mut(),
            pool.v.data_mut(),
            offsets.as_ref(),
            &t64,
            &kv_row32
        );

        // Long sequences (prefill chunks) take the tensor-core flash kernel; the paged kernels
        // take the other rows, with the flash rows' visible counts zeroed so they skip them.
        let flash = FlashPlan::new(
            batch,
            shape,
            self.gemm_precision,
            pool.dtype,
            self.max_shared_per_block,
            self.flash_kv_pipeline,
        )
        .map(|plan| {
            if self.flash_heavy_first {
                plan.heaviest_first()
            } else {
                plan
            }
        });
        let paged_rows = flash.as_ref().map(|plan| plan.paged_rows(&table.rows));
        let (host_rows, device_rows) = match &paged_rows {
            Some(paged) => (
                paged.as_slice(),
                self.upload_cached(table::ATTENTION_PAGED_ROWS, paged),
            ),
            None => (table.rows.as_slice(), rows.clone()),
        };
        if host_rows.iter().step_by(2).any(|&visible| visible > 0) {
            self.paged_attention(q, pool, shape, host_rows, &device_rows, &blocks, out);
        }
        if let Some(plan) = &flash {
            self.flash_attention(plan, q, pool, shape, &rows, &blocks, out);
        }
    }

    /// The paged kernels over the rows of `host_rows` (a copy of `device_rows`) that see at
    /// least one position.
    #[allow(clippy::too_many_arguments)]
    fn paged_attention(
        &self,
        q: &CudaBuf,
        pool: &KvLayerPool<Self>,
        shape: AttnShape,
        host_rows: &[i32],
        rows: &CudaSlice<i32>,
        blocks: &CudaSlice<u32>,
        out: &mut CudaBuf,
    ) {
        let AttnShape {
            q_heads,
            kv_heads,
            head_dim,
        } = shape;
        let tokens = host_rows.len() / 2;
        let Ok(grid_blocks) = u32::try_from(tokens * q_heads) else {
            panic!("attention: {tokens} tokens x {q_heads} heads exceed one launch grid");
        };
        let scale = (1.0 / (head_dim as f64).sqrt()) as f32;
        let (qh, kvh, bs) = (q_heads as i32, kv_heads as i32, pool.block_size as i32);
        if let Some(one_head_kernel) = warp_kernel(head_dim, pool.dtype) {
            let group = head_group(shape, tokens, self.grouped_attention);
            let kernel = match group {
                1 => one_head_kernel,
                g => grouped_warp_kernel(head_dim, g, pool.dtype),
            };
            let wanted = split_count(host_rows);
            // Long prefill chunks have parallelism in their rows already; their partials would
            // grow with rows x context. Capped, each block takes several chunks in turn.
            let per_split = tokens * q_heads * head_dim * std::mem::size_of::<f32>();
            let affordable = (MAX_PARTIAL_BYTES / per_split.max(1)).max(1);
            let splits = wanted.min(1 << affordable.ilog2());
            let partials = if splits > 1 {
                tokens * q_heads * splits
            } else {
                0
            };
            let mut stats = self.alloc_zeros::<f32>("attention partial stats", 2 * partials);
            let mut acc = self.alloc_zeros::<f32>("attention partial outputs", partials * head_dim);
            let cfg = LaunchConfig {
                grid_dim: (grid_blocks / group as u32, splits as u32, 1),
                block_dim: (32 * WARPS, 1, 1),
                shared_mem_bytes: (group * WARPS as usize * head_dim * std::mem::size_of::<f32>())
                    as u32,
            };
            // Contract: as for `paged_attention` below; head_dim = 32 * the kernel's dims per
            // lane; `group` divides the q heads of a kv head (head_group), each block taking that
            // many; with several splits the partial buffers hold one entry per (row, head, split).
            launch!(
                self,
                kernel,
                cfg,
                q.data(),
                pool.k.data(),
                pool.v.data(),
                out.data_mut(),
                &mut stats,
                &mut acc,
                rows,
                blocks,
                &qh,
                &kvh,
                &bs,
                &scale
            );
            if splits > 1 {
                let (hd, splits32) = (head_dim as i32, splits as i32);
                let cfg = LaunchConfig {
                    grid_dim: (grid_blocks, 1, 1),
                    block_dim: (ATTENTION_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                // Contract: the partials were written for every split a row uses (its visible
                // positions / SPLIT_POSITIONS, rounded up), which the combine recomputes from `rows`.
                launch!(
                    self,
                    "attention_combine",
                    cfg,
                    &stats,
                    &acc,
                    out.data_mut(),
                    rows,
                    &qh,
                    &hd,
                    &splits32
                );
            }
            return;
        }
        let shared = (2 * head_dim + ATTENTION_THREADS as usize + 32) * std::mem::size_of::<f32>();
        let cfg = LaunchConfig {
            grid_dim: (grid_blocks, 1, 1),
            block_dim: (ATTENTION_THREADS, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        let hd = head_dim as i32;
        // Contract: rows holds 2 entries per token, each table offset + position / block_size lies
        // in `blocks` (the layout covers every position), block ids are < num_blocks (checked);
        // the kernel's element type is the pool's.
        launch!(
            self,
            general_kernel(pool.dtype),
            cfg,
            q.data(),
            pool.k.data(),
            pool.v.data(),
            out.data_mut(),
            rows,
            blocks,
            &qh,
            &kvh,
            &hd,
            &bs,
            &scale
        );
    }
}
