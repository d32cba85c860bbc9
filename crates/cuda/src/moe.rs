//! The routed experts of a MoE block on the device (moe.cu): routing, grouping by expert, the
//! gate/up and down projections of every chosen expert in one launch each, and the weighted combine
//! with the shared expert; no host round trip, so a MoE decode step can be captured in a graph.
//! Expert weights are stacked at load (`ExpertWeights::Stacked`) so each kernel finds an expert's
//! rows at a fixed stride: bf16, or block-FP8 codes and scales where the checkpoint (or
//! `--quantization fp8`) gives them and FP8 weights are kept (`Fp8Stack`). f32 GEMMs
//! (`--cuda-matmul-precision f32`) and shapes the kernels do not take keep one matrix per expert and
//! the generic path.

use crate::backend::{launch, CudaBackend};
use crate::buffer::CudaBuf;
use crate::launcher::{KernelArg, ValueArg};
use crate::mat::{CudaMat, MatData, FP8_BLOCK};
use crate::options::GemmPrecision;
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig};
use deltaserve_tensor::dtype::f32_to_bf16;
use deltaserve_tensor::moe::{load_per_expert, moe_per_expert, shared_expert_output};
use deltaserve_tensor::Backend;
use deltaserve_tensor::{
    BlockFp8Matrix, DType, ExpertShape, ExpertTensors, ExpertWeights, Experts, GeneratedMatrix,
    HostTensor, MoeRouting, SharedExpert, TensorError,
};

/// `MOE_MAX_EXPERTS` and `MOE_WARPS` of moe.cu.
const MAX_EXPERTS: usize = 512;
const WARPS: u32 = 8;

/// The grouped kernels for `tokens`, and their work-block size (8 slots per token tile). A decode
/// batch puts a few slots on each expert, so one tile keeps the registers (and the blocks in
/// flight per SM) of a one-tile kernel; a prefill puts tens on each, and wider blocks read each
/// expert fewer times. A slot's result does not depend on the choice (see moe_tile).
/// Measured on the H200 (35B-A3B shape): one tile made a batch-16 step 14.8 ms instead of 17.2;
/// eight tiles (64-slot blocks) made a 2048-token prefill slower than four (6,568 vs 8,129 tok/s).
fn grouped_kernels(tokens: usize, fp8: bool) -> (&'static str, &'static str, usize) {
    match (tokens <= 64, fp8) {
        (true, false) => ("moe_gate_up_t1", "moe_down_t1", 8),
        (true, true) => ("moe_gate_up_fp8_t1", "moe_down_fp8_t1", 8),
        (false, false) => ("moe_gate_up_t4", "moe_down_t4", 32),
        (false, true) => ("moe_gate_up_fp8_t4", "moe_down_fp8_t4", 32),
    }
}
/// Output rows of one tile of the grouped gate/up and down kernels (one 16-row mma tile).
const TILE_ROWS: usize = 16;

/// moe.cu's default `MOE_TILE_K_WARPS`: warps that share one 16-row tile's K.
const TILE_K_WARPS: u32 = 2;

/// Output rows a block of the grouped kernels: `MOE_WARPS / MOE_TILE_K_WARPS` tiles (moe.cu; by
/// default two warps share one tile's K, so a block holds 4 tiles), read from the same defines as
/// the kernels so the grid matches them.
pub(crate) fn grouped_rows_per_block(options: &crate::options::CudaOptions) -> usize {
    let k_warps = options
        .define::<u32>("MOE_TILE_K_WARPS")
        .unwrap_or(TILE_K_WARPS);
    if k_warps == 0 || !WARPS.is_multiple_of(k_warps) {
        panic!("MOE_TILE_K_WARPS={k_warps}: it must divide moe.cu's {WARPS} warps a block");
    }
    TILE_ROWS * (WARPS / k_warps) as usize
}
/// The by-slot kernels' block shapes: `moe_gate_up_slots`' `MOE_LANE_WARPS` warps of
/// `MOE_LANE_ROWS` (gate, up) row pairs each (moe.cu's defaults unless `CudaOptions::defines` sets
/// them, read from the same defines so the grids match the kernel), and the output rows a block of
/// `moe_down_combine_r*` for one token and for 2-4 (`MOE_DOWN_ROWS_ONE_TOKEN`,
/// `MOE_DOWN_ROWS_MULTI`: 2, 4, 8 or 16, the kernels there are; a row's value is the same at
/// each). One token's grid is a quarter of four tokens', so it takes fewer rows a block to have
/// blocks enough.
/// Measured on an H100 (35B-A3B shape, docs/benchmarks.md, session 23): rows a block 4 / 8 / 16
/// gave one-token decode 272.3 / 265.9 / 267.2 tok/s and MTP k=3 449.9 / 453.3 / 454.2.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SlotShape {
    lane_warps: u32,
    lane_rows_per_block: usize,
    down_one_token: DownKernel,
    down_multi: DownKernel,
}

