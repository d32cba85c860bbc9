//! Collapse of distinct n-grams over a sliding window of word units: babble and near-periodic loops
//! that exact periodicity misses. Owns the two distinct-n measures and the sustain rule; the unit
//! segmentation is `words`, the verdict is assembled by the detector.
//!
//! Rules (see `Config` for the numbers):
//! - vocabulary collapse: at most `vocab_max_distinct_ratio` of the last `collapse_window` units are
//!   distinct (`prime prime primes prime number prime ...`, `yes no no yes ...`);
//! - phrase collapse: at most `phrase_max_distinct_ratio` of the window's `phrase_ngram`-grams are
//!   distinct (a sentence looping with a word changing here and there);
//! - either must hold for `collapse_sustain_units` more units after the window first collapses, or
//!   `collapse_sustain_units_symbolic` when most units are numbers, single letters or symbols
//!   (0/1 matrices, bit strings and grids of check marks collapse legitimately, but not for long).
//!
//! What stays below: prose (distinct-1 around 0.5, distinct-4 near 1), counting and tables of numbers
//! (each line brings new numbers), code with similar lines (indices and names change), logs (timestamps
//! change), tables and JSON arrays (cell values change), a refrain between verses.

use crate::config::Config;
use crate::ngram_window::NgramWindow;
use crate::verdict::Rule;
use crate::words::WordUnit;

/// A sustained collapse.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CollapseHit {
    pub rule: Rule,
    pub ngram: u32,
    pub distinct_ratio: f64,
    /// Char offset of the first unit of the first collapsed window.
    pub start_char: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct CollapseDetector {
    window: usize,
    vocab: NgramWindow,
    vocab_limit: usize,
    phrase: NgramWindow,
    phrase_n: usize,
    phrase_limit: usize,
    /// Ring of the last `window` units: whether each was wordy, where each began.
    wordy: Vec<bool>,
    unit_starts: Vec<u64>,
    units_seen: u64,
    wordy_in_window: usize,
    min_wordy: usize,
    sustain: usize,
    sustain_symbolic: usize,
    /// Units read since the window last was healthy (0 = healthy now).
    collapsed_for: usize,
    collapse_start_char: u64,
}

impl CollapseDetector {
    pub(crate) fn new(config: &Config) -> Self {
        let window = config.collapse_window;
        let limit = |ratio: f64| (ratio * window as f64).floor() as usize;
        Self {
            window,
            vocab: NgramWindow::new(1, window),
            vocab_limit: limit(config.vocab_max_distinct_ratio),
            phrase: NgramWindow::new(config.phrase_ngram, window),
            phrase_n: config.phrase_ngram,
            phrase_limit: limit(config.phrase_max_distinct_ratio),
            wordy: vec![false; window],
            unit_starts: vec![0; window],
            units_seen: 0,
            wordy_in_window: 0,
            min_wordy: (config.min_wordy_fraction * window as f64).ceil() as usize,
            sustain: config.collapse_sustain_units,
            sustain_symbolic: config.collapse_sustain_units_symbolic,
            collapsed_for: 0,
            collapse_start_char: 0,
        }
    }

    pub(crate) fn reset(&mut self) {
        self.vocab.reset();
        self.phrase.reset();
        self.wordy.fill(false);
        self.unit_starts.fill(0);
        self.units_seen = 0;
        self.wordy_in_window = 0;
        self.collapsed_for = 0;
        self.collapse_start_char = 0;
    }

