//! The whole model on the CUDA backend against Hugging Face transformers: every fixture under
//! tests/fixtures/ must reproduce transformers' prefill logits, token-by-token logits, decode
//! logits, greedy continuation and MTP head, as crates/model/tests/golden.rs checks the CPU
//! backends, plus batch invariance. Skipped (with a printed reason) where no CUDA device can be used.
//!
//! Tolerances: with `GemmPrecision::F32` the GPU computes in f32 like transformers, so the CPU
//! backends' bound (2e-3 on logits) applies unchanged, and so does the greedy continuation. With
//! `GemmPrecision::Bf16` every GEMM input is rounded to bf16 (relative error up to 2^-9 per input).
//! These tiny random models amplify such rounding strongly: transformers' own logits for the same
//! weights in f32 (qwen35_f32) and rounded to bf16 (qwen35_bf16) differ by up to 2.4 (logits reach
//! 14, std 3), a relative RMS difference of 0.04-0.057 and a top-1 agreement of 0.83-0.96 (5 of
//! the 6 decode rows). An absolute bound would be meaningless there, so the bf16 mode is held to
//! agreement measures instead, set at about 4x (RMS) and below (top-1) what weight rounding alone
//! costs transformers: `BF16_MAX_RELATIVE_RMS` and `BF16_MIN_TOP1_AGREEMENT` per checked logits
//! tensor (RMS only for hidden states). A broken kernel gives a relative RMS near 1. The greedy
//! continuation is reported, not asserted, in this mode.
//!
//! KV dtype: the bf16 mode runs with its default bf16 KV pools and with f32 ones. Storing K/V in
//! bf16 rounds each K/V value once (relative error <= 2^-9), the size of the rounding every GEMM
//! input already carries in that mode, in the few full-attention layers only, so the same agreement
//! bounds apply. The f32 mode keeps f32 pools (exact); batch invariance is checked with both pools,
//! since the rounding is per value and cannot depend on the batch.

mod common;
#[path = "../../model/tests/support/fixtures.rs"]
mod fixtures;

use common::{cuda, cuda_kv};
use deltaserve_cuda::{CudaBackend, GemmPrecision};
use deltaserve_model::{npy, ForwardInput, Model, MtpInput};
use deltaserve_tensor::{Backend, BatchLayout, KvDtype};
use fixtures::{
    blocks_of, check_batch_invariance, fixture_dirs, full_cache, ids, load, max_abs_diff,
    BatchEquality,
};
use serde_json::Value;
use std::path::Path;

const F32_LOGIT_TOLERANCE: f32 = 2e-3;
/// `||ours - theirs|| / ||theirs||` over a checked tensor, bf16 mode.
const BF16_MAX_RELATIVE_RMS: f32 = 0.2;
/// Fraction of logit rows whose argmax equals transformers', bf16 mode.
const BF16_MIN_TOP1_AGREEMENT: f32 = 0.75;
/// Logits of a sequence batched with others against alone (f32 mode). cuBLAS may pick another
/// kernel, and so another summation order, for another number of rows: a relative change of ~1e-7
/// that these models amplify about 1000-fold (see above); a batching bug changes logits by O(1).
const BATCH_TOLERANCE: f32 = 1e-3;

/// How closely a backend must follow transformers.
enum Checker {
    /// Max |diff| at most `tolerance` (f32 mode).
    Absolute { tolerance: f32, worst: f32 },
    /// Relative RMS error and top-1 agreement per row of `width` (bf16 mode).
    Agreement { worst_rms: f32, worst_top1: f32 },
}

