//! The fused MoE path of the CUDA backend (moe.cu: routing, grouping by expert, the stacked
//! experts' gate/up and down kernels, the combine) against the reference's per-expert path on the
//! same bf16-rounded weights and activations, and with block-FP8 experts kept as codes on the same
//! exactly dequantized weights. Skipped (with a printed reason) without a CUDA device.
//!
//! `TOL_MOE` (relative to max(1, max |want|)): the fused kernels round the SiLU-mul activations to
//! bf16 before the down projection, as the dense path's bf16 GEMM does with its input, while the
//! reference keeps them exact: an error of up to 2^-9 per activation, which sums to ~1e-3 of the
//! largest output over these shapes. A wrong expert, weight or slot is an error of order 1. The
//! FP8 kernels multiply the exact FP8 weights (the slot kernels with the f32 activations, the
//! grouped ones with them rounded to bf16 as the reference is given them), so the same bound holds.

mod common;

use common::{check, cuda, cuda_fp8, Rng};
use deltaserve_cuda::{CudaBackend, CudaMat, CudaOptions, GemmPrecision};
use deltaserve_model::dummy::DummySource;
use deltaserve_model::online_fp8::{quantized_to_block_fp8, Fp8QuantizingSource};
use deltaserve_model::quantization::Fp8Quantization;
use deltaserve_model::source::TensorSource;
use deltaserve_tensor::op_check::Operands;
use deltaserve_tensor::reference::{RefMat, ReferenceBackend};
use deltaserve_tensor::{
    Backend, DType, ExpertShape, ExpertTensors, ExpertWeights, Experts, HostTensor, MoeRouting,
    SharedExpert,
};

const TOL_MOE: f32 = 1e-2;
/// On the grouped path the shared expert runs through the dense ops, whose FP8 GEMV for 2-16 rows
/// quantizes its activations to e4m3 per 1 x 128 block (W8A8, docs/fp8.md: ~3e-2 of the largest
/// output on random data), so an FP8 case with a shared expert there is held to that.
const TOL_FP8_SHARED_W8A8: f32 = 6e-2;

/// The experts' storage a case is made with.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Weights {
    Bf16,
    /// Block-FP8 (128 x 128 blocks) kept as codes on the device.
    Fp8,
}

impl Weights {
    fn backend(self, test: &str) -> Option<&'static CudaBackend> {
        match self {
            Self::Bf16 => cuda(GemmPrecision::Bf16, test),
            Self::Fp8 => cuda_fp8(test),
        }
    }

    fn tensors(self, rng: &mut Rng, shape: ExpertShape) -> Vec<ExpertTensors> {
        match self {
            Self::Bf16 => expert_tensors(rng, shape),
            Self::Fp8 => fp8_expert_tensors(rng, shape),
        }
    }
}

/// Random experts quantized to block FP8 with the checkpoints' recipe, as an FP8 checkpoint hands
/// them on: the exactly dequantized values carrying their codes and scales.
fn fp8_expert_tensors(rng: &mut Rng, shape: ExpertShape) -> Vec<ExpertTensors> {
    let quantized = |t: HostTensor| quantized_to_block_fp8(t, [128, 128]);
    expert_tensors(rng, shape)
        .into_iter()
        .map(|t| ExpertTensors {
            gate: quantized(t.gate),
            up: quantized(t.up),
            down: quantized(t.down),
        })
        .collect()
}

fn expert_tensors(rng: &mut Rng, shape: ExpertShape) -> Vec<ExpertTensors> {
    let ExpertShape {
        experts,
        intermediate: im,
        hidden: h,
    } = shape;
    let scale = 1.0 / (h as f32).sqrt();
    (0..experts)
        .map(|_| ExpertTensors {
            gate: HostTensor::from_f32_as_bf16("gate", vec![im, h], &rng.vec(im * h, scale)),
            up: HostTensor::from_f32_as_bf16("up", vec![im, h], &rng.vec(im * h, scale)),
            down: HostTensor::from_f32_as_bf16(
                "down",
                vec![h, im],
                &rng.vec(h * im, 1.0 / (im as f32).sqrt()),
            ),
        })
        .collect()
}

