//! Data parallelism in one process (`--dp-size N`): N whole engines, each with its own weights,
//! cache pools and scheduler thread, behind one `EngineHandle`. A request goes to the replica with
//! the fewest running and queued requests, ties taken in turn; a request id carries its replica, so
//! an abort reaches the right engine; statistics add up, and the metrics report the totals under
//! their usual names plus every replica's own samples labelled `replica`.

use crate::api::*;
use crate::engine::LocalEngine;
use crate::metrics::EngineMetrics;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// N engine replicas serving as one.
pub struct ReplicaSet {
    replicas: Vec<Arc<LocalEngine>>,
    /// Where the search for the least loaded replica starts, advanced on every submission: equal
    /// loads are served in turn.
    turn: AtomicUsize,
}

impl ReplicaSet {
    /// The replicas, in `replica` label order. There must be at least one.
    pub fn new(replicas: Vec<Arc<LocalEngine>>) -> Arc<Self> {
        assert!(!replicas.is_empty(), "a replica set needs a replica");
        Arc::new(Self {
            replicas,
            turn: AtomicUsize::new(0),
        })
    }

    pub fn engines(&self) -> &[Arc<LocalEngine>] {
        &self.replicas
    }

    /// The replica the next request goes to.
    fn pick(&self) -> usize {
        let loads: Vec<usize> = self.replicas.iter().map(|r| r.load()).collect();
        least_loaded(&loads, self.turn.fetch_add(1, Ordering::Relaxed))
    }
}

/// The index of the smallest load; among equal ones the first at or after `start` (cyclically).
pub fn least_loaded(loads: &[usize], start: usize) -> usize {
    let n = loads.len().max(1);
    (0..n)
        .map(|k| (start + k) % n)
        .min_by_key(|&i| loads.get(i).copied().unwrap_or(usize::MAX))
        .unwrap_or(0)
}

/// The id the caller sees for request `local` of replica `replica` out of `n`.
fn global_id(local: RequestId, replica: usize, n: usize) -> RequestId {
    local * n as u64 + replica as u64
}

/// `(replica, local id)` of a global id.
fn split_id(global: RequestId, n: usize) -> (usize, RequestId) {
    ((global % n as u64) as usize, global / n as u64)
}

impl EngineHandle for ReplicaSet {
    fn submit(
        &self,
        request: GenerationRequest,
    ) -> Result<(RequestId, EventReceiver), SubmitError> {
        self.submit_constrained(request, None)
    }

    fn submit_constrained(
        &self,
        request: GenerationRequest,
        constraint: Option<Box<dyn TokenConstraint>>,
    ) -> Result<(RequestId, EventReceiver), SubmitError> {
        let replica = self.pick();
        let (local, events) = self.replicas[replica].submit_constrained(request, constraint)?;
        Ok((global_id(local, replica, self.replicas.len()), events))
    }

    fn abort(&self, id: RequestId) {
        let (replica, local) = split_id(id, self.replicas.len());
        self.replicas[replica].abort(local);
    }

    fn stats(&self) -> EngineStats {
        self.replicas
            .iter()
            .map(|r| r.stats())
            .fold(EngineStats::default(), |sum, s| EngineStats {
                running: sum.running + s.running,
                queued: sum.queued + s.queued,
                kv_blocks_used: sum.kv_blocks_used + s.kv_blocks_used,
                kv_blocks_total: sum.kv_blocks_total + s.kv_blocks_total,
                state_slots_used: sum.state_slots_used + s.state_slots_used,
                state_slots_total: sum.state_slots_total + s.state_slots_total,
                cached_kv_blocks: sum.cached_kv_blocks + s.cached_kv_blocks,
                cached_snapshots: sum.cached_snapshots + s.cached_snapshots,
            })
    }

    /// Every replica runs the same model with the same plan: replica 0 speaks for all.
    fn context_length(&self) -> usize {
        self.replicas[0].context_length()
    }

    fn vocab_size(&self) -> usize {
        self.replicas[0].vocab_size()
    }

    fn prometheus_metrics(&self) -> String {
        let total =
            EngineMetrics::sum(self.replicas.iter().map(|r| r.metrics())).render(&self.stats());
        let per_replica: Vec<String> = self
            .replicas
            .iter()
            .map(|r| r.prometheus_metrics())
            .collect();
        with_replica_samples(&total, &per_replica)
    }

    fn flush_cache(&self) -> bool {
        // Every replica flushes: no short cut after the first.
        self.replicas
            .iter()
            .map(|r| r.flush_cache())
            .fold(false, |any, flushed| any | flushed)
    }

    fn replicas(&self) -> Vec<SharedEngine> {
        self.replicas
            .iter()
            .map(|r| Arc::clone(r) as SharedEngine)
            .collect()
    }

    fn generated_tokens(&self) -> u64 {
        self.replicas.iter().map(|r| r.generated_tokens()).sum()
    }

    /// The first replica whose device is lost: the process restarts as a whole (one replica's
    /// GPU gone usually means the host needs attention).
    fn device_lost(&self) -> Option<String> {
        self.replicas
            .iter()
            .enumerate()
            .find_map(|(i, r)| r.device_lost().map(|cause| format!("replica {i}: {cause}")))
    }
}

