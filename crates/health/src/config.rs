//! Thresholds of the degeneration detector, their documented defaults and their validation.
//! Owns only the numbers and what they mean; the detectors that read them live in their own files.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Every threshold of [`crate::DegenerationDetector`].
///
/// Lengths called `*_bytes` are measured in UTF-8 bytes of the generated text, which follows the
/// token count across scripts better than characters do (an English token is about 4 bytes, a CJK
/// token about one character of 3 bytes); a token whose text delta is empty (a special token, part
/// of a UTF-8 sequence) counts as one byte, so a loop of invisible tokens is still measured.
/// "Symbolic" means the repeated unit contains no letter at all (digits, punctuation, whitespace,
/// emoji): such units are what legitimate structured output repeats (dividers, zero rows, table
/// rules), so they must cover more text before they count as a loop.
///
/// # The periodic-loop rules
/// A suffix of the output that is exactly periodic with period `p` (in characters, in token ids or
/// in words) and covers `L` bytes has (covered length / `p`) repeats. It is a loop when
/// - it repeats at least [`many_repeats`](Self::many_repeats) times and covers at least
///   [`short_loop_bytes`](Self::short_loop_bytes) (symbolic: [`short_loop_bytes_symbolic`](Self::short_loop_bytes_symbolic)),
///   which catches `prime prime prime ...` and `2 + 2 = 2.2 + 2 = 2. ...` within a few hundred
///   bytes; or
/// - it repeats at least [`min_repeats`](Self::min_repeats) times and covers at least
///   [`long_loop_bytes`](Self::long_loop_bytes) (symbolic: [`long_loop_bytes_symbolic`](Self::long_loop_bytes_symbolic)),
///   which catches a repeated sentence or paragraph.
///
/// So the minimum number of repeats shrinks as the period grows: `max(min_repeats, long / p)`, and a
/// short unit must repeat `many_repeats` times. What stays below: a word the user asked for five or
/// ten times, a divider line, a row of a small empty grid, a refrain (its verses break the period),
/// and anything that increments (counting, tables of numbers, `x[0] = 0`, logs with timestamps),
/// because a changing number breaks exact periodicity at once. What is flagged although it may be
/// wanted: a unit the user asked for more than `many_repeats` times over `short_loop_bytes`, and
/// long runs of one symbolic unit (a zero array of more than about a hundred elements, a divider
/// longer than `short_loop_bytes_symbolic`).
///
/// # The end-of-text rules
/// A short reply cut by `max_tokens` leaves a loop little room to repeat, so the rules above miss it.
/// What gives it away is that the text ends inside the loop: the loop was still running when the
/// stream stopped. At the end of a stream that did not stop by itself ([`StreamEnd::Length`] or
/// [`StreamEnd::Unknown`], never [`StreamEnd::Stop`]), the periodic stretch that reaches the last
/// character (with its shortest period) is a loop when
/// - its unit contains a letter or an emoji, it repeats at least
///   [`end_loop_min_repeats`](Self::end_loop_min_repeats) times and covers at least
///   [`end_loop_min_bytes`](Self::end_loop_min_bytes) (`Okay. Actually, Actually, ...` 24 times); or
///   its unit has neither and it repeats [`end_loop_min_repeats_symbolic`](Self::end_loop_min_repeats_symbolic)
///   times over [`end_loop_min_bytes_symbolic`](Self::end_loop_min_bytes_symbolic) (a line of 230
///   `=`, 200 newlines); or
/// - the text ends in the middle of a word of it (the last character and the one the loop would write
///   next are both letters or digits, and the unit holds a letter and a separator), it repeats
///   `min_repeats` times and covers [`mid_word_min_bytes`](Self::mid_word_min_bytes): a sentence
///   repeated ten times whose tenth copy stops at `Thur`.
///
/// What stays below: ten requested lines or sentences that end the reply at a whole copy, a few
/// `ha ha ha` or emoji, dividers, repeating decimals and bit patterns shorter than 200 characters,
/// and any text cut mid-word outside a loop. What is flagged although it may be wanted, when the
/// model's own stop is not known: a reply that ends in `end_loop_min_repeats` or more copies of a
/// requested word or line over `end_loop_min_bytes` (`Hello World` fifteen times, nothing after it).
///
/// [`StreamEnd::Length`]: crate::StreamEnd::Length
/// [`StreamEnd::Unknown`]: crate::StreamEnd::Unknown
/// [`StreamEnd::Stop`]: crate::StreamEnd::Stop
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// Longest loop period looked for on the text, in characters (cost per character is linear in it).
    pub max_period_chars: usize,
    /// Longest loop period looked for on token ids (a loop of tokens with empty text, long loops).
    pub max_period_tokens: usize,
    /// Longest loop period looked for on word units (paragraph loops longer than `max_period_chars`,
    /// however the text was tokenised; only units that contain a word count there).
    pub max_period_words: usize,
    /// Fewest repeats any loop needs, whatever its length.
    pub min_repeats: u32,
    /// Repeats after which a short unit counts as a loop once it covers `short_loop_bytes`.
    pub many_repeats: u32,
    /// Covered bytes for the `many_repeats` rule when the unit contains a letter.
    pub short_loop_bytes: usize,
    /// Covered bytes for the `many_repeats` rule when the unit has no letter.
    pub short_loop_bytes_symbolic: usize,
    /// Covered bytes for the `min_repeats` rule when the unit contains a letter.
    pub long_loop_bytes: usize,
    /// Covered bytes for the `min_repeats` rule when the unit has no letter.
    pub long_loop_bytes_symbolic: usize,
    /// At the end of a stream cut by `max_tokens`, a trailing loop with at least this many repeats...
    pub length_cut_min_repeats: u32,
    /// ...covering at least this many bytes is reported: a loop that runs into the length limit.
    pub length_cut_min_bytes: usize,
    /// At the end of a stream that did not stop by itself, a loop that reaches the last character,
    /// whose unit contains a letter or an emoji, with at least this many repeats...
    pub end_loop_min_repeats: u32,
    /// ...covering at least this many bytes is reported.
    pub end_loop_min_bytes: usize,
    /// The same for a unit without letters or emoji (digits, marks, whitespace): this many repeats...
    pub end_loop_min_repeats_symbolic: u32,
    /// ...over at least this many bytes.
    pub end_loop_min_bytes_symbolic: usize,
    /// A text that ends in the middle of a word of a loop (at least `min_repeats` repeats) is reported
    /// once the loop covers this many bytes.
    pub mid_word_min_bytes: usize,

    /// Sliding window, in word units, over which distinct-n ratios are measured (words, numbers,
    /// single CJK characters and emoji are units; ASCII punctuation and whitespace separate them).
    pub collapse_window: usize,
    /// Vocabulary collapse: at most this fraction of the window's units are distinct (n = 1).
    pub vocab_max_distinct_ratio: f64,
    /// Length of the n-grams of the phrase-collapse measure.
    pub phrase_ngram: usize,
    /// Phrase collapse: at most this fraction of the window's `phrase_ngram`-grams are distinct.
    pub phrase_max_distinct_ratio: f64,
    /// A collapsed window must stay collapsed for this many more units before it is reported...
    pub collapse_sustain_units: usize,
    /// ...or this many when fewer than `min_wordy_fraction` of the window's units are words
    /// (numbers, symbols, single letters: matrices, bit strings and grids of marks collapse legitimately).
    pub collapse_sustain_units_symbolic: usize,
    /// Fraction of word units (a letter and two or more characters, or one CJK character) that makes a
    /// window wordy.
    pub min_wordy_fraction: f64,

    /// Tokens allowed inside an unterminated `<think>` block; one more is reported as
    /// `unclosed_reasoning`. `None` turns the rule off. Set it from the deployment's reasoning budget.
    pub reasoning_budget_tokens: Option<u64>,
    /// Whether the detector watches the text for literal `<think>` and `</think>` itself. Turn it off
    /// when the caller reports reasoning boundaries through `start_reasoning` / `end_reasoning`.
    pub scan_think_tags: bool,

    /// Longest text quoted in a verdict's evidence, in characters.
    pub sample_chars: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_period_chars: 512,
            max_period_tokens: 256,
            max_period_words: 256,
            min_repeats: 3,
            many_repeats: 32,
            short_loop_bytes: 200,
            short_loop_bytes_symbolic: 320,
            long_loop_bytes: 640,
            long_loop_bytes_symbolic: 1024,
            length_cut_min_repeats: 4,
            length_cut_min_bytes: 120,
            end_loop_min_repeats: 12,
            end_loop_min_bytes: 160,
            end_loop_min_repeats_symbolic: 48,
            end_loop_min_bytes_symbolic: 200,
            mid_word_min_bytes: 100,
            collapse_window: 128,
            vocab_max_distinct_ratio: 0.10,
            phrase_ngram: 4,
            phrase_max_distinct_ratio: 0.25,
            collapse_sustain_units: 32,
            collapse_sustain_units_symbolic: 384,
            min_wordy_fraction: 0.5,
            reasoning_budget_tokens: Some(16384),
            scan_think_tags: true,
            sample_chars: 160,
        }
    }
}