impl Checker {
    /// `logits`: rows of `width` whose argmax means something (not hidden states).
    fn close(
        &mut self,
        what: &str,
        dir: &Path,
        width: usize,
        logits: bool,
        ours: &[f32],
        theirs: &[f32],
    ) {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let diff = max_abs_diff(ours, theirs);
        let norm =
            |v: &mut dyn Iterator<Item = f32>| v.map(|x| x as f64 * x as f64).sum::<f64>().sqrt();
        let rms = (norm(&mut ours.iter().zip(theirs).map(|(a, b)| a - b))
            / norm(&mut theirs.iter().copied()).max(1e-30)) as f32;
        let rows = ours.len() / width;
        let agree = ours
            .chunks(width)
            .zip(theirs.chunks(width))
            .filter(|(a, b)| argmax(a) == argmax(b))
            .count();
        let top1 = agree as f32 / rows.max(1) as f32;
        println!("{name}: {what}: max |diff| = {diff:.2e}, relative rms = {rms:.2e}, top-1 agreement {agree}/{rows}");
        match self {
            Checker::Absolute { tolerance, worst } => {
                *worst = worst.max(diff);
                assert!(
                    diff <= *tolerance,
                    "{name}: {what} differs from transformers by {diff}"
                );
            }
            Checker::Agreement {
                worst_rms,
                worst_top1,
            } => {
                *worst_rms = worst_rms.max(rms);
                assert!(
                    rms <= BF16_MAX_RELATIVE_RMS,
                    "{name}: {what}: relative rms error {rms} from transformers"
                );
                if logits {
                    *worst_top1 = worst_top1.min(top1);
                    assert!(
                        top1 >= BF16_MIN_TOP1_AGREEMENT,
                        "{name}: {what}: top-1 agreement {agree}/{rows}"
                    );
                }
            }
        }
    }
}

fn argmax(row: &[f32]) -> usize {
    deltaserve_model::argmax(row) as usize
}

type M = Model<CudaBackend>;

fn check_fixture(m: &M, dir: &Path, checker: &mut Checker, assert_greedy: bool) {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let vocab = m.config.vocab_size;

    // 1. One prefill forward over 100 tokens.
    let prefill = ids(&expected, "prefill_ids");
    let (_, theirs) = npy::read_f32(&dir.join("prefill_logits.npy")).unwrap();
    let mut cache = full_cache(m, 1, prefill.len());
    let batch = BatchLayout::packed(
        16,
        [(
            prefill.len(),
            0,
            blocks_of(0, prefill.len().div_ceil(16), 1),
            0,
        )],
    );
    let rows: Vec<u32> = (0..prefill.len() as u32).collect();
    let out = m.forward(
        &ForwardInput {
            tokens: &prefill,
            batch: &batch,
            logit_rows: &rows,
            hidden_rows: &[],
        },
        &mut cache,
    );
    checker.close(
        "prefill logits",
        dir,
        vocab,
        true,
        &m.backend.to_host(&out.logits),
        &theirs,
    );

    // 2. The same tokens one at a time (decode path, growing KV).
    let mut cache = full_cache(m, 1, prefill.len());
    let blocks = blocks_of(0, prefill.len().div_ceil(16), 1);
    let mut stepwise = Vec::with_capacity(theirs.len());
    for (i, &tok) in prefill.iter().enumerate() {
        let batch = BatchLayout::packed(16, [(1, i, blocks.clone(), 0)]);
        let out = m.forward(
            &ForwardInput {
                tokens: &[tok],
                batch: &batch,
                logit_rows: &[0],
                hidden_rows: &[],
            },
            &mut cache,
        );
        stepwise.extend(m.backend.to_host(&out.logits));
    }
    checker.close(
        "token-by-token logits vs transformers prefill",
        dir,
        vocab,
        true,
        &stepwise,
        &theirs,
    );

    // 3. Prefill then decode through the cache.
    let prompt = ids(&expected, "decode_prompt_ids");
    let steps = ids(&expected, "decode_ids");
    let (_, theirs) = npy::read_f32(&dir.join("decode_logits.npy")).unwrap();
    let total = prompt.len() + steps.len();
    let mut cache = full_cache(m, 1, total);
    let blocks = blocks_of(0, total.div_ceil(16), 1);
    let batch = BatchLayout::packed(16, [(prompt.len(), 0, blocks.clone(), 0)]);
    m.forward(
        &ForwardInput {
            tokens: &prompt,
            batch: &batch,
            logit_rows: &[0],
            hidden_rows: &[],
        },
        &mut cache,
    );
    let mut decoded = Vec::new();
    for (i, &tok) in steps.iter().enumerate() {
        let batch = BatchLayout::packed(16, [(1, prompt.len() + i, blocks.clone(), 0)]);
        let out = m.forward(
            &ForwardInput {
                tokens: &[tok],
                batch: &batch,
                logit_rows: &[0],
                hidden_rows: &[],
            },
            &mut cache,
        );
        decoded.extend(m.backend.to_host(&out.logits));
    }
    checker.close("decode logits", dir, vocab, true, &decoded, &theirs);

    // 4. Greedy continuation.
    let greedy_prompt = ids(&expected, "greedy_prompt_ids");
    let want = ids(&expected, "greedy_tokens");
    let got = m.generate_greedy(&greedy_prompt, want.len(), &[], &mut |_| {});
    let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
    println!(
        "{}: greedy: {same} of {} tokens match transformers",
        dir.file_name().unwrap().to_string_lossy(),
        want.len()
    );
    if assert_greedy {
        assert_eq!(
            got,
            want,
            "{}: greedy continuation differs from transformers",
            dir.display()
        );
    }

    // 5. MTP head.
    if dir.join("mtp_logits.npy").is_file() {
        let mtp_ids = ids(&expected, "mtp_ids");
        let n = mtp_ids.len();
        let mut cache = full_cache(m, 1, n);
        let blocks = blocks_of(0, n.div_ceil(16), 1);
        let batch = BatchLayout::packed(16, [(n, 0, blocks.clone(), 0)]);
        let rows: Vec<u32> = (0..n as u32).collect();
        let trunk = m.forward(
            &ForwardInput {
                tokens: &mtp_ids,
                batch: &batch,
                logit_rows: &rows,
                hidden_rows: &rows,
            },
            &mut cache,
        );
        let hidden = m.backend.to_host(&trunk.hidden);
        let h = m.config.hidden_size;
        let pairs = n - 1;
        let batch = BatchLayout::packed(16, [(pairs, 0, blocks, 0)]);
        let rows: Vec<u32> = (0..pairs as u32).collect();
        let out = m
            .mtp_forward(
                &MtpInput {
                    hidden: &hidden[..pairs * h],
                    next_tokens: &mtp_ids[1..],
                    batch: &batch,
                    logit_rows: &rows,
                    hidden_rows: &rows,
                },
                &mut cache,
            )
            .unwrap();
        let (_, theirs) = npy::read_f32(&dir.join("mtp_logits.npy")).unwrap();
        checker.close(
            "MTP logits",
            dir,
            vocab,
            true,
            &m.backend.to_host(&out.logits),
            &theirs,
        );
        let (_, theirs_hidden) = npy::read_f32(&dir.join("mtp_hidden.npy")).unwrap();
        checker.close(
            "MTP hidden",
            dir,
            m.config.hidden_size,
            false,
            &m.backend.to_host(&out.hidden),
            &theirs_hidden,
        );
    }
}

