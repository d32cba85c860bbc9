//! Launchers of the dense ops (embedding, norms, elementwise, RoPE, row copies): argument checks on
//! the host, then one kernel from elementwise.cu, norm.cu or rope.cu. Lengths follow the reference:
//! zipped buffers use the shorter one.

use crate::backend::{launch, launch_elementwise, CudaBackend};
use crate::buffer::CudaBuf;
use crate::fp8_gemm::fp8_activation_rows;
use crate::launcher::KernelArg;
use crate::mat::{CudaMat, MatData};
use crate::upload_cache::table;
use cudarc::driver::{CudaSlice, LaunchConfig};
use deltaserve_tensor::AttnShape;
use std::sync::Arc;

/// `gated_rms_norm_warps` of norm.cu: rows of at most `32 * GATED_NORM_PER_LANE` values, and
/// `GATED_NORM_WARPS` rows a block.
const GATED_NORM_WARP_DIM: usize = 32 * 8;
const GATED_NORM_WARPS: usize = 8;
/// The most value heads a token has in the GDN layers of the supported models (27B: 48).
const GATED_NORM_MAX_HEADS: usize = 64;

/// One block per row of `dim` for the norms: enough warps to cover `dim` once, at most 256 threads,
/// and beyond 2048 values as many as keep a thread at 8 values (`ADD_NORM_PER_THREAD` of norm.cu;
/// up to 1024 threads). Every norm kernel gets the same block for a row width, so the fused
/// residual add + norm sums in rms_norm's order.
fn row_config(rows: usize, dim: usize) -> LaunchConfig {
    let covering = (dim.div_ceil(32) * 32).clamp(32, 256);
    let eight_each = (dim.div_ceil(8).div_ceil(32) * 32).min(1024);
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (covering.max(eight_each) as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches the norm kernel `$name` with one block per row, `row_config(rows, dim)` (the one place
/// the norms get their block, so all three sum a row alike); the row width is bound to `$dim32`,
/// the kernel's `int dim`, for the argument list to name. Launches nothing for no rows or an empty
/// row. As `launch!`, callers state the contract.
macro_rules! launch_per_row {
    ($be:expr, $name:expr, $rows:expr, $dim32:ident = $dim:expr, $($arg:expr),+ $(,)?) => {{
        let (rows, dim): (usize, usize) = ($rows, $dim);
        if rows > 0 && dim > 0 {
            let $dim32 = dim as i32;
            launch!($be, $name, row_config(rows, dim), $($arg),+);
        }
    }};
}

/// The kernels' `twin` argument when no bf16 twin is written: a null pointer.
static NO_TWIN: u64 = 0;

impl CudaBackend {
    /// `out`'s f32 values to write and the kernel's `twin` argument: a bf16 twin of `len` values
    /// when `wants_bf16_twin(tokens)`, else null (and any older twin dropped).
    fn output_with_twin<'a>(
        &self,
        out: &'a mut CudaBuf,
        tokens: usize,
        len: usize,
    ) -> (&'a mut CudaSlice<f32>, &'a dyn KernelArg) {
        if !self.wants_bf16_twin(tokens) {
            return (out.data_mut(), &NO_TWIN);
        }
        // Written whole by the op along with the f32 values.
        let (data, twin) = out.data_and_twin_mut(len, |n| self.alloc_for_overwrite("bf16 twin", n));
        (data, twin)
    }

    pub(crate) fn embedding_op(&self, table: &CudaMat, ids: &[u32], out: &mut CudaBuf) {
        let hidden = table.cols;
        let n = ids.len();
        assert!(
            out.len >= n * hidden,
            "embedding: out holds {} values, {n} ids x {hidden} need more",
            out.len
        );
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= table.rows) {
            panic!(
                "embedding: token id {bad} is outside the table's {} rows",
                table.rows
            );
        }
        if n * hidden == 0 {
            return;
        }
        let ids_dev = self.upload_cached(table::TOKEN_IDS, ids);
        let (n64, hidden32) = (n as i64, hidden as i32);
        let widened;
        let (kernel, t): (_, &dyn KernelArg) = match &table.data {
            MatData::Bf16(t) => ("embedding_bf16", t),
            MatData::Fp8 { codes, scales } => {
                // Checkpoints keep their embedding unquantized; widened whole if one does not.
                widened = self.dequantize_block_fp8(codes, scales, table.rows, table.cols);
                ("embedding_bf16", &widened)
            }
            MatData::F32(t) => ("embedding_f32", t),
        };
        // Contract: ids < rows (checked), out >= n * hidden (checked), table is rows x hidden of
        // the kernel's element type.
        launch!(
            self,
            kernel,
            Self::elementwise_config(n * hidden),
            t,
            ids_dev.as_ref(),
            out.data_mut(),
            &n64,
            &hidden32
        );
    }

    pub(crate) fn rms_norm_op(
        &self,
        x: &CudaBuf,
        w: &CudaBuf,
        eps: f32,
        dim: usize,
        out: &mut CudaBuf,
    ) {
        let rows = x.len / dim.max(1);
        assert!(
            w.len >= dim && out.len >= rows * dim,
            "rms_norm: weight {} / out {} too short for {rows} rows of {dim}",
            w.len,
            out.len
        );
        // Contract: one block per row of `dim` within x and out; w holds dim values (checked).
        launch_per_row!(
            self,
            "rms_norm",
            rows,
            dim32 = dim,
            x.data(),
            w.data(),
            out.data_mut(),
            &dim32,
            &eps
        );
    }

    pub(crate) fn add_rms_norm_op(
        &self,
        acc: &mut CudaBuf,
        x: &CudaBuf,
        w: &CudaBuf,
        eps: f32,
        dim: usize,
        out: &mut CudaBuf,
    ) {
        let rows = acc.len / dim.max(1);
        assert!(
            x.len >= rows * dim && w.len >= dim && out.len >= rows * dim,
            "add_rms_norm: x {} / weight {} / out {} too short for {rows} rows of {dim}",
            x.len,
            w.len,
            out.len
        );
        if rows > 0 && self.wants_fp8_twin(rows, dim) {
            let padded = fp8_activation_rows(rows);
            let (out_data, fp8) = out.data_and_fp8_twin_mut(rows, padded, dim, |codes, scales| {
                self.alloc_fp8_activations(codes, scales)
            });
            let (padded32, rows32, dim32) = (padded as i32, rows as i32, dim as i32);
            // Contract: a block per row of `dim` within acc, x and out, and per padded row of the
            // FP8 twin (codes padded x dim, scales dim / 128 x padded, both written whole: the
            // blocks past `rows` write the padding); dim % 128 == 0 (wants_fp8_twin) and blocks
            // of whole warps (row_config), as the twin's warp groups need; w holds dim values.
            launch!(
                self,
                "add_rms_norm_fp8",
                row_config(padded, dim),
                acc.data_mut(),
                x.data(),
                w.data(),
                out_data,
                &mut fp8.codes,
                &mut fp8.scales,
                &padded32,
                &rows32,
                &dim32,
                &eps
            );
            return;
        }
        let (out_data, twin) = self.output_with_twin(out, rows, rows * dim);
        // Contract: one block per row of `dim` within acc, x and out (and the twin, if any); w
        // holds dim values (checked).
        launch_per_row!(
            self,
            "add_rms_norm",
            rows,
            dim32 = dim,
            acc.data_mut(),
            x.data(),
            w.data(),
            out_data,
            twin,
            &dim32,
            &eps
        );
    }

    pub(crate) fn gated_rms_norm_op(
        &self,
        x: &CudaBuf,
        z: &CudaBuf,
        w: &CudaBuf,
        eps: f32,
        dim: usize,
        out: &mut CudaBuf,
    ) {
        let rows = x.len / dim.max(1);
        assert!(
            w.len >= dim && z.len >= rows * dim && out.len >= rows * dim,
            "gated_rms_norm: weight {} / gate {} / out {} too short for {rows} rows of {dim}",
            w.len,
            z.len,
            out.len
        );
        if self.gated_norm_by_warp && (1..=GATED_NORM_WARP_DIM).contains(&dim) && rows > 0 {
            let (rows32, dim32) = (rows as i32, dim as i32);
            let cfg = LaunchConfig {
                grid_dim: (rows.div_ceil(GATED_NORM_WARPS) as u32, 1, 1),
                block_dim: (32 * GATED_NORM_WARPS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // Rows are heads here; the GEMM after the norm (out_proj) takes a token's heads as one
            // row, so count tokens as if a token had GATED_NORM_MAX_HEADS heads: never more tokens
            // than there are, and so no twin that a GEMV step would not read.
            let tokens = rows / GATED_NORM_MAX_HEADS;
            let (out_data, twin) = self.output_with_twin(out, tokens, rows * dim);
            // Contract: x, z and out (and the twin, if any) hold rows x dim, dim <= 32 *
            // GATED_NORM_PER_LANE, w dim (checked above).
            launch!(
                self,
                "gated_rms_norm_warps",
                cfg,
                x.data(),
                z.data(),
                w.data(),
                out_data,
                twin,
                &rows32,
                &dim32,
                &eps
            );
            return;
        }
        // Contract: as rms_norm, and z is as long as x (checked).
        launch_per_row!(
            self,
            "gated_rms_norm",
            rows,
            dim32 = dim,
            x.data(),
            z.data(),
            w.data(),
            out.data_mut(),
            &dim32,
            &eps
        );
    }

    pub(crate) fn add_inplace_op(&self, acc: &mut CudaBuf, x: &CudaBuf) {
        let n = acc.len.min(x.len);
        // Contract: n is within both buffers.
        launch_elementwise!(self, "add_inplace", n64 = n, acc.data_mut(), x.data(), &n64);
    }

    pub(crate) fn silu_mul_op(&self, gate: &CudaBuf, up: &CudaBuf, out: &mut CudaBuf) {
        let n = out.len.min(gate.len).min(up.len);
        // Contract: n is within all three buffers, each a whole (16-byte aligned) allocation.
        launch_elementwise!(
            self,
            "silu_mul",
            n64 = n,
            4 per thread,
            gate.data(),
            up.data(),
            out.data_mut(),
            &n64
        );
    }

    pub(crate) fn sigmoid_mul_op(&self, x: &mut CudaBuf, gate: &CudaBuf) {
        let n = x.len.min(gate.len);
        // Contract: n is within both buffers, each a whole (16-byte aligned) allocation.
        launch_elementwise!(
            self,
            "sigmoid_mul_inplace",
            n64 = n,
            4 per thread,
            x.data_mut(),
            gate.data(),
            &n64
        );
    }

    pub(crate) fn sigmoid_scale_rows_op(&self, x: &mut CudaBuf, gate: &CudaBuf, dim: usize) {
        let rows = (x.len / dim.max(1)).min(gate.len);
        if rows == 0 || dim == 0 {
            return;
        }
        let (rows64, dim32) = (rows as i64, dim as i32);
        // Contract: rows * dim within x, rows within gate.
        launch!(
            self,
            "sigmoid_scale_rows",
            Self::elementwise_config(rows * dim),
            x.data_mut(),
            gate.data(),
            &rows64,
            &dim32
        );
    }

    pub(crate) fn concat_cols_op(
        &self,
        a: &CudaBuf,
        b: &CudaBuf,
        a_dim: usize,
        b_dim: usize,
        out: &mut CudaBuf,
    ) {
        let rows = a.len / a_dim.max(1);
        assert!(
            b.len >= rows * b_dim && out.len >= rows * (a_dim + b_dim),
            "concat_cols: b {} / out {} too short for {rows} rows of {a_dim} + {b_dim}",
            b.len,
            out.len
        );
        if rows * (a_dim + b_dim) == 0 {
            return;
        }
        let (rows64, a32, b32) = (rows as i64, a_dim as i32, b_dim as i32);
        // Contract: rows of a_dim in a, b_dim in b, a_dim + b_dim in out (checked).
        launch!(
            self,
            "concat_cols",
            Self::elementwise_config(rows * (a_dim + b_dim)),
            a.data(),
            b.data(),
            out.data_mut(),
            &rows64,
            &a32,
            &b32
        );
    }

    pub(crate) fn gather_rows_op(&self, src: &CudaBuf, dim: usize, rows: &[u32]) -> CudaBuf {
        let available = src.len / dim.max(1);
        if let Some(&bad) = rows.iter().find(|&&r| r as usize >= available) {
            panic!("gather_rows: row {bad} is outside the source's {available} rows of {dim}");
        }
        let mut out = CudaBuf::new(
            self.alloc_zeros("gather_rows", rows.len() * dim),
            rows.len() * dim,
        );
        if out.len == 0 {
            return out;
        }
        let rows_dev = self.upload_cached(table::GATHER_ROWS, rows);
        let (n64, dim32) = (rows.len() as i64, dim as i32);
        let config = Self::elementwise_config(out.len);
        // Contract: every row index is within src (checked); out has rows.len() * dim values.
        launch!(
            self,
            "gather_rows",
            config,
            src.data(),
            rows_dev.as_ref(),
            out.data_mut(),
            &n64,
            &dim32
        );
        out
    }

    pub(crate) fn scatter_add_rows_op(
        &self,
        acc: &mut CudaBuf,
        src: &CudaBuf,
        dim: usize,
        rows: &[u32],
        weights: &[f32],
    ) {
        let n = rows.len().min(weights.len());
        let available = acc.len / dim.max(1);
        assert!(
            src.len >= n * dim,
            "scatter_add_rows: src holds {} values, {n} rows of {dim} need more",
            src.len
        );
        if let Some(&bad) = rows[..n].iter().find(|&&r| r as usize >= available) {
            panic!("scatter_add_rows: row {bad} is outside the accumulator's {available} rows of {dim}");
        }
        if n * dim == 0 {
            return;
        }
        let rows_dev = self.upload("scatter_add_rows rows", &rows[..n]);
        let weights_dev = self.upload("scatter_add_rows weights", &weights[..n]);
        let (n32, dim32) = (n as i32, dim as i32);
        // Contract: row indices within acc (checked), n rows of dim within src (checked).
        launch!(
            self,
            "scatter_add_rows",
            Self::elementwise_config(dim),
            acc.data_mut(),
            src.data(),
            &rows_dev,
            &weights_dev,
            &n32,
            &dim32
        );
    }

    /// The reference's inverse frequencies (f32, `1 / theta^(2i / rotary_dim)`) on the device.
    fn inv_freq(&self, rotary_dim: usize, theta: f32) -> Arc<CudaSlice<f32>> {
        let mut tables = self
            .rope_tables
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        tables
            .entry((rotary_dim, theta.to_bits()))
            .or_insert_with(|| {
                let values: Vec<f32> = (0..rotary_dim / 2)
                    .map(|i| 1.0f32 / theta.powf((2 * i) as f32 / rotary_dim as f32))
                    .collect();
                Arc::new(self.upload("rope frequencies", &values))
            })
            .clone()
    }

    /// `qk_norm_rope`: one launch of row_config's blocks over the q rows then the k rows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn qk_norm_rope_op(
        &self,
        q_raw: &CudaBuf,
        k_raw: &CudaBuf,
        [q_norm, k_norm]: [&CudaBuf; 2],
        eps: f32,
        positions: &[u32],
        shape: AttnShape,
        (rotary_dim, theta): (usize, f32),
        q: &mut CudaBuf,
        k: &mut CudaBuf,
    ) {
        let (tokens, d) = (positions.len(), shape.head_dim);
        let (q_rows, k_rows) = (tokens * shape.q_heads, tokens * shape.kv_heads);
        assert!(
            rotary_dim <= d,
            "qk_norm_rope: rotary_dim {rotary_dim} exceeds head_dim {d}"
        );
        assert!(
            q_raw.len >= q_rows * d && q.len >= q_rows * d,
            "qk_norm_rope: q_raw {} / q {} too short for {q_rows} rows of {d}",
            q_raw.len,
            q.len
        );
        assert!(
            k_raw.len >= k_rows * d && k.len >= k_rows * d,
            "qk_norm_rope: k_raw {} / k {} too short for {k_rows} rows of {d}",
            k_raw.len,
            k.len
        );
        assert!(
            q_norm.len >= d && k_norm.len >= d,
            "qk_norm_rope: norm weights {} / {} shorter than head_dim {d}",
            q_norm.len,
            k_norm.len
        );
        if q_rows + k_rows == 0 || d == 0 {
            return;
        }
        let table = self.inv_freq(rotary_dim, theta);
        let positions_dev = self.upload_cached(table::POSITIONS, positions);
        let (q_rows64, hq, hk, d32, r32) = (
            q_rows as i64,
            shape.q_heads as i32,
            shape.kv_heads as i32,
            d as i32,
            rotary_dim as i32,
        );
        // Contract: q_raw/q hold q_rows and k_raw/k k_rows rows of head_dim (checked), one block a
        // row; the norm weights hold head_dim values; the table holds rotary_dim / 2 and the
        // positions one per token (rows / heads).
        launch!(
            self,
            "qk_norm_rope",
            row_config(q_rows + k_rows, d),
            q_raw.data(),
            k_raw.data(),
            q_norm.data(),
            k_norm.data(),
            q.data_mut(),
            k.data_mut(),
            positions_dev.as_ref(),
            table.as_ref(),
            &q_rows64,
            &hq,
            &hk,
            &d32,
            &r32,
            &eps
        );
    }

    pub(crate) fn rope_op(
        &self,
        x: &mut CudaBuf,
        positions: &[u32],
        heads: usize,
        head_dim: usize,
        rotary_dim: usize,
        theta: f32,
    ) {
        let tokens = positions.len();
        assert!(
            rotary_dim <= head_dim,
            "rope: rotary_dim {rotary_dim} exceeds head_dim {head_dim}"
        );
        assert!(
            x.len >= tokens * heads * head_dim,
            "rope: x holds {} values, {tokens} tokens x {heads} heads x {head_dim} need more",
            x.len
        );
        let half = rotary_dim / 2;
        if tokens * heads * half == 0 {
            return;
        }
        let table = self.inv_freq(rotary_dim, theta);
        let positions_dev = self.upload_cached(table::POSITIONS, positions);
        let (t64, h32, d32, r32) = (
            tokens as i64,
            heads as i32,
            head_dim as i32,
            rotary_dim as i32,
        );
        // Contract: x holds tokens x heads x head_dim (checked); the table holds rotary_dim / 2.
        launch!(
            self,
            "rope",
            Self::elementwise_config(tokens * heads * half),
            x.data_mut(),
            positions_dev.as_ref(),
            table.as_ref(),
            &t64,
            &h32,
            &d32,
            &r32
        );
    }
}