/// The shared expert's matrices on one backend.
struct SharedMats<M> {
    gate: M,
    up: M,
    down: M,
}

struct Case {
    be: &'static CudaBackend,
    routing: MoeRouting,
    reference: Experts<RefMat>,
    device: Experts<CudaMat>,
    shared: Option<(SharedMats<RefMat>, SharedMats<CudaMat>)>,
}

/// Experts of `shape` (and a shared expert of `shared_rows` rows when given) on both backends.
fn case(
    rng: &mut Rng,
    shape: ExpertShape,
    top_k: usize,
    renormalize: bool,
    shared_rows: Option<usize>,
) -> Option<Case> {
    case_of(Weights::Bf16, rng, shape, top_k, renormalize, shared_rows)
}

/// `case` with experts (and the shared expert) stored as `weights`.
fn case_of(
    weights: Weights,
    rng: &mut Rng,
    shape: ExpertShape,
    top_k: usize,
    renormalize: bool,
    shared_rows: Option<usize>,
) -> Option<Case> {
    let be = weights.backend("moe")?;
    let tensors = weights.tensors(rng, shape);
    let device = be.load_experts(&tensors, shape).unwrap();
    assert!(
        matches!(device.weights, ExpertWeights::Stacked { .. }),
        "{weights:?} experts of shape {shape:?} should take the fused path"
    );
    let shared = shared_rows.map(|ims| {
        let [t] = <[ExpertTensors; 1]>::try_from(weights.tensors(
            rng,
            ExpertShape {
                experts: 1,
                intermediate: ims,
                hidden: shape.hidden,
            },
        ))
        .ok()
        .unwrap();
        let r = |m: &HostTensor| ReferenceBackend.load_mat(m).unwrap();
        let d = |m: &HostTensor| be.load_mat(m).unwrap();
        (
            SharedMats {
                gate: r(&t.gate),
                up: r(&t.up),
                down: r(&t.down),
            },
            SharedMats {
                gate: d(&t.gate),
                up: d(&t.up),
                down: d(&t.down),
            },
        )
    });
    Some(Case {
        be,
        routing: MoeRouting { top_k, renormalize },
        reference: ReferenceBackend.load_experts(&tensors, shape).unwrap(),
        device,
        shared,
    })
}

impl Case {
    /// (device, reference) outputs for `x [tokens, h]`, router `logits [tokens, E]` and the
    /// shared expert's gate logits `[tokens]` (used when the case has a shared expert).
    fn run(
        &self,
        x: &[f32],
        logits: &[f32],
        tokens: usize,
        shared_logits: &[f32],
    ) -> (Vec<f32>, Vec<f32>) {
        let be = self.be;
        let gate_dev = be.upload(&shared_logits[..tokens]);
        let gate_ref = shared_logits[..tokens].to_vec();
        let got = be.moe_experts(
            &be.upload(x),
            &be.upload(logits),
            &self.device,
            self.routing,
            tokens,
            self.shared.as_ref().map(|(_, d)| SharedExpert {
                gate: &d.gate,
                up: &d.up,
                down: &d.down,
                gate_logits: &gate_dev,
            }),
        );
        let want = ReferenceBackend.moe_experts(
            &Operands::Bf16.seen(x),
            &logits.to_vec(),
            &self.reference,
            self.routing,
            tokens,
            self.shared.as_ref().map(|(r, _)| SharedExpert {
                gate: &r.gate,
                up: &r.up,
                down: &r.down,
                gate_logits: &gate_ref,
            }),
        );
        (be.to_host(&got), want)
    }
}

/// A row of a shape table: (experts, im, h, top_k, renormalize, shared expert rows).
type ShapeRow = (usize, usize, usize, usize, bool, Option<usize>);

