//! The skinny-GEMM path of `matmul` for decode and verify (gemv.cu): up to `GEMV_MAX_TOKENS` rows
//! against up to `GEMV_MATRICES` bf16 weight matrices that share their input, in one launch, or up
//! to 8-32 rows (`LaneShape::fp8_mma_to`) against block-FP8 matrices (W8A16, half the bytes of
//! bf16: one token on the CUDA cores with the f32 activations, one scale a 16-code vector; 2-8
//! rows W8A8 on the FP8 tensor cores from compute capability 8.9, the activations quantized to FP8
//! per 128 columns, or elsewhere on the tensor cores with them rounded to bf16, one scale a
//! 128-column piece; one token over a group mixing FP8 and bf16 matrices in one launch). cuBLAS
//! picks GEMM tilings that leave bandwidth unused on these shapes and needs a separate cast of the
//! activations per matrix; this path rounds the activations once per group and streams each weight
//! byte once with 16-byte loads into tensor-core multiply-adds, K split over a block's warps.
//! Larger batches and f32 weights go to cuBLAS (`gemm`).

use crate::backend::{launch, CudaBackend};
use crate::buffer::CudaBuf;
use crate::fp8_gemm::Fp8Activations;
use crate::launcher::ValueArg;
use crate::mat::{CudaMat, MatData};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};

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

/// `GEMV_MMA_TOKENS` of gemv.cu: the most tokens of the FP8 tensor-core kernel (4 tiles of 8).
const MMA_TOKENS: usize = 32;
/// Tokens per tile of the FP8 tensor-core kernel (one mma operand's columns).
const MMA_TILE: usize = 8;
/// The most tokens of the W8A8 kernel (two tiles of 8).
const W8A8_TOKENS: usize = 16;
/// Rows a block of the FP8 tensor-core kernel owns (8 gate + 8 up rows when paired).
const MMA_ROWS_PER_BLOCK: usize = 16;

