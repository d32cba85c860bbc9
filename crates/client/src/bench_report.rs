//! Statistics of a `bench serve` run: latency distributions (mean, p50, p90, p99 with numpy's linear
//! interpolation), throughputs, and the printed table. It never sends requests (bench_serve.rs does).

use std::time::Duration;

use crate::bench_serve::{BenchServeConfig, RequestResult};

/// Percentile summary of one latency metric, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Distribution {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Distribution {
    fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        Self {
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
            p50: percentile(&sorted, 50.0),
            p90: percentile(&sorted, 90.0),
            p99: percentile(&sorted, 99.0),
        }
    }
}

/// Linear-interpolated percentile of sorted values (numpy's default method).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let low = rank.floor() as usize;
    let high = rank.ceil() as usize;
    sorted[low] + (sorted[high] - sorted[low]) * (rank - low as f64)
}

/// What `bench serve` measured.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchServeReport {
    pub model: String,
    pub completed: usize,
    pub failed: usize,
    /// The first few error messages, for the operator.
    pub errors: Vec<String>,
    pub duration: Duration,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    pub request_throughput: f64,
    pub input_throughput: f64,
    pub output_throughput: f64,
    pub ttft: Distribution,
    pub tpot: Distribution,
    pub itl: Distribution,
    pub e2e: Distribution,
    pub streamed: bool,
    pub concurrency: usize,
    /// Prompt tokens the server reported served from its prefix cache.
    pub cached_tokens: usize,
    /// TTFT of each turn (multi-turn mode; one entry otherwise).
    pub ttft_by_turn: Vec<Distribution>,
}

impl BenchServeReport {
    pub(crate) fn from_results(
        config: &BenchServeConfig,
        model: String,
        results: &[RequestResult],
        duration: Duration,
    ) -> Self {
        let ok: Vec<&RequestResult> = results.iter().filter(|r| r.error.is_none()).collect();
        let seconds = duration.as_secs_f64().max(1e-9);
        let prompt_tokens = ok.iter().map(|r| r.prompt_tokens).sum();
        let output_tokens = ok.iter().map(|r| r.output_tokens).sum();
        let tpot: Vec<f64> = ok
            .iter()
            .filter(|r| r.output_tokens > 1)
            .map(|r| (r.e2e - r.ttft) / (r.output_tokens - 1) as f64)
            .collect();
        let itl: Vec<f64> = ok.iter().flat_map(|r| r.itl.iter().copied()).collect();
        Self {
            model,
            completed: ok.len(),
            failed: results.len() - ok.len(),
            errors: results
                .iter()
                .filter_map(|r| r.error.clone())
                .take(5)
                .collect(),
            duration,
            prompt_tokens,
            output_tokens,
            request_throughput: ok.len() as f64 / seconds,
            input_throughput: prompt_tokens as f64 / seconds,
            output_throughput: output_tokens as f64 / seconds,
            ttft: Distribution::of(&ok.iter().map(|r| r.ttft).collect::<Vec<_>>()),
            tpot: Distribution::of(&tpot),
            itl: Distribution::of(&itl),
            e2e: Distribution::of(&ok.iter().map(|r| r.e2e).collect::<Vec<_>>()),
            streamed: config.stream,
            concurrency: config.concurrency,
            cached_tokens: ok.iter().map(|r| r.cached_tokens).sum(),
            ttft_by_turn: (0..config.multi_turn.max(1))
                .map(|t| {
                    Distribution::of(
                        &ok.iter()
                            .filter(|r| r.turn == t)
                            .map(|r| r.ttft)
                            .collect::<Vec<_>>(),
                    )
                })
                .collect(),
        }
    }

    /// Cached prompt tokens / prompt tokens.
    pub fn cache_hit_rate(&self) -> f64 {
        if self.prompt_tokens == 0 {
            0.0
        } else {
            self.cached_tokens as f64 / self.prompt_tokens as f64
        }
    }