/// The case of one shape-table row with experts stored as `weights`.
fn table_case(weights: Weights, rng: &mut Rng, row: ShapeRow) -> Option<Case> {
    let (experts, intermediate, hidden, top_k, renormalize, shared) = row;
    let shape = ExpertShape {
        experts,
        intermediate,
        hidden,
    };
    case_of(weights, rng, shape, top_k, renormalize, shared)
}

#[test]
fn fused_moe_matches_the_reference() {
    let mut rng = Rng(91);
    let shapes = [
        // (experts, im, h, top_k, renormalize, shared expert rows)
        (8, 32, 64, 2, true, Some(48)),
        (64, 48, 136, 8, true, None),
        (128, 64, 256, 8, false, Some(64)),
        (512, 16, 64, 10, true, Some(12)),
    ];
    let mut worst = 0.0f32;
    for row in shapes {
        let Some(c) = table_case(Weights::Bf16, &mut rng, row) else {
            return;
        };
        let (experts, im, h, top_k, _, shared) = row;
        // 1-4: the by-slot kernels (a decode, an MTP verify); 5 and 33: the grouped ones with
        // 8-slot work blocks; 300 and 700: with 32-slot blocks, several per expert.
        for tokens in [1, 3, 4, 5, 33, 300, 700] {
            let x = rng.vec(tokens * h, 1.0);
            let logits = rng.vec(tokens * experts, 3.0);
            let gate = rng.vec(tokens, 2.0);
            let label = format!(
                "moe E={experts} im={im} h={h} k={top_k} shared={shared:?} tokens={tokens}"
            );
            let (got, want) = c.run(&x, &logits, tokens, &gate);
            worst = worst.max(check(&label, &got, &want, TOL_MOE));
        }
    }
    println!("fused moe: worst relative error {worst:.2e} (tolerance {TOL_MOE:.0e})");
}

/// Block-FP8 experts kept as codes (the by-slot and the grouped FP8 kernels, with and without a
/// shared expert, Qwen3-Next's 512 experts and top-10) against the reference on the same exactly
/// dequantized weights; their outputs batch-invariant bit for bit within each path.
#[test]
fn fused_fp8_moe_matches_the_reference() {
    let mut rng = Rng(95);
    let shapes = [
        // (experts, im, h, top_k, renormalize, shared expert rows)
        (8, 128, 256, 2, true, Some(128)),
        (64, 256, 384, 8, true, None),
        (512, 128, 128, 10, true, Some(256)),
    ];
    let mut worst = 0.0f32;
    for row in shapes {
        let Some(c) = table_case(Weights::Fp8, &mut rng, row) else {
            return;
        };
        let (experts, im, h, top_k, _, shared) = row;
        let ExpertWeights::Stacked { gate_up, .. } = &c.device.weights else {
            unreachable!("checked by case_of")
        };
        assert_eq!(
            c.be.mat_bytes(gate_up),
            experts * 2 * im * h + experts * 2 * (im / 128) * (h / 128) * 4,
            "FP8 experts are stored as codes and scales"
        );
        let widest = 300;
        let x = rng.vec(widest * h, 1.0);
        let logits = rng.vec(widest * experts, 3.0);
        let gate = rng.vec(widest, 2.0);
        let run =
            |tokens: usize| c.run(&x[..tokens * h], &logits[..tokens * experts], tokens, &gate);
        let (slots_all, want) = run(4);
        let label = format!("fp8 moe E={experts} im={im} h={h} k={top_k} shared={shared:?}");
        worst = worst.max(check(
            &format!("{label} tokens=4"),
            &slots_all,
            &want,
            TOL_MOE,
        ));
        for tokens in 1..4 {
            assert_eq!(
                run(tokens).0,
                slots_all[..tokens * h],
                "{label}: by-slot rows of {tokens} tokens"
            );
        }
        // Past 4 tokens: the grouped kernels (8-slot work blocks up to 64 tokens, 32 beyond).
        // With a shared expert its dense GEMMs change kernel past 8 rows, so bit for bit
        // only up to there.
        let (grouped_all, want) = run(if shared.is_some() { 8 } else { widest });
        let tol = if shared.is_some() {
            TOL_FP8_SHARED_W8A8
        } else {
            TOL_MOE
        };
        let grouped_error = check(&format!("{label} grouped"), &grouped_all, &want, tol);
        if shared.is_none() {
            worst = worst.max(grouped_error);
        }
        for tokens in [5, 7] {
            assert_eq!(
                run(tokens).0,
                grouped_all[..tokens * h],
                "{label}: grouped rows of {tokens} tokens"
            );
        }
        if shared.is_none() {
            let (got, want) = run(70);
            worst = worst.max(check(&format!("{label} tokens=70"), &got, &want, TOL_MOE));
        }
    }
    println!("fused fp8 moe: worst relative error {worst:.2e} (tolerance {TOL_MOE:.0e})");
}

