//! Turning a detection into a [`Verdict`]: where the loop or collapse began (token and char), its
//! period and repeats, and the quoted span. Reads the detector's state, never changes it.

use super::{DegenerationDetector, Finding};
use crate::collapse::CollapseHit;
use crate::verdict::{DegenerationKind, Evidence, Rule, Signal, Verdict};

impl DegenerationDetector {
    /// Characters `from..to` of the output as far as they are still remembered, cut to
    /// `sample_chars`; whether anything was left out.
    fn text_between(&self, from: u64, to: u64) -> (String, bool) {
        let remembered_from = self.chars_seen.saturating_sub(self.char_bytes.len() as u64);
        let start = from.max(remembered_from);
        let end = to
            .min(self.chars_seen)
            .min(start + self.config.sample_chars as u64);
        let text = (start..end)
            .filter_map(|i| self.chars.symbol_back(self.chars_seen - 1 - i))
            .filter_map(char::from_u32)
            .collect();
        (text, start > from || end < to)
    }

    /// The last `sample_chars` characters before `to`, from no earlier than `from`.
    fn text_tail(&self, from: u64, to: u64) -> (String, bool) {
        let start = from.max(to.saturating_sub(self.config.sample_chars as u64));
        let (text, cut) = self.text_between(start, to);
        (text, cut || start > from)
    }

    /// The token containing char offset `offset` (the oldest remembered one if it is older).
    fn token_at_char(&self, offset: u64) -> u64 {
        self.token_ledger
            .last_at_or_before(offset, |record| record.start_char)
    }

    /// The smallest token period that repeats at least twice and spans a whole number of
    /// `period_chars` (the same loop seen on the ids).
    fn token_period_of(&self, period_chars: u64) -> Option<u32> {
        (1..=self.tokens.max_period()).find_map(|p| {
            let covered = self.tokens.covered(p);
            if covered < 2 * p as u64 {
                return None;
            }
            let start = self
                .token_ledger
                .get(self.tokens_seen - p as u64)?
                .start_char;
            let chars = self.chars_seen - start;
            (chars > 0 && chars.is_multiple_of(period_chars)).then_some(p as u32)
        })
    }

    /// Evidence of an exact character loop of `covered` characters ending at `end_char`.
    fn char_loop_evidence(
        &self,
        period: usize,
        covered: u64,
        end_char: u64,
        token: u64,
    ) -> Evidence {
        let start_char = end_char - covered;
        let start_token = self.token_at_char(start_char);
        // The unit as first emitted: the last whole period aligned with the loop start.
        let whole = covered / period as u64;
        let unit_from = start_char + (whole.max(1) - 1) * period as u64;
        let (span, span_truncated) = self.text_between(unit_from, unit_from + period as u64);
        Evidence {
            start_token,
            start_char,
            covered_tokens: token + 1 - start_token,
            covered_chars: covered,
            period_tokens: self.token_period_of(period as u64),
            period_chars: Some(period as u32),
            repeats: Some(covered as f64 / period as f64),
            ngram: None,
            distinct_ratio: None,
            window_units: None,
            reasoning_tokens: None,
            span,
            span_truncated,
        }
    }

    fn token_loop_evidence(&self, period: usize, covered: u64) -> Evidence {
        let first = self.tokens_seen - covered;
        let start_of = |token: u64| {
            if token >= self.tokens_seen {
                Some(self.chars_seen)
            } else {
                self.token_ledger.get(token).map(|r| r.start_char)
            }
        };
        let oldest = self.token_ledger.oldest();
        let start_char = start_of(first).or_else(|| start_of(oldest)).unwrap_or(0);
        let whole = covered / period as u64;
        let unit_first = first + (whole.max(1) - 1) * period as u64;
        let unit_from = start_of(unit_first).unwrap_or(start_char);
        let unit_to = start_of(unit_first + period as u64).unwrap_or(self.chars_seen);
        let (span, span_truncated) = self.text_between(unit_from, unit_to);
        let period_chars = start_of(self.tokens_seen - period as u64)
            .map(|s| (self.chars_seen - s) as u32)
            .filter(|&c| c > 0);
        Evidence {
            start_token: first.max(oldest),
            start_char,
            covered_tokens: covered,
            covered_chars: self.chars_seen - start_char,
            period_tokens: Some(period as u32),
            period_chars,
            repeats: Some(covered as f64 / period as f64),
            ngram: None,
            distinct_ratio: None,
            window_units: None,
            reasoning_tokens: None,
            span,
            span_truncated,
        }
    }