/// The GEMV kernels' block shapes and which one runs: the CUDA-core kernel's `GEMV_LANE_WARPS`
/// warps of `GEMV_LANE_ROWS` rows (one token) or `GEMV_LANE_ROWS_MULTI` rows (two to four tokens)
/// each, the FP8 tensor-core kernel's `GEMV_MMA_WARPS`; the defaults of gemv.cu unless
/// `CudaOptions::defines` overrides them (for measuring variants).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaneShape {
    warps: usize,
    rows_one_token: usize,
    /// `GEMV_FP8_ROWS`: rows a warp owns for one token with block-FP8 weights.
    fp8_rows_one_token: usize,
    rows_more_tokens: usize,
    /// Whether `matmul_silu_gate` takes the paired kernel (`GEMV_SILU_GATE=0` measures without).
    silu_gate: bool,
    mma_warps: usize,
    /// Block-FP8 weights take the tensor-core kernel from this many tokens to `fp8_mma_to`
    /// (`GEMV_FP8_MMA_FROM`; the CUDA-core kernel below it; past `fp8_mma_to`: never, and then
    /// the CUDA-core kernel takes 1-4 tokens and cuBLAS the rest, as before the kernel existed).
    fp8_mma_from: usize,
    /// The most tokens the FP8 tensor-core kernel takes: 8 per tile, `GEMV_FP8_MMA_TILES` tiles
    /// (default 1; up to 4). Measured on the H200 (27B shape, batch 16 / 32 step): 4 tiles 25.8 /
    /// 47.9 ms, one tile and the W8A8 GEMM past it (fp8_gemm.rs) 16.7 / 18.8 ms.
    fp8_mma_to: usize,
    /// The most rows the GEMV takes, bf16 and FP8 (`GEMV_BF16_TO`, `GEMV_FP8_TO`; default: all the
    /// kernels can): fewer send the rest to cuBLAS / the W8A8 GEMM, to measure where those win (a
    /// 9-row FP8 step on the W8A8 GEMM, 16.4 ms, beat an 8-row one on the GEMV, 17.5 ms).
    rows_to: [usize; 2],
    /// Block-FP8 weights take the W8A8 kernel from this many tokens (`GEMV_FP8_W8A8_FROM`; default
    /// 2) to `fp8_w8a8_to`: the activations quantized per 128 columns and multiplied on the FP8
    /// tensor cores, as the prefill GEMM does, where the GPU has them (compute capability 8.9 on)
    /// and k is whole 128-column blocks. Measured on the H200 (27B shape, FP8 kept, session 14): a
    /// k=3 verify of 4 tokens 12.1 ms against 14.0 on the kernel that widens the codes to bf16 (MTP
    /// k=3 270 against 238.5 tok/s); batch 2 / 4 / 8 steps 10.7 / 11.1 / 12.1 ms against 12.8 /
    /// 14.0 / 17.3 (session 13). One token stays on the lane kernel (88.9 tok/s here against 91.0
    /// there, session 13). Its activations are read after the wait for the previous kernel
    /// (`load_fresh`; docs/fp8.md has session 13's race that a hoisted read caused).
    fp8_w8a8_from: usize,
    /// The most tokens the W8A8 kernel takes (`GEMV_FP8_W8A8_TO`, 8 or 16: one or two tiles of 8;
    /// default 16). Past it, the W8A8 GEMM (fp8_gemm.rs). H100, FP8 kept, batch-16 steps (session
    /// 34, one call): 35B-A3B 10.51 / 10.48 ms against 11.67 / 11.77 on the GEMM, 27B 17.13
    /// against 18.73. (Session 14 measured the opposite on the H200, 17.75 against 16.2-16.7 ms
    /// for the 27B, before the kernel's activations were read through L1.) Four and eight tiles
    /// (17-64 tokens, session 34) lost to the GEMM: batch 64 21.0 against 20.7 ms (35B-A3B) and
    /// 40.1 against 26.6 (27B).
    fp8_w8a8_to: usize,
    /// One FP8 token takes the deeper-buffered lane kernel (`gemv_fp8_lanes_deep_t1`) for launches
    /// of fewer warps than this many per SM (`GEMV_FP8_DEEP_BELOW`; default 16, the down and output
    /// projections of the 27B shape; 0: never), on a GPU of `sm_count` SMs. H200, 27B FP8 decode
    /// (session 14): 92.0 tok/s against 91.1 without; below 8 / 32 warps 95.2 / 95.0 against 96.6.
    fp8_deep_below: usize,
    /// bf16 launches that would fill fewer blocks than this many per SM take one row a warp
    /// (`gemv_bf16_lanes_narrow_t*`; `GEMV_LANE_NARROW`, default 1; 0: never). The unquantized GDN
    /// gate projections of an FP8 model (2 x 48 rows of 5120) ran as 6 blocks for 15 us on the
    /// H200. 2 also sends a 35B-A3B verify's 2048-row projections (256 blocks of the 4-token
    /// kernel) there: no measurable change on an H100 (docs/benchmarks.md, session 23: MTP k=3
    /// 455.7 against 456.1 tok/s with 2 in one call; the larger differences of earlier calls were
    /// the first bench of a call running slower).
    narrow_blocks_per_sm: usize,
    /// One token over a group of FP8 and bf16 matrices takes one launch (`gemv_mixed_lanes_t1`;
    /// `GEMV_MIXED=0`: one launch per format). H200, 27B FP8 decode (session 14): 100.7 tok/s
    /// against 96.4 with the GDN in_proj_a/b rows launched on their own.
    mixed: bool,
    sm_count: usize,
}

/// What a GEMV launch reads as its activations.
enum GemvInput<'a> {
    /// The f32 activations as they are (one bf16 token, the FP8 lane and tensor-core kernels).
    F32,
    /// Rounded to bf16 once for the group.
    Bf16(CudaSlice<u16>),
    /// Rounded to bf16 by the op that wrote them (the activations' twin, buffer.rs).
    Twin(&'a CudaSlice<u16>),
    /// Quantized to e4m3 per 128 columns (the W8A8 kernel).
    Fp8(Fp8Activations),
    /// The same, written by the op that wrote the activations (buffer.rs).
    Fp8Twin(&'a Fp8Activations),
}

impl GemvInput<'_> {
    /// The quantized activations, whoever made them.
    fn fp8(&self) -> Option<&Fp8Activations> {
        match self {
            GemvInput::Fp8(xq) => Some(xq),
            GemvInput::Fp8Twin(xq) => Some(xq),
            _ => None,
        }
    }
}

