//! Recorded steps (CUDA graphs) against the same steps launched op by op: the demo model and the
//! MoE fixtures (whose routed experts run on the device, so their steps record too) run 3
//! sequences (batch 1 and batch 3, contexts crossing the 64-position attention splits so that the
//! recordings are re-made for new shapes) once with recordings and once without, as plain decode
//! steps and as speculative verify steps (4 tokens a sequence with a snapshot slot each, then a
//! rollback to the snapshot of the last kept token); every step's logits (and a verify's hidden
//! states) must be bit for bit the same, since a replay runs the same kernels on the same data in
//! the same order. Both KV pool dtypes (bf16, the default with bf16 GEMMs, and f32). The MTP
//! head's draft steps (an extend of 4 pairs a sequence, then two one-token draft steps fed with
//! the head's own hidden state and argmax, as the engine drafts) are compared the same way on the
//! models that have one.
//! Skipped (with a printed reason) where no CUDA device can be used.

mod common;
#[path = "../../model/tests/support/fixtures.rs"]
mod fixtures;

use common::cuda_kv;
use deltaserve_cuda::GemmPrecision;
use deltaserve_model::step_graphs::StepGraphCounts;
use deltaserve_model::{argmax, ForwardInput, HybridCache, Model, MtpInput};
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

/// Prefills each of the `SEQS` sequences (state slot s, blocks `blocks(s)`) with a 16-token
/// prompt made from `(a, b)`; returns each one's greedy next token.
fn prefill<B: Backend>(
    m: &Model<B>,
    cache: &mut HybridCache<B>,
    blocks: &dyn Fn(usize) -> Vec<u32>,
    (a, b): (usize, usize),
) -> Vec<u32> {
    (0..SEQS)
        .map(|s| {
            cache.reset_slot(&m.backend, s);
            let prompt: Vec<u32> = (0..16)
                .map(|i| ((i * a + s * b) % 200 + 10) as u32)
                .collect();
            let layout = BatchLayout::packed(16, [(prompt.len(), 0, blocks(s), s)]);
            let out = m.forward(
                &ForwardInput {
                    tokens: &prompt,
                    batch: &layout,
                    logit_rows: &[15],
                    hidden_rows: &[],
                },
                cache,
            );
            argmax(&m.backend.to_host(&out.logits))
        })
        .collect()
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
    let mut next = prefill(m, &mut cache, &blocks, (7, 13));
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

/// Tokens a verify step runs per sequence: the next token and three drafts (MTP k = 3).
const VERIFY_TOKENS: usize = 4;
const VERIFY_STEPS: usize = 40;

/// Prefills `SEQS` sequences, then runs `VERIFY_STEPS` verify steps, `batch` sequences at a
/// time: each sequence runs its greedy token and three made-up drafts, with a snapshot slot per
/// token, then keeps 0-3 of the drafts in turn (its state rolls back to the snapshot after the
/// last kept token, as the engine's commit does). Returns every logits and hidden row in order.
fn verify<B: Backend>(m: &Model<B>, batch: usize) -> Vec<Vec<f32>> {
    let context = 16 + VERIFY_STEPS * VERIFY_TOKENS + 1;
    let per_seq = context.div_ceil(16);
    let mut cache: HybridCache<B> = full_cache(m, SEQS * (1 + VERIFY_TOKENS), context);
    let blocks =
        |s: usize| -> Vec<u32> { ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect() };
    let snapshots = |s: usize| -> Vec<usize> {
        (0..VERIFY_TOKENS)
            .map(|i| SEQS + s * VERIFY_TOKENS + i)
            .collect()
    };
    let (vocab, hidden) = (m.config.vocab_size, m.config.hidden_size);
    let mut next = prefill(m, &mut cache, &blocks, (5, 11));
    let mut pos = [16; SEQS];
    let mut all = Vec::new();
    for step in 0..VERIFY_STEPS {
        for group in (0..SEQS).collect::<Vec<_>>().chunks(batch) {
            let mut layout = BatchLayout::packed(
                16,
                group.iter().map(|&s| (VERIFY_TOKENS, pos[s], blocks(s), s)),
            );
            for (seq, &s) in layout.seqs.iter_mut().zip(group) {
                seq.snapshot_slots = snapshots(s);
            }
            let tokens: Vec<u32> = group
                .iter()
                .flat_map(|&s| {
                    let first = next[s];
                    (0..VERIFY_TOKENS as u32).map(move |i| {
                        if i == 0 {
                            first
                        } else {
                            (first * 7 + i * 31) % 200 + 5
                        }
                    })
                })
                .collect();
            let rows: Vec<u32> = (0..tokens.len() as u32).collect();
            let out = m.forward(
                &ForwardInput {
                    tokens: &tokens,
                    batch: &layout,
                    logit_rows: &rows,
                    hidden_rows: &rows,
                },
                &mut cache,
            );
            let logits = m.backend.to_host(&out.logits);
            let states = m.backend.to_host(&out.hidden);
            for (i, &s) in group.iter().enumerate() {
                let kept = (step + s) % VERIFY_TOKENS;
                let row = i * VERIFY_TOKENS + kept;
                cache.copy_slot(&m.backend, snapshots(s)[kept], s);
                pos[s] += 1 + kept;
                next[s] = argmax(&logits[row * vocab..(row + 1) * vocab]);
            }
            all.extend(logits.chunks(vocab).map(<[f32]>::to_vec));
            all.extend(states.chunks(hidden).map(<[f32]>::to_vec));
        }
    }
    all
}

/// MTP rounds of the draft comparison: each an extend of `VERIFY_TOKENS` pairs a sequence and
/// `VERIFY_TOKENS - 2` one-token draft steps.
const DRAFT_ROUNDS: usize = 30;

/// Prefills `SEQS` sequences (the trunk's hidden states of their prompts start the MTP head),
/// then runs `DRAFT_ROUNDS` rounds of MTP steps, `batch` sequences at a time, as the engine drafts
/// with k = 3 under full acceptance: an extend of 4 pairs a sequence (logits and hidden state of
/// each sequence's last pair) at the next 4 positions, then two draft steps of one token each, fed
/// with the previous step's hidden state and argmax. The next round's extend starts 4 positions
/// later (overwriting the draft steps' KV rows, as the engine's extends do) with the round's own
/// hidden states. Returns every logits and hidden row in order; empty for a model without MTP.
fn draft<B: Backend>(m: &Model<B>, batch: usize) -> Vec<Vec<f32>> {
    if !m.has_mtp() {
        return Vec::new();
    }
    let context = 16 + DRAFT_ROUNDS * VERIFY_TOKENS + VERIFY_TOKENS;
    let per_seq = context.div_ceil(16);
    let mut cache: HybridCache<B> = full_cache(m, SEQS, context);
    let blocks =
        |s: usize| -> Vec<u32> { ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect() };
    let (vocab, hidden) = (m.config.vocab_size, m.config.hidden_size);
    let mut next = prefill(m, &mut cache, &blocks, (3, 17));
    // Each sequence's hidden rows for its next extend: a fixed pattern in [-1, 1] at first (any
    // f32 rows of a hidden state's size run the same ops), then the head's own outputs.
    let mut rows_in: Vec<Vec<f32>> = (0..SEQS)
        .map(|s| {
            (0..VERIFY_TOKENS * hidden)
                .map(|i| (((i * 37 + s * 101) % 211) as f32 - 105.0) / 105.0)
                .collect()
        })
        .collect();
    let mut pos = [0usize; SEQS];
    let mut all = Vec::new();
    for _ in 0..DRAFT_ROUNDS {
        for group in (0..SEQS).collect::<Vec<_>>().chunks(batch) {
            // The extend: 4 pairs a sequence, logits of each sequence's last.
            let layout = BatchLayout::packed(
                16,
                group.iter().map(|&s| (VERIFY_TOKENS, pos[s], blocks(s), s)),
            );
            let tokens: Vec<u32> = group
                .iter()
                .flat_map(|&s| {
                    let first = next[s];
                    (0..VERIFY_TOKENS as u32).map(move |i| (first * 5 + i * 29) % 200 + 5)
                })
                .collect();
            let hidden_in: Vec<f32> = group.iter().flat_map(|&s| rows_in[s].clone()).collect();
            let last: Vec<u32> = (0..group.len())
                .map(|i| ((i + 1) * VERIFY_TOKENS - 1) as u32)
                .collect();
            let mut outputs = Vec::new();
            let mut step = mtp_step(m, &mut cache, &hidden_in, &tokens, &layout, &last);
            for draft_step in 1..VERIFY_TOKENS - 1 {
                outputs.push(step.clone());
                let (logits, states) = &step;
                let tokens: Vec<u32> = (0..group.len())
                    .map(|i| argmax(&logits[i * vocab..(i + 1) * vocab]))
                    .collect();
                let layout = BatchLayout::packed(
                    16,
                    group
                        .iter()
                        .map(|&s| (1, pos[s] + VERIFY_TOKENS - 1 + draft_step, blocks(s), s)),
                );
                let rows: Vec<u32> = (0..group.len() as u32).collect();
                step = mtp_step(m, &mut cache, states, &tokens, &layout, &rows);
            }
            outputs.push(step);
            for (i, &s) in group.iter().enumerate() {
                pos[s] += VERIFY_TOKENS;
                next[s] = argmax(&outputs[0].0[i * vocab..(i + 1) * vocab]);
                // The next extend's hidden rows: this round's three outputs and the first again.
                rows_in[s] = (0..VERIFY_TOKENS)
                    .flat_map(|r| {
                        outputs[r % outputs.len()].1[i * hidden..(i + 1) * hidden].to_vec()
                    })
                    .collect();
            }
            for (logits, states) in outputs {
                all.extend(logits.chunks(vocab).map(<[f32]>::to_vec));
                all.extend(states.chunks(hidden).map(<[f32]>::to_vec));
            }
        }
    }
    all
}

/// One MTP step; its logits and hidden rows (`rows` both) on the host.
fn mtp_step<B: Backend>(
    m: &Model<B>,
    cache: &mut HybridCache<B>,
    hidden: &[f32],
    next_tokens: &[u32],
    batch: &BatchLayout,
    rows: &[u32],
) -> (Vec<f32>, Vec<f32>) {
    let out = m
        .mtp_forward(
            &MtpInput {
                hidden,
                next_tokens,
                batch,
                logit_rows: rows,
                hidden_rows: rows,
            },
            cache,
        )
        .expect("the model has an MTP head and the cache its pool");
    (
        m.backend.to_host(&out.logits),
        m.backend.to_host(&out.hidden),
    )
}

type Cuda = deltaserve_cuda::CudaBackend;

/// Runs `steps` on a model launching op by op and on one recording (graphs up to 16 rows),
/// at batch 1 and `SEQS`, and asks for bit-for-bit equal rows and enough replays (`counts`: the
/// recordings of the kind of step compared). Models for which `steps` returns nothing are
/// skipped; at least one must take part.
fn compare_recorded<F>(
    test: &str,
    what: &str,
    min_replays: u64,
    counts: fn(&Model<Cuda>) -> Option<StepGraphCounts>,
    steps: F,
) where
    F: Fn(&Model<Cuda>, usize) -> Vec<Vec<f32>>,
{
    for kv in [KvDtype::Bf16, KvDtype::F32] {
        let Some(be) = cuda_kv(GemmPrecision::Bf16, kv, test) else {
            return;
        };
        let kv = kv.name();
        let mut compared = 0;
        for dir in model_dirs() {
            let plain = load(be.clone(), dir);
            let recorded = load(be.clone(), dir);
            recorded.enable_step_graphs(16);
            let mut took_part = true;
            for batch in [1, SEQS] {
                let want = steps(&plain, batch);
                if want.is_empty() {
                    took_part = false;
                    break;
                }
                let got = steps(&recorded, batch);
                assert_eq!(want.len(), got.len());
                for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                    assert!(
                        w == g,
                        "{}: {kv} KV: {what} batch {batch}: row {i} differs between the replayed and the launched step (max diff {})",
                        dir.display(),
                        fixtures::max_abs_diff(w, g)
                    );
                }
                println!(
                    "{}: {kv} KV: {what} batch {batch}: {} rows bit for bit equal",
                    dir.display(),
                    want.len()
                );
            }
            if !took_part {
                println!("{}: {what}: nothing to compare", dir.display());
                continue;
            }
            compared += 1;
            let counts = counts(&recorded).expect("recording is on");
            println!("{}: {kv} KV: {what}: {counts:?}", dir.display());
            assert_eq!(counts.failed, 0, "a recording failed: {counts:?}");
            assert!(
                counts.recorded >= 4 && counts.replayed > min_replays,
                "{}: {kv} KV: {what}: too few steps were replayed for the comparison to mean anything: {counts:?}",
                dir.display()
            );
        }
        assert!(compared > 0, "{what}: no model took part");
    }
}

#[test]
fn replayed_verify_steps_equal_launched_steps_bitwise() {
    compare_recorded(
        "replayed_verify_steps_equal_launched_steps_bitwise",
        "verify",
        VERIFY_STEPS as u64,
        Model::step_graph_counts,
        verify,
    );
}

#[test]
fn replayed_steps_equal_launched_steps_bitwise() {
    compare_recorded(
        "replayed_steps_equal_launched_steps_bitwise",
        "decode",
        2 * STEPS as u64,
        Model::step_graph_counts,
        decode,
    );
}

#[test]
fn replayed_mtp_draft_steps_equal_launched_steps_bitwise() {
    compare_recorded(
        "replayed_mtp_draft_steps_equal_launched_steps_bitwise",
        "MTP drafts",
        2 * DRAFT_ROUNDS as u64,
        Model::mtp_step_graph_counts,
        draft,
    );
}