/// A [`Config`] value that the detector cannot work with.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    #[error("health config field `{field}`: expected {expected}, found {found}")]
    OutOfRange {
        field: &'static str,
        expected: &'static str,
        found: String,
    },
}

/// Largest period, window or n the detector accepts; keeps its buffers small and its counters in `u32`.
const MAX_EXTENT: usize = 1 << 16;

fn check_extent(field: &'static str, value: usize, min: usize) -> Result<(), ConfigError> {
    if (min..=MAX_EXTENT).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            field,
            expected: "a whole number between the field's minimum and 65536",
            found: format!("{value} (minimum {min})"),
        })
    }
}

fn check_ratio(field: &'static str, value: f64, allow_zero: bool) -> Result<(), ConfigError> {
    let ok = value.is_finite() && value <= 1.0 && (value > 0.0 || (allow_zero && value == 0.0));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            field,
            expected: if allow_zero {
                "a fraction in [0, 1]"
            } else {
                "a fraction in (0, 1]"
            },
            found: value.to_string(),
        })
    }
}

impl Config {
    /// Checks every field; the detector is built only from a validated config.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_extent("max_period_chars", self.max_period_chars, 1)?;
        check_extent("max_period_tokens", self.max_period_tokens, 1)?;
        check_extent("max_period_words", self.max_period_words, 1)?;
        check_extent("min_repeats", self.min_repeats as usize, 2)?;
        check_extent(
            "many_repeats",
            self.many_repeats as usize,
            self.min_repeats as usize,
        )?;
        check_extent("short_loop_bytes", self.short_loop_bytes, 1)?;
        check_extent(
            "short_loop_bytes_symbolic",
            self.short_loop_bytes_symbolic,
            1,
        )?;
        check_extent("long_loop_bytes", self.long_loop_bytes, 1)?;
        check_extent("long_loop_bytes_symbolic", self.long_loop_bytes_symbolic, 1)?;
        check_extent(
            "length_cut_min_repeats",
            self.length_cut_min_repeats as usize,
            2,
        )?;
        check_extent("length_cut_min_bytes", self.length_cut_min_bytes, 1)?;
        check_extent(
            "end_loop_min_repeats",
            self.end_loop_min_repeats as usize,
            2,
        )?;
        check_extent("end_loop_min_bytes", self.end_loop_min_bytes, 1)?;
        check_extent(
            "end_loop_min_repeats_symbolic",
            self.end_loop_min_repeats_symbolic as usize,
            2,
        )?;
        check_extent(
            "end_loop_min_bytes_symbolic",
            self.end_loop_min_bytes_symbolic,
            1,
        )?;
        check_extent("mid_word_min_bytes", self.mid_word_min_bytes, 1)?;
        check_extent("collapse_window", self.collapse_window, 8)?;
        check_ratio(
            "vocab_max_distinct_ratio",
            self.vocab_max_distinct_ratio,
            false,
        )?;
        check_extent("phrase_ngram", self.phrase_ngram, 2)?;
        if self.phrase_ngram > 16 {
            return Err(ConfigError::OutOfRange {
                field: "phrase_ngram",
                expected: "an n-gram length between 2 and 16",
                found: self.phrase_ngram.to_string(),
            });
        }
        check_ratio(
            "phrase_max_distinct_ratio",
            self.phrase_max_distinct_ratio,
            false,
        )?;
        check_extent("collapse_sustain_units", self.collapse_sustain_units, 0)?;
        check_extent(
            "collapse_sustain_units_symbolic",
            self.collapse_sustain_units_symbolic,
            0,
        )?;
        check_ratio("min_wordy_fraction", self.min_wordy_fraction, true)?;
        check_extent("sample_chars", self.sample_chars, 16)?;
        Ok(())
    }

    /// Repeats and covered bytes that make a periodic suffix a loop, or `None`.
    pub(crate) fn loop_rule(&self, repeats: f64, covered: u64, symbolic: bool) -> Option<LoopRule> {
        let (short, long) = if symbolic {
            (
                self.short_loop_bytes_symbolic,
                self.long_loop_bytes_symbolic,
            )
        } else {
            (self.short_loop_bytes, self.long_loop_bytes)
        };
        if repeats >= f64::from(self.many_repeats) && covered >= short as u64 {
            Some(LoopRule::ManyRepeats)
        } else if repeats >= f64::from(self.min_repeats) && covered >= long as u64 {
            Some(LoopRule::LongCoverage)
        } else {
            None
        }
    }

    /// Whether a loop that reaches the end of a stream that did not stop by itself is reported:
    /// `wordy` when its unit holds a letter or an emoji, `mid_word` when the text ends inside one of
    /// the unit's words.
    pub(crate) fn end_loop_rule(
        &self,
        repeats: f64,
        covered: u64,
        wordy: bool,
        mid_word: bool,
    ) -> Option<LoopRule> {
        let (min_repeats, min_bytes) = if wordy {
            (self.end_loop_min_repeats, self.end_loop_min_bytes)
        } else {
            (
                self.end_loop_min_repeats_symbolic,
                self.end_loop_min_bytes_symbolic,
            )
        };
        if repeats >= f64::from(min_repeats) && covered >= min_bytes as u64 {
            Some(LoopRule::EndsInLoop)
        } else if mid_word
            && repeats >= f64::from(self.min_repeats)
            && covered >= self.mid_word_min_bytes as u64
        {
            Some(LoopRule::EndsMidWord)
        } else {
            None
        }
    }

    /// Fewest characters a periodic suffix of `period` characters covers when some loop rule holds
    /// (a character is at most 4 bytes); the character tracker looks closer from there on.
    pub(crate) fn min_loop_chars(&self, period: usize) -> usize {
        let many = (self.many_repeats as usize * period).max(self.short_loop_bytes.div_ceil(4));
        let long = (self.min_repeats as usize * period).max(self.long_loop_bytes.div_ceil(4));
        many.min(long)
    }
}

