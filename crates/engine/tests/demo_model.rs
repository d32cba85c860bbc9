//! The bundled demo model through the engine on the cpu backend, on every held-out prompt of
//! tests/data/demo (never trained on): greedy replies equal transformers' greedy replies token for
//! token (a divergence is allowed only at a measured near-tie of transformers' top two logits), and
//! the task accuracies reach the targets of the demo-model issue. Also run with MTP speculation.

mod demo_eval;

use deltaserve_engine::*;
use deltaserve_tensor::cpu::CpuBackend;
use demo_eval::{
    accept_length, assert_fp8_keeps_accuracy_and_acceptance, ids, load, load_with_token_map,
    mtp_k3, run, score, Scores, Weighting,
};
use serde_json::Value;

/// transformers ran in f32 on another machine; a top-two gap below this may flip either way.
const NEAR_TIE: f32 = 0.05;

/// Token-for-token comparison; returns (exact, near-tie divergences).
fn compare_with_transformers(greedy: &[Value], replies: &[Vec<u32>]) -> (usize, usize) {
    let (mut exact, mut near_ties) = (0, 0);
    for (g, ours) in greedy.iter().zip(replies) {
        let theirs = ids(&g["reply_ids"]);
        match ours.iter().zip(&theirs).position(|(a, b)| a != b) {
            None if ours.len() == theirs.len() => exact += 1,
            None => panic!(
                "{}: lengths differ ({} vs {}) with equal prefixes",
                g["id"],
                ours.len(),
                theirs.len()
            ),
            Some(at) => {
                let margin = g["margins"][at].as_f64().unwrap() as f32;
                assert!(margin < NEAR_TIE, "{}: diverges from transformers at token {at} where transformers' top-2 margin is {margin}", g["id"]);
                near_ties += 1;
            }
        }
    }
    (exact, near_ties)
}

/// The plain greedy run, shared by both tests (it is the slow part).
fn plain_run() -> &'static (Vec<Value>, Vec<Vec<u32>>, Usage) {
    static PLAIN: std::sync::OnceLock<(Vec<Value>, Vec<Vec<u32>>, Usage)> =
        std::sync::OnceLock::new();
    PLAIN.get_or_init(|| run(load(CpuBackend::new(0), Weighting::Bf16), None))
}

/// MTP k=3 over every prompt, shared by the tests that need it.
fn speculative_run() -> &'static (Vec<Value>, Vec<Vec<u32>>, Usage) {
    static SPEC: std::sync::OnceLock<(Vec<Value>, Vec<Vec<u32>>, Usage)> =
        std::sync::OnceLock::new();
    SPEC.get_or_init(|| run(load(CpuBackend::new(0), Weighting::Bf16), Some(mtp_k3())))
}

/// The ids of the prompts whose replies differ between two runs.
fn differing_prompts(greedy: &[Value], one: &[Vec<u32>], other: &[Vec<u32>]) -> Vec<Value> {
    greedy
        .iter()
        .zip(one.iter().zip(other))
        .filter(|(_, (a, b))| a != b)
        .map(|(g, _)| g["id"].clone())
        .collect()
}

#[test]
fn demo_model_matches_transformers_and_meets_its_targets() {
    let (greedy, replies, _) = plain_run();
    let (greedy, replies) = (greedy.as_slice(), replies.as_slice());
    let (exact, near_ties) = compare_with_transformers(greedy, replies);
    println!("token-for-token vs transformers: {exact} identical, {near_ties} diverge at a near-tie (< {NEAR_TIE}), of {}", greedy.len());
    let Scores {
        groups: tally,
        python_missing,
        thinking,
        closed,
    } = score(greedy, replies);
    let closed_rate = closed as f64 / thinking as f64;
    println!("reasoning closed: {closed}/{thinking} = {:.3}", closed_rate);
    assert!(closed_rate >= 0.99);
    let mut groups: Vec<_> = tally.iter().collect();
    groups.sort();
    for (group, (ok, n)) in groups {
        let rate = *ok as f64 / *n as f64;
        println!("{group}: {ok}/{n} = {rate:.3}");
        let target = if *group == "tool_call_wellformed" {
            0.95
        } else {
            0.90
        };
        assert!(
            rate >= target,
            "{group}: {rate:.3} is below the target {target}"
        );
    }
    if python_missing {
        println!("python3 not found: the generated is_prime functions were not executed");
    } else {
        assert!(tally.contains_key("code_is_prime"));
    }
    for group in ["add2", "sub2", "prime", "tool_call_wellformed"] {
        assert!(
            tally.contains_key(group),
            "no held-out prompts of {group} were scored"
        );
    }
}

