//! The skinny-GEMM path of `matmul` for decode and verify (gemv.cu): up to `GEMV_MAX_TOKENS` rows
//! against up to `GEMV_MATRICES` bf16 weight matrices that share their input, in one launch, or up
//! to `LANE_TOKENS` rows against block-FP8 matrices (W8A16: the codes are read, one scale a
//! 16-code vector, and multiply the f32 activations; half the bytes of bf16). cuBLAS
//! picks GEMM tilings that leave bandwidth unused on these shapes and needs a separate cast of the
//! activations per matrix; this path rounds the activations once per group and streams each weight
//! byte once with 16-byte loads into tensor-core multiply-adds, K split over a block's warps.
//! Larger batches and f32 weights go to cuBLAS (`gemm`).

use crate::backend::{launch, CudaBackend, Kernel};
use crate::buffer::CudaBuf;
use crate::error::CudaError;
use crate::launcher::ValueArg;
use crate::mat::{CudaMat, MatData};
use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig};
use std::collections::HashMap;
use std::sync::Arc;

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

/// The streamed kernel of gemv.cu (`gemv_bf16_stream_t*`: bf16 weights, 1-4 rows): its shape, the
/// persistent grid's size and the workspace of the row blocks that several blocks share. On unless
/// `GEMV_STREAM=0` (for measuring against the CUDA-core kernel).
pub(crate) struct GemvStream {
    enabled: bool,
    /// Groups of more rows keep the CUDA-core kernel (`GEMV_STREAM_MAX_ROWS`).
    max_rows: usize,
    rows: usize,
    cols: usize,
    shared_bytes: usize,
    /// Blocks of a launch at most (`GEMV_STREAM_BLOCKS_PER_SM` on every SM).
    blocks: usize,
    partials: CudaSlice<f32>,
    arrivals: CudaSlice<u32>,
}

const STREAM_KERNELS: [&str; LANE_TOKENS] = [
    "gemv_bf16_stream_t1",
    "gemv_bf16_stream_t2",
    "gemv_bf16_stream_t3",
    "gemv_bf16_stream_t4",
];

impl GemvStream {
    /// Reads the kernel's shape from the same defines as gemv.cu, allocates the workspace and lets
    /// the kernels use their shared memory.
    pub(crate) fn new(
        stream: &Arc<CudaStream>,
        options: &crate::options::CudaOptions,
        kernels: &HashMap<&'static str, Kernel>,
        sm_count: usize,
    ) -> Result<Self, CudaError> {
        let rows: usize = options.define("GEMV_STREAM_ROWS").unwrap_or(8);
        let cols: usize = options.define("GEMV_STREAM_COLS").unwrap_or(2048);
        let stages: usize = options.define("GEMV_STREAM_STAGES").unwrap_or(3);
        let per_sm: usize = options.define("GEMV_STREAM_BLOCKS_PER_SM").unwrap_or(2);
        let blocks = (per_sm * sm_count).max(1);
        // The pieces, then a full and an empty barrier (8 bytes each) per stage.
        let shared_bytes = stages * rows * cols * 2 + 16 * stages;
        let mut enabled = options.define::<usize>("GEMV_STREAM") != Some(0);
        let max_rows = options.define("GEMV_STREAM_MAX_ROWS").unwrap_or(8192);
        for name in STREAM_KERNELS {
            let kernel = kernels.get(name).ok_or(CudaError::MissingKernel {
                file: "gemv.cu",
                function: name,
                message: "not loaded".to_string(),
            })?;
            // A GPU that cannot give a block this much shared memory keeps the CUDA-core kernel.
            enabled &= kernel
                .function
                .set_attribute(
                    CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared_bytes as i32,
                )
                .is_ok();
        }
        let partials = stream
            .alloc_zeros::<f32>(2 * blocks * rows * LANE_TOKENS)
            .map_err(|e| CudaError::driver("allocating the streamed GEMV's partial sums", e))?;
        let arrivals = stream
            .alloc_zeros::<u32>(blocks * rows)
            .map_err(|e| CudaError::driver("allocating the streamed GEMV's arrival counts", e))?;
        Ok(Self {
            enabled,
            max_rows,
            rows,
            cols,
            shared_bytes,
            blocks,
            partials,
            arrivals,
        })
    }

    /// Whether it takes these weights for `tokens` rows: bf16 matrices whose rows start 16-byte
    /// aligned (`cp.async.bulk` copies 16-byte multiples between 16-byte aligned addresses).
    fn applies(&self, fp8: bool, tokens: usize, rows: usize, weight_ptrs: &[u64]) -> bool {
        self.enabled
            && rows <= self.max_rows
            && !fp8
            && (1..=LANE_TOKENS).contains(&tokens)
            && weight_ptrs.iter().all(|p| p % 16 == 0)
    }

    /// The persistent grid for `rows` rows of `k` columns: never more blocks than units, so that
    /// every block owns at least one (the kernel's arrival counts rely on it).
    fn grid(&self, rows: usize, k: usize) -> usize {
        let units = rows.div_ceil(self.rows) * k.div_ceil(self.cols);
        self.blocks.min(units).max(1)
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
    partials: u64,
    arrivals: u64,
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
            let streamed = lanes
                && self
                    .gemv_stream
                    .applies(fp8, tokens, rows, &group.w[..chunk_w.len()]);
            if streamed {
                let (partials, partials_guard) = self.gemv_stream.partials.device_ptr(&self.stream);
                let (arrivals, arrivals_guard) = self.gemv_stream.arrivals.device_ptr(&self.stream);
                group.partials = partials;
                group.arrivals = arrivals;
                guards.push(partials_guard);
                guards.push(arrivals_guard);
                let cfg = LaunchConfig {
                    grid_dim: (self.gemv_stream.grid(rows, k) as u32, 1, 1),
                    block_dim: (32 * (self.gemv_stream.rows as u32 + 1), 1, 1),
                    shared_mem_bytes: self.gemv_stream.shared_bytes as u32,
                };
                let (t32, k32) = (tokens as i32, k as i32);
                // Contract: bf16 matrices [rows_m, k] with k % 8 == 0 starting 16-byte aligned
                // (applies, gemv_applies), so every row piece is too; x as for the lanes kernels
                // below; the grid has at most as many blocks as units and the workspace holds
                // 2 * blocks * rows * LANE_TOKENS partial sums and blocks * rows counts, zero
                // between launches (each launch resets what it used).
                let kernel = STREAM_KERNELS[tokens - 1];
                match &x_bf16 {
                    Some(xb) => launch!(self, kernel, cfg, &group, xb, &t32, &k32),
                    None => launch!(self, kernel, cfg, &group, &x.data, &t32, &k32),
                }
                drop(guards);
                continue;
            }
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