impl LaneShape {
    pub(crate) fn from_options(options: &crate::options::CudaOptions, sm_count: usize) -> Self {
        let rows_one_token = options.define("GEMV_LANE_ROWS").unwrap_or(4);
        Self {
            warps: options.define("GEMV_LANE_WARPS").unwrap_or(4),
            rows_one_token,
            fp8_rows_one_token: options.define("GEMV_FP8_ROWS").unwrap_or(rows_one_token),
            rows_more_tokens: options.define("GEMV_LANE_ROWS_MULTI").unwrap_or(2),
            silu_gate: options.define::<u32>("GEMV_SILU_GATE").unwrap_or(1) != 0,
            mma_warps: options.define("GEMV_MMA_WARPS").unwrap_or(4),
            fp8_mma_from: options.define("GEMV_FP8_MMA_FROM").unwrap_or(2),
            fp8_mma_to: (MMA_TILE * options.define("GEMV_FP8_MMA_TILES").unwrap_or(1))
                .clamp(MMA_TILE, MMA_TOKENS),
            rows_to: [
                options.define("GEMV_BF16_TO").unwrap_or(usize::MAX),
                options.define("GEMV_FP8_TO").unwrap_or(usize::MAX),
            ],
            fp8_w8a8_from: options.define("GEMV_FP8_W8A8_FROM").unwrap_or(2),
            fp8_w8a8_to: options
                .define("GEMV_FP8_W8A8_TO")
                .unwrap_or(W8A8_TOKENS)
                .clamp(MMA_TILE, W8A8_TOKENS),
            fp8_deep_below: options.define("GEMV_FP8_DEEP_BELOW").unwrap_or(16),
            narrow_blocks_per_sm: options.define("GEMV_LANE_NARROW").unwrap_or(1),
            mixed: options.define::<u32>("GEMV_MIXED").unwrap_or(1) != 0,
            sm_count,
        }
    }

    /// The token counts the W8A8 kernel takes.
    pub(crate) fn w8a8_tokens(&self) -> std::ops::RangeInclusive<usize> {
        self.fp8_w8a8_from..=self.fp8_w8a8_to
    }

    /// Whether `tokens` rows against matrices of this format take the FP8 tensor-core kernel.
    fn mma(&self, fp8: bool, tokens: usize) -> bool {
        fp8 && (self.fp8_mma_from..=self.fp8_mma_to).contains(&tokens)
    }

    /// The most tokens the GEMV kernels take for this format.
    pub(crate) fn max_tokens(&self, fp8: bool) -> usize {
        let kernels = if !fp8 {
            GEMV_MAX_TOKENS
        } else if self.fp8_mma_from <= LANE_TOKENS + 1 {
            self.fp8_mma_to
        } else {
            LANE_TOKENS
        };
        kernels.min(self.rows_to[usize::from(fp8)])
    }

