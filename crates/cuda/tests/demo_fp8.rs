//! The demo model with `--quantization fp8` on the GPU, FP8 kept: the W8A16 GEMV for decode and the
//! k=3 verify, the W8A8 tensor-core GEMM for the products past 8 rows whose matrices fit it (its
//! `o_proj` and GDN `out_proj`). Held-out accuracy within 2 points of the same GPU's bf16 run and MTP
//! k=3 accept length within 5 %: issue 14's proof, whose cpu form is
//! crates/engine/tests/demo_model.rs (`demo_model_quantized_to_fp8_keeps_its_accuracy_and_mtp_acceptance`).
//! And `--speculative-draft-model-quantization fp8` (the bf16 trunk, the MTP head drafting in FP8):
//! the same bounds against the bf16 draft. Skipped without a GPU.

mod common;
#[path = "../../engine/tests/demo_eval/mod.rs"]
mod demo_eval;

use deltaserve_cuda::GemmPrecision;
use demo_eval::{assert_fp8_keeps_accuracy_and_acceptance, load, mtp_k3, run, Weighting};

#[test]
fn demo_model_fp8_kept_on_the_gpu_keeps_its_accuracy_and_mtp_acceptance() {
    against_bf16_on_the_gpu(
        "demo_model_fp8_kept_on_the_gpu_keeps_its_accuracy_and_mtp_acceptance",
        Weighting::Fp8,
    );
}

#[test]
fn demo_model_fp8_draft_on_the_gpu_keeps_accuracy_and_mtp_acceptance() {
    against_bf16_on_the_gpu(
        "demo_model_fp8_draft_on_the_gpu_keeps_accuracy_and_mtp_acceptance",
        Weighting::DraftFp8,
    );
}

/// The demo's held-out prompts with MTP k=3 on the bf16 backend and, FP8 kept, with `weighting`:
/// accuracy within 2 points, accept length within 5 %.
fn against_bf16_on_the_gpu(test: &str, weighting: Weighting) {
    let (Some(bf16), Some(fp8)) = (
        common::cuda(GemmPrecision::Bf16, test),
        common::cuda_fp8(test),
    ) else {
        return;
    };
    let (greedy, bf16_replies, bf16_usage) =
        run(load(bf16.clone(), Weighting::Bf16), Some(mtp_k3()));
    let (_, replies, usage) = run(load(fp8.clone(), weighting), Some(mtp_k3()));
    assert_fp8_keeps_accuracy_and_acceptance(
        &greedy,
        (&bf16_replies, &bf16_usage),
        (&replies, &usage),
    );
}