/// One of the `moe_down_combine_r*` kernels: its output rows a block and name, and the FP8 kernel
/// (`moe_down_combine_fp8_r*`) with its rows a block that stands in for it.
#[derive(Clone, Copy, Debug)]
struct DownKernel {
    rows: usize,
    bf16: &'static str,
    fp8: (&'static str, usize),
}

/// The rows a block that `moe_down_combine_r*` comes in. The FP8 kernels stop at 8: with 16 rows
/// a lane holds 16 code vectors and their 256 widened values, more than the 128 registers a thread
/// of a 512-thread block may have (ptxas, sm_90: 164 bytes spilled), so 16 takes the 8-row one.
const DOWN_KERNELS: [DownKernel; 4] = [
    DownKernel {
        rows: 2,
        bf16: "moe_down_combine_r2",
        fp8: ("moe_down_combine_fp8_r2", 2),
    },
    DownKernel {
        rows: 4,
        bf16: "moe_down_combine_r4",
        fp8: ("moe_down_combine_fp8_r4", 4),
    },
    DownKernel {
        rows: 8,
        bf16: "moe_down_combine_r8",
        fp8: ("moe_down_combine_fp8_r8", 8),
    },
    DownKernel {
        rows: 16,
        bf16: "moe_down_combine_r16",
        fp8: ("moe_down_combine_fp8_r8", 8),
    },
];

impl SlotShape {
    pub(crate) fn from_options(options: &crate::options::CudaOptions) -> Self {
        let lane_warps = options.define("MOE_LANE_WARPS").unwrap_or(4);
        let down_kernel = |name: &str, default: usize| {
            let rows = options.define::<usize>(name).unwrap_or(default);
            let kernel = DOWN_KERNELS.iter().find(|k| k.rows == rows);
            *kernel.unwrap_or_else(|| {
                let offered: Vec<usize> = DOWN_KERNELS.iter().map(|k| k.rows).collect();
                panic!("{name}={rows}: moe.cu has down kernels for {offered:?} rows a block")
            })
        };
        Self {
            lane_warps,
            lane_rows_per_block: lane_warps as usize * options.define("MOE_LANE_ROWS").unwrap_or(1),
            down_one_token: down_kernel("MOE_DOWN_ROWS_ONE_TOKEN", 4),
            down_multi: down_kernel("MOE_DOWN_ROWS_MULTI", 16),
        }
    }