#[test]
fn demo_model_speculative_greedy_equals_plain_greedy() {
    let (greedy, plain, _) = plain_run();
    let (_, spec, usage) = speculative_run();
    let differing = differing_prompts(greedy, plain, spec);
    let accept_len = accept_length(usage);
    println!(
        "MTP k=3: {} drafted, {} accepted, accept length {accept_len:.2}",
        usage.draft_tokens, usage.accepted_draft_tokens
    );
    assert!(
        differing.is_empty(),
        "speculative greedy differs from plain greedy on {differing:?}"
    );
    assert!(
        usage.accepted_draft_tokens * 2 > usage.draft_tokens,
        "the trained MTP head should be accepted most of the time"
    );
}

/// `--speculative-draft-model-quantization fp8` on the demo model (the MTP layer and a draft head
/// of its own in block FP8, the trunk in bf16): greedy text equals plain greedy (verification is
/// the trunk's), and the drafts are accepted within 5 % as often as the bf16 head's.
#[test]
fn demo_model_draft_in_fp8_keeps_greedy_text_and_acceptance() {
    let (greedy, plain, _) = plain_run();
    let (_, _, bf16_usage) = speculative_run();
    let (_, spec, usage) = run(
        load(CpuBackend::new(0), Weighting::DraftFp8),
        Some(mtp_k3()),
    );
    let differing = differing_prompts(greedy, plain, &spec);
    let (bf16_accept, fp8_accept) = (accept_length(bf16_usage), accept_length(&usage));
    println!("MTP k=3 accept length: bf16 draft {bf16_accept:.3}, FP8 draft {fp8_accept:.3}");
    assert!(
        differing.is_empty(),
        "speculative greedy with an FP8 draft differs from plain greedy on {differing:?}"
    );
    assert!(
        fp8_accept >= bf16_accept * 0.95,
        "FP8 draft accept length {fp8_accept:.3} is more than 5 % below bf16's {bf16_accept:.3}"
    );
}

/// `--speculative-token-map` on the demo model, with a map of every id in reverse order but the
/// plain replies' most frequent token: greedy text equals plain greedy (verification runs the
/// trunk's whole head), and the drafts are still accepted at least half as often as the whole
/// head's (a draft head whose rows went back to the wrong ids would almost never be).
#[test]
fn demo_model_token_map_keeps_greedy_text() {
    let (greedy, plain, _) = plain_run();
    let (_, _, whole_usage) = speculative_run();
    let mut counts = std::collections::HashMap::<u32, usize>::new();
    for &id in plain.iter().flatten() {
        *counts.entry(id).or_default() += 1;
    }
    let (&left_out, &times) = counts
        .iter()
        .max_by_key(|&(&id, &n)| (n, std::cmp::Reverse(id)))
        .unwrap();
    let backend = CpuBackend::new(0);
    let vocab =
        deltaserve_model::config::ModelConfig::from_dir(&demo_eval::root().join("models/demo"))
            .unwrap()
            .vocab_size as u32;
    let map: Vec<u32> = (0..vocab).rev().filter(|&id| id != left_out).collect();
    let (_, spec, usage) = run(load_with_token_map(backend, map), Some(mtp_k3()));
    let differing = differing_prompts(greedy, plain, &spec);
    let (whole, mapped) = (accept_length(whole_usage), accept_length(&usage));
    println!(
        "MTP k=3 accept length: whole head {whole:.3}, map without token {left_out} \
         ({times} of the replies' tokens) {mapped:.3}"
    );
    assert!(
        differing.is_empty(),
        "speculative greedy with a token map differs from plain greedy on {differing:?}"
    );
    assert!(
        mapped >= whole * 0.5,
        "accept length {mapped:.3} with the token map is under half the whole head's {whole:.3}"
    );
}

/// `--quantization fp8` on the demo model (every linear weight but the embedding, lm_head, router,
/// GDN a/b projections and mtp.fc quantized to 128 x 128 block FP8): its held-out accuracy stays
/// within 2 points of bf16 and its MTP k=3 accept length within 5 %. One speculative run gives
/// both (speculative greedy equals plain greedy: the test above proves it for the same engine).
#[test]
#[ignore = "a third pass over the demo prompts (~100 s on 2 cores); run with --ignored, figures in docs/fp8.md"]
fn demo_model_quantized_to_fp8_keeps_its_accuracy_and_mtp_acceptance() {
    let (greedy, plain, _) = plain_run();
    let (_, _, bf16_usage) = speculative_run();
    let (_, fp8, fp8_usage) = run(load(CpuBackend::new(0), Weighting::Fp8), Some(mtp_k3()));
    assert_fp8_keeps_accuracy_and_acceptance(greedy, (plain, bf16_usage), (&fp8, &fp8_usage));
}
