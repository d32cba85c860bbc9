//! Engine-side Prometheus metrics: pool and queue gauges, preemptions, forward steps, and the
//! speculative-decoding counters of docs/serving.md, "Metrics". Counters only ever grow, so rates
//! can be derived; HTTP-level metrics (requests, latencies) belong to the api crate.

use crate::api::EngineStats;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Speculative positions tracked individually (`accepted per position`).
pub const MAX_SPEC_POSITIONS: usize = 8;

#[derive(Default)]
pub struct EngineMetrics {
    pub preemptions: AtomicU64,
    /// Steps that failed (a panic inside the step, e.g. a device error); their requests ended
    /// with an error.
    pub failed_steps: AtomicU64,
    pub forward_steps: AtomicU64,
    pub batch_tokens: AtomicU64,
    pub prompt_tokens_computed: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Speculative decoding: verify steps, drafted tokens, accepted drafts, accepted per position.
    pub spec_verify_steps: AtomicU64,
    pub spec_draft_tokens: AtomicU64,
    pub spec_accepted_tokens: AtomicU64,
    pub spec_accepted_at: [AtomicU64; MAX_SPEC_POSITIONS],
    /// Prefix cache: prompt tokens looked up, tokens reused, snapshots taken, evictions.
    pub prefix_cache_queried_tokens: AtomicU64,
    pub prefix_cache_hit_tokens: AtomicU64,
    pub prefix_cache_snapshots_taken: AtomicU64,
    pub prefix_cache_evicted_pages: AtomicU64,
    pub prefix_cache_evicted_snapshots: AtomicU64,
    /// Microseconds the device waited for the host between the engine's device work while the
    /// engine had work, and microseconds of that device work (`host_gap.rs`).
    pub host_gap_us: AtomicU64,
    pub device_work_us: AtomicU64,
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

fn counter_seconds(out: &mut String, name: &str, help: &str, micros: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
        micros as f64 / 1e6
    );
}

fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
    );
}

impl EngineMetrics {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Every counter, in a fixed order (what `sum` adds up). The destructuring names every field,
    /// so a new counter cannot be left out of the totals.
    fn counters(&self) -> impl Iterator<Item = &AtomicU64> {
        let EngineMetrics {
            preemptions,
            failed_steps,
            forward_steps,
            batch_tokens,
            prompt_tokens_computed,
            generated_tokens,
            spec_verify_steps,
            spec_draft_tokens,
            spec_accepted_tokens,
            spec_accepted_at,
            prefix_cache_queried_tokens,
            prefix_cache_hit_tokens,
            prefix_cache_snapshots_taken,
            prefix_cache_evicted_pages,
            prefix_cache_evicted_snapshots,
            host_gap_us,
            device_work_us,
        } = self;
        [
            preemptions,
            failed_steps,
            forward_steps,
            batch_tokens,
            prompt_tokens_computed,
            generated_tokens,
            spec_verify_steps,
            spec_draft_tokens,
            spec_accepted_tokens,
            prefix_cache_queried_tokens,
            prefix_cache_hit_tokens,
            prefix_cache_snapshots_taken,
            prefix_cache_evicted_pages,
            prefix_cache_evicted_snapshots,
            host_gap_us,
            device_work_us,
        ]
        .into_iter()
        .chain(spec_accepted_at)
    }