/// The lines of a Prometheus text by metric family (each starts at its `# HELP` line), keyed by
/// the family's name.
fn families(text: &str) -> Vec<(&str, Vec<&str>)> {
    let mut out: Vec<(&str, Vec<&str>)> = Vec::new();
    for line in text.lines() {
        if let Some(help) = line.strip_prefix("# HELP ") {
            let name = help.split(' ').next().unwrap_or(help);
            out.push((name, Vec::new()));
        }
        match out.last_mut() {
            Some((_, lines)) => lines.push(line),
            None => out.push(("", vec![line])),
        }
    }
    out
}

/// A sample line with `replica="R"` as its first label.
fn labelled(sample: &str, replica: usize) -> String {
    match sample.find(['{', ' ']) {
        Some(i) if sample[i..].starts_with('{') => {
            format!(
                "{}{{replica=\"{replica}\",{}",
                &sample[..i],
                &sample[i + 1..]
            )
        }
        Some(i) => format!("{}{{replica=\"{replica}\"}}{}", &sample[..i], &sample[i..]),
        None => sample.to_string(),
    }
}

/// `total` with each replica's samples of a family appended to that family, labelled with the
/// replica's index (a family's samples must stay together in the text format).
fn with_replica_samples(total: &str, per_replica: &[String]) -> String {
    let per_replica: Vec<HashMap<&str, Vec<&str>>> = per_replica
        .iter()
        .map(|text| families(text).into_iter().collect())
        .collect();
    let mut out = String::new();
    for (name, lines) in families(total) {
        for line in lines {
            out.push_str(line);
            out.push('\n');
        }
        for (replica, families) in per_replica.iter().enumerate() {
            let samples = families.get(name).into_iter().flatten();
            for sample in samples.filter(|l| !l.starts_with('#')) {
                out.push_str(&labelled(sample, replica));
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_loaded_replica_wins_and_ties_go_in_turn() {
        assert_eq!(least_loaded(&[3, 1, 2], 0), 1);
        assert_eq!(least_loaded(&[3, 1, 2], 2), 1);
        let picks: Vec<usize> = (0..6).map(|turn| least_loaded(&[0, 0, 0], turn)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        assert_eq!(least_loaded(&[1, 0, 0], 0), 1);
        assert_eq!(least_loaded(&[1, 0, 0], 2), 2);
        assert_eq!(least_loaded(&[5], 7), 0);
    }

    #[test]
    fn request_ids_carry_their_replica() {
        for n in 1..5 {
            for replica in 0..n {
                for local in [1, 2, 99, 1 << 40] {
                    let global = global_id(local, replica, n);
                    assert_eq!(split_id(global, n), (replica, local));
                }
            }
        }
        assert_eq!(global_id(7, 0, 1), 7, "one replica keeps the engine's ids");
    }

    #[test]
    fn replica_samples_join_their_family_with_a_replica_label() {
        let render = |running: u32, accepted: u32| {
            format!(
                "# HELP deltaserve_running_requests Requests.\n# TYPE deltaserve_running_requests gauge\n\
                 deltaserve_running_requests {running}\n\
                 # HELP deltaserve_accepted_total Per position.\n# TYPE deltaserve_accepted_total counter\n\
                 deltaserve_accepted_total{{position=\"0\"}} {accepted}\n"
            )
        };
        let merged = with_replica_samples(&render(3, 5), &[render(1, 2), render(2, 3)]);
        assert_eq!(
            merged,
            "# HELP deltaserve_running_requests Requests.\n# TYPE deltaserve_running_requests gauge\n\
             deltaserve_running_requests 3\n\
             deltaserve_running_requests{replica=\"0\"} 1\n\
             deltaserve_running_requests{replica=\"1\"} 2\n\
             # HELP deltaserve_accepted_total Per position.\n# TYPE deltaserve_accepted_total counter\n\
             deltaserve_accepted_total{position=\"0\"} 5\n\
             deltaserve_accepted_total{replica=\"0\",position=\"0\"} 2\n\
             deltaserve_accepted_total{replica=\"1\",position=\"0\"} 3\n"
        );
    }

    #[test]
    fn totals_add_every_counter_of_every_replica() {
        let (a, b) = (EngineMetrics::default(), EngineMetrics::default());
        EngineMetrics::add(&a.generated_tokens, 4);
        EngineMetrics::add(&b.generated_tokens, 6);
        EngineMetrics::add(&b.spec_accepted_at[2], 1);
        EngineMetrics::add(&a.prefix_cache_evicted_snapshots, 2);
        let total = EngineMetrics::sum([&a, &b]);
        assert_eq!(total.generated_tokens.load(Ordering::Relaxed), 10);
        assert_eq!(total.spec_accepted_at[2].load(Ordering::Relaxed), 1);
        assert_eq!(
            total.prefix_cache_evicted_snapshots.load(Ordering::Relaxed),
            2
        );
    }
}