    fn word_loop_evidence(
        &self,
        period: usize,
        covered: u64,
        (end_char, units): (u64, u64),
        token: u64,
    ) -> Evidence {
        let first = units - covered;
        let start_of = |unit: u64| {
            if unit >= units {
                Some(end_char)
            } else {
                self.unit_ledger.get(unit).map(|r| r.start_char)
            }
        };
        let start_char = start_of(first).unwrap_or(0);
        let start_token = self.token_at_char(start_char);
        let whole = covered / period as u64;
        let unit_first = first + (whole.max(1) - 1) * period as u64;
        let unit_from = start_of(unit_first).unwrap_or(start_char);
        let unit_to = start_of(unit_first + period as u64).unwrap_or(end_char);
        let (span, span_truncated) = self.text_between(unit_from, unit_to);
        let period_chars = start_of(units - period as u64).map(|s| end_char - s);
        Evidence {
            start_token,
            start_char,
            covered_tokens: token + 1 - start_token,
            covered_chars: end_char - start_char,
            period_tokens: period_chars.and_then(|c| self.token_period_of(c)),
            period_chars: period_chars.map(|c| c as u32),
            repeats: Some(covered as f64 / period as f64),
            ngram: None,
            distinct_ratio: None,
            window_units: None,
            reasoning_tokens: None,
            span,
            span_truncated,
        }
    }

    pub(super) fn build_verdict(&self, finding: Finding, token: u64) -> Verdict {
        let (kind, rule, signal, detected_at_char, evidence) = match finding {
            Finding::CharLoop {
                period,
                covered,
                rule,
                end_char,
            } => (
                DegenerationKind::PeriodicLoop,
                rule,
                Signal::Text,
                end_char,
                self.char_loop_evidence(period, covered, end_char, token),
            ),
            Finding::TokenLoop {
                period,
                covered,
                rule,
            } => (
                DegenerationKind::PeriodicLoop,
                rule,
                Signal::TokenIds,
                self.chars_seen,
                self.token_loop_evidence(period, covered),
            ),
            Finding::WordLoop {
                period,
                covered,
                rule,
                end_char,
                end_unit,
            } => (
                DegenerationKind::PeriodicLoop,
                rule,
                Signal::Words,
                end_char,
                self.word_loop_evidence(period, covered, (end_char, end_unit), token),
            ),
            Finding::Collapse { hit, end_char } => {
                let (kind, evidence) = self.collapse_evidence(hit, end_char, token);
                (kind, hit.rule, Signal::Words, end_char, evidence)
            }
            Finding::Reasoning(open) => {
                let (span, span_truncated) = self.text_tail(open.start_char, self.chars_seen);
                let evidence = Evidence {
                    start_token: open.start_token,
                    start_char: open.start_char,
                    covered_tokens: self.tokens_seen - open.start_token,
                    covered_chars: self.chars_seen - open.start_char,
                    period_tokens: None,
                    period_chars: None,
                    repeats: None,
                    ngram: None,
                    distinct_ratio: None,
                    window_units: None,
                    reasoning_tokens: Some(open.tokens),
                    span,
                    span_truncated,
                };
                (
                    DegenerationKind::UnclosedReasoning,
                    Rule::ReasoningBudget,
                    Signal::Reasoning,
                    self.chars_seen,
                    evidence,
                )
            }
        };
        Verdict {
            kind,
            rule,
            signal,
            detected_at_token: token,
            detected_at_char,
            evidence,
        }
    }

    /// Collapse evidence; a collapse that is an exact loop underneath (at least `min_repeats` over
    /// `short_loop_bytes`) is reported as that loop, with its period, the more precise description.
    fn collapse_evidence(
        &self,
        hit: CollapseHit,
        end_char: u64,
        token: u64,
    ) -> (DegenerationKind, Evidence) {
        let exact = self
            .chars
            .periods_with(u64::from(self.config.min_repeats), 1)
            .find(|&(period, covered)| {
                self.bytes_of_periodic_suffix(period, covered)
                    >= self.config.short_loop_bytes as u64
            });
        if let Some((period, covered)) = exact {
            let mut evidence = self.char_loop_evidence(period, covered, self.chars_seen, token);
            evidence.ngram = Some(hit.ngram);
            evidence.distinct_ratio = Some(hit.distinct_ratio);
            evidence.window_units = Some(self.config.collapse_window as u32);
            return (DegenerationKind::PeriodicLoop, evidence);
        }
        let start_char = hit.start_char;
        let start_token = self.token_at_char(start_char);
        let (span, span_truncated) = self.text_tail(start_char, end_char);
        let evidence = Evidence {
            start_token,
            start_char,
            covered_tokens: token + 1 - start_token,
            covered_chars: end_char - start_char,
            period_tokens: None,
            period_chars: None,
            repeats: None,
            ngram: Some(hit.ngram),
            distinct_ratio: Some(hit.distinct_ratio),
            window_units: Some(self.config.collapse_window as u32),
            reasoning_tokens: None,
            span,
            span_truncated,
        };
        (DegenerationKind::NgramCollapse, evidence)
    }
}
