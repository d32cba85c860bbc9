//! What the detector reports: the kind of degeneration, the rule that fired and the evidence (where the
//! repetition began, its period, how often it repeated, a quote). Plain serde data, no detection logic.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The kind of degeneration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DegenerationKind {
    /// The output ends in an exactly periodic stretch: `prime prime prime`, `2 + 2 = 2.2 + 2 = 2.`,
    /// a repeated sentence or paragraph.
    PeriodicLoop,
    /// A sliding window of words uses very few distinct words or phrases without being exactly
    /// periodic: babble, loops with small variations.
    NgramCollapse,
    /// The output stayed inside an unterminated `<think>` block for more than the reasoning budget.
    UnclosedReasoning,
}

impl DegenerationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PeriodicLoop => "periodic_loop",
            Self::NgramCollapse => "ngram_collapse",
            Self::UnclosedReasoning => "unclosed_reasoning",
        }
    }
}

/// The rule of [`crate::Config`] that fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// A short unit repeated `many_repeats` times over `short_loop_chars`.
    ManyRepeats,
    /// A unit repeated `min_repeats` times over `long_loop_chars`.
    LongCoverage,
    /// A trailing loop in a stream cut by the length limit.
    LengthCutTail,
    /// A loop still running at the end of a stream that did not stop by itself, repeated
    /// `end_loop_min_repeats` times over `end_loop_min_bytes`.
    EndsInLoop,
    /// A stream that did not stop by itself ends in the middle of a word of a loop.
    EndsMidWord,
    /// Few distinct words over the window (distinct-1).
    VocabularyCollapse,
    /// Few distinct phrases over the window (distinct-n, n = `phrase_ngram`).
    PhraseCollapse,
    /// More reasoning tokens than `reasoning_budget_tokens` without `</think>`.
    ReasoningBudget,
}

/// The stream a verdict was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    /// The characters of the generated text.
    Text,
    /// The token ids.
    TokenIds,
    /// The word units of the text.
    Words,
    /// The reasoning state (think tags or the caller's reasoning events).
    Reasoning,
}

/// Where and how the degeneration showed.
///
/// Offsets count from the first generated token and character (0-based). `start_*` is where the
/// repetition (or the collapsed window, or the open think block) began; `covered_*` is how much output
/// it spans up to the moment of the verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    pub start_token: u64,
    pub start_char: u64,
    pub covered_tokens: u64,
    pub covered_chars: u64,
    /// Loop period in tokens, when the token ids are periodic too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_tokens: Option<u32>,
    /// Loop period in characters, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_chars: Option<u32>,
    /// Covered length divided by the period (fractional: the last repeat may be partial).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeats: Option<f64>,
    /// The n of the collapsed distinct-n measure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ngram: Option<u32>,
    /// Distinct n-grams divided by the window size, for collapse verdicts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distinct_ratio: Option<f64>,
    /// Window size in word units, for collapse verdicts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_units: Option<u32>,
    /// Tokens generated inside the open think block, for reasoning verdicts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
    /// The repeated unit for loops (as first emitted); the latest text for collapse and reasoning
    /// verdicts. At most `Config::sample_chars` characters.
    pub span: String,
    /// Whether `span` was cut to fit.
    pub span_truncated: bool,
}

/// A detection: the output of this request has degenerated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub kind: DegenerationKind,
    pub rule: Rule,
    pub signal: Signal,
    /// The token (0-based) being read when the rule fired; the token count for end-of-stream rules.
    pub detected_at_token: u64,
    /// Characters generated when the rule fired.
    pub detected_at_char: u64,
    pub evidence: Evidence,
}

impl fmt::Display for Verdict {
    /// One log line: kind, rule, where it began, period and repeats, and the quoted span.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &self.evidence;
        write!(
            f,
            "{} ({:?} on {:?}) at token {}: began at token {} (char {})",
            self.kind.as_str(),
            self.rule,
            self.signal,
            self.detected_at_token,
            e.start_token,
            e.start_char
        )?;
        match (e.period_tokens, e.period_chars) {
            (Some(t), Some(c)) => write!(f, ", period {t} tokens / {c} chars")?,
            (Some(t), None) => write!(f, ", period {t} tokens")?,
            (None, Some(c)) => write!(f, ", period {c} chars")?,
            (None, None) => {}
        }
        if let Some(r) = e.repeats {
            write!(f, ", {r:.1} repeats")?;
        }
        if let (Some(n), Some(ratio)) = (e.ngram, e.distinct_ratio) {
            write!(f, ", distinct-{n} {ratio:.3}")?;
        }
        if let Some(t) = e.reasoning_tokens {
            write!(f, ", {t} reasoning tokens")?;
        }
        let ellipsis = if e.span_truncated { "..." } else { "" };
        write!(f, ": {:?}{ellipsis}", e.span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_with_snake_case_kinds_and_without_empty_fields() {
        let verdict = Verdict {
            kind: DegenerationKind::PeriodicLoop,
            rule: Rule::ManyRepeats,
            signal: Signal::Text,
            detected_at_token: 90,
            detected_at_char: 400,
            evidence: Evidence {
                start_token: 12,
                start_char: 48,
                covered_tokens: 79,
                covered_chars: 352,
                period_tokens: Some(8),
                period_chars: Some(10),
                repeats: Some(35.2),
                ngram: None,
                distinct_ratio: None,
                window_units: None,
                reasoning_tokens: None,
                span: "2 + 2 = 2.".into(),
                span_truncated: false,
            },
        };
        let json = serde_json::to_value(&verdict).unwrap();
        assert_eq!(json["kind"], "periodic_loop");
        assert_eq!(json["rule"], "many_repeats");
        assert_eq!(json["evidence"]["period_chars"], 10);
        assert!(json["evidence"].get("ngram").is_none());
        let back: Verdict = serde_json::from_value(json).unwrap();
        assert_eq!(back, verdict);
        let line = verdict.to_string();
        assert!(line.contains("periodic_loop"), "{line}");
        assert!(line.contains("period 8 tokens / 10 chars"), "{line}");
    }
}
