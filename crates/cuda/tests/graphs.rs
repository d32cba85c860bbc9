//! Recorded decode steps (CUDA graphs) against the same steps launched op by op: the demo model
//! and the MoE fixtures (whose routed experts run on the device, so their steps record too) decode
//! 3 sequences (batch 1 and batch 3, contexts crossing the 64-position attention splits so
//! that the recordings are re-made for new shapes) once with recordings and once without; every
//! step's logits must be bit for bit the same, since a replay runs the same kernels on the same
//! data in the same order. Both KV pool dtypes (bf16, the default with bf16 GEMMs, and f32).
//! Skipped (with a printed reason) where no CUDA device can be used.

mod common;
#[path = "../../model/tests/support/fixtures.rs"]
mod fixtures;

use common::cuda_kv;
use deltaserve_cuda::GemmPrecision;
use deltaserve_model::{argmax, ForwardInput, HybridCache, Model};
use deltaserve_tensor::{Backend, BatchLayout, KvDtype};
use fixtures::{full_cache, load};
use std::path::Path;

const STEPS: usize = 150;
const SEQS: usize = 3;

fn model_dirs() -> [&'static Path; 3] {
    [
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo")),
        Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/qwen35_moe"
        )),
        Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/qwen3_next"
        )),
    ]
}

/// Prefills `SEQS` sequences with different prompts, then decodes them `STEPS` times, batch
/// `batch` at a time (each step feeds each sequence its own greedy token); returns every logits
/// row in order.
fn decode<B: Backend>(m: &Model<B>, batch: usize) -> Vec<Vec<f32>> {
    let mut cache: HybridCache<B> = full_cache(m, SEQS, 16 + STEPS + 1);
    let per_seq = cache.geometry.num_blocks / SEQS;
    let blocks =
        |s: usize| -> Vec<u32> { ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect() };
    let vocab = m.config.vocab_size;
    let mut next = Vec::new();
    for s in 0..SEQS {
        cache.reset_slot(&m.backend, s);
        let prompt: Vec<u32> = (0..16)
            .map(|i| ((i * 7 + s * 13) % 200 + 10) as u32)
            .collect();
        let layout = BatchLayout::packed(16, [(prompt.len(), 0, blocks(s), s)]);
        let out = m.forward(
            &ForwardInput {
                tokens: &prompt,
                batch: &layout,
                logit_rows: &[15],
                hidden_rows: &[],
            },
            &mut cache,
        );
        next.push(argmax(&m.backend.to_host(&out.logits)));
    }
    let mut all = Vec::new();
    for step in 0..STEPS {
        for group in (0..SEQS).collect::<Vec<_>>().chunks(batch) {
            let layout =
                BatchLayout::packed(16, group.iter().map(|&s| (1, 16 + step, blocks(s), s)));
            let tokens: Vec<u32> = group.iter().map(|&s| next[s]).collect();
            let rows: Vec<u32> = (0..group.len() as u32).collect();
            let out = m.forward(
                &ForwardInput {
                    tokens: &tokens,
                    batch: &layout,
                    logit_rows: &rows,
                    hidden_rows: &[],
                },
                &mut cache,
            );
            let logits = m.backend.to_host(&out.logits);
            for (i, &s) in group.iter().enumerate() {
                let row = logits[i * vocab..(i + 1) * vocab].to_vec();
                next[s] = argmax(&row);
                all.push(row);
            }
        }
    }
    all
}

#[test]
fn replayed_steps_equal_launched_steps_bitwise() {
    for kv in [KvDtype::Bf16, KvDtype::F32] {
        let Some(be) = cuda_kv(
            GemmPrecision::Bf16,
            kv,
            "replayed_steps_equal_launched_steps_bitwise",
        ) else {
            return;
        };
        let kv = kv.name();
        for dir in model_dirs() {
            let plain = load(be.clone(), dir);
            let recorded = load(be.clone(), dir);
            recorded.enable_step_graphs(8);
            for batch in [1, SEQS] {
                let want = decode(&plain, batch);
                let got = decode(&recorded, batch);
                assert_eq!(want.len(), got.len());
                for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                    assert!(
                        w == g,
                        "{}: {kv} KV: batch {batch}: logits row {i} differ between the replayed and the launched step (max diff {})",
                        dir.display(),
                        fixtures::max_abs_diff(w, g)
                    );
                }
                println!(
                    "{}: {kv} KV: batch {batch}: {} logits rows bit for bit equal",
                    dir.display(),
                    want.len()
                );
            }
            let counts = recorded.step_graph_counts().expect("recording is on");
            println!("{}: {kv} KV: {counts:?}", dir.display());
            assert_eq!(counts.failed, 0, "a recording failed: {counts:?}");
            assert!(
                counts.recorded >= 4 && counts.replayed > 2 * STEPS as u64,
                "{}: {kv} KV: too few steps were replayed for the comparison to mean anything: {counts:?}",
                dir.display()
            );
        }
    }
}
