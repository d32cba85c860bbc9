//! Launchers of the Gated DeltaNet ops: causal conv1d with its window (conv.cu), the gates and the
//! delta rule (recurrent in gdn.cu: the row-coalesced kernel where the dims allow, the column kernel
//! otherwise; chunked on the tensor cores for prefill, gdn_chunked.rs), and resetting / copying a state
//! slot. The state pools stay on the device; the batch's sequence table is uploaded per call.

use crate::backend::{device_failure, launch, launch_elementwise, CudaBackend};
use crate::buffer::CudaBuf;
use crate::gdn_chunked;
use crate::kernels::MAX_CONV_HISTORY;
use crate::launcher::ValueArg;
use crate::layout::{check_state, seq_table};
use crate::options::{GdnPrefill, GemmPrecision};
use crate::upload_cache::table;
use cudarc::driver::{DevicePtr, LaunchConfig};
use deltaserve_tensor::{Backend, BatchLayout, GdnGateInputs, GdnShape, StateLayerPool};

/// Channels per block of the conv.
const CONV_THREADS: u32 = 128;

/// From this many new tokens in one sequence (prefill), the conv runs parallel over tokens
/// (`causal_conv1d_tokens` + `conv_window_update`) instead of walking them per channel.
const PARALLEL_CONV_MIN_TOKENS: usize = 16;
/// `CONV_SEGMENT` of conv.cu: consecutive rows a thread of the parallel conv walks; and the most
/// segment rows its grid has (a block row then strides over the rest).
const CONV_SEGMENT: usize = 16;
const CONV_MAX_SEGMENT_ROWS: usize = 65535;

/// From this many new tokens in one sequence (and no snapshot slots in the batch), the delta rule
/// runs in chunked form on the tensor cores (gdn_chunked.rs) where `GdnPrefill` allows it.
const CHUNKED_MIN_TOKENS: usize = 32;

/// Threads per block of the row-coalesced delta rule (`ROW_WARPS` warps in gdn.cu).
const ROW_THREADS: u32 = 256;
/// Below this many blocks at 4 columns a lane (a small batch: one prefill, a few decode rows), the
/// row kernel takes 1 column a lane instead: four times the blocks, a quarter of the work each, for
/// a GPU the batch alone would not fill. Both widths give bitwise the same results.
const ROW_WIDE_MIN_BLOCKS: usize = 512;
/// Value columns a lane owns in the row kernel's wide form (the narrow form owns 1).
const ROW_WIDE_COLUMNS: usize = 4;

/// Where the delta rule takes each token's gates from.
#[derive(Clone, Copy)]
pub(crate) enum GateSource<'a> {
    /// `g` and `beta` `[T, value_heads]` as `gdn_gates` wrote them.
    Computed { g: &'a CudaBuf, beta: &'a CudaBuf },
    /// The raw projections: the row kernel turns them into gates as it reads them (no gates
    /// launch); the other paths run `gdn_gates` first.
    Raw(GdnGateInputs<'a, CudaBuf>),
}

/// `GdnGates` of gdn.cu, field for field (g, beta, a, b, a_log, dt_bias): `g`/`beta`, or
/// (non-null `a`) the raw inputs.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct GdnGatesArg([u64; 6]);

// SAFETY: `GdnGatesArg` is `repr(C)` with six 8-byte pointers in the order of the CUDA struct, so
// its bytes are what the kernel expects as a by-value parameter.
unsafe impl ValueArg for GdnGatesArg {}

/// The delta-rule kernel that keeps whole state rows in registers and reads them in coalesced
/// sweeps, `columns` value columns a lane, compiled for these key dims (a multiple of its 8 warps).
fn row_kernel(key_dim: usize, value_dim: usize, columns: usize) -> Option<&'static str> {
    if !value_dim.is_multiple_of(columns) {
        return None;
    }
    Some(match (key_dim, columns) {
        (16, 1) => "gated_delta_rule_rows_k16_c1",
        (32, 1) => "gated_delta_rule_rows_k32_c1",
        (64, 1) => "gated_delta_rule_rows_k64_c1",
        (128, 1) => "gated_delta_rule_rows_k128_c1",
        (256, 1) => "gated_delta_rule_rows_k256_c1",
        (16, 4) => "gated_delta_rule_rows_k16_c4",
        (32, 4) => "gated_delta_rule_rows_k32_c4",
        (64, 4) => "gated_delta_rule_rows_k64_c4",
        (128, 4) => "gated_delta_rule_rows_k128_c4",
        (256, 4) => "gated_delta_rule_rows_k256_c4",
        _ => return None,
    })
}

