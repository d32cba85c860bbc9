//! The fused MoE path of the CUDA backend (moe.cu: routing, grouping by expert, the stacked
//! experts' gate/up and down kernels, the combine) against the reference's per-expert path on the
//! same bf16-rounded weights and activations. Skipped (with a printed reason) without a CUDA device.
//!
//! `TOL_MOE` (relative to max(1, max |want|)): the fused kernels round the SiLU-mul activations to
//! bf16 before the down projection, as the dense path's bf16 GEMM does with its input, while the
//! reference keeps them exact: an error of up to 2^-9 per activation, which sums to ~1e-3 of the
//! largest output over these shapes. A wrong expert, weight or slot is an error of order 1.

mod common;

use common::{check, cuda, round_bf16, Rng};
use deltaserve_cuda::GemmPrecision;
use deltaserve_tensor::reference::ReferenceBackend;
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

struct Case {
    routing: MoeRouting,
    reference: Experts<deltaserve_tensor::reference::RefMat>,
    device: Experts<deltaserve_cuda::CudaMat>,
}

fn case(rng: &mut Rng, shape: ExpertShape, top_k: usize, renormalize: bool) -> Option<Case> {
    let be = cuda(GemmPrecision::Bf16, "moe")?;
    let tensors = expert_tensors(rng, shape);
    let device = be.load_experts(&tensors, shape).unwrap();
    assert!(
        matches!(device.weights, ExpertWeights::Stacked { .. }),
        "bf16 experts of shape {shape:?} should take the fused path"
    );
    Some(Case {
        routing: MoeRouting { top_k, renormalize },
        reference: ReferenceBackend.load_experts(&tensors, shape).unwrap(),
        device,
    })
}

impl Case {
    /// (device, reference) outputs for `x [tokens, h]`, router `logits [tokens, E]`, with a shared
    /// expert output and gate when `shared` is given.
    fn run(
        &self,
        x: &[f32],
        logits: &[f32],
        tokens: usize,
        shared: Option<(&[f32], &[f32])>,
    ) -> (Vec<f32>, Vec<f32>) {
        let be = cuda(GemmPrecision::Bf16, "moe").unwrap();
        let (sx, sg) = match shared {
            Some((o, g)) => (Some(be.upload(o)), Some(be.upload(g))),
            None => (None, None),
        };
        let got = be.moe_experts(
            &be.upload(x),
            &be.upload(logits),
            &self.device,
            self.routing,
            tokens,
            sx.zip(sg.as_ref())
                .map(|(out, gate)| SharedExpert { out, gate }),
        );
        let reference_gate = shared.map(|(_, g)| g.to_vec());
        let want = ReferenceBackend.moe_experts(
            &round_bf16(x),
            &logits.to_vec(),
            &self.reference,
            self.routing,
            tokens,
            shared
                .zip(reference_gate.as_ref())
                .map(|((out, _), gate)| SharedExpert {
                    out: out.to_vec(),
                    gate,
                }),
        );
        (be.to_host(&got), want)
    }
}

#[test]
fn fused_moe_matches_the_reference() {
    let mut rng = Rng(91);
    let shapes = [
        // (experts, im, h, top_k, renormalize)
        (8, 32, 64, 2, true),
        (64, 48, 136, 8, true),
        (128, 64, 256, 8, false),
        (512, 16, 64, 10, true),
    ];
    let mut worst = 0.0f32;
    for (experts, im, h, top_k, renorm) in shapes {
        let shape = ExpertShape {
            experts,
            intermediate: im,
            hidden: h,
        };
        let Some(c) = case(&mut rng, shape, top_k, renorm) else {
            return;
        };
        // 1: decode; 5 and 33: a few tokens; 300: many tokens per expert (several work blocks).
        for tokens in [1, 5, 33, 300] {
            let x = rng.vec(tokens * h, 1.0);
            let logits = rng.vec(tokens * experts, 3.0);
            let label = format!("moe E={experts} im={im} h={h} k={top_k} tokens={tokens}");
            let (got, want) = c.run(&x, &logits, tokens, None);
            worst = worst.max(check(&label, &got, &want, TOL_MOE));
            let shared_out = rng.vec(tokens * h, 1.0);
            let shared_gate = rng.vec(tokens, 2.0);
            let (got, want) = c.run(&x, &logits, tokens, Some((&shared_out, &shared_gate)));
            worst = worst.max(check(&format!("{label} + shared"), &got, &want, TOL_MOE));
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
    let Some(c) = case(&mut rng, shape, 4, true) else {
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
    let (got, want) = c.run(&x, &logits, tokens, None);
    check("moe routing ties", &got, &want, TOL_MOE);
}

/// A token's output does not depend on what else is batched: bit for bit the same within each pair
/// of kernels (CUDA-core up to 4 tokens, tensor-core beyond: alone or in a decode batch, in a verify
/// batch or a prefill of 200 tokens), and within the bf16 tolerance across the two.
#[test]
fn fused_moe_is_batch_invariant_bitwise() {
    let mut rng = Rng(93);
    let shape = ExpertShape {
        experts: 32,
        intermediate: 64,
        hidden: 128,
    };
    let Some(c) = case(&mut rng, shape, 4, true) else {
        return;
    };
    let h = shape.hidden;
    let x = rng.vec(200 * h, 1.0);
    let logits = rng.vec(200 * 32, 3.0);
    let shared_out = rng.vec(200 * h, 1.0);
    let shared_gate = rng.vec(200, 2.0);
    let rows = |tokens: usize| {
        c.run(
            &x[..tokens * h],
            &logits[..tokens * 32],
            tokens,
            Some((&shared_out[..tokens * h], &shared_gate[..tokens])),
        )
        .0
    };
    for (kernel, widest) in [(vec![1, 2, 3], 4), (vec![5, 17, 64], 200)] {
        let all = rows(widest);
        for tokens in kernel {
            assert_eq!(
                rows(tokens),
                all[..tokens * h],
                "moe rows differ between a batch of {tokens} and a batch of {widest}"
            );
        }
    }
    check(
        "moe 4-token kernels vs 5-token kernels",
        &rows(4),
        &rows(5)[..4 * h],
        TOL_MOE,
    );
}