    /// The `moe_down_combine_r*` kernel (or its FP8 twin) for `tokens`, and its rows a block.
    fn down_kernel(&self, tokens: usize, fp8: bool) -> (&'static str, usize) {
        let kernel = if tokens == 1 {
            self.down_one_token
        } else {
            self.down_multi
        };
        if fp8 {
            kernel.fp8
        } else {
            (kernel.bf16, kernel.rows)
        }
    }
}

/// Warps a block of `moe_down_combine_r*` has at most (one a rank; its launch bounds: 512 threads).
const DOWN_MAX_WARPS: usize = 16;
/// Up to this many tokens the by-slot kernels run (each slot reads its expert; with more tokens
/// the experts repeat and grouping them on the tensor cores reads less); beyond, the grouped path.
/// A token's result is bit for bit the same at every batch size within each of the two ranges.
const SLOT_PATH_MAX_TOKENS: usize = 4;
/// Tokens routed per block of `moe_route` (`MOE_ROUTE_WARPS`: one warp each).
const ROUTE_TOKENS_PER_BLOCK: usize = 4;
/// The most experts `moe_route_256` ranks.
const ROUTE_NARROW_EXPERTS: usize = 256;

/// Whether the fused kernels can run these experts: bf16 GEMMs, rows of whole 16-byte vectors,
/// few enough experts for the routing kernel's registers.
fn fused_applies(precision: GemmPrecision, shape: ExpertShape) -> bool {
    precision == GemmPrecision::Bf16
        && (1..=MAX_EXPERTS).contains(&shape.experts)
        && shape.hidden.is_multiple_of(8)
        && shape.intermediate.is_multiple_of(8)
        && shape.hidden > 0
        && shape.intermediate > 0
        && shape.experts * 2 * shape.intermediate * shape.hidden < i32::MAX as usize
}

/// Whether the FP8 kernels can run these experts as block-FP8 codes: the bf16 kernels' conditions,
/// and an intermediate and hidden size of whole 128 x 128 blocks, so that every scale block lies
/// inside one expert's gate, up or down matrix (true of every released checkpoint).
fn fp8_fused_applies(precision: GemmPrecision, shape: ExpertShape) -> bool {
    fused_applies(precision, shape)
        && shape.hidden.is_multiple_of(FP8_BLOCK[1])
        && shape.intermediate.is_multiple_of(FP8_BLOCK[0])
}

/// The bf16 bits of a host tensor (bf16 as stored, anything else rounded to nearest even).
fn bf16_bits(t: &HostTensor) -> Vec<u16> {
    match t.dtype {
        DType::BF16 => t
            .bytes()
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect(),
        _ => t.to_f32_vec().into_iter().map(f32_to_bf16).collect(),
    }
}

impl CudaBackend {
    pub(crate) fn load_experts_op(
        &self,
        experts: &[ExpertTensors],
        shape: ExpertShape,
    ) -> Result<Experts<CudaMat>, TensorError> {
        if !fused_applies(self.gemm_precision, shape) || experts.len() != shape.experts {
            return load_per_expert(self, experts, shape);
        }
        if self.keep_fp8_weights && fp8_fused_applies(self.gemm_precision, shape) {
            if let Some(stack) = Fp8Stack::of(experts, shape)? {
                return self.upload_fp8_stack(stack, shape);
            }
        }
        let ExpertShape {
            experts: e,
            intermediate: im,
            hidden: h,
        } = shape;
        let mut gate_up: CudaSlice<u16> =
            self.alloc_for_overwrite("stacked experts", e * 2 * im * h);
        let mut down: CudaSlice<u16> = self.alloc_for_overwrite("stacked experts", e * h * im);
        for (i, t) in experts.iter().enumerate() {
            for (part, (tensor, rows)) in [(&t.gate, im), (&t.up, im)].into_iter().enumerate() {
                tensor.expect_shape(&[rows, h])?;
                let start = (i * 2 + part) * im * h;
                self.copy_into(&mut gate_up, start, &bf16_bits(tensor), &tensor.name)?;
            }
            t.down.expect_shape(&[h, im])?;
            self.copy_into(&mut down, i * h * im, &bf16_bits(&t.down), &t.down.name)?;
        }
        Ok(Experts {
            shape,
            weights: ExpertWeights::Stacked {
                gate_up: CudaMat {
                    rows: e * 2 * im,
                    cols: h,
                    data: MatData::Bf16(gate_up),
                },
                down: CudaMat {
                    rows: e * h,
                    cols: im,
                    data: MatData::Bf16(down),
                },
            },
        })
    }

    /// Stacked block-FP8 experts on the device (the kernels' `Fp8Stack` layout).
    fn upload_fp8_stack(
        &self,
        stack: Fp8Stack,
        shape: ExpertShape,
    ) -> Result<Experts<CudaMat>, TensorError> {
        let ExpertShape {
            experts: e,
            intermediate: im,
            hidden: h,
        } = shape;
        let upload_codes = |codes: &[u8]| {
            self.stream
                .clone_htod(codes)
                .map_err(|err| stack.device_error(err))
        };
        let upload_scales = |scales: &[f32]| {
            self.stream
                .clone_htod(scales)
                .map_err(|err| stack.device_error(err))
        };
        let gate_up = CudaMat {
            rows: e * 2 * im,
            cols: h,
            data: MatData::Fp8 {
                codes: upload_codes(&stack.gate_up_codes)?,
                scales: upload_scales(&stack.gate_up_scales)?,
            },
        };
        let down = CudaMat {
            rows: e * h,
            cols: im,
            data: MatData::Fp8 {
                codes: upload_codes(&stack.down_codes)?,
                scales: upload_scales(&stack.down_scales)?,
            },
        };
        Ok(Experts {
            shape,
            weights: ExpertWeights::Stacked { gate_up, down },
        })
    }

    fn copy_into(
        &self,
        dst: &mut CudaSlice<u16>,
        start: usize,
        bits: &[u16],
        name: &str,
    ) -> Result<(), TensorError> {
        let mut view = dst.slice_mut(start..start + bits.len());
        self.stream
            .memcpy_htod(bits, &mut view)
            .map_err(|e| TensorError::Invalid {
                name: name.to_string(),
                message: format!("could not copy the expert to the GPU: {e:?}"),
            })
    }

