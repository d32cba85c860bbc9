//! The device sampler against the engine's host sampler (the definition). For each setting the host's
//! processed distribution is walked in id order with the same uniform number the device gets, which
//! is exactly the draw the device must make: every token must agree, except where the uniform number
//! lies within rounding of a boundary between two tokens' cumulative masses. Greedy must agree always.
//! Skipped without a GPU.

mod common;

use common::{cuda, Rng};
use deltaserve_cuda::GemmPrecision;
use deltaserve_engine::sampler::{argmax, processed_distribution, PenaltyHistory};
use deltaserve_engine::{SamplingParams, TokenMask};
use deltaserve_tensor::{Backend, RowSampling};

/// Cumulative masses are f64 on both sides, the weights f32 exponentials on the device: a uniform
/// number this close to a boundary may fall on either side of it.
const BOUNDARY_SLACK: f64 = 1e-6;

/// The token the device must draw for `uniform`: the host's kept tokens in id order, the first whose
/// cumulative probability passes `uniform`; `None` when `uniform` is within slack of a boundary.
fn expected_draw(dist: &[(u32, f32)], uniform: f64) -> Option<u32> {
    let mut by_id: Vec<(u32, f64)> = dist.iter().map(|&(t, p)| (t, p as f64)).collect();
    by_id.sort_by_key(|&(t, _)| t);
    let total: f64 = by_id.iter().map(|&(_, p)| p).sum();
    let target = uniform * total;
    let mut cumulative = 0.0;
    for (i, &(token, p)) in by_id.iter().enumerate() {
        cumulative += p;
        let last = i + 1 == by_id.len();
        if !last && (target - cumulative).abs() < BOUNDARY_SLACK {
            return None;
        }
        if target < cumulative {
            return Some(token);
        }
    }
    by_id.last().map(|&(t, _)| t)
}

fn logits_rows(vocab: usize, rows: usize, seed: u64, quantize: bool) -> Vec<f32> {
    let mut rng = Rng(seed);
    let mut x = rng.vec(vocab * rows, 8.0);
    if quantize {
        // Many exact ties, including at the top-k and top-p boundaries.
        for v in &mut x {
            *v = (*v * 2.0).round() / 2.0;
        }
    }
    x
}

fn settings() -> Vec<(&'static str, SamplingParams)> {
    let p = |temperature, top_k, top_p, min_p| SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        ..Default::default()
    };
    vec![
        ("temperature 0.7", p(0.7, 0, 1.0, 0.0)),
        ("top-k 20", p(1.0, 20, 1.0, 0.0)),
        (
            "qwen defaults (t 0.6, top-k 20, top-p 0.95)",
            p(0.6, 20, 0.95, 0.0),
        ),
        ("top-p 0.9", p(1.0, 0, 0.9, 0.0)),
        ("top-p 0.3, t 0.2", p(0.2, 0, 0.3, 0.0)),
        ("min-p 0.05, t 1.2", p(1.2, 0, 1.0, 0.05)),
        ("all filters", p(0.8, 50, 0.8, 0.02)),
        ("top-k 1", p(1.0, 1, 1.0, 0.0)),
        ("top-p 0", p(1.0, 0, 0.0, 0.0)),
        ("top-k = vocab", p(1.0, 1_000_000, 1.0, 0.0)),
        ("min-p 1.5 keeps the argmax", p(1.0, 0, 1.0, 1.5)),
    ]
}

fn row_sampling(row: u32, p: &SamplingParams, uniform: f64) -> RowSampling<'static> {
    RowSampling {
        row,
        temperature: p.temperature,
        top_k: p.top_k as u32,
        top_p: p.top_p,
        min_p: p.min_p,
        uniform,
        allowed: None,
    }
}

