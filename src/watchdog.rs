//! `--watchdog-timeout`: when requests are running and no forward step has finished for that long,
//! the engine is hung (a kernel that never returns, a deadlock); the server marks /health failed and
//! exits with status 1 so that a supervisor restarts it, as SGLang's watchdog does.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use deltaserve_api::{AppState, HealthStatus};
use deltaserve_engine::{EngineHandle, LocalEngine};

/// Starts the watchdog thread for `engine`.
pub fn spawn(engine: Arc<LocalEngine>, state: Arc<AppState>, timeout: Duration) -> Result<()> {
    let poll = (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || {
            let mut clock = StallClock::new(timeout, Instant::now());
            loop {
                std::thread::sleep(poll);
                let steps = engine.metrics().forward_steps.load(Ordering::Relaxed);
                let running = engine.stats().running;
                if let Some(stalled) = clock.observe(Instant::now(), steps, running > 0) {
                    let why = format!(
                        "watchdog: no forward step finished for {:.1} s with {running} request(s) running \
                         (--watchdog-timeout {:.1}); exiting",
                        stalled.as_secs_f64(),
                        timeout.as_secs_f64()
                    );
                    eprintln!("{why}");
                    state.health.set(HealthStatus::Failed(why));
                    std::process::exit(1);
                }
            }
        })
        .context("starting the watchdog thread")?;
    Ok(())
}

/// Tracks how long the engine has been busy without finishing a forward step.
#[derive(Debug)]
pub struct StallClock {
    timeout: Duration,
    last_steps: u64,
    since: Instant,
}

impl StallClock {
    pub fn new(timeout: Duration, now: Instant) -> Self {
        Self {
            timeout,
            last_steps: 0,
            since: now,
        }
    }

    /// Records the engine's forward-step counter and whether requests are running; returns how long
    /// it has been stalled once that exceeds the timeout.
    pub fn observe(&mut self, now: Instant, steps: u64, busy: bool) -> Option<Duration> {
        if steps != self.last_steps || !busy {
            self.last_steps = steps;
            self.since = now;
            return None;
        }
        let stalled = now.duration_since(self.since);
        (stalled > self.timeout).then_some(stalled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_only_when_busy_without_progress() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut clock = StallClock::new(s(10), t0);
        assert_eq!(clock.observe(t0 + s(5), 0, false), None);
        assert_eq!(
            clock.observe(t0 + s(30), 0, false),
            None,
            "idle is not a stall"
        );
        assert_eq!(clock.observe(t0 + s(31), 0, true), None);
        assert_eq!(
            clock.observe(t0 + s(40), 3, true),
            None,
            "progress resets the clock"
        );
        assert_eq!(clock.observe(t0 + s(49), 3, true), None);
        assert_eq!(clock.observe(t0 + s(51), 3, true), Some(s(11)));
    }
}