    /// The report as JSON (seconds for durations), for `--output-file`.
    pub fn to_json(&self) -> serde_json::Value {
        let d = |d: &Distribution| serde_json::json!({"mean": d.mean, "p50": d.p50, "p90": d.p90, "p99": d.p99});
        serde_json::json!({
            "model": self.model,
            "concurrency": self.concurrency,
            "completed": self.completed,
            "failed": self.failed,
            "duration_s": self.duration.as_secs_f64(),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "cache_hit_rate": self.cache_hit_rate(),
            "output_tokens": self.output_tokens,
            "request_throughput": self.request_throughput,
            "input_throughput": self.input_throughput,
            "output_throughput": self.output_throughput,
            "streamed": self.streamed,
            "ttft_s": d(&self.ttft),
            "ttft_by_turn_s": self.ttft_by_turn.iter().map(d).collect::<Vec<_>>(),
            "tpot_s": d(&self.tpot),
            "itl_s": d(&self.itl),
            "e2e_s": d(&self.e2e),
            "errors": self.errors,
        })
    }

    /// A human-readable table in the spirit of SGLang's bench_serving output (latencies in ms).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let line = |out: &mut String, name: &str, value: String| {
            out.push_str(&format!("{name:<34}{value:>14}\n"))
        };
        out.push_str("============ Serving Benchmark Result ============\n");
        line(&mut out, "Model:", self.model.clone());
        line(&mut out, "Max concurrency:", self.concurrency.to_string());
        line(&mut out, "Successful requests:", self.completed.to_string());
        line(&mut out, "Failed requests:", self.failed.to_string());
        line(
            &mut out,
            "Benchmark duration (s):",
            format!("{:.2}", self.duration.as_secs_f64()),
        );
        line(
            &mut out,
            "Total input tokens:",
            self.prompt_tokens.to_string(),
        );
        line(
            &mut out,
            "Total generated tokens:",
            self.output_tokens.to_string(),
        );
        line(
            &mut out,
            "Cached input tokens:",
            format!(
                "{} ({:.1} %)",
                self.cached_tokens,
                100.0 * self.cache_hit_rate()
            ),
        );
        line(
            &mut out,
            "Request throughput (req/s):",
            format!("{:.2}", self.request_throughput),
        );
        line(
            &mut out,
            "Input token throughput (tok/s):",
            format!("{:.2}", self.input_throughput),
        );
        line(
            &mut out,
            "Output token throughput (tok/s):",
            format!("{:.2}", self.output_throughput),
        );
        let mut section = |title: &str, name: &str, d: &Distribution| {
            out.push_str(&format!("{:-^50}\n", format!(" {title} ")));
            line(
                &mut out,
                &format!("Mean {name} (ms):"),
                format!("{:.2}", d.mean * 1e3),
            );
            line(
                &mut out,
                &format!("P50 {name} (ms):"),
                format!("{:.2}", d.p50 * 1e3),
            );
            line(
                &mut out,
                &format!("P90 {name} (ms):"),
                format!("{:.2}", d.p90 * 1e3),
            );
            line(
                &mut out,
                &format!("P99 {name} (ms):"),
                format!("{:.2}", d.p99 * 1e3),
            );
        };
        section("End-to-End Latency", "E2E", &self.e2e);
        if self.streamed {
            section("Time to First Token", "TTFT", &self.ttft);
            section(
                "Time per Output Token (excl. 1st token)",
                "TPOT",
                &self.tpot,
            );
            section("Inter-token Latency", "ITL", &self.itl);
            if self.ttft_by_turn.len() > 1 {
                out.push_str(&format!("{:-^50}\n", " TTFT by Turn "));
                for (t, d) in self.ttft_by_turn.iter().enumerate() {
                    line(
                        &mut out,
                        &format!("Turn {} mean / P50 TTFT (ms):", t + 1),
                        format!("{:.1} / {:.1}", d.mean * 1e3, d.p50 * 1e3),
                    );
                }
            }
        } else {
            out.push_str("(TTFT, TPOT and ITL need --stream)\n");
        }
        out.push_str(&"=".repeat(50));
        out.push('\n');
        for error in &self.errors {
            out.push_str(&format!("error: {error}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let sorted: Vec<f64> = (1..=10).map(f64::from).collect();
        assert!((percentile(&sorted, 50.0) - 5.5).abs() < 1e-12);
        assert!((percentile(&sorted, 90.0) - 9.1).abs() < 1e-12);
        assert!((percentile(&sorted, 99.0) - 9.91).abs() < 1e-12);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
    }
}
