//! The skinny-GEMM path of `matmul` for decode and verify (gemv.cu): up to `GEMV_MAX_TOKENS` rows
//! against up to `GEMV_MATRICES` bf16 weight matrices that share their input, in one launch, or up
//! to `LANE_TOKENS` rows against block-FP8 matrices (W8A16: the codes are read, one scale a
//! 16-code vector, and multiply the f32 activations; half the bytes of bf16). cuBLAS
//! picks GEMM tilings that leave bandwidth unused on these shapes and needs a separate cast of the
//! activations per matrix; this path rounds the activations once per group and streams each weight
//! byte once with 16-byte loads into tensor-core multiply-adds, K split over a block's warps.
//! Larger batches and f32 weights go to cuBLAS (`gemm`).

use crate::backend::{launch, CudaBackend};
use crate::buffer::CudaBuf;
use crate::launcher::ValueArg;
use crate::mat::{CudaMat, MatData};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};

/// Rows up to which this path runs (at most `8 * GEMV_MAX_TOKEN_TILES` of gemv.cu); `GEMV_MATRICES`
/// and `GEMV_WARPS` of gemv.cu; each block owns 16 rows. Measured on the H200 (27B shape, batched
/// decode steps, docs/benchmarks.md): with this path up to 32 rows a 16-row step took 23.5 ms and a
/// 32-row one 34.8 ms, with cuBLAS from 9 rows on 18.4 and 20.3 ms (the tensor-core kernel's
/// activation loads grow with the rows); 1-8 rows stay here.
pub(crate) const GEMV_MAX_TOKENS: usize = 8;
const GEMV_MATRICES: usize = 4;
const GEMV_WARPS: usize = 8;
const ROWS_PER_BLOCK: usize = 16;
/// `GEMV_LANE_TOKENS` of gemv.cu: token counts of the CUDA-core kernel.
const LANE_TOKENS: usize = 4;

/// The CUDA-core kernel's block shape: `GEMV_LANE_WARPS` warps of `GEMV_LANE_ROWS` rows (one
/// token) or `GEMV_LANE_ROWS_MULTI` rows (two to four tokens) each, the defaults of gemv.cu unless
/// `CudaOptions::defines` overrides them (for measuring variants).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaneShape {
    warps: usize,
    rows_one_token: usize,
    rows_more_tokens: usize,
}

impl LaneShape {
    pub(crate) fn from_options(options: &crate::options::CudaOptions) -> Self {
        Self {
            warps: options.define("GEMV_LANE_WARPS").unwrap_or(4),
            rows_one_token: options.define("GEMV_LANE_ROWS").unwrap_or(4),
            rows_more_tokens: options.define("GEMV_LANE_ROWS_MULTI").unwrap_or(2),
        }
    }

    /// Rows a block covers for `tokens` tokens.
    fn rows_per_block(&self, tokens: usize) -> usize {
        self.warps
            * if tokens == 1 {
                self.rows_one_token
            } else {
                self.rows_more_tokens
            }
    }
}

/// `GemvGroup` of gemv.cu, field for field.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct GemvGroup {
    w: [u64; GEMV_MATRICES],
    out: [u64; GEMV_MATRICES],
    scale: [u64; GEMV_MATRICES],
    first_row: [i32; GEMV_MATRICES + 1],
    count: i32,
}

// SAFETY: `GemvGroup` is `repr(C)` with the field types and order of the CUDA struct (8-byte
// pointers, then 32-bit ints), so its bytes are what the kernel expects as a by-value parameter.
unsafe impl ValueArg for GemvGroup {}

impl CudaBackend {
    /// Whether `matmul_group` can take the GEMV path for these matrices and this many rows: one
    /// shared input width, few rows, and either bf16 weights whose rows are whole 16-byte vectors
    /// or block-FP8 ones whose rows are whole 16-code vectors (at most `LANE_TOKENS` rows).
    pub(crate) fn gemv_applies(ws: &[&CudaMat], tokens: usize) -> bool {
        let Some(first) = ws.first() else {
            return false;
        };
        let k = first.cols;
        let fits = |w: &&CudaMat| w.cols == k && w.rows > 0;
        let bf16 = (1..=GEMV_MAX_TOKENS).contains(&tokens)
            && k % 8 == 0
            && ws
                .iter()
                .all(|w| fits(w) && matches!(w.data, MatData::Bf16(_)));
        let fp8 = (1..=LANE_TOKENS).contains(&tokens)
            && k % 16 == 0
            && ws
                .iter()
                .all(|w| fits(w) && matches!(w.data, MatData::Fp8 { .. }));
        k > 0 && (bf16 || fp8) && ws.iter().map(|w| w.rows).sum::<usize>() < i32::MAX as usize
    }