#[test]
fn cuda_f32_gemm_matches_transformers() {
    let Some(be) = cuda(GemmPrecision::F32, "cuda_f32_gemm_matches_transformers") else {
        return;
    };
    let mut checker = Checker::Absolute {
        tolerance: F32_LOGIT_TOLERANCE,
        worst: 0.0,
    };
    for dir in fixture_dirs() {
        check_fixture(&load(be.clone(), &dir), &dir, &mut checker, true);
    }
    if let Checker::Absolute { worst, .. } = checker {
        println!("f32 GEMMs: worst |diff| from transformers over all fixtures: {worst:.2e}");
    }
}

#[test]
fn cuda_bf16_gemm_agrees_with_transformers() {
    for kv in [KvDtype::Bf16, KvDtype::F32] {
        let Some(be) = cuda_kv(
            GemmPrecision::Bf16,
            kv,
            "cuda_bf16_gemm_agrees_with_transformers",
        ) else {
            return;
        };
        let mut checker = Checker::Agreement {
            worst_rms: 0.0,
            worst_top1: 1.0,
        };
        for dir in fixture_dirs() {
            println!("{} KV pool:", kv.name());
            check_fixture(&load(be.clone(), &dir), &dir, &mut checker, false);
        }
        if let Checker::Agreement {
            worst_rms,
            worst_top1,
        } = checker
        {
            println!(
                "bf16 GEMMs, {} KV over all fixtures: worst relative rms {worst_rms:.2e}, worst top-1 agreement {worst_top1:.2}",
                kv.name()
            );
        }
    }
}

#[test]
fn cuda_backend_is_batch_invariant() {
    for kv in [KvDtype::F32, KvDtype::Bf16] {
        let Some(be) = cuda_kv(GemmPrecision::F32, kv, "cuda_backend_is_batch_invariant") else {
            return;
        };
        for dir in fixture_dirs() {
            println!("{} KV pool:", kv.name());
            check_batch_invariance(
                &load(be.clone(), &dir),
                &dir,
                BatchEquality::Within(BATCH_TOLERANCE),
            );
        }
    }
}
