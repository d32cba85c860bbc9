//! Health of the server as /health reports it: a settable status (loading, ready, failed with a reason)
//! plus proof of life: the time of the last successful generation, and a one-token greedy probe through
//! the engine when none is recent. It does not decide what the start-up canary checks.

use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use deltaserve_engine::{
    EngineEvent, EngineHandle, FinishReason, GenerationRequest, SamplingParams, SharedEngine,
};

/// What the server says about itself before any generation is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthStatus {
    /// Loading weights or warming up; the reason says what is happening.
    Loading(String),
    /// Loaded; /health still proves generation before answering 200.
    Ready,
    /// Start-up canary or another fatal check failed; the server answers 503 until set otherwise.
    Failed(String),
}

/// Result of one health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthReport {
    Healthy { probed: bool },
    Loading(String),
    Failed(String),
    Unhealthy(String),
}

/// The health state shared by the routes.
#[derive(Debug)]
pub struct HealthMonitor {
    status: RwLock<HealthStatus>,
    last_success: Mutex<Option<Instant>>,
    /// Data-parallel replicas: what each had generated when last seen, and when that last grew
    /// or a probe on it succeeded (its own proof of life; one busy replica proves nothing of another).
    replica_progress: Mutex<Vec<ReplicaProgress>>,
    /// Serialises probes so a burst of health checks runs one generation, not many.
    probe: tokio::sync::Mutex<()>,
    interval: Duration,
    probe_timeout: Duration,
}

impl HealthMonitor {
    pub fn new(interval: Duration, probe_timeout: Duration) -> Self {
        Self {
            status: RwLock::new(HealthStatus::Loading("starting".to_string())),
            last_success: Mutex::new(None),
            replica_progress: Mutex::new(Vec::new()),
            probe: tokio::sync::Mutex::new(()),
            interval,
            probe_timeout,
        }
    }

    pub fn set(&self, status: HealthStatus) {
        *self.status.write().unwrap_or_else(|p| p.into_inner()) = status;
    }