impl CudaBackend {
    pub(crate) fn causal_conv1d_op(
        &self,
        x: &CudaBuf,
        w: &CudaBuf,
        pool: &mut StateLayerPool<Self>,
        batch: &BatchLayout,
        out: &mut CudaBuf,
    ) {
        let (conv_dim, history) = (pool.conv_dim, pool.conv_history);
        assert!(
            history <= MAX_CONV_HISTORY,
            "causal_conv1d: a kernel of {} taps exceeds the {} this backend supports",
            history + 1,
            MAX_CONV_HISTORY + 1
        );
        check_state("causal_conv1d", batch, pool.slots);
        let tokens = batch.total_tokens();
        assert!(
            x.len >= tokens * conv_dim && out.len >= tokens * conv_dim,
            "causal_conv1d: x {} / out {} too short for {tokens} tokens x {conv_dim} channels",
            x.len,
            out.len
        );
        assert!(
            w.len >= conv_dim * (history + 1),
            "causal_conv1d: weight holds {}, {conv_dim} channels x {} taps need more",
            w.len,
            history + 1
        );
        if batch.seqs.is_empty() || conv_dim == 0 {
            return;
        }
        let table = seq_table(batch);
        let seqs = self.upload_cached(table::SEQUENCES, &table.seqs);
        let snaps = self.upload_cached(table::SNAPSHOT_SLOTS, &table.snaps);
        let (cd, hist) = (conv_dim as i32, history as i32);
        // One block row of channels per sequence: the windows' update and the per-channel conv.
        let window_cfg = LaunchConfig {
            grid_dim: (
                (conv_dim as u32).div_ceil(CONV_THREADS),
                batch.seqs.len() as u32,
                1,
            ),
            block_dim: (CONV_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        if batch.seqs.iter().any(|s| s.len >= PARALLEL_CONV_MIN_TOKENS) {
            let row_seqs: Vec<i32> = batch
                .seqs
                .iter()
                .enumerate()
                .flat_map(|(i, s)| std::iter::repeat_n(i as i32, s.len))
                .collect();
            let row_seqs = self.upload_cached(table::CONV_ROW_SEQUENCES, &row_seqs);
            let t64 = tokens as i64;
            // Contract: the layout was checked (rows within x/out, slots and snapshot slots <
            // slots); row_seqs names each row's sequence; snapshot slots differ from the slots
            // read, so no thread reads what another writes.
            let cfg = LaunchConfig {
                grid_dim: (
                    (conv_dim as u32).div_ceil(CONV_THREADS),
                    tokens.div_ceil(CONV_SEGMENT).min(CONV_MAX_SEGMENT_ROWS) as u32,
                    1,
                ),
                block_dim: (CONV_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            launch!(
                self,
                "causal_conv1d_tokens",
                cfg,
                x.data(),
                w.data(),
                pool.conv.data_mut(),
                out.data_mut(),
                seqs.as_ref(),
                snaps.as_ref(),
                row_seqs.as_ref(),
                &t64,
                &cd,
                &hist
            );
            // Contract: as above; runs after every row has read the old windows (same stream).
            launch!(
                self,
                "conv_window_update",
                window_cfg,
                x.data(),
                pool.conv.data_mut(),
                seqs.as_ref(),
                &cd,
                &hist
            );
            return;
        }
        // Contract: the layout was checked (rows within x/out, slots and snapshot slots < slots).
        launch!(
            self,
            "causal_conv1d",
            window_cfg,
            x.data(),
            w.data(),
            pool.conv.data_mut(),
            out.data_mut(),
            seqs.as_ref(),
            snaps.as_ref(),
            &cd,
            &hist
        );
    }

    pub(crate) fn gdn_gates_op(
        &self,
        a: &CudaBuf,
        b: &CudaBuf,
        a_log: &CudaBuf,
        dt_bias: &CudaBuf,
        g: &mut CudaBuf,
        beta: &mut CudaBuf,
    ) {
        let heads = a_log.len;
        let n = a.len;
        assert!(
            heads > 0 && dt_bias.len >= heads,
            "gdn_gates: a_log has {heads} heads, dt_bias {}",
            dt_bias.len
        );
        assert!(
            b.len >= n && g.len >= n && beta.len >= n,
            "gdn_gates: b {} / g {} / beta {} shorter than a {n}",
            b.len,
            g.len,
            beta.len
        );
        let h32 = heads as i32;
        // Contract: n within a, b, g, beta; heads within a_log and dt_bias (checked).
        launch_elementwise!(
            self,
            "gdn_gates",
            n64 = n,
            a.data(),
            b.data(),
            a_log.data(),
            dt_bias.data(),
            g.data_mut(),
            beta.data_mut(),
            &n64,
            &h32
        );
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gated_delta_rule_op(
        &self,
        mixed: &CudaBuf,
        gates: GateSource<'_>,
        pool: &mut StateLayerPool<Self>,
        batch: &BatchLayout,
        shape: GdnShape,
        out: &mut CudaBuf,
    ) {
        let GdnShape {
            key_heads,
            value_heads,
            key_dim,
            value_dim,
        } = shape;
        assert!(
            pool.value_heads == value_heads && pool.key_dim == key_dim && pool.value_dim == value_dim,
            "gated_delta_rule: the pool holds {} heads of {}x{}, the layer has {value_heads} of {key_dim}x{value_dim}",
            pool.value_heads,
            pool.key_dim,
            pool.value_dim
        );
        assert!(key_heads > 0 && value_heads % key_heads == 0, "gated_delta_rule: {value_heads} value heads are not a multiple of {key_heads} key heads");
        let threads = (value_dim.max(1).div_ceil(32) * 32) as u32;
        assert!(
            threads <= 1024,
            "gated_delta_rule: value_dim {value_dim} exceeds the 1024 threads of a block"
        );
        check_state("gated_delta_rule", batch, pool.slots);
        let tokens = batch.total_tokens();
        assert!(
            mixed.len >= tokens * shape.conv_dim(),
            "gated_delta_rule: mixed holds {}, {tokens} x {} needed",
            mixed.len,
            shape.conv_dim()
        );
        let (first, second) = match gates {
            GateSource::Computed { g, beta } => (g.len, beta.len),
            GateSource::Raw(raw) => {
                assert!(
                    raw.a_log.len >= value_heads && raw.dt_bias.len >= value_heads,
                    "gated_delta_rule: a_log {} / dt_bias {} shorter than {value_heads} heads",
                    raw.a_log.len,
                    raw.dt_bias.len
                );
                (raw.a.len, raw.b.len)
            }
        };
        assert!(
            first >= tokens * value_heads && second >= tokens * value_heads,
            "gated_delta_rule: gates (or their inputs) {first} / {second} too short"
        );
        assert!(
            out.len >= tokens * value_heads * value_dim,
            "gated_delta_rule: out holds {}, {tokens} x {value_heads} x {value_dim} needed",
            out.len
        );
        if batch.seqs.is_empty() || value_heads == 0 || key_dim == 0 || value_dim == 0 {
            return;
        }
        let chunked =
            match self.gdn_prefill {
                GdnPrefill::Auto => self.gemm_precision == GemmPrecision::Bf16,
                GdnPrefill::Recurrent => false,
                GdnPrefill::Chunked => true,
            } && gdn_chunked::supports(shape, self.gdn_scan_pipeline, self.max_shared_per_block)
                && batch.seqs.iter().any(|s| s.len >= CHUNKED_MIN_TOKENS)
                && batch.seqs.iter().all(|s| s.snapshot_slots.is_empty());
        let grid = |columns_per_block: usize| {
            (
                value_heads as u32,
                batch.seqs.len() as u32,
                value_dim.div_ceil(columns_per_block) as u32,
            )
        };
        let wide_blocks =
            value_heads * batch.seqs.len() * value_dim.div_ceil(32 * ROW_WIDE_COLUMNS);
        let columns =
            if wide_blocks >= ROW_WIDE_MIN_BLOCKS && value_dim.is_multiple_of(ROW_WIDE_COLUMNS) {
                ROW_WIDE_COLUMNS
            } else {
                1
            };
        let fast = row_kernel(key_dim, value_dim, columns)
            .map(|kernel| (kernel, grid(32 * columns), ROW_THREADS));
        if let GateSource::Raw(raw) = gates {
            if chunked || fast.is_none() {
                // Only the row kernel computes gates itself.
                let n = tokens * value_heads;
                let (mut g, mut beta) = (self.scratch(n), self.scratch(n));
                self.gdn_gates_op(raw.a, raw.b, raw.a_log, raw.dt_bias, &mut g, &mut beta);
                let computed = GateSource::Computed { g: &g, beta: &beta };
                self.gated_delta_rule_op(mixed, computed, pool, batch, shape, out);
                return;
            }
        }
        if chunked {
            let GateSource::Computed { g, beta } = gates else {
                unreachable!("raw gates were computed above")
            };
            self.chunked_delta_rule(mixed, g, beta, pool, batch, shape, out);
            return;
        }
        let table = seq_table(batch);
        let seqs = self.upload_cached(table::SEQUENCES, &table.seqs);
        let snaps = self.upload_cached(table::SNAPSHOT_SLOTS, &table.snaps);
        let (hk, hv, dv) = (key_heads as i32, value_heads as i32, value_dim as i32);
        if let Some((kernel, grid_dim, threads)) = fast {
            let cfg = LaunchConfig {
                grid_dim,
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            };
            let buffers = match gates {
                GateSource::Computed { g, beta } => [Some(g), Some(beta), None, None, None, None],
                GateSource::Raw(raw) => [
                    None,
                    None,
                    Some(raw.a),
                    Some(raw.b),
                    Some(raw.a_log),
                    Some(raw.dt_bias),
                ],
            };
            let mut arg = GdnGatesArg::default();
            let mut guards = Vec::with_capacity(4);
            for (ptr, buf) in arg.0.iter_mut().zip(buffers) {
                if let Some(buf) = buf {
                    let (device_ptr, guard) = buf.data().device_ptr(&self.stream);
                    *ptr = device_ptr;
                    guards.push(guard);
                }
            }
            // Contract: the layout was checked (rows within mixed/out and the gates or their
            // inputs, slots and snapshot slots < slots, value_heads within a_log/dt_bias); the
            // blocks cover value_dim columns; the kernel was compiled for `key_dim`.
            launch!(
                self,
                kernel,
                cfg,
                mixed.data(),
                &arg,
                pool.ssm.data_mut(),
                out.data_mut(),
                seqs.as_ref(),
                snaps.as_ref(),
                &hk,
                &hv,
                &dv
            );
            drop(guards);
            return;
        }
        let GateSource::Computed { g, beta } = gates else {
            unreachable!("raw gates were computed above")
        };
        let cfg = LaunchConfig {
            grid_dim: (value_heads as u32, batch.seqs.len() as u32, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: ((2 * key_dim + 32) * std::mem::size_of::<f32>()) as u32,
        };
        let (hk, hv, dk, dv) = (
            key_heads as i32,
            value_heads as i32,
            key_dim as i32,
            value_dim as i32,
        );
        // Contract: the layout was checked (rows within mixed/g/beta/out, slots < slots); the block
        // covers value_dim threads and its shared memory holds q, k and the reduction scratch.
        launch!(
            self,
            "gated_delta_rule",
            cfg,
            mixed.data(),
            g.data(),
            beta.data(),
            pool.ssm.data_mut(),
            out.data_mut(),
            seqs.as_ref(),
            snaps.as_ref(),
            &hk,
            &hv,
            &dk,
            &dv
        );
    }

    pub(crate) fn reset_state_slot_op(&self, pool: &mut StateLayerPool<Self>, slot: usize) {
        assert!(
            slot < pool.slots,
            "reset_state_slot: slot {slot} of {}",
            pool.slots
        );
        let (c, s) = (pool.conv_slot_len(), pool.ssm_slot_len());
        for (buf, len) in [(&mut pool.conv, c), (&mut pool.ssm, s)] {
            if len == 0 {
                continue;
            }
            let mut view = buf.data_mut().slice_mut(slot * len..(slot + 1) * len);
            if let Err(e) = self.stream.memset_zeros(&mut view) {
                device_failure("reset_state_slot", e);
            }
        }
    }

    pub(crate) fn copy_state_slot_op(
        &self,
        pool: &mut StateLayerPool<Self>,
        src: usize,
        dst: usize,
    ) {
        assert!(
            src < pool.slots && dst < pool.slots,
            "copy_state_slot: slots {src} -> {dst} of {}",
            pool.slots
        );
        if src == dst {
            return;
        }
        let (c, s) = (pool.conv_slot_len(), pool.ssm_slot_len());
        for (buf, len) in [(&mut pool.conv, c), (&mut pool.ssm, s)] {
            if len == 0 {
                continue;
            }
            // Two disjoint views of one allocation: split between the two slots.
            let split = src.max(dst) * len;
            let (low, mut high) = buf.data_mut().split_at_mut(split);
            let result = if src < dst {
                let from = low.slice(src * len..(src + 1) * len);
                let mut to = high.slice_mut(0..len);
                self.stream.memcpy_dtod(&from, &mut to)
            } else {
                let from = high.slice(0..len);
                let mut low = low;
                let mut to = low.slice_mut(dst * len..(dst + 1) * len);
                self.stream.memcpy_dtod(&from, &mut to)
            };
            if let Err(e) = result {
                device_failure("copy_state_slot", e);
            }
        }
    }
}