    /// `outs[i] [tokens, rows_i] = bf16(x) @ ws[i]^T`; the caller checked `gemv_applies` and the
    /// buffer lengths.
    pub(crate) fn gemv_op(
        &self,
        x: &CudaBuf,
        ws: &[&CudaMat],
        outs: &mut [&mut CudaBuf],
        tokens: usize,
    ) {
        let k = ws[0].cols;
        // The kernels read the activations rounded to bf16 once for the whole group (as the cuBLAS
        // path does), except the one-token kernel, which rounds the f32 values itself the same way
        // and so saves the cast's launch (with more tokens the rounding costs more than the launch).
        let lanes = tokens <= LANE_TOKENS;
        let fp8 = matches!(ws[0].data, MatData::Fp8 { .. });
        // The FP8 kernels multiply the f32 activations as they are.
        let x_bf16 = (tokens > 1 && !fp8).then(|| self.cast_to_bf16(x, tokens * k));
        for (chunk_w, chunk_out) in ws.chunks(GEMV_MATRICES).zip(outs.chunks_mut(GEMV_MATRICES)) {
            let mut group = GemvGroup {
                count: chunk_w.len() as i32,
                ..GemvGroup::default()
            };
            let mut guards = Vec::with_capacity(2 * chunk_w.len());
            let mut rows = 0usize;
            for (m, (w, out)) in chunk_w.iter().zip(chunk_out.iter_mut()).enumerate() {
                let (w_ptr, w_guard) = match &w.data {
                    MatData::Bf16(data) => data.device_ptr(&self.stream),
                    MatData::Fp8 { codes, scales } => {
                        let (scale_ptr, scale_guard) = scales.device_ptr(&self.stream);
                        group.scale[m] = scale_ptr;
                        guards.push(scale_guard);
                        codes.device_ptr(&self.stream)
                    }
                    MatData::F32(_) => {
                        unreachable!("gemv_applies admits bf16 and fp8 matrices only")
                    }
                };
                let (out_ptr, out_guard) = out.data.device_ptr_mut(&self.stream);
                guards.push(w_guard);
                guards.push(out_guard);
                group.w[m] = w_ptr;
                group.out[m] = out_ptr;
                group.first_row[m] = rows as i32;
                rows += w.rows;
            }
            group.first_row[chunk_w.len()] = rows as i32;
            let (rows_per_block, warps) = if lanes {
                let shape = self.gemv_lane_shape;
                (shape.rows_per_block(tokens), shape.warps)
            } else {
                (ROWS_PER_BLOCK, GEMV_WARPS)
            };
            let cfg = LaunchConfig {
                grid_dim: (rows.div_ceil(rows_per_block) as u32, 1, 1),
                block_dim: (32 * warps as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let (t32, k32) = (tokens as i32, k as i32);
            // Contract: every matrix is bf16 [rows_m, k] with k % 8 == 0, or block-FP8 codes
            // [rows_m, k] with k % 16 == 0 and their 128 x 128 scale grid (gemv_applies), so each
            // row starts 16-byte aligned (and each x_bf16 or f32 x row too); tokens <=
            // GEMV_MAX_TOKENS (LANE_TOKENS for FP8); x (f32 for one token and for FP8, x_bf16
            // otherwise) holds tokens * k values and each out tokens * rows_m f32
            // (checked by the callers); first_row partitions the grid's rows among the matrices.
            let kernel = match (fp8, tokens) {
                (true, 1) => "gemv_fp8_lanes_t1",
                (true, 2) => "gemv_fp8_lanes_t2",
                (true, 3) => "gemv_fp8_lanes_t3",
                (true, _) => "gemv_fp8_lanes_t4",
                (false, 1) => "gemv_bf16_lanes_t1",
                (false, 2) => "gemv_bf16_lanes_t2",
                (false, 3) => "gemv_bf16_lanes_t3",
                (false, 4) => "gemv_bf16_lanes_t4",
                (false, _) => "gemv_bf16_t1",
            };
            match &x_bf16 {
                Some(xb) => launch!(self, kernel, cfg, &group, xb, &t32, &k32),
                None => launch!(self, kernel, cfg, &group, &x.data, &t32, &k32),
            }
            drop(guards);
        }
    }
}
