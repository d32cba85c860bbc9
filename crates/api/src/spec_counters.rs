//! Samples the engine's speculative-decoding counters (from its Prometheus text) along one request, so
//! the diagnosis of a degenerate output can compare acceptance early and late in it. The counters are
//! server-wide (every running request adds to them); this module never changes the engine.

use deltaserve_engine::EngineHandle;

use crate::diagnosis::Acceptance;

/// The engine's counter of drafted tokens (deltaserve-engine metrics.rs, docs/serving.md,
/// "Metrics").
const DRAFT_TOKENS_COUNTER: &str = "deltaserve_spec_decode_num_draft_tokens_total";
/// The engine's counter of accepted draft tokens.
const ACCEPTED_TOKENS_COUNTER: &str = "deltaserve_spec_decode_num_accepted_tokens_total";

/// Generated tokens between two samples: rendering the engine's metrics text costs a few
/// microseconds, a sample every 16 tokens keeps that far below the cost of the tokens.
const SAMPLE_EVERY_TOKENS: u64 = 16;

/// Drafted and accepted totals in an engine's Prometheus text; `None` when it exports neither.
pub fn parse_spec_counters(text: &str) -> Option<Acceptance> {
    let value = |name: &str| {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?;
            let number = rest.strip_prefix(' ')?;
            number.trim().parse::<f64>().ok().map(|v| v as u64)
        })
    };
    let drafted = value(DRAFT_TOKENS_COUNTER);
    let accepted = value(ACCEPTED_TOKENS_COUNTER);
    if drafted.is_none() && accepted.is_none() {
        return None;
    }
    Some(Acceptance::new(drafted.unwrap_or(0), accepted.unwrap_or(0)))
}

/// The engine's counters at a number of generated tokens of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    tokens: u64,
    counters: Acceptance,
}

/// Counter samples along one request (empty when the engine exports no speculative counters).
#[derive(Debug, Clone, Default)]
pub struct SpecTimeline {
    samples: Vec<Sample>,
}

impl SpecTimeline {
    /// Takes the first sample, before the request's first token.
    pub fn start(engine: &dyn EngineHandle) -> Self {
        let samples = parse_spec_counters(&engine.prometheus_metrics())
            .map(|counters| {
                vec![Sample {
                    tokens: 0,
                    counters,
                }]
            })
            .unwrap_or_default();
        Self { samples }
    }

    /// Called after each generated token; samples every [`SAMPLE_EVERY_TOKENS`].
    pub fn on_token(&mut self, engine: &dyn EngineHandle, tokens: u64) {
        if self.samples.is_empty() || !tokens.is_multiple_of(SAMPLE_EVERY_TOKENS) {
            return;
        }
        self.sample(engine, tokens);
    }

    fn sample(&mut self, engine: &dyn EngineHandle, tokens: u64) {
        if let Some(counters) = parse_spec_counters(&engine.prometheus_metrics()) {
            self.samples.push(Sample { tokens, counters });
        }
    }

    /// Takes the last sample at `tokens` generated and splits the request at the sample nearest its
    /// middle: the counters' growth over the first and over the second half.
    pub fn halves(
        &mut self,
        engine: &dyn EngineHandle,
        tokens: u64,
    ) -> Option<(Acceptance, Acceptance)> {
        if self.samples.is_empty() {
            return None;
        }
        if self.samples.last().is_none_or(|s| s.tokens < tokens) {
            self.sample(engine, tokens);
        }
        split_at_middle(&self.samples, tokens)
    }
}

fn split_at_middle(samples: &[Sample], tokens: u64) -> Option<(Acceptance, Acceptance)> {
    let (first, last) = (samples.first()?, samples.last()?);
    if samples.len() < 3 {
        return None;
    }
    let middle = tokens / 2;
    // Not the first or the last sample: each half must have some length.
    let inner = &samples[1..samples.len() - 1];
    let mid = inner.iter().min_by_key(|s| s.tokens.abs_diff(middle))?;
    Some((
        mid.counters.since(first.counters),
        last.counters.since(mid.counters),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltaserve_engine::metrics::EngineMetrics;
    use deltaserve_engine::EngineStats;
    use std::sync::atomic::Ordering;

    #[test]
    fn reads_the_engine_metrics_text() {
        let metrics = EngineMetrics::default();
        metrics.spec_draft_tokens.store(171, Ordering::Relaxed);
        metrics.spec_accepted_tokens.store(144, Ordering::Relaxed);
        metrics.spec_verify_steps.store(57, Ordering::Relaxed);
        let text = metrics.render(&EngineStats::default());
        assert_eq!(parse_spec_counters(&text), Some(Acceptance::new(171, 144)));
        assert_eq!(parse_spec_counters("deltaserve_running_requests 1\n"), None);
        assert_eq!(parse_spec_counters(""), None);
    }

    #[test]
    fn halves_split_at_the_sample_nearest_the_middle() {
        let sample = |tokens, drafted, accepted| Sample {
            tokens,
            counters: Acceptance::new(drafted, accepted),
        };
        let samples = [
            sample(0, 1000, 900),
            sample(16, 1012, 911),
            sample(32, 1024, 922),
            sample(48, 1036, 925),
            sample(60, 1045, 926),
        ];
        let (first, second) = split_at_middle(&samples, 60).unwrap();
        assert_eq!(first, Acceptance::new(24, 22));
        assert_eq!(second, Acceptance::new(21, 4));
        assert_eq!(split_at_middle(&samples[..2], 16), None);
    }
}