    /// Rows a block covers for `tokens` tokens.
    fn rows_per_block(&self, fp8: bool, tokens: usize) -> usize {
        self.warps
            * if tokens == 1 && fp8 {
                self.fp8_rows_one_token
            } else if tokens == 1 {
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
    /// or block-FP8 ones whose rows are whole 16-code vectors (`LaneShape::max_tokens` rows).
    pub(crate) fn gemv_applies(&self, ws: &[&CudaMat], tokens: usize) -> bool {
        let Some(first) = ws.first() else {
            return false;
        };
        let k = first.cols;
        let shape = self.gemv_lane_shape;
        let fits = |w: &&CudaMat| w.cols == k && w.rows > 0;
        let bf16 = (1..=shape.max_tokens(false)).contains(&tokens)
            && k % 8 == 0
            && ws
                .iter()
                .all(|w| fits(w) && matches!(w.data, MatData::Bf16(_)));
        let fp8 = ((1..=shape.max_tokens(true)).contains(&tokens) || self.gemv_w8a8(ws, tokens))
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
        let input = self.gemv_input(x, ws, tokens);
        for (chunk_w, chunk_out) in ws.chunks(GEMV_MATRICES).zip(outs.chunks_mut(GEMV_MATRICES)) {
            let mut out_ptrs = Vec::with_capacity(chunk_out.len());
            let mut out_guards = Vec::with_capacity(chunk_out.len());
            for out in chunk_out.iter_mut() {
                let (ptr, guard) = out.data_mut().device_ptr_mut(&self.stream);
                out_ptrs.push(ptr);
                out_guards.push(guard);
            }
            self.launch_gemv(x, &input, chunk_w, &out_ptrs, tokens, false);
            drop(out_guards);
        }
    }

    /// Whether a launch over these bf16 matrices for `tokens` rows (1 to the lane kernels' 4, not
    /// the paired form) takes the narrow lane kernels: with the usual rows a warp it would fill
    /// fewer blocks than `LaneShape::narrow_blocks_per_sm` a SM.
    fn narrow_gemv(&self, ws: &[&CudaMat], tokens: usize, paired: bool) -> bool {
        let shape = self.gemv_lane_shape;
        let rows: usize = ws.iter().map(|w| w.rows).sum();
        !paired
            && (1..=LANE_TOKENS).contains(&tokens)
            && ws.iter().all(|w| matches!(w.data, MatData::Bf16(_)))
            && rows.div_ceil(shape.rows_per_block(false, tokens))
                < shape.narrow_blocks_per_sm * shape.sm_count
    }

    /// Whether one token over these matrices, some block-FP8 and some bf16, can take one launch of
    /// `gemv_mixed_lanes_t1`: one input width of whole 16-code vectors, every matrix a whole
    /// number of warps' rows (so no warp straddles two formats), and enough rows that the FP8
    /// lanes would not take the deep kernel.
    pub(crate) fn mixed_gemv_applies(&self, ws: &[&CudaMat], tokens: usize) -> bool {
        let shape = self.gemv_lane_shape;
        let rows_per_warp = shape.fp8_rows_one_token;
        let Some(first) = ws.first() else {
            return false;
        };
        let k = first.cols;
        let rows: usize = ws.iter().map(|w| w.rows).sum();
        let launch_warps = rows / rows_per_warp;
        shape.mixed
            && tokens == 1
            && ws.len() <= GEMV_MATRICES
            && rows_per_warp == shape.rows_one_token
            && k > 0
            && k % 16 == 0
            && rows < i32::MAX as usize
            && launch_warps >= shape.fp8_deep_below * shape.sm_count
            && ws.iter().all(|w| {
                w.cols == k
                    && w.rows > 0
                    && w.rows.is_multiple_of(rows_per_warp)
                    && matches!(w.data, MatData::Bf16(_) | MatData::Fp8 { .. })
            })
    }

    /// `outs[i] [1, rows_i] = x @ ws[i]^T` over FP8 and bf16 matrices in one launch, the bf16 ones
    /// first (their warps, whose rows are twice the bytes, start in the first blocks); the caller
    /// checked `mixed_gemv_applies` and the buffer lengths.
    pub(crate) fn gemv_mixed_op(&self, x: &CudaBuf, ws: &[&CudaMat], outs: &mut [&mut CudaBuf]) {
        let k = ws[0].cols;
        let mut order: Vec<usize> = (0..ws.len()).collect();
        order.sort_by_key(|&i| matches!(ws[i].data, MatData::Fp8 { .. }));
        let out_ptrs: Vec<_> = outs
            .iter_mut()
            .map(|out| out.data_mut().device_ptr_mut(&self.stream))
            .collect();
        let members = order.iter().map(|&i| (ws[i], out_ptrs[i].0));
        let (group, rows, guards) = self.gemv_group(members);
        let shape = self.gemv_lane_shape;
        let cfg = LaunchConfig {
            grid_dim: (
                rows.div_ceil(shape.warps * shape.fp8_rows_one_token) as u32,
                1,
                1,
            ),
            block_dim: (32 * shape.warps as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (t32, k32) = (1i32, k as i32);
        // Contract: one token; every matrix bf16 or block-FP8 [rows_m, k] with k % 16 == 0 and
        // rows_m a multiple of the kernel's rows a warp, FP8 ones with their 128 x 128 scale grid
        // and bf16 ones with a null scale pointer (mixed_gemv_applies); x holds k f32 values and
        // each out rows_m (checked by the callers); first_row partitions the grid's rows.
        launch!(
            self,
            "gemv_mixed_lanes_t1",
            cfg,
            &group,
            x.data(),
            &t32,
            &k32
        );
        drop(guards);
        drop(out_ptrs);
    }

    /// The kernels' `GemvGroup` over `members` (each matrix with its output pointer, in launch
    /// order), the group's total rows, and the guards that keep the weights' device pointers valid
    /// until the launch is queued.
    fn gemv_group<'a>(
        &'a self,
        members: impl Iterator<Item = (&'a CudaMat, u64)>,
    ) -> (GemvGroup, usize, Vec<cudarc::driver::SyncOnDrop<'a>>) {
        let mut group = GemvGroup::default();
        let mut guards = Vec::new();
        let mut rows = 0usize;
        for (m, (w, out)) in members.enumerate() {
            let (w_ptr, w_guard) = match &w.data {
                MatData::Bf16(data) => data.device_ptr(&self.stream),
                MatData::Fp8 { codes, scales } => {
                    let (scale_ptr, scale_guard) = scales.device_ptr(&self.stream);
                    group.scale[m] = scale_ptr;
                    guards.push(scale_guard);
                    codes.device_ptr(&self.stream)
                }
                MatData::F32(_) => unreachable!("the GEMV paths admit bf16 and fp8 matrices only"),
            };
            guards.push(w_guard);
            group.w[m] = w_ptr;
            group.out[m] = out;
            group.first_row[m] = rows as i32;
            group.count = m as i32 + 1;
            rows += w.rows;
        }
        group.first_row[group.count as usize] = rows as i32;
        (group, rows, guards)
    }

    /// Whether `matmul_silu_gate` can take a paired GEMV kernel: the token counts of the lane
    /// kernels or of the streamed tensor-core kernel, and a gate and an up matrix of one shape and
    /// format.
    pub(crate) fn silu_gate_gemv_applies(
        &self,
        gate: &CudaMat,
        up: &CudaMat,
        tokens: usize,
    ) -> bool {
        let shape = self.gemv_lane_shape;
        let fp8 = matches!(gate.data, MatData::Fp8 { .. });
        shape.silu_gate
            && (tokens <= LANE_TOKENS
                || shape.mma(fp8, tokens)
                || self.gemv_w8a8(&[gate, up], tokens))
            && (gate.rows, gate.cols) == (up.rows, up.cols)
            && self.gemv_applies(&[gate, up], tokens)
    }

    /// `out [tokens, rows] = silu(bf16(x) @ gate^T) * (bf16(x) @ up^T)` in one launch; the caller
    /// checked `silu_gate_gemv_applies` and the buffer lengths.
    pub(crate) fn gemv_silu_gate_op(
        &self,
        x: &CudaBuf,
        gate: &CudaMat,
        up: &CudaMat,
        out: &mut CudaBuf,
        tokens: usize,
    ) {
        let input = self.gemv_input(x, &[gate, up], tokens);
        let (out_ptr, out_guard) = out.data_mut().device_ptr_mut(&self.stream);
        self.launch_gemv(x, &input, &[gate, up], &[out_ptr, out_ptr], tokens, true);
        drop(out_guard);
    }

    /// The activations rounded to bf16 once for a whole group (as the cuBLAS path does; the twin
    /// the op that wrote them left, where there is one, so no cast is launched), except
    /// for the kernels that read the f32 values: the one-token bf16 lane kernel and the FP8
    /// tensor-core kernel round them themselves the same way and so save the cast's launch (with
    /// 2-4 tokens on the CUDA cores the rounding costs more than the launch), and the FP8 lane
    /// kernels multiply them as they are; or quantized to FP8 once for the W8A8 kernel.
    fn gemv_input<'a>(&self, x: &'a CudaBuf, ws: &[&CudaMat], tokens: usize) -> GemvInput<'a> {
        let fp8 = matches!(ws[0].data, MatData::Fp8 { .. });
        let len = tokens * ws[0].cols;
        if self.gemv_w8a8(ws, tokens) {
            match x.fp8_twin(tokens, ws[0].cols) {
                Some(twin) => GemvInput::Fp8Twin(twin),
                None => GemvInput::Fp8(self.quantize_activations_fp8(x, tokens, ws[0].cols)),
            }
        } else if fp8 || tokens == 1 {
            GemvInput::F32
        } else if let Some(twin) = x.bf16_twin(len) {
            GemvInput::Twin(twin)
        } else {
            GemvInput::Bf16(self.cast_to_bf16(x, len))
        }
    }

    /// Whether these FP8 matrices take the W8A8 kernel for `tokens` rows
    /// (`LaneShape::fp8_w8a8_from`).
    fn gemv_w8a8(&self, ws: &[&CudaMat], tokens: usize) -> bool {
        let shape = self.gemv_lane_shape;
        self.compute_capability() >= (8, 9)
            && shape.w8a8_tokens().contains(&tokens)
            && ws[0].cols.is_multiple_of(128)
            && matches!(ws[0].data, MatData::Fp8 { .. })
    }

    /// One GEMV launch over at most `GEMV_MATRICES` matrices writing to `outs`; `paired`: the
    /// silu-gate kernel over `[gate, up]`, whose result goes to `outs[0]`. `input`: what
    /// `gemv_input` made of `x`.
    fn launch_gemv(
        &self,
        x: &CudaBuf,
        input: &GemvInput,
        ws: &[&CudaMat],
        outs: &[u64],
        tokens: usize,
        paired: bool,
    ) {
        let k = ws[0].cols;
        let fp8 = matches!(ws[0].data, MatData::Fp8 { .. });
        let shape = self.gemv_lane_shape;
        let w8a8 = input.fp8().is_some();
        let mma = w8a8 || shape.mma(fp8, tokens);
        let lanes = !mma && tokens <= LANE_TOKENS;
        let (group, rows, guards) = self.gemv_group(ws.iter().copied().zip(outs.iter().copied()));
        let (mut rows_per_block, warps) = if mma {
            (MMA_ROWS_PER_BLOCK, shape.mma_warps)
        } else if lanes {
            (shape.rows_per_block(fp8, tokens), shape.warps)
        } else {
            (ROWS_PER_BLOCK, GEMV_WARPS)
        };
        let narrow = lanes && self.narrow_gemv(ws, tokens, paired);
        debug_assert!(
            fp8 || tokens == 1 || narrow || !matches!(input, GemvInput::F32),
            "gemv_input gave f32 activations to a bf16 kernel that reads them rounded"
        );
        if narrow {
            rows_per_block = warps;
        }
        // A paired warp covers half as many gate rows as it holds rows.
        let (grid_rows, grid_rows_per_block) = if paired {
            (ws[0].rows, rows_per_block / 2)
        } else {
            (rows, rows_per_block)
        };
        let cfg = LaunchConfig {
            grid_dim: (grid_rows.div_ceil(grid_rows_per_block) as u32, 1, 1),
            block_dim: (32 * warps as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (t32, k32) = (tokens as i32, k as i32);
        // Contract: every matrix is bf16 [rows_m, k] with k % 8 == 0, or block-FP8 codes
        // [rows_m, k] with k % 16 == 0 and their 128 x 128 scale grid (gemv_applies), so each
        // row starts 16-byte aligned (and each x_bf16 or f32 x row too); tokens <=
        // GEMV_MAX_TOKENS (LANE_TOKENS for FP8 and paired; W8A8_TOKENS for the W8A8 kernel); x
        // (f32 for one token and for FP8, x_bf16 otherwise) holds tokens * k values and each out
        // tokens * rows_m f32 (checked by the callers); first_row partitions the grid's rows among
        // the matrices; a paired group is a gate and an up matrix of one shape
        // (silu_gate_gemv_applies). The W8A8 kernel's quantized input holds `rows` >= 16 >= tokens
        // rows (zero past `tokens`) of k codes, k % 128 == 0, and k / 128 x rows scales
        // (gemv_w8a8, quantize_activations_fp8).
        let launch_warps = cfg.grid_dim.0 as usize * warps;
        let deep =
            lanes && fp8 && tokens == 1 && launch_warps < shape.fp8_deep_below * shape.sm_count;
        let kernel = match (mma, fp8, paired, tokens) {
            _ if narrow && tokens == 1 => "gemv_bf16_lanes_narrow_t1",
            _ if narrow && tokens == 2 => "gemv_bf16_lanes_narrow_t2",
            _ if narrow && tokens == 3 => "gemv_bf16_lanes_narrow_t3",
            _ if narrow => "gemv_bf16_lanes_narrow_t4",
            _ if deep && paired => "gemv_fp8_lanes_deep_silu_gate_t1",
            _ if deep => "gemv_fp8_lanes_deep_t1",
            _ if w8a8 && paired && tokens <= MMA_TILE => "gemv_fp8_w8a8_silu_gate_t1",
            _ if w8a8 && paired => "gemv_fp8_w8a8_silu_gate_t2",
            _ if w8a8 && tokens <= MMA_TILE => "gemv_fp8_w8a8_t1",
            _ if w8a8 => "gemv_fp8_w8a8_t2",
            (true, _, false, 1..=8) => "gemv_fp8_mma_t1",
            (true, _, false, 9..=16) => "gemv_fp8_mma_t2",
            (true, _, false, 17..=24) => "gemv_fp8_mma_t3",
            (true, _, false, _) => "gemv_fp8_mma_t4",
            (true, _, true, 1..=8) => "gemv_fp8_mma_silu_gate_t1",
            (true, _, true, 9..=16) => "gemv_fp8_mma_silu_gate_t2",
            (true, _, true, 17..=24) => "gemv_fp8_mma_silu_gate_t3",
            (true, _, true, _) => "gemv_fp8_mma_silu_gate_t4",
            (false, true, false, 1) => "gemv_fp8_lanes_t1",
            (false, true, false, 2) => "gemv_fp8_lanes_t2",
            (false, true, false, 3) => "gemv_fp8_lanes_t3",
            (false, true, false, _) => "gemv_fp8_lanes_t4",
            (false, true, true, 1) => "gemv_fp8_lanes_silu_gate_t1",
            (false, true, true, 2) => "gemv_fp8_lanes_silu_gate_t2",
            (false, true, true, 3) => "gemv_fp8_lanes_silu_gate_t3",
            (false, true, true, _) => "gemv_fp8_lanes_silu_gate_t4",
            (false, false, false, 1) => "gemv_bf16_lanes_t1",
            (false, false, false, 2) => "gemv_bf16_lanes_t2",
            (false, false, false, 3) => "gemv_bf16_lanes_t3",
            (false, false, false, 4) => "gemv_bf16_lanes_t4",
            (false, false, false, _) => "gemv_bf16_t1",
            (false, false, true, 1) => "gemv_bf16_lanes_silu_gate_t1",
            (false, false, true, 2) => "gemv_bf16_lanes_silu_gate_t2",
            (false, false, true, 3) => "gemv_bf16_lanes_silu_gate_t3",
            (false, false, true, _) => "gemv_bf16_lanes_silu_gate_t4",
        };
        match input {
            GemvInput::Bf16(xb) => launch!(self, kernel, cfg, &group, xb, &t32, &k32),
            GemvInput::Twin(xb) => launch!(self, kernel, cfg, &group, *xb, &t32, &k32),
            GemvInput::F32 => launch!(self, kernel, cfg, &group, x.data(), &t32, &k32),
            GemvInput::Fp8(_) | GemvInput::Fp8Twin(_) => {
                let xq = input.fp8().expect("an FP8 input");
                let rows32 = xq.rows as i32;
                launch!(self, kernel, cfg, &group, &xq.codes, &xq.scales, &rows32, &t32, &k32)
            }
        }
        drop(guards);
    }
}