    pub fn status(&self) -> HealthStatus {
        self.status
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Called when a real request finished generating at least one token.
    pub fn record_success(&self) {
        *self.last_success.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    fn recent_success(&self) -> bool {
        self.last_success
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| t.elapsed() <= self.interval)
    }

    /// Checks health, running a one-token greedy generation through `engine` when no generation
    /// succeeded within the interval. `probe_prompt` must be non-empty token ids.
    pub async fn check(
        &self,
        engine: Option<&dyn EngineHandle>,
        probe_prompt: &[u32],
    ) -> HealthReport {
        match self.status() {
            HealthStatus::Loading(reason) => return HealthReport::Loading(reason),
            HealthStatus::Failed(reason) => return HealthReport::Failed(reason),
            HealthStatus::Ready => {}
        }
        if let Some(lost) = engine.and_then(|e| e.device_lost()) {
            return HealthReport::Failed(format!("the device is lost: {lost}"));
        }
        let Some(engine) = engine else {
            return match self.recent_success() {
                true => HealthReport::Healthy { probed: false },
                false => HealthReport::Loading("the engine is not attached yet".to_string()),
            };
        };
        let replicas = engine.replicas();
        if !replicas.is_empty() {
            return self.check_replicas(&replicas, probe_prompt).await;
        }
        if self.recent_success() {
            return HealthReport::Healthy { probed: false };
        }
        let _guard = self.probe.lock().await;
        // Another check may have probed (or a request finished) while this one waited for the lock.
        if self.recent_success() {
            return HealthReport::Healthy { probed: false };
        }
        match tokio::time::timeout(self.probe_timeout, probe(engine, probe_prompt)).await {
            Ok(Ok(())) => {
                self.record_success();
                HealthReport::Healthy { probed: true }
            }
            Ok(Err(reason)) => HealthReport::Unhealthy(reason),
            Err(_) => HealthReport::Unhealthy(format!(
                "the one-token probe generation did not finish within {} s",
                self.probe_timeout.as_secs_f32()
            )),
        }
    }

    /// Healthy only while every replica is: each one that generated nothing within the interval
    /// is probed; the first failure names its replica.
    async fn check_replicas(
        &self,
        replicas: &[SharedEngine],
        probe_prompt: &[u32],
    ) -> HealthReport {
        let stale: Vec<usize> = {
            let mut progress = self
                .replica_progress
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            progress.resize(replicas.len(), ReplicaProgress::default());
            let now = Instant::now();
            replicas
                .iter()
                .zip(progress.iter_mut())
                .enumerate()
                .filter_map(|(i, (replica, seen))| {
                    seen.observe(replica.generated_tokens(), now);
                    (!seen.recent(now, self.interval)).then_some(i)
                })
                .collect()
        };
        if stale.is_empty() {
            return HealthReport::Healthy { probed: false };
        }
        let _guard = self.probe.lock().await;
        for i in stale {
            let outcome = tokio::time::timeout(
                self.probe_timeout,
                probe(replicas[i].as_ref(), probe_prompt),
            )
            .await;
            let why = match outcome {
                Ok(Ok(())) => {
                    let mut progress = self
                        .replica_progress
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    if let Some(seen) = progress.get_mut(i) {
                        seen.proven = Some(Instant::now());
                    }
                    continue;
                }
                Ok(Err(reason)) => reason,
                Err(_) => format!(
                    "the one-token probe generation did not finish within {} s",
                    self.probe_timeout.as_secs_f32()
                ),
            };
            return HealthReport::Unhealthy(format!(
                "data-parallel replica {i} of {}: {why}",
                replicas.len()
            ));
        }
        HealthReport::Healthy { probed: true }
    }
}

/// One replica's proof of life.
#[derive(Debug, Clone, Copy, Default)]
struct ReplicaProgress {
    generated: u64,
    /// When `generated` was last seen to grow, or a probe on the replica last succeeded.
    proven: Option<Instant>,
}

impl ReplicaProgress {
    fn observe(&mut self, generated: u64, now: Instant) {
        if generated != self.generated {
            self.generated = generated;
            self.proven = Some(now);
        }
    }

    fn recent(&self, now: Instant, interval: Duration) -> bool {
        self.proven
            .is_some_and(|t| now.saturating_duration_since(t) <= interval)
    }
}

/// Aborts an engine request when dropped unless it finished: a probe cut by its timeout frees its slot.
struct ProbeGuard<'a> {
    engine: &'a dyn EngineHandle,
    id: u64,
    done: bool,
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.engine.abort(self.id);
        }
    }
}

/// One greedy token through the engine, like SGLang's /health_generate.
async fn probe(engine: &dyn EngineHandle, prompt: &[u32]) -> Result<(), String> {
    let request = GenerationRequest {
        prompt_ids: prompt.to_vec(),
        sampling: SamplingParams::default(),
        max_new_tokens: 1,
        stop_token_ids: Vec::new(),
        disable_speculation: true,
    };
    let (id, mut events) = engine
        .submit(request)
        .map_err(|e| format!("the engine refused the probe generation: {e}"))?;
    let mut guard = ProbeGuard {
        engine,
        id,
        done: false,
    };
    let mut tokens = 0;
    while let Some(event) = events.recv().await {
        match event {
            EngineEvent::Token { .. } => tokens += 1,
            EngineEvent::Finished { reason, .. } => {
                guard.done = true;
                return match (reason, tokens) {
                    (FinishReason::Abort, _) => Err("the probe generation was aborted".to_string()),
                    (_, 0) => Err("the probe generation finished without a token".to_string()),
                    _ => Ok(()),
                };
            }
            EngineEvent::Error { message } => {
                guard.done = true;
                return Err(format!("the probe generation failed: {message}"));
            }
        }
    }
    guard.done = true;
    Err("the engine dropped the probe generation without finishing it".to_string())
}
