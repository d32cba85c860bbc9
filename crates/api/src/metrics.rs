//! HTTP-level Prometheus metrics the API owns (requests by route and status, token counts, degenerate
//! outputs by kind, TTFT, TPOT and end-to-end latency histograms) and their text rendering. Engine metrics are appended as text by the
//! server state; this module never reads the engine.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use deltaserve_health::DegenerationKind;

/// Every degeneration kind, so each counter is exported (at 0) before the first detection.
const DEGENERATION_KINDS: [DegenerationKind; 3] = [
    DegenerationKind::PeriodicLoop,
    DegenerationKind::NgramCollapse,
    DegenerationKind::UnclosedReasoning,
];

/// Latency bucket bounds in seconds, shared by the three histograms (TTFT, TPOT, e2e).
const TTFT_BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
];
const TPOT_BUCKETS: [f64; 14] = [
    0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
];
const E2E_BUCKETS: [f64; 14] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0, 1200.0,
];

/// A cumulative Prometheus histogram with fixed bucket bounds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    inner: Mutex<HistogramData>,
}

#[derive(Debug, Default, Clone)]
struct HistogramData {
    /// Non-cumulative counts per bucket; the last entry is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            inner: Mutex::new(HistogramData {
                counts: vec![0; bounds.len() + 1],
                ..HistogramData::default()
            }),
        }
    }

    pub fn observe(&self, seconds: f64) {
        if !seconds.is_finite() {
            return;
        }
        let bucket = self
            .bounds
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(self.bounds.len());
        let mut data = lock(&self.inner);
        data.counts[bucket] += 1;
        data.sum += seconds;
        data.count += 1;
    }

    pub fn count(&self) -> u64 {
        lock(&self.inner).count
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let data = lock(&self.inner).clone();
        header(out, name, help, "histogram");
        let mut cumulative = 0;
        for (bound, count) in self.bounds.iter().zip(&data.counts) {
            cumulative += count;
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        cumulative += data.counts[self.bounds.len()];
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{name}_sum {}", data.sum);
        let _ = writeln!(out, "{name}_count {}", data.count);
    }
}

/// Locks a metrics mutex. A panic while holding it leaves plain counters behind, still valid to read.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Escapes a label value for the Prometheus text format.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Everything the HTTP layer counts.
#[derive(Debug)]
pub struct HttpMetrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    finished: Mutex<BTreeMap<String, u64>>,
    health_probes: Mutex<BTreeMap<&'static str, u64>>,
    /// Degenerate outputs (choices), indexed like `DEGENERATION_KINDS`.
    degenerate: [AtomicU64; 3],
    in_flight: AtomicI64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    reasoning_tokens: AtomicU64,
    pub time_to_first_token: Histogram,
    pub time_per_output_token: Histogram,
    pub e2e_latency: Histogram,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        Self {
            requests: Mutex::default(),
            finished: Mutex::default(),
            health_probes: Mutex::default(),
            degenerate: Default::default(),
            in_flight: AtomicI64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            reasoning_tokens: AtomicU64::new(0),
            time_to_first_token: Histogram::new(&TTFT_BUCKETS),
            time_per_output_token: Histogram::new(&TPOT_BUCKETS),
            e2e_latency: Histogram::new(&E2E_BUCKETS),
        }
    }
}

/// Timing and token counts of one finished generation (one choice).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerationRecord {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub reasoning_tokens: usize,
    pub time_to_first_token: Option<Duration>,
    pub e2e: Duration,
}

impl HttpMetrics {
    /// Counts one answered request; `route` is a fixed route name, never a raw client path.
    pub fn record_request(&self, route: &str, status: u16) {
        *lock(&self.requests)
            .entry((route.to_string(), status))
            .or_default() += 1;
    }

    pub fn requests_counted(&self, route: &str, status: u16) -> u64 {
        lock(&self.requests)
            .get(&(route.to_string(), status))
            .copied()
            .unwrap_or(0)
    }