#[test]
fn greedy_equals_host_argmax_with_ties() {
    let Some(be) = cuda(GemmPrecision::Bf16, "greedy_equals_host_argmax_with_ties") else {
        return;
    };
    for (vocab, quantize) in [(248_320, false), (248_320, true), (1000, true), (7, false)] {
        let rows = 6;
        let mut x = logits_rows(vocab, rows, 11, quantize);
        // Row 1: the maximum twice (ties go to the lower id); row 2: all equal.
        x[vocab + 5] = 100.0;
        x[vocab + vocab - 1] = 100.0;
        for v in &mut x[2 * vocab..3 * vocab] {
            *v = 0.5;
        }
        let buf = be.upload(&x);
        let requests: Vec<RowSampling> = (0..rows as u32).map(RowSampling::greedy).collect();
        let got = be
            .sample_rows(&buf, vocab, &requests)
            .expect("cuda samples");
        let want: Vec<u32> = (0..rows)
            .map(|r| argmax(&x[r * vocab..(r + 1) * vocab]))
            .collect();
        assert_eq!(got, want, "vocab {vocab}, quantized {quantize}");
    }
}

#[test]
fn sampled_tokens_are_the_host_distribution_walked_in_id_order() {
    let Some(be) = cuda(
        GemmPrecision::Bf16,
        "sampled_tokens_are_the_host_distribution_walked_in_id_order",
    ) else {
        return;
    };
    let draws = 200;
    let mut checked = 0usize;
    let mut at_boundary = 0usize;
    for (vocab, quantize) in [(248_320, false), (248_320, true), (3000, true)] {
        let rows = 3;
        let x = logits_rows(vocab, rows, 7 + vocab as u64, quantize);
        let buf = be.upload(&x);
        for (label, params) in settings() {
            let mut uniforms = Rng(99);
            let mut requests = Vec::new();
            for row in 0..rows as u32 {
                for i in 0..draws {
                    let u = match i {
                        0 => 0.0,
                        1 => 1.0 - 1e-12,
                        _ => (uniforms.next_f32() as f64 + 1.0) / 2.0,
                    };
                    requests.push(row_sampling(row, &params, u));
                }
            }
            let got = be
                .sample_rows(&buf, vocab, &requests)
                .expect("cuda samples");
            let dists: Vec<Vec<(u32, f32)>> = (0..rows)
                .map(|r| {
                    let row = &x[r * vocab..][..vocab];
                    processed_distribution(row, &params, &PenaltyHistory::default())
                })
                .collect();
            for (req, &token) in requests.iter().zip(&got) {
                let dist = &dists[req.row as usize];
                assert!(
                    dist.iter().any(|&(t, _)| t == token),
                    "{label} (vocab {vocab}, quantized {quantize}, row {}): token {token} is outside \
                     the host's kept set of {} tokens",
                    req.row,
                    dist.len()
                );
                match expected_draw(dist, req.uniform) {
                    Some(want) => {
                        assert_eq!(
                            token,
                            want,
                            "{label} (vocab {vocab}, quantized {quantize}, row {}, u {}): kept {}",
                            req.row,
                            req.uniform,
                            dist.len()
                        );
                        checked += 1;
                    }
                    None => at_boundary += 1,
                }
            }
        }
    }
    println!("{checked} draws equal the host's; {at_boundary} within rounding of a boundary");
    assert!(
        at_boundary * 10 < checked,
        "too many draws at a boundary ({at_boundary} of {checked}) for the check to mean anything"
    );
}

#[test]
fn device_sampling_leaves_logits_untouched_and_handles_repeated_rows() {
    let Some(be) = cuda(
        GemmPrecision::Bf16,
        "device_sampling_leaves_logits_untouched_and_handles_repeated_rows",
    ) else {
        return;
    };
    let vocab = 5000;
    let x = logits_rows(vocab, 2, 3, false);
    let buf = be.upload(&x);
    let p = SamplingParams {
        temperature: 1.0,
        top_p: 0.5,
        ..Default::default()
    };
    let requests = vec![row_sampling(1, &p, 0.25), row_sampling(1, &p, 0.25)];
    let got = be
        .sample_rows(&buf, vocab, &requests)
        .expect("cuda samples");
    assert_eq!(
        got[0], got[1],
        "the same row and number give the same token"
    );
    assert_eq!(be.to_host(&buf), x, "sampling must not write to the logits");
}

