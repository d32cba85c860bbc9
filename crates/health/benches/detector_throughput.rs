//! Throughput of the streaming degeneration detector in ns per token (no assertions: timings vary by
//! machine). Run with `cargo bench -p deltaserve-health`; a path argument replaces the corpus file
//! (for running the built binary elsewhere).

use deltaserve_health::{
    pseudo_token_id, Config, DegenerationDetector, PseudoTokenizer, StreamEnd,
};
use serde_json::Value;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

fn healthy_texts() -> Vec<String> {
    let path = std::env::args()
        .skip(1)
        .find(|arg| !arg.starts_with("--"))
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/data/degeneration/corpus.jsonl")
        });
    let corpus = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    corpus
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|item| item["label"] == "healthy")
        .filter_map(|item| item["text"].as_str().map(str::to_owned))
        .collect()
}

/// Pre-tokenised requests: (id, piece) per token.
fn tokenise(texts: &[String], tokenizer: PseudoTokenizer) -> Vec<Vec<(u32, &str)>> {
    texts
        .iter()
        .map(|t| {
            tokenizer
                .pieces(t)
                .map(|p| (pseudo_token_id(p), p))
                .collect()
        })
        .collect()
}

fn measure(name: &str, requests: &[Vec<(u32, &str)>], config: &Config) {
    let mut detector = DegenerationDetector::new(config.clone()).expect("valid config");
    let tokens: usize = requests.iter().map(Vec::len).sum();
    let chars: usize = requests
        .iter()
        .flatten()
        .map(|(_, p)| p.chars().count())
        .sum();
    let mut best = f64::INFINITY;
    let mut verdicts = 0;
    for _ in 0..7 {
        verdicts = 0;
        let start = Instant::now();
        for request in requests {
            detector.reset();
            for &(id, piece) in request {
                black_box(detector.push(id, piece));
            }
            verdicts += usize::from(detector.finish(StreamEnd::Unknown).is_some());
        }
        best = best.min(start.elapsed().as_secs_f64());
    }
    println!(
        "{name:<44} {tokens:>8} tokens {chars:>9} chars  {:>7.1} ns/token {:>6.1} ns/char  ({verdicts} verdicts)",
        best * 1e9 / tokens as f64,
        best * 1e9 / chars as f64,
    );
}

fn main() {
    let config = Config::default();
    let texts = healthy_texts();
    let one_stream = vec![texts.concat()];
    let symbolic = vec![(0..4000)
        .map(|i| {
            format!(
                "2024-06-01T08:{:02}:{:02},greenhouse-2,21.5,64\n",
                i / 60 % 60,
                i % 60
            )
        })
        .collect::<String>()];
    let arabic_numerals = vec![(1..20_000).map(|i| format!("{i}, ")).collect::<String>()];
    for tokenizer in [PseudoTokenizer::WordPieces, PseudoTokenizer::CharChunks(3)] {
        println!("{tokenizer:?}:");
        measure(
            "healthy corpus items, one request each",
            &tokenise(&texts, tokenizer),
            &config,
        );
        measure(
            "healthy corpus as one long request",
            &tokenise(&one_stream, tokenizer),
            &config,
        );
        measure(
            "4000 near-identical CSV lines",
            &tokenise(&symbolic, tokenizer),
            &config,
        );
        measure(
            "counting to 20000",
            &tokenise(&arabic_numerals, tokenizer),
            &config,
        );
    }
}