    pub fn enter(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    pub fn leave(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Counts one choice whose output degenerated.
    pub fn record_degeneration(&self, kind: DegenerationKind) {
        if let Some(i) = DEGENERATION_KINDS.iter().position(|&k| k == kind) {
            self.degenerate[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn degenerations_counted(&self, kind: DegenerationKind) -> u64 {
        DEGENERATION_KINDS
            .iter()
            .position(|&k| k == kind)
            .map_or(0, |i| self.degenerate[i].load(Ordering::Relaxed))
    }

    pub fn record_health_probe(&self, result: &'static str) {
        *lock(&self.health_probes).entry(result).or_default() += 1;
    }

    /// Counts a finished generation and feeds the latency histograms.
    pub fn record_generation(&self, finish_reason: &str, record: &GenerationRecord) {
        *lock(&self.finished)
            .entry(finish_reason.to_string())
            .or_default() += 1;
        self.prompt_tokens
            .fetch_add(record.prompt_tokens as u64, Ordering::Relaxed);
        self.generation_tokens
            .fetch_add(record.completion_tokens as u64, Ordering::Relaxed);
        self.reasoning_tokens
            .fetch_add(record.reasoning_tokens as u64, Ordering::Relaxed);
        self.e2e_latency.observe(record.e2e.as_secs_f64());
        if let Some(ttft) = record.time_to_first_token {
            self.time_to_first_token.observe(ttft.as_secs_f64());
            if record.completion_tokens > 1 {
                let decode = record.e2e.saturating_sub(ttft).as_secs_f64();
                self.time_per_output_token
                    .observe(decode / (record.completion_tokens - 1) as f64);
            }
        }
    }

    /// The Prometheus text exposition of these metrics.
    pub fn render(&self) -> String {
        let mut out = String::new();
        header(
            &mut out,
            "deltaserve_http_requests_total",
            "HTTP requests answered, by route and status code.",
            "counter",
        );
        for ((route, status), n) in lock(&self.requests).iter() {
            let _ = writeln!(
                out,
                "deltaserve_http_requests_total{{route=\"{}\",status=\"{status}\"}} {n}",
                label(route)
            );
        }
        header(
            &mut out,
            "deltaserve_http_requests_in_flight",
            "HTTP requests being answered now.",
            "gauge",
        );
        let _ = writeln!(
            out,
            "deltaserve_http_requests_in_flight {}",
            self.in_flight.load(Ordering::Relaxed)
        );
        header(
            &mut out,
            "deltaserve_request_finished_total",
            "Generations (choices) finished, by finish reason.",
            "counter",
        );
        for (reason, n) in lock(&self.finished).iter() {
            let _ = writeln!(
                out,
                "deltaserve_request_finished_total{{finish_reason=\"{}\"}} {n}",
                label(reason)
            );
        }
        for (name, help, value) in [
            (
                "deltaserve_prompt_tokens_total",
                "Prompt tokens of finished generations.",
                &self.prompt_tokens,
            ),
            (
                "deltaserve_generation_tokens_total",
                "Tokens generated.",
                &self.generation_tokens,
            ),
            (
                "deltaserve_reasoning_tokens_total",
                "Generated tokens inside reasoning.",
                &self.reasoning_tokens,
            ),
        ] {
            header(&mut out, name, help, "counter");
            let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
        }
        header(
            &mut out,
            "deltaserve_degenerate_requests_total",
            "Generations (choices) whose output the degeneration detector flagged, by kind.",
            "counter",
        );
        for (kind, count) in DEGENERATION_KINDS.iter().zip(&self.degenerate) {
            let _ = writeln!(
                out,
                "deltaserve_degenerate_requests_total{{kind=\"{}\"}} {}",
                kind.as_str(),
                count.load(Ordering::Relaxed)
            );
        }
        header(
            &mut out,
            "deltaserve_health_probes_total",
            "One-token generations run by /health, by result.",
            "counter",
        );
        for (result, n) in lock(&self.health_probes).iter() {
            let _ = writeln!(
                out,
                "deltaserve_health_probes_total{{result=\"{result}\"}} {n}"
            );
        }
        self.time_to_first_token.render(
            &mut out,
            "deltaserve_time_to_first_token_seconds",
            "Time from request arrival to the first generated token.",
        );
        self.time_per_output_token.render(
            &mut out,
            "deltaserve_time_per_output_token_seconds",
            "Mean time between generated tokens after the first, per request.",
        );
        self.e2e_latency.render(
            &mut out,
            "deltaserve_e2e_request_latency_seconds",
            "Time from request arrival to its last token.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_with_inf() {
        let metrics = HttpMetrics::default();
        let record = GenerationRecord {
            prompt_tokens: 7,
            completion_tokens: 11,
            reasoning_tokens: 3,
            time_to_first_token: Some(Duration::from_millis(40)),
            e2e: Duration::from_millis(240),
        };
        metrics.record_generation("stop", &record);
        metrics.record_request("/v1/chat/completions", 200);
        metrics.record_request("/v1/chat/completions", 200);
        metrics.time_to_first_token.observe(1000.0);
        metrics.record_degeneration(DegenerationKind::PeriodicLoop);
        metrics.record_degeneration(DegenerationKind::PeriodicLoop);
        let text = metrics.render();
        assert!(text.contains("deltaserve_degenerate_requests_total{kind=\"periodic_loop\"} 2\n"));
        assert!(text.contains("deltaserve_degenerate_requests_total{kind=\"ngram_collapse\"} 0\n"));
        assert!(
            text.contains("deltaserve_degenerate_requests_total{kind=\"unclosed_reasoning\"} 0\n")
        );
        assert!(text.contains(
            "deltaserve_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2"
        ));
        assert!(text.contains("deltaserve_prompt_tokens_total 7\n"));
        assert!(text.contains("deltaserve_generation_tokens_total 11\n"));
        assert!(text.contains("deltaserve_request_finished_total{finish_reason=\"stop\"} 1"));
        // 40 ms falls in the 0.05 bucket; the 1000 s observation only in +Inf.
        assert!(text.contains("deltaserve_time_to_first_token_seconds_bucket{le=\"0.025\"} 0\n"));
        assert!(text.contains("deltaserve_time_to_first_token_seconds_bucket{le=\"0.05\"} 1\n"));
        assert!(text.contains("deltaserve_time_to_first_token_seconds_bucket{le=\"80\"} 1\n"));
        assert!(text.contains("deltaserve_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"));
        assert!(text.contains("deltaserve_time_to_first_token_seconds_count 2\n"));
        // TPOT = (240 - 40) ms / 10 tokens = 20 ms.
        assert!(text.contains("deltaserve_time_per_output_token_seconds_bucket{le=\"0.01\"} 0\n"));
        assert!(text.contains("deltaserve_time_per_output_token_seconds_bucket{le=\"0.02\"} 1\n"));
    }
}