/// Which periodic-loop rule of [`Config`] held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoopRule {
    ManyRepeats,
    LongCoverage,
    EndsInLoop,
    EndsMidWord,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        Config::default().validate().unwrap();
    }

    #[test]
    fn invalid_fields_are_named() {
        let cfg = Config {
            vocab_max_distinct_ratio: 1.5,
            ..Config::default()
        };
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("vocab_max_distinct_ratio"), "{err}");
        assert!(err.contains("1.5"), "{err}");

        let cfg = Config {
            many_repeats: 2,
            ..Config::default()
        };
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("many_repeats"), "{err}");

        let cfg = Config {
            max_period_chars: 0,
            ..Config::default()
        };
        assert!(cfg.validate().is_err());
    }

    #[test]
    fn repeats_needed_shrink_with_the_period() {
        let cfg = Config::default();
        // A 6-character word: needs `many_repeats` (32) and 200 characters.
        assert_eq!(cfg.loop_rule(31.0, 186, false), None);
        assert_eq!(cfg.loop_rule(34.0, 204, false), Some(LoopRule::ManyRepeats));
        // A 60-character sentence: 11 repeats cover 660 characters.
        assert_eq!(cfg.loop_rule(10.0, 600, false), None);
        assert_eq!(
            cfg.loop_rule(11.0, 660, false),
            Some(LoopRule::LongCoverage)
        );
        // A 300-character paragraph: 3 repeats.
        assert_eq!(cfg.loop_rule(2.9, 870, false), None);
        assert_eq!(cfg.loop_rule(3.0, 900, false), Some(LoopRule::LongCoverage));
        // Symbolic units need more text.
        assert_eq!(cfg.loop_rule(25.0, 250, true), None);
        assert_eq!(cfg.loop_rule(32.0, 320, true), Some(LoopRule::ManyRepeats));
        assert_eq!(cfg.min_loop_chars(1), 50);
        assert_eq!(cfg.min_loop_chars(6), 160);
        assert_eq!(cfg.min_loop_chars(60), 180);
        assert_eq!(cfg.min_loop_chars(300), 900);
    }

    #[test]
    fn end_of_text_rules() {
        let cfg = Config::default();
        // `Actually, ` 24 times: 240 bytes.
        assert_eq!(
            cfg.end_loop_rule(24.0, 240, true, false),
            Some(LoopRule::EndsInLoop)
        );
        // Ten requested lines that end the reply at a whole line.
        assert_eq!(cfg.end_loop_rule(9.96, 259, true, false), None);
        // The same ten lines, the tenth cut mid-word.
        assert_eq!(
            cfg.end_loop_rule(9.5, 247, true, true),
            Some(LoopRule::EndsMidWord)
        );
        assert_eq!(cfg.end_loop_rule(2.5, 247, true, true), None);
        assert_eq!(cfg.end_loop_rule(6.0, 60, true, true), None);
        // A divider: 80 `=` stay, 230 do not.
        assert_eq!(cfg.end_loop_rule(80.0, 80, false, false), None);
        assert_eq!(
            cfg.end_loop_rule(230.0, 230, false, false),
            Some(LoopRule::EndsInLoop)
        );
        // 1/7 to 120 places: 20 repeats of six digits.
        assert_eq!(cfg.end_loop_rule(20.0, 120, false, false), None);
    }
}