/// Equal router logits pick the lower expert index on both backends (the rule of
/// `Backend::route_top_k`), and the weights split evenly.
#[test]
fn fused_moe_breaks_routing_ties_like_the_reference() {
    let mut rng = Rng(92);
    let shape = ExpertShape {
        experts: 64,
        intermediate: 32,
        hidden: 64,
    };
    let Some(c) = case(&mut rng, shape, 4, true, None) else {
        return;
    };
    let tokens = 3;
    let mut logits = rng.vec(tokens * 64, 1.0);
    // Token 0: experts 5, 9, 40, 41 and 63 tie for the top (one of them must be left out);
    // token 1: every expert ties; token 2: two tied pairs straddle the 4th place.
    for e in [5, 9, 40, 41, 63] {
        logits[e] = 4.0;
    }
    logits[64..128].fill(0.25);
    for (e, v) in [(1, 3.0), (2, 3.0), (30, 2.0), (31, 2.0), (50, 2.0)] {
        logits[128 + e] = v;
    }
    let x = rng.vec(tokens * 64, 1.0);
    let (got, want) = c.run(&x, &logits, tokens, &[0.0; 3]);
    check("moe routing ties", &got, &want, TOL_MOE);
}

/// A token's output does not depend on what else is batched: bit for bit the same within each path
/// (by slot up to 4 tokens: alone, in a decode batch or an MTP verify; grouped beyond: in a small
/// batch or a prefill of 700 tokens, whatever work-block size), and within the bf16 tolerance across
/// the two. The shared
/// expert runs inside the by-slot kernels but through the dense ops on the grouped path, whose
/// GEMMs change kernel past 8 rows (`GEMV_MAX_TOKENS`), so with it the grouped range ends there.
#[test]
fn fused_moe_is_batch_invariant_bitwise() {
    let mut rng = Rng(93);
    let shape = ExpertShape {
        experts: 32,
        intermediate: 64,
        hidden: 128,
    };
    let h = shape.hidden;
    let x = rng.vec(700 * h, 1.0);
    let logits = rng.vec(700 * 32, 3.0);
    let shared_gate = rng.vec(700, 2.0);
    // Without a shared expert the grouped range spans both work-block sizes (8 and 32 slots: up to
    // 64 tokens and more).
    for (shared, grouped_widest) in [(None, 700), (Some(64), 8)] {
        let Some(c) = case(&mut rng, shape, 4, true, shared) else {
            return;
        };
        let rows = |tokens: usize| {
            c.run(
                &x[..tokens * h],
                &logits[..tokens * 32],
                tokens,
                &shared_gate,
            )
            .0
        };
        let grouped: Vec<usize> = [5, 7, 17, 31, 200]
            .into_iter()
            .filter(|&t| t < grouped_widest)
            .collect();
        for (path, widest) in [(vec![1, 2, 3], 4), (grouped, grouped_widest)] {
            let all = rows(widest);
            for tokens in path {
                assert_eq!(
                    rows(tokens),
                    all[..tokens * h],
                    "moe (shared {shared:?}) rows differ between a batch of {tokens} and a batch of {widest}"
                );
            }
        }
        check(
            &format!("moe (shared {shared:?}) by-slot vs grouped"),
            &rows(4),
            &rows(5)[..4 * h],
            TOL_MOE,
        );
    }
}

