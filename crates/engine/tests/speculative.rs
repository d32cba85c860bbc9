//! MTP speculative decoding end to end on tiny random checkpoints with an MTP head: greedy output
//! equals non-speculative greedy output token for token (k = 1, 2, 3, many requests joining and
//! leaving), a drafter that proposes wrong tokens changes nothing, rollback restores the GDN state
//! bitwise, and speculative sampling keeps the token distribution (chi-square).

mod common;

use common::{config, fixture_model, spec};
use deltaserve_engine::*;
use deltaserve_model::{CacheGeometry, ForwardInput, HybridCache, Model};
use deltaserve_tensor::reference::ReferenceBackend;
use deltaserve_tensor::{BatchLayout, SeqLayout};
use std::collections::HashMap;

fn model(fixture: &str) -> Model<ReferenceBackend> {
    fixture_model(fixture)
}

fn prompt(i: usize) -> Vec<u32> {
    (0..(3 + 5 * i) as u32)
        .map(|t| (t * 53 + i as u32 * 29 + 7) % 256)
        .collect()
}

fn request(prompt: Vec<u32>, max_new: usize, sampling: SamplingParams) -> GenerationRequest {
    GenerationRequest {
        prompt_ids: prompt,
        sampling,
        max_new_tokens: max_new,
        stop_token_ids: vec![],
        disable_speculation: false,
    }
}

fn collect(rx: EventReceiver) -> (Vec<u32>, Usage) {
    let done = common::collect(rx);
    (done.tokens, done.usage)
}

/// Runs requests with staggered arrivals: half are submitted first, the rest after the first
/// finishes, so sequences join and leave a running batch.
fn run_all(engine: &LocalEngine, requests: Vec<GenerationRequest>) -> Vec<(Vec<u32>, Usage)> {
    let half = (requests.len() / 2).max(1);
    let mut results = vec![None; requests.len()];
    let mut pending: Vec<(usize, EventReceiver)> = Vec::new();
    for (i, r) in requests.iter().enumerate().take(half) {
        pending.push((i, engine.submit(r.clone()).unwrap().1));
    }
    let (first, rx) = pending.remove(0);
    results[first] = Some(collect(rx));
    for (i, r) in requests.iter().enumerate().skip(half) {
        pending.push((i, engine.submit(r.clone()).unwrap().1));
    }
    for (i, rx) in pending {
        results[i] = Some(collect(rx));
    }
    results.into_iter().map(|r| r.unwrap()).collect()
}

#[test]
fn greedy_speculation_equals_plain_greedy() {
    for fixture in ["qwen35_f32", "qwen35_moe"] {
        let m = model(fixture);
        for batch in [1usize, 3, 8] {
            let requests: Vec<_> = (0..batch)
                .map(|i| request(prompt(i), 24, SamplingParams::default()))
                .collect();
            let expected: Vec<Vec<u32>> = requests
                .iter()
                .map(|r| m.generate_greedy(&r.prompt_ids, 24, &[], &mut |_| {}))
                .collect();
            // An oracle that knows each request's greedy continuation but lies at every third
            // position, so verification sees full, partial and zero acceptance.
            let continuations: Vec<Vec<u32>> = requests
                .iter()
                .zip(&expected)
                .map(|(r, e)| [r.prompt_ids.clone(), e.clone()].concat())
                .collect();
            let oracle =
                DraftFault::Scripted(DraftScript(std::sync::Arc::new(move |so_far: &[u32]| {
                    let truth = continuations
                        .iter()
                        .find(|c| c.len() > so_far.len() && c[..so_far.len()] == *so_far);
                    match truth {
                        Some(c) if !so_far.len().is_multiple_of(3) => c[so_far.len()],
                        _ => (so_far.len() as u32 * 7) % 256,
                    }
                })));
            for k in 1..=3 {
                for fault in [DraftFault::None, DraftFault::WrongTokens, oracle.clone()] {
                    let engine = LocalEngine::spawn(model(fixture), config(spec(k, fault.clone())));
                    let results = run_all(&engine, requests.clone());
                    let drafted: usize = results.iter().map(|r| r.1.draft_tokens).sum();
                    for (i, (tokens, _)) in results.iter().enumerate() {
                        assert_eq!(
                            tokens, &expected[i],
                            "{fixture} k={k} {fault:?} batch={batch}: request {i} differs"
                        );
                    }
                    assert!(drafted > 0, "{fixture} k={k}: nothing was drafted");
                    let accepted: usize = results.iter().map(|r| r.1.accepted_draft_tokens).sum();
                    if matches!(fault, DraftFault::Scripted(_)) {
                        assert!(accepted * 3 > drafted, "{fixture} k={k}: the oracle's drafts were mostly rejected ({accepted}/{drafted})");
                    }
                    println!("{fixture} batch={batch} k={k} {fault:?}: drafted {drafted}, accepted {accepted}");
                }
            }
        }
    }
}

