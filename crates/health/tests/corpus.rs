//! The detector against the labelled corpus in tests/data/degeneration (made by
//! scripts/make_degeneration_corpus.py), streamed under two pseudo-tokenisations, and the founding
//! failure's outputs (docs/serving.md) checked for how early they fire. Run with `--nocapture` to
//! see the numbers: precision and recall over all texts and over the short ones (a reply cut by a
//! small `max_tokens`), every miss and every false alarm.

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

/// Texts up to this many bytes are reported apart: the size of a reply cut by a small `max_tokens`,
/// where a loop has had little room to repeat.
const SHORT_BYTES: usize = 512;

fn ratio(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        1.0
    } else {
        part as f64 / whole as f64
    }
}

/// Verdict counts over a set of items.
#[derive(Debug, Default, Clone, Copy)]
struct Score {
    tp: usize,
    fp: usize,
    fn_: usize,
    tn: usize,
}

impl Score {
    fn add(&mut self, degenerate: bool, flagged: bool) {
        match (degenerate, flagged) {
            (true, true) => self.tp += 1,
            (true, false) => self.fn_ += 1,
            (false, true) => self.fp += 1,
            (false, false) => self.tn += 1,
        }
    }

    /// Of the flagged items, the share that is degenerate (1 when nothing was flagged).
    fn precision(&self) -> f64 {
        ratio(self.tp, self.tp + self.fp)
    }

    /// Of the degenerate items, the share that was flagged (1 when there are none).
    fn recall(&self) -> f64 {
        ratio(self.tp, self.tp + self.fn_)
    }

    fn line(&self) -> String {
        format!(
            "precision {:.4} recall {:.4} (tp {}, fp {}, fn {}, tn {})",
            self.precision(),
            self.recall(),
            self.tp,
            self.fp,
            self.fn_,
            self.tn
        )
    }
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
    let short_items = items.iter().filter(|i| i.text.len() <= SHORT_BYTES);
    let short_degenerate = short_items
        .clone()
        .filter(|i| i.label == "degenerate")
        .count();
    println!(
        "corpus: {} items, {healthy} healthy, {degenerate} degenerate; {} of at most {SHORT_BYTES} \
         bytes ({short_degenerate} degenerate)",
        items.len(),
        short_items.count()
    );

    let mut detector = DegenerationDetector::new(corpus_config()).unwrap();
    let mut scores = Vec::new();
    for tokenizer in [PseudoTokenizer::WordPieces, PseudoTokenizer::CharChunks(3)] {
        let (mut all, mut short_texts) = (Score::default(), Score::default());
        let mut kinds: BTreeMap<(String, &'static str), usize> = BTreeMap::new();
        let mut report = Vec::new();
        for item in &items {
            stream(&mut detector, &item.text, tokenizer);
            let verdict = detector.finish(StreamEnd::Unknown).cloned();
            let is_degenerate = item.label == "degenerate";
            all.add(is_degenerate, verdict.is_some());
            if item.text.len() <= SHORT_BYTES {
                short_texts.add(is_degenerate, verdict.is_some());
            }
            match (is_degenerate, &verdict) {
                (true, Some(v)) => {
                    let expected = item.kind.clone().unwrap_or_default();
                    *kinds.entry((expected, v.kind.as_str())).or_default() += 1;
                }
                (true, None) => report.push(format!("  missed   {}: {}", item.id, item.note)),
                (false, Some(v)) => report.push(format!("  false +  {}: {}", item.id, short(v))),
                (false, None) => {}
            }
        }
        println!("{tokenizer:?}: all texts:   {}", all.line());
        println!(
            "{tokenizer:?}: short texts: {} (at most {SHORT_BYTES} bytes)",
            short_texts.line()
        );
        for line in &report {
            println!("{line}");
        }
        for ((expected, got), n) in &kinds {
            println!("  labelled {expected:<18} reported {got:<18} {n}");
        }
        scores.push((tokenizer, all, short_texts));
    }
    for (tokenizer, all, short_texts) in scores {
        assert_eq!(all.fp, 0, "{tokenizer:?}: a healthy item was flagged");
        assert!(
            all.recall() >= 0.95,
            "{tokenizer:?}: recall {:.4} < 0.95",
            all.recall()
        );
        assert!(
            short_texts.recall() >= 0.95,
            "{tokenizer:?}: recall on short texts {:.4} < 0.95",
            short_texts.recall()
        );
    }
}

/// The short texts under each way a stream can end. A loop that ran into `max_tokens`
/// (`finish_reason: "length"`) was always flagged; a stored text whose end is unknown (what
/// `lint-output` reads from a text file) now is too; a model that stopped by itself ended its own
/// repetition, so nothing short is flagged then. Healthy texts told they were cut by the length
/// limit may be flagged (a divider or ten requested lines that ran into the limit): printed, not
/// asserted.
#[test]
fn short_texts_by_how_the_stream_ended() {
    let items = corpus();
    let short_items: Vec<&Item> = items
        .iter()
        .filter(|i| i.text.len() <= SHORT_BYTES)
        .collect();
    let mut detector = DegenerationDetector::new(corpus_config()).unwrap();
    for end in [StreamEnd::Length, StreamEnd::Unknown, StreamEnd::Stop] {
        let mut score = Score::default();
        let mut flagged_healthy = Vec::new();
        for item in &short_items {
            stream(&mut detector, &item.text, PseudoTokenizer::WordPieces);
            let flagged = detector.finish(end).is_some();
            score.add(item.label == "degenerate", flagged);
            if flagged && item.label == "healthy" {
                flagged_healthy.push(item.id.as_str());
            }
        }
        println!("{end:?}: short texts: {}", score.line());
        if !flagged_healthy.is_empty() {
            println!("  healthy flagged: {}", flagged_healthy.join(", "));
        }
        match end {
            StreamEnd::Length | StreamEnd::Unknown => assert_eq!(score.fn_, 0, "{end:?}"),
            StreamEnd::Stop => assert_eq!(score.tp + score.fp, 0, "{end:?}"),
        }
        if end != StreamEnd::Length {
            assert_eq!(score.fp, 0, "{end:?}");
        }
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
