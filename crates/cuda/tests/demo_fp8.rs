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
    let test = "demo_model_fp8_kept_on_the_gpu_keeps_its_accuracy_and_mtp_acceptance";
    let (Some(bf16), Some(fp8)) = (
        common::cuda(GemmPrecision::Bf16, test),
        common::cuda_fp8(test),
    ) else {
        return;
    };
    let (greedy, bf16_replies, bf16_usage) =
        run(load(bf16.clone(), Weighting::Bf16), Some(mtp_k3()));
    let (_, fp8_replies, fp8_usage) = run(load(fp8.clone(), Weighting::Fp8), Some(mtp_k3()));
    assert_fp8_keeps_accuracy_and_acceptance(
        &greedy,
        (&bf16_replies, &bf16_usage),
        (&fp8_replies, &fp8_usage),
    );
}

#[test]
fn demo_model_fp8_draft_on_the_gpu_keeps_accuracy_and_mtp_acceptance() {
    let test = "demo_model_fp8_draft_on_the_gpu_keeps_accuracy_and_mtp_acceptance";
    let (Some(bf16), Some(fp8)) = (
        common::cuda(GemmPrecision::Bf16, test),
        common::cuda_fp8(test),
    ) else {
        return;
    };
    let (greedy, bf16_replies, bf16_usage) =
        run(load(bf16.clone(), Weighting::Bf16), Some(mtp_k3()));
    let (_, draft_replies, draft_usage) =
        run(load(fp8.clone(), Weighting::DraftFp8), Some(mtp_k3()));
    assert_fp8_keeps_accuracy_and_acceptance(
        &greedy,
        (&bf16_replies, &bf16_usage),
        (&draft_replies, &draft_usage),
    );
}