    /// The counters of several engines added up (data-parallel replicas' totals).
    pub fn sum<'a>(parts: impl IntoIterator<Item = &'a EngineMetrics>) -> EngineMetrics {
        let total = EngineMetrics::default();
        for part in parts {
            for (sum, counter) in total.counters().zip(part.counters()) {
                Self::add(sum, counter.load(Ordering::Relaxed));
            }
        }
        total
    }

    /// Prometheus text exposition of the engine's metrics and the current pool occupancy.
    pub fn render(&self, stats: &EngineStats) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut out = String::new();
        gauge(
            &mut out,
            "deltaserve_running_requests",
            "Requests in the running batch.",
            stats.running as f64,
        );
        gauge(
            &mut out,
            "deltaserve_queued_requests",
            "Requests waiting for admission.",
            stats.queued as f64,
        );
        gauge(
            &mut out,
            "deltaserve_kv_blocks_used",
            "Paged KV blocks in use (full-attention layers).",
            stats.kv_blocks_used as f64,
        );
        gauge(
            &mut out,
            "deltaserve_kv_blocks_total",
            "Paged KV blocks in the pool.",
            stats.kv_blocks_total as f64,
        );
        let ratio = |used: usize, total: usize| {
            if total == 0 {
                0.0
            } else {
                used as f64 / total as f64
            }
        };
        gauge(
            &mut out,
            "deltaserve_kv_usage",
            "Fraction of KV blocks in use.",
            ratio(stats.kv_blocks_used, stats.kv_blocks_total),
        );
        gauge(
            &mut out,
            "deltaserve_state_slots_used",
            "GDN state slots in use (conv window + recurrent state).",
            stats.state_slots_used as f64,
        );
        gauge(
            &mut out,
            "deltaserve_state_slots_total",
            "GDN state slots in the pool.",
            stats.state_slots_total as f64,
        );
        gauge(
            &mut out,
            "deltaserve_state_slot_usage",
            "Fraction of GDN state slots in use.",
            ratio(stats.state_slots_used, stats.state_slots_total),
        );
        counter(
            &mut out,
            "deltaserve_preemptions_total",
            "Sequences whose cache was dropped to free KV blocks (recomputed later).",
            get(&self.preemptions),
        );
        counter(
            &mut out,
            "deltaserve_failed_steps_total",
            "Engine steps that failed (e.g. a device error); the requests they ran ended with an error.",
            get(&self.failed_steps),
        );
        counter(
            &mut out,
            "deltaserve_forward_steps_total",
            "Model forward steps run by the engine.",
            get(&self.forward_steps),
        );
        counter_seconds(
            &mut out,
            "deltaserve_engine_host_gap_seconds_total",
            "Time the device waited for the host between steps while the engine had work (scheduling, committing tokens, building inputs).",
            get(&self.host_gap_us),
        );
        counter_seconds(
            &mut out,
            "deltaserve_engine_device_work_seconds_total",
            "Wall time of the engine's device work: forwards, their sampling and MTP drafting, until the results were on the host.",
            get(&self.device_work_us),
        );
        counter(
            &mut out,
            "deltaserve_batch_tokens_total",
            "Tokens processed by forward steps (prefill and decode).",
            get(&self.batch_tokens),
        );
        counter(
            &mut out,
            "deltaserve_engine_prompt_tokens_computed_total",
            "Prompt tokens run through the model (recomputation included).",
            get(&self.prompt_tokens_computed),
        );
        counter(
            &mut out,
            "deltaserve_engine_generated_tokens_total",
            "Tokens generated by the engine.",
            get(&self.generated_tokens),
        );
        counter(
            &mut out,
            "deltaserve_spec_decode_num_drafts_total",
            "Speculative verify steps (one per sequence per step).",
            get(&self.spec_verify_steps),
        );
        counter(
            &mut out,
            "deltaserve_spec_decode_num_draft_tokens_total",
            "Draft tokens proposed by the MTP head.",
            get(&self.spec_draft_tokens),
        );
        counter(
            &mut out,
            "deltaserve_spec_decode_num_accepted_tokens_total",
            "Draft tokens accepted by the target (bonus tokens excluded).",
            get(&self.spec_accepted_tokens),
        );
        let (queried, hits) = (
            get(&self.prefix_cache_queried_tokens),
            get(&self.prefix_cache_hit_tokens),
        );
        counter(
            &mut out,
            "deltaserve_prefix_cache_queries_total",
            "Prompt tokens of admitted requests looked up in the prefix cache (vLLM's prefix_cache_queries).",
            queried,
        );
        counter(
            &mut out,
            "deltaserve_prefix_cache_hits_total",
            "Prompt tokens reused from the prefix cache instead of computed (vLLM's prefix_cache_hits).",
            hits,
        );
        gauge(
            &mut out,
            "deltaserve_cache_hit_rate",
            "Cached prompt tokens / prompt tokens since start (SGLang's cache_hit_rate).",
            if queried == 0 {
                0.0
            } else {
                hits as f64 / queried as f64
            },
        );
        counter(
            &mut out,
            "deltaserve_prefix_cache_snapshots_taken_total",
            "GDN state snapshots stored in the prefix cache.",
            get(&self.prefix_cache_snapshots_taken),
        );
        counter(
            &mut out,
            "deltaserve_prefix_cache_evicted_pages_total",
            "KV pages the prefix cache let go of to make room.",
            get(&self.prefix_cache_evicted_pages),
        );
        counter(
            &mut out,
            "deltaserve_prefix_cache_evicted_snapshots_total",
            "GDN snapshots the prefix cache let go of to make room.",
            get(&self.prefix_cache_evicted_snapshots),
        );
        gauge(
            &mut out,
            "deltaserve_prefix_cache_kv_blocks",
            "KV blocks held only by the prefix cache (evictable at once; also counted as used).",
            stats.cached_kv_blocks as f64,
        );
        gauge(
            &mut out,
            "deltaserve_prefix_cache_snapshots",
            "State slots holding prefix-cache snapshots.",
            stats.cached_snapshots as f64,
        );
        let _ = writeln!(
            out,
            "# HELP deltaserve_spec_decode_num_accepted_tokens_per_pos_total Verify steps whose draft at this position was accepted.\n# TYPE deltaserve_spec_decode_num_accepted_tokens_per_pos_total counter"
        );
        for (pos, c) in self.spec_accepted_at.iter().enumerate() {
            let _ = writeln!(
                out,
                "deltaserve_spec_decode_num_accepted_tokens_per_pos_total{{position=\"{pos}\"}} {}",
                get(c)
            );
        }
        out
    }
}