/// The by-slot path's outputs on `be` for experts made from `tensors` (and the shared expert's
/// from `shared`), loaded on `be`.
#[allow(clippy::too_many_arguments)]
fn by_slot_outputs(
    be: &CudaBackend,
    tensors: &[ExpertTensors],
    shape: ExpertShape,
    shared: Option<&ExpertTensors>,
    routing: MoeRouting,
    x: &[f32],
    logits: &[f32],
    gate_logits: &[f32],
    tokens: usize,
) -> Vec<f32> {
    let experts = be.load_experts(tensors, shape).unwrap();
    let shared = shared.map(|t| {
        let d = |m: &HostTensor| be.load_mat(m).unwrap();
        (d(&t.gate), d(&t.up), d(&t.down))
    });
    let gate_logits = be.upload(gate_logits);
    let out = be.moe_experts(
        &be.upload(x),
        &be.upload(logits),
        &experts,
        routing,
        tokens,
        shared.as_ref().map(|(gate, up, down)| SharedExpert {
            gate,
            up,
            down,
            gate_logits: &gate_logits,
        }),
    );
    be.to_host(&out)
}

/// The by-slot down kernel's rows a block (`moe_down_combine_r*`: 4 for one token and 16 for 2-4
/// by default) only share the work out differently: every row is the same dot products in the
/// same order, so other choices (2 and 8 for both) give the default's outputs bit for bit. Hidden
/// sizes that leave the last block partly empty (136, 200), up to 11 ranks (Qwen3-Next's top-10
/// and its shared expert), 1-4 tokens (a decode, an MTP verify); bf16 and FP8 experts (whose
/// kernels stop at 8 rows: a define of 16 runs the 8-row one).
#[test]
fn moe_down_rows_a_block_do_not_change_the_outputs() {
    let test = "moe_down_rows_a_block_do_not_change_the_outputs";
    let mut rng = Rng(94);
    // (experts, im, h, top_k, shared expert rows)
    let bf16_shapes = [
        (64, 48, 136, 8, Some(64)),
        (512, 16, 200, 10, Some(24)),
        (32, 64, 128, 4, None),
    ];
    let fp8_shapes = [(64, 128, 384, 8, Some(128)), (512, 128, 128, 10, Some(256))];
    for (weights, shapes) in [
        (Weights::Bf16, &bf16_shapes[..]),
        (Weights::Fp8, &fp8_shapes[..]),
    ] {
        let Some(default) = weights.backend(test) else {
            return;
        };
        for rows in [2, 8] {
            let options = CudaOptions {
                gemm_precision: GemmPrecision::Bf16,
                keep_fp8_weights: Some(weights == Weights::Fp8),
                defines: vec![
                    ("MOE_DOWN_ROWS_ONE_TOKEN".to_string(), rows.to_string()),
                    ("MOE_DOWN_ROWS_MULTI".to_string(), rows.to_string()),
                ],
                ..CudaOptions::default()
            };
            let other = CudaBackend::with_options(0, options).expect("a second backend on GPU 0");
            for &(experts, im, h, top_k, shared_rows) in shapes {
                let shape = ExpertShape {
                    experts,
                    intermediate: im,
                    hidden: h,
                };
                let tensors = weights.tensors(&mut rng, shape);
                let shared = shared_rows.map(|ims| {
                    weights
                        .tensors(
                            &mut rng,
                            ExpertShape {
                                experts: 1,
                                intermediate: ims,
                                hidden: h,
                            },
                        )
                        .remove(0)
                });
                let routing = MoeRouting {
                    top_k,
                    renormalize: true,
                };
                for tokens in 1..=4 {
                    let x = rng.vec(tokens * h, 1.0);
                    let logits = rng.vec(tokens * experts, 3.0);
                    let gate = rng.vec(tokens, 2.0);
                    let run = |be: &CudaBackend| {
                        by_slot_outputs(
                            be,
                            &tensors,
                            shape,
                            shared.as_ref(),
                            routing,
                            &x,
                            &logits,
                            &gate,
                            tokens,
                        )
                    };
                    assert_eq!(
                    run(&other),
                    run(default),
                    "{weights:?} down kernel with {rows} rows a block differs: E={experts} im={im} h={h} k={top_k} shared={shared_rows:?} tokens={tokens}"
                );
                }
            }
        }
    }
}

