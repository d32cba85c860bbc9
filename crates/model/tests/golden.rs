//! The model against Hugging Face transformers: every fixture under tests/fixtures/ (made by
//! scripts/make_fixtures.py) is loaded on each CPU backend (the cpu one at every kernel level this
//! CPU runs) and must reproduce transformers' prefill
//! logits, step-by-step decode logits, greedy continuation and the MTP head's logits.

#[path = "support/fixtures.rs"]
mod fixtures;

use deltaserve_model::{npy, ForwardInput, Model, MtpInput};
use deltaserve_tensor::cpu::{CpuBackend, IsaLevel};
use deltaserve_tensor::reference::ReferenceBackend;
use deltaserve_tensor::{Backend, BatchLayout};
use fixtures::{
    blocks_of, check_batch_invariance, fixture_dirs, full_cache, ids, load, max_abs_diff,
    BatchEquality,
};
use serde_json::Value;
use std::path::Path;

/// transformers and we both compute in f32 (we accumulate some sums in f64); differences come from
/// summation order and bf16 rounding points and stay far below this on the tiny fixtures.
const LOGIT_TOLERANCE: f32 = 2e-3;

fn assert_close(what: &str, dir: &Path, ours: &[f32], theirs: &[f32]) {
    let diff = max_abs_diff(ours, theirs);
    println!(
        "{}: {what}: max |diff| = {diff:.2e}",
        dir.file_name().unwrap().to_string_lossy()
    );
    assert!(
        diff <= LOGIT_TOLERANCE,
        "{}: {what} differs from transformers by {diff}",
        dir.display()
    );
}

fn prefill_logits<B: Backend>(m: &Model<B>, ids: &[u32]) -> Vec<f32> {
    let mut cache = full_cache(m, 1, ids.len());
    let batch = BatchLayout::packed(
        16,
        [(ids.len(), 0, blocks_of(0, ids.len().div_ceil(16), 1), 0)],
    );
    let rows: Vec<u32> = (0..ids.len() as u32).collect();
    let out = m.forward(
        &ForwardInput {
            tokens: ids,
            batch: &batch,
            logit_rows: &rows,
            hidden_rows: &[],
        },
        &mut cache,
    );
    m.backend.to_host(&out.logits)
}

fn check_fixture<B: Backend>(m: &Model<B>, dir: &Path) {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let vocab = m.config.vocab_size;

    // 1. One prefill forward over 100 tokens (crosses a GDN chunk boundary).
    let prefill = ids(&expected, "prefill_ids");
    let (_, theirs) = npy::read_f32(&dir.join("prefill_logits.npy")).unwrap();
    let ours = prefill_logits(m, &prefill);
    assert_close("prefill logits", dir, &ours, &theirs);

    // 2. The same tokens fed one at a time (recurrent GDN path, growing KV) give the same logits.
    let mut cache = full_cache(m, 1, prefill.len());
    let blocks = blocks_of(0, prefill.len().div_ceil(16), 1);
    let mut stepwise = Vec::with_capacity(ours.len());
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
    assert_close(
        "token-by-token logits vs transformers prefill",
        dir,
        &stepwise,
        &theirs,
    );

    // 3. Prefill then decode through the cache, as transformers did with past_key_values.
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
    assert_close("decode logits", dir, &decoded, &theirs);

    // 4. Greedy continuation, token for token.
    let greedy_prompt = ids(&expected, "greedy_prompt_ids");
    let want = ids(&expected, "greedy_tokens");
    let got = m.generate_greedy(&greedy_prompt, want.len(), &[], &mut |_| {});
    assert_eq!(
        got,
        want,
        "{}: greedy continuation differs from transformers",
        dir.display()
    );

    // 5. MTP head over (post-norm hidden of t, token t+1) pairs.
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
        assert_close("MTP logits", dir, &m.backend.to_host(&out.logits), &theirs);
        let (_, theirs_hidden) = npy::read_f32(&dir.join("mtp_hidden.npy")).unwrap();
        assert_close(
            "MTP hidden",
            dir,
            &m.backend.to_host(&out.hidden),
            &theirs_hidden,
        );
    }
    let _ = vocab;
}

#[test]
fn reference_backend_matches_transformers() {
    for dir in fixture_dirs() {
        check_fixture(&load(ReferenceBackend, &dir), &dir);
    }
}

/// The cpu backend at `level`, whatever `DELTASERVE_CPU_LEVEL` says.
fn cpu_at(level: IsaLevel) -> CpuBackend {
    println!("cpu backend, {level} kernels");
    CpuBackend::with_isa(0, level).unwrap()
}

#[test]
fn cpu_backend_matches_transformers() {
    for level in IsaLevel::available() {
        for dir in fixture_dirs() {
            check_fixture(&load(cpu_at(level), &dir), &dir);
        }
    }
}

#[test]
fn reference_backend_is_batch_invariant() {
    for dir in fixture_dirs() {
        check_batch_invariance(&load(ReferenceBackend, &dir), &dir, BatchEquality::Bitwise);
    }
}

#[test]
fn cpu_backend_is_batch_invariant() {
    for level in IsaLevel::available() {
        for dir in fixture_dirs() {
            check_batch_invariance(&load(cpu_at(level), &dir), &dir, BatchEquality::Bitwise);
        }
    }
}
