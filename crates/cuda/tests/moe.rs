//! The fused MoE path of the CUDA backend (moe.cu: routing, grouping by expert, the stacked
//! experts' gate/up and down kernels, the combine) against the reference's per-expert path on the
//! same bf16-rounded weights and activations. Skipped (with a printed reason) without a CUDA device.
//!
//! `TOL_MOE` (relative to max(1, max |want|)): the fused kernels round the SiLU-mul activations to
//! bf16 before the down projection, as the dense path's bf16 GEMM does with its input, while the
//! reference keeps them exact: an error of up to 2^-9 per activation, which sums to ~1e-3 of the
//! largest output over these shapes. A wrong expert, weight or slot is an error of order 1.

mod common;

use common::{check, cuda, Rng};
use deltaserve_cuda::{CudaBackend, CudaMat, CudaOptions, GemmPrecision};
use deltaserve_tensor::op_check::Operands;
use deltaserve_tensor::reference::{RefMat, ReferenceBackend};
use deltaserve_tensor::{
    Backend, ExpertShape, ExpertTensors, ExpertWeights, Experts, HostTensor, MoeRouting,
    SharedExpert,
};

const TOL_MOE: f32 = 1e-2;

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
    let be = cuda(GemmPrecision::Bf16, "moe")?;
    let tensors = expert_tensors(rng, shape);
    let device = be.load_experts(&tensors, shape).unwrap();
    assert!(
        matches!(device.weights, ExpertWeights::Stacked { .. }),
        "bf16 experts of shape {shape:?} should take the fused path"
    );
    let shared = shared_rows.map(|ims| {
        let [t] = <[ExpertTensors; 1]>::try_from(expert_tensors(
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
        let be = cuda(GemmPrecision::Bf16, "moe").unwrap();
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
    for (experts, im, h, top_k, renorm, shared) in shapes {
        let shape = ExpertShape {
            experts,
            intermediate: im,
            hidden: h,
        };
        let Some(c) = case(&mut rng, shape, top_k, renorm, shared) else {
            return;
        };
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
/// and its shared expert), 1-4 tokens (a decode, an MTP verify).
#[test]
fn moe_down_rows_a_block_do_not_change_the_outputs() {
    let test = "moe_down_rows_a_block_do_not_change_the_outputs";
    let Some(default) = cuda(GemmPrecision::Bf16, test) else {
        return;
    };
    let mut rng = Rng(94);
    for rows in [2, 8] {
        let options = CudaOptions {
            gemm_precision: GemmPrecision::Bf16,
            defines: vec![
                ("MOE_DOWN_ROWS_ONE_TOKEN".to_string(), rows.to_string()),
                ("MOE_DOWN_ROWS_MULTI".to_string(), rows.to_string()),
            ],
            ..CudaOptions::default()
        };
        let other = CudaBackend::with_options(0, options).expect("a second backend on GPU 0");
        // (experts, im, h, top_k, shared expert rows)
        for (experts, im, h, top_k, shared_rows) in [
            (64, 48, 136, 8, Some(64)),
            (512, 16, 200, 10, Some(24)),
            (32, 64, 128, 4, None),
        ] {
            let shape = ExpertShape {
                experts,
                intermediate: im,
                hidden: h,
            };
            let tensors = expert_tensors(&mut rng, shape);
            let shared = shared_rows.map(|ims| {
                expert_tensors(
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
                    "down kernel with {rows} rows a block differs: E={experts} im={im} h={h} k={top_k} shared={shared_rows:?} tokens={tokens}"
                );
            }
        }
    }
}
