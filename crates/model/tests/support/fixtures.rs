//! What the golden tests of every backend share (crates/model/tests/golden.rs for the CPU backends,
//! crates/cuda/tests/golden.rs for the GPU, which includes this file by path): finding and loading
//! the transformers fixtures under tests/fixtures/, cache and block-table set-up, and the batch
//! invariance check. `DELTASERVE_FIXTURES` (test-only) points at the fixtures when a test binary
//! runs from another tree.
#![allow(dead_code)]

use deltaserve_model::config::ModelConfig;
use deltaserve_model::safetensors::SafetensorsSource;
use deltaserve_model::weights::Weights;
use deltaserve_model::{ForwardInput, HybridCache, Model};
use deltaserve_tensor::{Backend, BatchLayout};
use serde_json::Value;
use std::path::{Path, PathBuf};

pub fn fixtures_dir() -> PathBuf {
    std::env::var_os("DELTASERVE_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures"))
}

/// Every fixture model directory (those with expected outputs), sorted.
pub fn fixture_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .expect("tests/fixtures exists")
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.join("expected.json").is_file() && p.join("config.json").is_file())
        .collect();
    dirs.sort();
    assert!(
        dirs.len() >= 6,
        "expected the six fixture models, found {dirs:?}"
    );
    dirs
}

pub fn ids(expected: &Value, key: &str) -> Vec<u32> {
    expected[key]
        .as_array()
        .unwrap_or_else(|| panic!("expected.json has no array `{key}`"))
        .iter()
        .map(|v| v.as_u64().expect("token id") as u32)
        .collect()
}

pub fn load<B: Backend>(backend: B, dir: &Path) -> Model<B> {
    let config = ModelConfig::from_dir(dir).unwrap();
    let source = SafetensorsSource::open(dir).unwrap();
    let weights = Weights::load(&backend, &config, &source, true, &mut |_, _| {}).unwrap();
    Model::new(config, backend, weights)
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn full_cache<B: Backend>(m: &Model<B>, slots: usize, tokens: usize) -> HybridCache<B> {
    let geometry = deltaserve_model::CacheGeometry {
        num_blocks: slots * tokens.div_ceil(16),
        block_size: 16,
        state_slots: slots,
        mtp: m.has_mtp(),
    };
    HybridCache::new(&m.backend, &m.config, geometry)
}

/// Blocks of sequence `s` when each sequence owns `per_seq` blocks, interleaved across sequences so
/// that no block table is contiguous.
pub fn blocks_of(s: usize, per_seq: usize, seqs: usize) -> Vec<u32> {
    (0..per_seq).map(|i| (i * seqs + s) as u32).collect()
}

/// How close a sequence's logits batched must stay to its logits alone.
pub enum BatchEquality {
    /// Exactly (the CPU backends: one summation order whatever the batch).
    Bitwise,
    /// Within this max |diff| (cuBLAS may pick another kernel for another number of rows).
    Within(f32),
}

/// Three sequences in one ragged batch: a prefill, a prefill continuing from cache, and a decode.
/// Each must get the logits it gets alone, as `equality` says.
pub fn check_batch_invariance<B: Backend>(m: &Model<B>, dir: &Path, equality: BatchEquality) {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let ids = ids(&expected, "prefill_ids");
    let per_seq = ids.len().div_ceil(16);
    let seqs: [(&[u32], usize); 3] = [(&ids[..70], 0), (&ids[10..90], 30), (&ids[50..51], 40)];
    // Context already in the cache for sequences 1 and 2: their first `pos` tokens.
    let contexts: [&[u32]; 3] = [&[], &ids[..30], &ids[..40]];

    let run_alone = |s: usize| -> Vec<f32> {
        let mut cache = full_cache(m, 3, ids.len());
        let blocks = blocks_of(s, per_seq, 3);
        let (new, pos) = seqs[s];
        if pos > 0 {
            let batch = BatchLayout::packed(16, [(pos, 0, blocks.clone(), s)]);
            m.forward(
                &ForwardInput {
                    tokens: contexts[s],
                    batch: &batch,
                    logit_rows: &[0],
                    hidden_rows: &[],
                },
                &mut cache,
            );
        }
        let batch = BatchLayout::packed(16, [(new.len(), pos, blocks, s)]);
        let rows: Vec<u32> = (0..new.len() as u32).collect();
        m.backend.to_host(
            &m.forward(
                &ForwardInput {
                    tokens: new,
                    batch: &batch,
                    logit_rows: &rows,
                    hidden_rows: &[],
                },
                &mut cache,
            )
            .logits,
        )
    };
    let alone: Vec<Vec<f32>> = (0..3).map(run_alone).collect();

    let mut cache = full_cache(m, 3, ids.len());
    for s in 1..3 {
        let batch = BatchLayout::packed(16, [(seqs[s].1, 0, blocks_of(s, per_seq, 3), s)]);
        m.forward(
            &ForwardInput {
                tokens: contexts[s],
                batch: &batch,
                logit_rows: &[0],
                hidden_rows: &[],
            },
            &mut cache,
        );
    }
    let batch = BatchLayout::packed(
        16,
        (0..3).map(|s| (seqs[s].0.len(), seqs[s].1, blocks_of(s, per_seq, 3), s)),
    );
    let tokens: Vec<u32> = seqs
        .iter()
        .flat_map(|(new, _)| new.iter().copied())
        .collect();
    let rows: Vec<u32> = (0..tokens.len() as u32).collect();
    let together = m.backend.to_host(
        &m.forward(
            &ForwardInput {
                tokens: &tokens,
                batch: &batch,
                logit_rows: &rows,
                hidden_rows: &[],
            },
            &mut cache,
        )
        .logits,
    );
    let vocab = m.config.vocab_size;
    let mut offset = 0;
    for (s, solo) in alone.iter().enumerate() {
        let part = &together[offset * vocab..(offset + seqs[s].0.len()) * vocab];
        let diff = max_abs_diff(part, solo);
        println!(
            "{}: sequence {s} batched vs alone: max |diff| = {diff:.2e} (bitwise equal: {})",
            dir.file_name().unwrap().to_string_lossy(),
            part == solo.as_slice()
        );
        match equality {
            BatchEquality::Bitwise => assert!(
                part == solo.as_slice(),
                "{}: sequence {s} logits change when batched (max diff {diff})",
                dir.display()
            ),
            BatchEquality::Within(tolerance) => assert!(
                diff <= tolerance,
                "{}: sequence {s} logits change by {diff} when batched",
                dir.display()
            ),
        }
        offset += seqs[s].0.len();
    }
}