    pub(crate) fn generate_experts_op(
        &self,
        gate_up: &GeneratedMatrix,
        down: &GeneratedMatrix,
        shape: ExpertShape,
    ) -> Option<Result<Experts<CudaMat>, TensorError>> {
        if !fused_applies(self.gemm_precision, shape) {
            return None;
        }
        // FP8 codes the kernels cannot read as such (blocks across the gate/up boundary) are
        // widened to the bf16 bits the host path would upload.
        let fp8_readable = fp8_fused_applies(self.gemm_precision, shape);
        let generate = |spec: &GeneratedMatrix| -> Result<CudaMat, TensorError> {
            let mat = self.generate_mat_op(spec)?;
            Ok(match mat.data {
                MatData::Fp8 { codes, scales } if !fp8_readable => CudaMat {
                    data: MatData::Bf16(
                        self.dequantize_block_fp8(&codes, &scales, mat.rows, mat.cols),
                    ),
                    ..mat
                },
                _ => mat,
            })
        };
        let stacked = || -> Result<Experts<CudaMat>, TensorError> {
            Ok(Experts {
                shape,
                weights: ExpertWeights::Stacked {
                    gate_up: generate(gate_up)?,
                    down: generate(down)?,
                },
            })
        };
        Some(stacked())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_experts_op(
        &self,
        x: &CudaBuf,
        router_logits: &CudaBuf,
        experts: &Experts<CudaMat>,
        routing: MoeRouting,
        tokens: usize,
        shared: Option<SharedExpert<'_, CudaMat, CudaBuf>>,
    ) -> CudaBuf {
        let ExpertWeights::Stacked { gate_up, down } = &experts.weights else {
            return moe_per_expert(self, x, router_logits, experts, routing, tokens, shared);
        };
        let ExpertShape {
            experts: e,
            intermediate: im,
            hidden: h,
        } = experts.shape;
        let k = routing.top_k;
        assert!(
            (1..=e).contains(&k),
            "moe: top_k {k} must be between 1 and the {e} experts"
        );
        assert!(
            x.len >= tokens * h && router_logits.len >= tokens * e,
            "moe: x {} / router logits {} too short for {tokens} tokens",
            x.len,
            router_logits.len
        );
        if let Some(s) = &shared {
            assert!(
                s.gate_logits.len >= tokens,
                "moe: shared expert gate logits {} too short for {tokens} tokens",
                s.gate_logits.len
            );
        }
        let weights = match (&gate_up.data, &down.data) {
            (MatData::Bf16(gate_up), MatData::Bf16(down)) => StackedWeights::Bf16 { gate_up, down },
            (
                MatData::Fp8 {
                    codes: gate_up,
                    scales: gate_up_scales,
                },
                MatData::Fp8 {
                    codes: down,
                    scales: down_scales,
                },
            ) => StackedWeights::Fp8 {
                gate_up,
                gate_up_scales,
                down,
                down_scales,
            },
            _ => unreachable!(
                "stacked experts are bf16 or block-FP8 alike (load_experts_op, generate_experts_op)"
            ),
        };
        if tokens == 0 {
            return self.scratch(0);
        }
        let routes = self.moe_route(router_logits, tokens, e, routing);
        let fp8 = weights.is_fp8();
        let stacked = Stacked { weights, e, im, h };
        let fused_shared = match &shared {
            None => Some(None),
            Some(s) => SharedMats::of(s, h, fp8).map(Some),
        };
        match fused_shared {
            Some(fused) if tokens <= SLOT_PATH_MAX_TOKENS => {
                self.moe_slots(x, &stacked, &routes, fused)
            }
            _ if tokens <= SLOT_PATH_MAX_TOKENS => {
                // A shared expert the slot kernels cannot read (f32, or rows not whole vectors):
                // the routed experts fused, the shared one through the dense ops.
                let mut out = self.moe_slots(x, &stacked, &routes, None);
                if let Some(s) = &shared {
                    let mut y = shared_expert_output(self, x, s, tokens);
                    self.sigmoid_scale_rows_op(&mut y, s.gate_logits, h);
                    self.add_inplace_op(&mut out, &y);
                }
                out
            }
            _ => {
                let shared_out = shared
                    .as_ref()
                    .map(|s| (shared_expert_output(self, x, s, tokens), s.gate_logits));
                self.moe_grouped(x, &stacked, &routes, shared_out)
            }
        }
    }

    /// `moe_route` / `moe_route_256`: the top-k expert ids and weights of every token.
    fn moe_route(
        &self,
        router_logits: &CudaBuf,
        tokens: usize,
        experts: usize,
        routing: MoeRouting,
    ) -> Routes {
        let slots = tokens * routing.top_k;
        // Every id and weight is written by moe_route.
        let mut ids: CudaSlice<i32> = self.alloc_for_overwrite("moe expert ids", slots);
        let mut weights: CudaSlice<f32> = self.alloc_for_overwrite("moe weights", slots);
        let (t32, e32, k32) = (tokens as i32, experts as i32, routing.top_k as i32);
        let renormalize = i32::from(routing.renormalize);
        let cfg = LaunchConfig {
            grid_dim: (tokens.div_ceil(ROUTE_TOKENS_PER_BLOCK) as u32, 1, 1),
            block_dim: (32 * ROUTE_TOKENS_PER_BLOCK as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // Contract: logits hold tokens x experts (checked by the caller), 1 <= k <= experts <=
        // MAX_EXPERTS (checked, fused_applies), ids and weights hold tokens x k.
        // Up to 256 experts (Qwen3.5/3.6 MoE) a lane holds 8 logits instead of 16.
        let kernel = if experts <= ROUTE_NARROW_EXPERTS {
            "moe_route_256"
        } else {
            "moe_route"
        };
        launch!(
            self,
            kernel,
            cfg,
            router_logits.data(),
            &t32,
            &e32,
            &k32,
            &renormalize,
            &mut ids,
            &mut weights
        );
        Routes {
            ids,
            weights,
            k: routing.top_k,
            tokens,
        }
    }

    /// The by-slot path for a few tokens: each (token, rank) slot, the shared expert as rank k,
    /// runs its gate/up rows; then each token its down rows, combined in rank order.
    fn moe_slots(
        &self,
        x: &CudaBuf,
        w: &Stacked<'_>,
        routes: &Routes,
        shared: Option<SharedMats>,
    ) -> CudaBuf {
        let Routes {
            ids,
            weights,
            k,
            tokens,
        } = routes;
        let (k, tokens) = (*k, *tokens);
        let ranks = k + usize::from(shared.is_some());
        let ims = shared.as_ref().map_or(0, |s| s.ims);
        let act_stride = w.im.max(ims);
        let slots = tokens * ranks;
        let shape = self.moe_slot_shape;
        // Each act row's first `rows` of its rank are written by the blocks of its slot, and only
        // those are read.
        let mut act: CudaSlice<u16> =
            self.alloc_for_overwrite("moe activations", slots * act_stride);
        let mut out = CudaBuf::new(
            self.alloc_for_overwrite("moe output", tokens * w.h),
            tokens * w.h,
        );
        let fp8 = w.weights.is_fp8();
        let params = shared.map_or_else(MoeShared::default, |s| s.params);
        let (im32, h32, k32, ranks32, stride32) = (
            w.im as i32,
            w.h as i32,
            k as i32,
            ranks as i32,
            act_stride as i32,
        );
        let gate_up_cfg = LaunchConfig {
            grid_dim: (
                act_stride.div_ceil(shape.lane_rows_per_block) as u32,
                slots as u32,
                1,
            ),
            block_dim: (32 * shape.lane_warps, 1, 1),
            shared_mem_bytes: 0,
        };
        let gate_up_kernel = if fp8 {
            "moe_gate_up_slots_fp8"
        } else {
            "moe_gate_up_slots"
        };
        let mut args = w.weights.gate_up_args();
        args.extend([
            &im32 as &dyn KernelArg,
            &h32,
            x.data(),
            &k32,
            &ranks32,
            ids,
            &params,
            &mut act,
            &stride32,
        ]);
        // Contract: gate_up is e x 2im x h bf16, or FP8 codes with their scale grid, with h % 8 ==
        // 0 (fused_applies; FP8: im and h % 128 == 0, fp8_fused_applies), the shared expert's
        // gate/up ims x h and down h x ims in the same format with ims % 8 == 0 (FP8: % 128,
        // SharedMats::of); x holds tokens x h f32 (checked), ids tokens x k experts < e
        // (moe_route), act slots x act_stride.
        launch!(self, gate_up_kernel, gate_up_cfg; &args);
        let (down_kernel, down_rows) = shape.down_kernel(tokens, fp8);
        let down_cfg = LaunchConfig {
            grid_dim: (w.h.div_ceil(down_rows) as u32, tokens as u32, 1),
            block_dim: (32 * ranks.min(DOWN_MAX_WARPS) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args = w.weights.down_args();
        args.extend([
            &h32 as &dyn KernelArg,
            &im32,
            &act,
            &stride32,
            &k32,
            &ranks32,
            ids,
            weights,
            &params,
            out.data_mut(),
        ]);
        // Contract: down is e x h x im bf16 with im % 8 == 0 (FP8: codes and scale grid, im and h
        // % 128 == 0); act, ids, weights as written above; the shared gate logits hold tokens
        // values (checked); out tokens x h.
        launch!(self, down_kernel, down_cfg; &args);
        out
    }

    /// The grouped path for many tokens: slots grouped by expert, each expert's work blocks on the
    /// tensor cores, then the weighted combine with the shared expert's output.
    fn moe_grouped(
        &self,
        x: &CudaBuf,
        w: &Stacked<'_>,
        routes: &Routes,
        shared: Option<(CudaBuf, &CudaBuf)>,
    ) -> CudaBuf {
        let Routes {
            ids,
            weights,
            k,
            tokens,
        } = routes;
        let (k, tokens) = (*k, *tokens);
        let slots = tokens * k;
        let (t32, e32, k32, h32, im32) =
            (tokens as i32, w.e as i32, k as i32, w.h as i32, w.im as i32);
        let fp8 = w.weights.is_fp8();
        let (gate_up_kernel, down_kernel, block_rows) = grouped_kernels(tokens, fp8);
        // Most work blocks there can be: each expert's slots split into blocks of block_rows.
        let max_blocks = (slots / block_rows + w.e.min(slots)).min(slots);
        let slots32 = slots as i32;
        // Every sorted entry and used block is written by moe_plan, every act and y row of a slot
        // by the block that holds it.
        let mut sorted: CudaSlice<i32> = self.alloc_for_overwrite("moe slot order", slots);
        let mut blocks: CudaSlice<i32> =
            self.alloc_for_overwrite("moe work blocks", 4 * max_blocks);
        let mut block_count: CudaSlice<i32> = self.alloc_for_overwrite("moe block count", 1);
        let mut act: CudaSlice<u16> = self.alloc_for_overwrite("moe activations", slots * w.im);
        let mut y: CudaSlice<f32> = self.alloc_for_overwrite("moe expert outputs", slots * w.h);
        let mut out = CudaBuf::new(
            self.alloc_for_overwrite("moe output", tokens * w.h),
            tokens * w.h,
        );
        let plan_cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let block_rows = block_rows as i32;
        // Contract: ids hold slots values < e <= 1024 (one thread per expert); sorted holds
        // slots, blocks 4 x max_blocks ints (the most the plan can use, see above).
        launch!(
            self,
            "moe_plan",
            plan_cfg,
            ids,
            &slots32,
            &e32,
            &block_rows,
            &mut sorted,
            &mut blocks,
            &mut block_count
        );
        let x_bf16 = self.cast_to_bf16(x, tokens * w.h);
        let gemm_cfg = |rows: usize| LaunchConfig {
            grid_dim: (
                rows.div_ceil(self.moe_grouped_rows) as u32,
                max_blocks as u32,
                1,
            ),
            block_dim: (32 * WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args = w.weights.gate_up_args();
        args.extend([
            &im32 as &dyn KernelArg,
            &h32,
            &x_bf16,
            &k32,
            &sorted,
            &block_count,
            &blocks,
            &mut act,
        ]);
        // Contract: gate_up is e x 2im x h bf16 (FP8: codes and scale grid, im and h % 128 == 0)
        // and x_bf16 tokens x h with h % 8 == 0 (fused_applies: 16-byte aligned rows);
        // sorted/blocks/block_count as moe_plan left them (every slot < tokens x k, at most
        // block_rows per block: the kernel's 8 x TILES); act holds slots x im.
        launch!(self, gate_up_kernel, gemm_cfg(w.im); &args);
        let mut args = w.weights.down_args();
        args.extend([
            &h32 as &dyn KernelArg,
            &im32,
            &act,
            &sorted,
            &block_count,
            &blocks,
            &mut y,
        ]);
        // Contract: down is e x h x im bf16 (FP8: codes and scale grid), im % 8 == 0; act as
        // written above; y slots x h.
        launch!(self, down_kernel, gemm_cfg(w.h); &args);
        let null: u64 = 0;
        let (shared_out, gate_logits): (&dyn KernelArg, &dyn KernelArg) = match &shared {
            Some((shared_out, gate_logits)) => (shared_out.data(), gate_logits.data()),
            None => (&null, &null),
        };
        // Contract: y holds slots x h, weights slots; the shared output tokens x h (computed here)
        // and its gate logits tokens values (checked), or two null pointers; out tokens x h.
        launch!(
            self,
            "moe_combine",
            Self::elementwise_config(tokens * w.h),
            &y,
            weights,
            &t32,
            &k32,
            &h32,
            shared_out,
            gate_logits,
            out.data_mut()
        );
        out
    }
}

/// What `moe_route` chose: `ids` and `weights [tokens, k]`, rank order.
struct Routes {
    ids: CudaSlice<i32>,
    weights: CudaSlice<f32>,
    k: usize,
    tokens: usize,
}

/// The stacked experts' device data and geometry.
struct Stacked<'a> {
    weights: StackedWeights<'a>,
    e: usize,
    im: usize,
    h: usize,
}

/// The stacked expert matrices as the kernels take them: `gate_up [E * 2 * im, h]` and `down
/// [E * h, im]`, bf16 or block-FP8 codes with their 128 x 128 scale grids.
enum StackedWeights<'a> {
    Bf16 {
        gate_up: &'a CudaSlice<u16>,
        down: &'a CudaSlice<u16>,
    },
    Fp8 {
        gate_up: &'a CudaSlice<u8>,
        gate_up_scales: &'a CudaSlice<f32>,
        down: &'a CudaSlice<u8>,
        down_scales: &'a CudaSlice<f32>,
    },
}

impl StackedWeights<'_> {
    fn is_fp8(&self) -> bool {
        matches!(self, Self::Fp8 { .. })
    }

    /// The gate/up kernels' leading arguments: the matrix (and its scales).
    fn gate_up_args(&self) -> Vec<&dyn KernelArg> {
        match self {
            Self::Bf16 { gate_up, .. } => vec![*gate_up],
            Self::Fp8 {
                gate_up,
                gate_up_scales,
                ..
            } => vec![*gate_up, *gate_up_scales],
        }
    }

    /// The down kernels' leading arguments.
    fn down_args(&self) -> Vec<&dyn KernelArg> {
        match self {
            Self::Bf16 { down, .. } => vec![*down],
            Self::Fp8 {
                down, down_scales, ..
            } => vec![*down, *down_scales],
        }
    }
}

/// Block-FP8 experts stacked on the host as `StackedWeights::Fp8` lays them out: each expert's gate
/// then up codes, its down codes, and their scale grids in the same order (with im and h whole
/// blocks, an expert's grids are rows of the stacked grids).
struct Fp8Stack {
    gate_up_codes: Vec<u8>,
    gate_up_scales: Vec<f32>,
    down_codes: Vec<u8>,
    down_scales: Vec<f32>,
    /// The first expert tensor's name, for errors.
    name: String,
}

impl Fp8Stack {
    /// The stack of `experts` when every matrix carries its block-FP8 form in 128 x 128 blocks;
    /// `None` when one does not (the experts then load as bf16). A shape mismatch is an error.
    fn of(experts: &[ExpertTensors], shape: ExpertShape) -> Result<Option<Self>, TensorError> {
        let ExpertShape {
            intermediate: im,
            hidden: h,
            ..
        } = shape;
        fn fp8(
            t: &HostTensor,
            rows: usize,
            cols: usize,
        ) -> Result<Option<&BlockFp8Matrix>, TensorError> {
            t.expect_shape(&[rows, cols])?;
            Ok(t.block_fp8()
                .filter(|m| m.block == FP8_BLOCK && m.codes.len() == rows * cols))
        }
        let mut stack = Self {
            gate_up_codes: Vec::with_capacity(experts.len() * 2 * im * h),
            gate_up_scales: Vec::new(),
            down_codes: Vec::with_capacity(experts.len() * h * im),
            down_scales: Vec::new(),
            name: experts
                .first()
                .map_or_else(String::new, |t| t.gate.name.clone()),
        };
        for t in experts {
            let (Some(gate), Some(up), Some(down)) = (
                fp8(&t.gate, im, h)?,
                fp8(&t.up, im, h)?,
                fp8(&t.down, h, im)?,
            ) else {
                return Ok(None);
            };
            for m in [gate, up] {
                stack.gate_up_codes.extend_from_slice(&m.codes);
                stack.gate_up_scales.extend_from_slice(&m.scales);
            }
            stack.down_codes.extend_from_slice(&down.codes);
            stack.down_scales.extend_from_slice(&down.scales);
        }
        Ok(Some(stack))
    }

    fn device_error(&self, e: cudarc::driver::DriverError) -> TensorError {
        TensorError::Invalid {
            name: self.name.clone(),
            message: format!("could not copy the FP8 experts to the GPU: {e:?}"),
        }
    }
}

/// `MoeShared` of moe.cu, field for field: the shared expert in the routed experts' format (scale
/// grids null for bf16).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct MoeShared {
    gate: u64,
    up: u64,
    down: u64,
    gate_scales: u64,
    up_scales: u64,
    down_scales: u64,
    gate_logits: u64,
    ims: i32,
}

// SAFETY: `MoeShared` is `repr(C)` with the field types and order of the CUDA struct (seven 8-byte
// pointers, then a 32-bit int; both sides pad to 64 bytes), so its bytes are what the kernel
// expects as a by-value parameter.
unsafe impl ValueArg for MoeShared {}

/// The shared expert as the slot kernels read it (raw device pointers; the matrices outlive the
/// op that uses them).
struct SharedMats {
    params: MoeShared,
    ims: usize,
}

impl SharedMats {
    /// `None` when the slot kernels cannot read this shared expert: f32 weights, a format other
    /// than the routed experts' (`fp8`: block-FP8 codes, `ims` whole blocks), rows that are not
    /// whole 16-byte vectors, or shapes other than `[ims, h]` / `[h, ims]`.
    fn of(s: &SharedExpert<'_, CudaMat, CudaBuf>, h: usize, fp8: bool) -> Option<Self> {
        let ims = s.gate.rows;
        let shapes_fit = s.gate.cols == h
            && (s.up.rows, s.up.cols) == (ims, h)
            && (s.down.rows, s.down.cols) == (h, ims)
            && ims > 0
            && ims.is_multiple_of(if fp8 { FP8_BLOCK[0] } else { 8 });
        if !shapes_fit {
            return None;
        }
        let gate_logits = device_address(s.gate_logits.data());
        let params = match (&s.gate.data, &s.up.data, &s.down.data) {
            (MatData::Bf16(g), MatData::Bf16(u), MatData::Bf16(d)) if !fp8 => MoeShared {
                gate: device_address(g),
                up: device_address(u),
                down: device_address(d),
                gate_logits,
                ims: ims as i32,
                ..MoeShared::default()
            },
            (
                MatData::Fp8 {
                    codes: g,
                    scales: gs,
                },
                MatData::Fp8 {
                    codes: u,
                    scales: us,
                },
                MatData::Fp8 {
                    codes: d,
                    scales: ds,
                },
            ) if fp8 => MoeShared {
                gate: device_address(g),
                up: device_address(u),
                down: device_address(d),
                gate_scales: device_address(gs),
                up_scales: device_address(us),
                down_scales: device_address(ds),
                gate_logits,
                ims: ims as i32,
            },
            _ => return None,
        };
        Some(Self { params, ims })
    }
}

/// A device allocation's address, whatever its element type.
fn device_address<T>(m: &CudaSlice<T>) -> u64 {
    let (p, _record) = m.device_ptr(m.stream());
    p
}

#[cfg(test)]
mod tests {
    use super::grouped_rows_per_block;
    use crate::options::CudaOptions;

    fn options_with(defines: &[(&str, &str)]) -> CudaOptions {
        CudaOptions {
            defines: defines
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            ..CudaOptions::default()
        }
    }

    #[test]
    fn grouped_blocks_hold_the_tiles_the_kernels_make() {
        assert_eq!(grouped_rows_per_block(&options_with(&[])), 64);
        let rows =
            |k_warps: &str| grouped_rows_per_block(&options_with(&[("MOE_TILE_K_WARPS", k_warps)]));
        assert_eq!(rows("8"), 16);
        assert_eq!(rows("4"), 32);
        assert_eq!(rows("2"), 64);
        assert_eq!(rows("1"), 128);
    }

    #[test]
    #[should_panic(expected = "MOE_TILE_K_WARPS=3")]
    fn a_tile_split_that_leaves_warps_over_is_refused() {
        grouped_rows_per_block(&options_with(&[("MOE_TILE_K_WARPS", "3")]));
    }
}