/// Grammar masks on the device: each masked row is sampled as the host samples the row with every
/// forbidden logit at -infinity (greedy: the best allowed token; sampled: the host's distribution of
/// the masked row walked in id order), beside unmasked rows of the same call, and the logits are
/// left as they were. Masks: a sparse random set, everything but the argmax, a single token, and a
/// mask shorter than the row (ids past its words are forbidden).
#[test]
fn masked_rows_draw_from_the_allowed_tokens_as_the_host_does() {
    let Some(be) = cuda(
        GemmPrecision::Bf16,
        "masked_rows_draw_from_the_allowed_tokens_as_the_host_does",
    ) else {
        return;
    };
    for (vocab, quantize) in [(248_320, false), (3000, true)] {
        let rows = 5;
        let x = logits_rows(vocab, rows, 17 + vocab as u64, quantize);
        let buf = be.upload(&x);
        let words = vocab.div_ceil(32);
        let mut rng = Rng(5);
        let mut sparse = vec![0u32; words];
        for id in 0..vocab {
            if rng.next_f32() > 0.98 {
                sparse[id / 32] |= 1 << (id % 32);
            }
        }
        let row1_argmax = argmax(&x[vocab..2 * vocab]) as usize;
        let mut all_but_argmax = vec![u32::MAX; words];
        all_but_argmax[row1_argmax / 32] &= !(1 << (row1_argmax % 32));
        let mut single = vec![0u32; words];
        single[(vocab - 3) / 32] |= 1 << ((vocab - 3) % 32);
        let short = vec![u32::MAX; words / 2];
        // Row 4 has no mask.
        let masks: Vec<Option<Vec<u32>>> = vec![
            Some(sparse),
            Some(all_but_argmax),
            Some(single),
            Some(short),
            None,
        ];
        let masked_rows: Vec<Vec<f32>> = (0..rows)
            .map(|r| {
                let row = &x[r * vocab..][..vocab];
                match &masks[r] {
                    Some(words) => TokenMask {
                        words: words.clone(),
                    }
                    .apply(row),
                    None => row.to_vec(),
                }
            })
            .collect();
        let mut settings = settings();
        settings.push(("greedy", SamplingParams::default()));
        for (label, params) in settings {
            let mut uniforms = Rng(41);
            let mut requests = Vec::new();
            for (r, mask) in masks.iter().enumerate() {
                for i in 0..20 {
                    let u = match i {
                        0 => 0.0,
                        1 => 1.0 - 1e-12,
                        _ => (uniforms.next_f32() as f64 + 1.0) / 2.0,
                    };
                    let mut req = row_sampling(r as u32, &params, u);
                    req.allowed = mask.as_deref();
                    requests.push(req);
                }
            }
            let got = be
                .sample_rows(&buf, vocab, &requests)
                .expect("cuda samples");
            for (req, &token) in requests.iter().zip(&got) {
                let row = &masked_rows[req.row as usize];
                let dist = processed_distribution(row, &params, &PenaltyHistory::default());
                assert!(
                    row[token as usize] > f32::NEG_INFINITY,
                    "{label} (vocab {vocab}, row {}): token {token} is forbidden by the mask",
                    req.row
                );
                let want = match params.temperature == 0.0 {
                    true => Some(argmax(row)),
                    false => expected_draw(&dist, req.uniform),
                };
                if let Some(want) = want {
                    assert_eq!(
                        token, want,
                        "{label} (vocab {vocab}, row {}, u {})",
                        req.row, req.uniform
                    );
                }
            }
        }
        assert_eq!(be.to_host(&buf), x, "masking must not write to the logits");
    }
}
