//! The detector against the labelled corpus in tests/data/degeneration (made by
//! scripts/make_degeneration_corpus.py), streamed under two pseudo-tokenisations, and the founding
//! failure's outputs (docs/serving.md) checked for how early they fire. Run with `--nocapture` to
//! see the numbers.

use deltaserve_health::{
    pseudo_token_id, Config, DegenerationDetector, DegenerationKind, PseudoTokenizer, StreamEnd,
    Verdict,
};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Deserialize)]
struct Item {
    id: String,
    label: String,
    kind: Option<String>,
    text: String,
    note: String,
}

fn corpus() -> Vec<Item> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/degeneration/corpus.jsonl");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), i + 1))
        })
        .collect()
}

/// The corpus keeps its items a few thousand characters long, so it uses a reasoning budget of 1000
/// tokens instead of the default 16384 (the budget is a deployment policy, not a property of text).
/// Everything else is the default configuration.
fn corpus_config() -> Config {
    Config {
        reasoning_budget_tokens: Some(1000),
        ..Config::default()
    }
}

fn stream(detector: &mut DegenerationDetector, text: &str, tokenizer: PseudoTokenizer) {
    detector.reset();
    for piece in tokenizer.pieces(text) {
        if detector.push(pseudo_token_id(piece), piece).is_some() {
            break;
        }
    }
}

fn short(verdict: &Verdict) -> String {
    let mut line = verdict.to_string();
    if line.chars().count() > 200 {
        line = line.chars().take(200).collect::<String>() + "...";
    }
    line
}

#[test]
fn corpus_precision_and_recall() {
    let items = corpus();
    let healthy = items.iter().filter(|i| i.label == "healthy").count();
    let degenerate = items.iter().filter(|i| i.label == "degenerate").count();
    assert_eq!(
        healthy + degenerate,
        items.len(),
        "labels are healthy or degenerate"
    );
    assert!(items.len() >= 200, "corpus has {} items", items.len());
    assert!(
        healthy >= 100 && degenerate >= 100,
        "{healthy} healthy, {degenerate} degenerate"
    );
    println!(
        "corpus: {} items, {healthy} healthy, {degenerate} degenerate",
        items.len()
    );

    let mut detector = DegenerationDetector::new(corpus_config()).unwrap();
    for tokenizer in [PseudoTokenizer::WordPieces, PseudoTokenizer::CharChunks(3)] {
        let (mut tp, mut fp, mut fn_, mut tn) = (0usize, 0usize, 0usize, 0usize);
        let mut kinds: BTreeMap<(String, &'static str), usize> = BTreeMap::new();
        let mut report = Vec::new();
        for item in &items {
            stream(&mut detector, &item.text, tokenizer);
            let verdict = detector.finish(StreamEnd::Unknown).cloned();
            match (item.label == "degenerate", &verdict) {
                (true, Some(v)) => {
                    tp += 1;
                    let expected = item.kind.clone().unwrap_or_default();
                    *kinds.entry((expected, v.kind.as_str())).or_default() += 1;
                }
                (true, None) => {
                    fn_ += 1;
                    report.push(format!("  missed   {}: {}", item.id, item.note));
                }
                (false, Some(v)) => {
                    fp += 1;
                    report.push(format!("  false +  {}: {}", item.id, short(v)));
                }
                (false, None) => tn += 1,
            }
        }
        let precision = tp as f64 / (tp + fp).max(1) as f64;
        let recall = tp as f64 / (tp + fn_).max(1) as f64;
        println!(
            "{tokenizer:?}: precision {precision:.4} recall {recall:.4} \
             (tp {tp}, fp {fp}, fn {fn_}, tn {tn})"
        );
        for line in &report {
            println!("{line}");
        }
        for ((expected, got), n) in &kinds {
            println!("  labelled {expected:<18} reported {got:<18} {n}");
        }
        assert!(
            precision >= 0.98,
            "{tokenizer:?}: precision {precision:.4} < 0.98"
        );
        assert!(recall >= 0.95, "{tokenizer:?}: recall {recall:.4} < 0.95");
    }
}

/// Streams `opening` + `looped` and returns (token index of the loop's first token, token index
/// where the detector fired, the verdict).
fn fire_point(opening: &str, looped: &str, tokenizer: PseudoTokenizer) -> (u64, u64, Verdict) {
    let text = format!("{opening}{looped}");
    let mut detector = DegenerationDetector::new(Config::default()).unwrap();
    let mut consumed = 0;
    let mut loop_start = None;
    for piece in tokenizer.pieces(&text) {
        if consumed >= opening.len() && loop_start.is_none() {
            loop_start = Some(detector.tokens_seen());
        }
        consumed += piece.len();
        if detector.push(pseudo_token_id(piece), piece).is_some() {
            break;
        }
    }
    let verdict = detector.verdict().cloned().expect("the loop is flagged");
    (loop_start.unwrap_or(0), verdict.detected_at_token, verdict)
}

#[test]
fn founding_failure_examples_fire_early() {
    let cases = [
        (
            "We are tasked with a simple arithmetic problem: ",
            "2 + 2 = 2.".repeat(400),
            "2 + 2 = 2.",
        ),
        ("", "prime ".repeat(1000), "prime "),
    ];
    for (opening, looped, unit) in &cases {
        for tokenizer in [PseudoTokenizer::WordPieces, PseudoTokenizer::CharChunks(3)] {
            let (start, fired, verdict) = fire_point(opening, looped, tokenizer);
            println!(
                "{:?} under {tokenizer:?}: loop starts at token {start}, fires at token {fired} \
                 ({} tokens into the loop, {} chars): {}",
                unit,
                fired - start,
                verdict.detected_at_char - opening.len() as u64,
                short(&verdict)
            );
            assert_eq!(verdict.kind, DegenerationKind::PeriodicLoop);
            assert_eq!(verdict.evidence.start_char, opening.len() as u64);
            assert!(
                fired - start <= 300,
                "{unit:?}: fired {} tokens into the loop",
                fired - start
            );
        }
    }
}
