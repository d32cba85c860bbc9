//! The routed experts of a MoE block on the device (moe.cu): routing, grouping by expert, the
//! gate/up and down projections of every chosen expert in one launch each, and the weighted combine
//! with the shared expert; no host round trip, so a MoE decode step can be captured in a graph.
//! Expert weights are stacked at load (`ExpertWeights::Stacked`) so each kernel finds an expert's
//! rows at a fixed stride. f32 GEMMs (`--cuda-matmul-precision f32`) and shapes the kernels do not
//! take keep one matrix per expert and the generic path.

use crate::backend::{launch, CudaBackend};
use crate::buffer::CudaBuf;
use crate::mat::{CudaMat, MatData};
use crate::options::GemmPrecision;
use cudarc::driver::{CudaSlice, LaunchConfig};
use deltaserve_tensor::dtype::f32_to_bf16;
use deltaserve_tensor::moe::{load_per_expert, moe_per_expert};
use deltaserve_tensor::{
    DType, ExpertShape, ExpertTensors, ExpertWeights, Experts, GeneratedMatrix, HostTensor,
    MoeRouting, SharedExpert, TensorError,
};

/// `MOE_MAX_EXPERTS`, `MOE_BLOCK_ROWS` and `MOE_WARPS` of moe.cu.
const MAX_EXPERTS: usize = 512;
const BLOCK_ROWS: usize = 32;
const WARPS: u32 = 8;
/// Output rows per block of the gate/up and down kernels.
const TILE_ROWS: usize = 16;
/// `MOE_LANE_WARPS` and `MOE_LANE_WARPS` x `MOE_LANE_ROWS` of moe.cu: warps and output rows per
/// block of the by-slot CUDA-core kernels.
const LANE_WARPS: u32 = 4;
const LANE_ROWS_PER_BLOCK: usize = 4 * 2;
/// Up to this many tokens the by-slot kernels run (each slot reads its expert; with more tokens
/// the experts repeat and grouping them on the tensor cores reads less); beyond, the grouped path.
/// A token's result is bit for bit the same at every batch size within each of the two ranges.
const SLOT_PATH_MAX_TOKENS: usize = 4;
/// Tokens routed per block of `moe_route` (`MOE_ROUTE_WARPS`: one warp each).
const ROUTE_TOKENS_PER_BLOCK: usize = 4;

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
        let stacked = || -> Result<Experts<CudaMat>, TensorError> {
            Ok(Experts {
                shape,
                weights: ExpertWeights::Stacked {
                    gate_up: self.generate_mat_op(gate_up)?,
                    down: self.generate_mat_op(down)?,
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
        shared: Option<SharedExpert<'_, CudaBuf>>,
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
                s.out.len >= tokens * h && s.gate.len >= tokens,
                "moe: shared expert output {} / gate {} too short for {tokens} tokens",
                s.out.len,
                s.gate.len
            );
        }
        let (MatData::Bf16(gate_up), MatData::Bf16(down)) = (&gate_up.data, &down.data) else {
            unreachable!("stacked experts are bf16 (fused_applies)")
        };
        let mut out = CudaBuf {
            data: self.alloc_for_overwrite("moe output", tokens * h),
            len: tokens * h,
        };
        if tokens == 0 {
            return out;
        }
        let slots = tokens * k;
        let (t32, e32, k32, h32, im32) = (tokens as i32, e as i32, k as i32, h as i32, im as i32);
        // Every id and weight is written by moe_route.
        let mut ids: CudaSlice<i32> = self.alloc_for_overwrite("moe expert ids", slots);
        let mut weights: CudaSlice<f32> = self.alloc_for_overwrite("moe weights", slots);
        let renormalize = i32::from(routing.renormalize);
        let route_cfg = LaunchConfig {
            grid_dim: (tokens.div_ceil(ROUTE_TOKENS_PER_BLOCK) as u32, 1, 1),
            block_dim: (32 * ROUTE_TOKENS_PER_BLOCK as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // Contract: logits hold tokens x e (checked), 1 <= k <= e <= MAX_EXPERTS (checked,
        // fused_applies), ids and weights hold tokens x k.
        launch!(
            self,
            "moe_route",
            route_cfg,
            &router_logits.data,
            &t32,
            &e32,
            &k32,
            &renormalize,
            &mut ids,
            &mut weights
        );
        let null: u64 = 0;
        // Each act row is written by the block(s) of its slot.
        let mut act: CudaSlice<u16> = self.alloc_for_overwrite("moe activations", slots * im);
        if tokens <= SLOT_PATH_MAX_TOKENS {
            let gate_up_cfg = LaunchConfig {
                grid_dim: (im.div_ceil(LANE_ROWS_PER_BLOCK) as u32, slots as u32, 1),
                block_dim: (32 * LANE_WARPS, 1, 1),
                shared_mem_bytes: 0,
            };
            // Contract: gate_up is e x 2im x h bf16 with h % 8 == 0 (fused_applies), x holds
            // tokens x h f32 (checked), ids slots experts < e (moe_route), act slots x im.
            launch!(
                self,
                "moe_gate_up_slots",
                gate_up_cfg,
                gate_up,
                &im32,
                &h32,
                &x.data,
                &k32,
                &ids,
                &mut act
            );
            let down_cfg = LaunchConfig {
                grid_dim: (h.div_ceil(LANE_ROWS_PER_BLOCK) as u32, tokens as u32, 1),
                block_dim: (32 * LANE_WARPS, 1, 1),
                shared_mem_bytes: 0,
            };
            // Contract: down is e x h x im bf16 with im % 8 == 0; act, ids, weights as written
            // above; shared (when given) tokens x h and its gate tokens values (checked); out
            // tokens x h.
            match &shared {
                Some(sh) => launch!(
                    self,
                    "moe_down_combine",
                    down_cfg,
                    down,
                    &h32,
                    &im32,
                    &act,
                    &k32,
                    &ids,
                    &weights,
                    &sh.out.data,
                    &sh.gate.data,
                    &mut out.data
                ),
                None => launch!(
                    self,
                    "moe_down_combine",
                    down_cfg,
                    down,
                    &h32,
                    &im32,
                    &act,
                    &k32,
                    &ids,
                    &weights,
                    &null,
                    &null,
                    &mut out.data
                ),
            }
            return out;
        }

        // Most work blocks there can be: each expert's slots split into blocks of BLOCK_ROWS.
        let max_blocks = (slots / BLOCK_ROWS + e.min(slots)).min(slots);
        let slots32 = slots as i32;
        // Every sorted entry and used block is written by moe_plan, every y row of a slot by the
        // block that holds it.
        let mut sorted: CudaSlice<i32> = self.alloc_for_overwrite("moe slot order", slots);
        let mut blocks: CudaSlice<i32> =
            self.alloc_for_overwrite("moe work blocks", 4 * max_blocks);
        let mut block_count: CudaSlice<i32> = self.alloc_for_overwrite("moe block count", 1);
        let mut y: CudaSlice<f32> = self.alloc_for_overwrite("moe expert outputs", slots * h);
        let plan_cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let block_rows = BLOCK_ROWS as i32;
        // Contract: ids hold slots values < e <= 1024 (one thread per expert); sorted holds
        // slots, blocks 4 x max_blocks ints (the most the plan can use, see above).
        launch!(
            self,
            "moe_plan",
            plan_cfg,
            &ids,
            &slots32,
            &e32,
            &block_rows,
            &mut sorted,
            &mut blocks,
            &mut block_count
        );
        let x_bf16 = self.cast_to_bf16(x, tokens * h);
        let gemm_cfg = |rows: usize| LaunchConfig {
            grid_dim: (rows.div_ceil(TILE_ROWS) as u32, max_blocks as u32, 1),
            block_dim: (32 * WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        // Contract: gate_up is e x 2im x h bf16 and x_bf16 tokens x h with h % 8 == 0
        // (fused_applies: 16-byte aligned rows); sorted/blocks/block_count as moe_plan left them
        // (every slot < tokens x k, at most BLOCK_ROWS per block); act holds slots x im.
        launch!(
            self,
            "moe_gate_up",
            gemm_cfg(im),
            gate_up,
            &im32,
            &h32,
            &x_bf16,
            &k32,
            &sorted,
            &block_count,
            &blocks,
            &mut act
        );
        // Contract: down is e x h x im bf16, im % 8 == 0; act as written above; y slots x h.
        launch!(
            self,
            "moe_down",
            gemm_cfg(h),
            down,
            &h32,
            &im32,
            &act,
            &sorted,
            &block_count,
            &blocks,
            &mut y
        );
        let combine_cfg = Self::elementwise_config(tokens * h);
        // Contract: y holds slots x h, weights slots; shared (when given) tokens x h and its gate
        // tokens values (checked); out tokens x h.
        match &shared {
            Some(sh) => launch!(
                self,
                "moe_combine",
                combine_cfg,
                &y,
                &weights,
                &t32,
                &k32,
                &h32,
                &sh.out.data,
                &sh.gate.data,
                &mut out.data
            ),
            None => launch!(
                self,
                "moe_combine",
                combine_cfg,
                &y,
                &weights,
                &t32,
                &k32,
                &h32,
                &null,
                &null,
                &mut out.data
            ),
        }
        out
    }
}