/// `--load-format dummy --quantization fp8` generates packed experts on the device and quantizes
/// them there as one stacked matrix per projection: the same codes and scales as the host's
/// quantizer gives each expert of the packed `[E, out, in]` tensor, read as weights.rs splits it
/// (so the FP8 parts follow `rows` and `reshaped`), and both kept as codes.
#[test]
fn device_generated_fp8_experts_equal_host_quantized() {
    let Some(be) = cuda_fp8("device_generated_fp8_experts_equal_host_quantized") else {
        return;
    };
    let source = Fp8QuantizingSource::new(
        Box::new(DummySource::new(DType::BF16, 12)),
        Fp8Quantization::qwen_default(),
    );
    let shape = ExpertShape {
        experts: 16,
        intermediate: 128,
        hidden: 256,
    };
    let (e, im, h) = (shape.experts, shape.intermediate, shape.hidden);
    let (gate_up_name, down_name) = (
        "layers.0.mlp.experts.gate_up_proj",
        "layers.0.mlp.experts.down_proj",
    );
    let spec = |name: &str, rows: usize, cols: usize| {
        let spec = source
            .generated_matrix(name, [rows, cols])
            .expect("packed experts are offered for generation");
        assert_eq!(spec.block_fp8, Some([128, 128]), "{name}");
        spec
    };
    let generated = be
        .generate_experts(
            &spec(gate_up_name, e * 2 * im, h),
            &spec(down_name, e * h, im),
            shape,
        )
        .expect("the cuda backend generates stacked experts")
        .expect("generation succeeds");
    let gate_up = source.get(gate_up_name, &[e, 2 * im, h]).unwrap();
    let down = source.get(down_name, &[e, h, im]).unwrap();
    let tensors: Vec<ExpertTensors> = (0..e)
        .map(|i| {
            let gu = gate_up.rows(i, i + 1).reshaped(vec![2 * im, h]);
            ExpertTensors {
                gate: gu.rows(0, im),
                up: gu.rows(im, 2 * im),
                down: down.rows(i, i + 1).reshaped(vec![h, im]),
            }
        })
        .collect();
    let read = be.load_experts(&tensors, shape).unwrap();
    for experts in [&generated, &read] {
        let ExpertWeights::Stacked { gate_up, down } = &experts.weights else {
            panic!("FP8 experts of shape {shape:?} should be stacked")
        };
        let fp8_bytes = |rows: usize, cols: usize| rows * cols + (rows / 128) * (cols / 128) * 4;
        assert_eq!(
            (be.mat_bytes(gate_up), be.mat_bytes(down)),
            (fp8_bytes(e * 2 * im, h), fp8_bytes(e * h, im)),
            "kept as codes and scales"
        );
    }
    let mut rng = Rng(96);
    let routing = MoeRouting {
        top_k: 4,
        renormalize: true,
    };
    for tokens in [1, 3, 9, 100] {
        let x = be.upload(&rng.vec(tokens * h, 1.0));
        let logits = be.upload(&rng.vec(tokens * e, 3.0));
        let out = |experts: &Experts<CudaMat>| {
            be.to_host(&be.moe_experts(&x, &logits, experts, routing, tokens, None))
        };
        assert_eq!(
            out(&generated),
            out(&read),
            "generated and read FP8 experts differ for {tokens} tokens"
        );
    }
}