#[test]
fn speculation_can_be_turned_off_per_request() {
    let engine = LocalEngine::spawn(model("qwen35_f32"), config(spec(2, DraftFault::None)));
    let mut r = request(prompt(2), 16, SamplingParams::default());
    r.disable_speculation = true;
    let (tokens, usage) = collect(engine.submit(r).unwrap().1);
    assert_eq!(usage.draft_tokens, 0);
    assert_eq!(
        tokens,
        model("qwen35_f32").generate_greedy(&prompt(2), 16, &[], &mut |_| {})
    );
}

/// Verify 4 tokens with snapshots, roll back to "1 accepted", and compare every GDN layer's state
/// with a run that only ever saw those tokens: bitwise equal on the reference backend.
#[test]
fn rollback_restores_the_recurrent_state_bitwise() {
    let m = model("qwen35_f32");
    let geometry = CacheGeometry {
        num_blocks: 16,
        block_size: 4,
        state_slots: 6,
        mtp: false,
    };
    let prompt = prompt(3);
    let verify_tokens = [11u32, 200, 3, 97];
    let blocks: Vec<u32> = (0..16).collect();
    let run = |cache: &mut HybridCache<ReferenceBackend>,
               tokens: &[u32],
               pos: usize,
               snapshots: Vec<usize>| {
        let seq = SeqLayout {
            start: 0,
            len: tokens.len(),
            pos,
            blocks: blocks.clone(),
            slot: 0,
            snapshot_slots: snapshots,
        };
        let batch = BatchLayout {
            seqs: vec![seq],
            block_size: 4,
        };
        m.forward(
            &ForwardInput {
                tokens,
                batch: &batch,
                logit_rows: &[0],
                hidden_rows: &[],
            },
            cache,
        );
    };
    let mut speculative = HybridCache::new(&m.backend, &m.config, geometry);
    run(&mut speculative, &prompt, 0, vec![]);
    run(
        &mut speculative,
        &verify_tokens,
        prompt.len(),
        vec![1, 2, 3, 4],
    );
    speculative.copy_slot(&m.backend, 2, 0);

    let mut plain = HybridCache::new(&m.backend, &m.config, geometry);
    run(&mut plain, &prompt, 0, vec![]);
    for (i, &t) in verify_tokens[..2].iter().enumerate() {
        run(&mut plain, &[t], prompt.len() + i, vec![]);
    }
    for (layer, (a, b)) in speculative.state.iter().zip(&plain.state).enumerate() {
        let (ssm, conv) = (a.ssm_slot_len(), a.conv_slot_len());
        assert!(
            a.ssm[..ssm] == b.ssm[..ssm],
            "GDN layer {layer}: recurrent state differs after rollback"
        );
        assert!(
            a.conv[..conv] == b.conv[..conv],
            "GDN layer {layer}: conv window differs after rollback"
        );
    }
}

/// Two-sample chi-square over the first two sampled tokens (top-k 3, so 9 outcomes) of many seeded
/// requests, with and without speculation: the distributions must agree.
#[test]
fn speculative_sampling_keeps_the_distribution() {
    let sampling = |seed| SamplingParams {
        temperature: 1.0,
        top_k: 3,
        seed: Some(seed),
        ..Default::default()
    };
    let n = 1500;
    let histogram = |speculative: Option<SpecConfig>| -> HashMap<(u32, u32), usize> {
        let engine = LocalEngine::spawn(model("qwen35_f32"), config(speculative));
        let mut counts = HashMap::new();
        for chunk in (0..n as u64).collect::<Vec<_>>().chunks(64) {
            let rxs: Vec<_> = chunk
                .iter()
                .map(|&s| engine.submit(request(prompt(1), 2, sampling(s))).unwrap().1)
                .collect();
            for rx in rxs {
                let (t, _) = collect(rx);
                *counts.entry((t[0], t[1])).or_insert(0) += 1;
            }
        }
        counts
    };
    let plain = histogram(None);
    let spec_counts = histogram(spec(1, DraftFault::None));
    let keys: std::collections::BTreeSet<_> =
        plain.keys().chain(spec_counts.keys()).copied().collect();
    let mut chi2 = 0.0;
    for key in &keys {
        let (a, b) = (
            *plain.get(key).unwrap_or(&0) as f64,
            *spec_counts.get(key).unwrap_or(&0) as f64,
        );
        if a + b > 0.0 {
            chi2 += (a - b).powi(2) / (a + b);
        }
    }
    let dof = keys.len() - 1;
    println!(
        "chi-square {chi2:.2} with {dof} degrees of freedom over {} outcomes",
        keys.len()
    );
    assert!(
        keys.len() <= 9,
        "top-k 3 allows at most 9 outcomes, saw {}",
        keys.len()
    );
    // 26.12 is the 0.001 critical value for 8 degrees of freedom (fewer outcomes only lower it).
    assert!(chi2 < 26.12, "speculative sampling changed the distribution: chi-square {chi2}\nplain {plain:?}\nspec {spec_counts:?}");
}