    /// Reads one unit; returns a hit once a collapse has been sustained long enough.
    pub(crate) fn push(&mut self, unit: WordUnit) -> Option<CollapseHit> {
        let slot = (self.units_seen % self.window as u64) as usize;
        if self.units_seen >= self.window as u64 && self.wordy[slot] {
            self.wordy_in_window -= 1;
        }
        self.wordy[slot] = unit.wordy;
        self.unit_starts[slot] = unit.start_char;
        self.wordy_in_window += usize::from(unit.wordy);
        self.units_seen += 1;

        let vocab = self.vocab.push(unit.hash);
        let phrase = self.phrase.push(unit.hash);
        let collapsed_rule = match (vocab, phrase) {
            (Some(d), _) if d <= self.vocab_limit => Some((Rule::VocabularyCollapse, 1, d)),
            (_, Some(d)) if d <= self.phrase_limit => {
                Some((Rule::PhraseCollapse, self.phrase_n as u32, d))
            }
            _ => None,
        };
        let Some((rule, ngram, distinct)) = collapsed_rule else {
            self.collapsed_for = 0;
            return None;
        };
        if self.collapsed_for == 0 {
            // The oldest unit of the window is the next slot to be overwritten.
            let oldest = (self.units_seen % self.window as u64) as usize;
            self.collapse_start_char = self.unit_starts[oldest];
        }
        self.collapsed_for += 1;
        let sustain = if self.wordy_in_window >= self.min_wordy {
            self.sustain
        } else {
            self.sustain_symbolic
        };
        (self.collapsed_for > sustain).then(|| CollapseHit {
            rule,
            ngram,
            distinct_ratio: distinct as f64 / self.window as f64,
            start_char: self.collapse_start_char,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::words::WordSegmenter;

    /// Feeds `text` as word units; returns the unit count at the first hit and the hit.
    fn first_hit(text: &str, config: &Config) -> Option<(usize, CollapseHit)> {
        let mut segmenter = WordSegmenter::default();
        let mut detector = CollapseDetector::new(config);
        let mut units = 0;
        let mut hit = None;
        let mut emit = |u: WordUnit| {
            units += 1;
            if hit.is_none() {
                hit = detector.push(u).map(|h| (units, h));
            }
        };
        for (i, c) in text.chars().enumerate() {
            segmenter.push(c, i as u64, i as u64, &mut emit);
        }
        segmenter.flush(&mut emit);
        hit
    }

    /// Deterministic pseudo-random choice.
    fn pick<'a>(state: &mut u64, options: &[&'a str]) -> &'a str {
        *state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        options[(*state >> 33) as usize % options.len()]
    }

    #[test]
    fn babble_of_few_words_collapses_the_vocabulary() {
        let mut state = 1;
        let text: Vec<&str> = (0..400)
            .map(|_| {
                pick(
                    &mut state,
                    &["prime", "prime", "primes", "number", "prime,"],
                )
            })
            .collect();
        let (units, hit) = first_hit(&text.join(" "), &Config::default()).expect("collapse");
        assert_eq!(hit.rule, Rule::VocabularyCollapse);
        assert_eq!(units, 128 + 32);
        assert_eq!(hit.start_char, 0);
    }

    #[test]
    fn a_loop_with_variations_collapses_the_phrases() {
        let mut state = 5;
        let mut text = String::from("Let me think about how to add these numbers carefully. ");
        for _ in 0..40 {
            text += &format!(
                "The {} of two plus two is {} so the {} is correct. ",
                pick(&mut state, &["sum", "result", "total"]),
                pick(&mut state, &["four", "4", "four"]),
                pick(&mut state, &["answer", "answer", "result"]),
            );
        }
        let (_, hit) = first_hit(&text, &Config::default()).expect("collapse");
        assert_eq!(hit.rule, Rule::PhraseCollapse);
        assert_eq!(hit.ngram, 4);
        assert!(hit.distinct_ratio <= 0.25);
        assert!(
            hit.start_char > 0,
            "the healthy opening is not part of the collapse"
        );
    }

    #[test]
    fn counting_prose_and_code_do_not_collapse() {
        let counting: Vec<String> = (1..=400).map(|i| i.to_string()).collect();
        assert_eq!(first_hit(&counting.join(", "), &Config::default()), None);
        let code: String = (0..200).map(|i| format!("x[{i}] = {}\n", i * i)).collect();
        assert_eq!(first_hit(&code, &Config::default()), None);
        let table: String = (1..=12)
            .flat_map(|a| (1..=12).map(move |b| format!("{a} x {b} = {}\n", a * b)))
            .collect();
        assert_eq!(first_hit(&table, &Config::default()), None);
    }

    #[test]
    fn symbolic_windows_need_a_longer_sustain() {
        // A 0/1 matrix collapses its vocabulary but is mostly numbers: 12 x 12 stays healthy...
        let mut state = 3;
        let matrix = |rows: usize, state: &mut u64| -> String {
            (0..rows)
                .map(|_| {
                    let row: Vec<&str> = (0..rows).map(|_| pick(state, &["0", "1"])).collect();
                    row.join(" ") + "\n"
                })
                .collect()
        };
        assert_eq!(first_hit(&matrix(12, &mut state), &Config::default()), None);
        // ...but a 0/1 stream that goes on for hundreds of units does not.
        let (units, _) = first_hit(&matrix(40, &mut state), &Config::default()).expect("collapse");
        assert_eq!(units, 128 + 384);
    }
}
