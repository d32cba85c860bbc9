//! How long the device waits for the host between the engine's device work (forwards, their
//! sampling, MTP drafting). With synchronous steps every microsecond the host spends scheduling,
//! committing tokens and building the next inputs is a microsecond the GPU idles; this clock
//! measures that share so a user (and an overlap scheduler's benchmark) can see it. Time spent
//! blocked waiting for requests is not a gap: the engine had nothing to run.

use crate::metrics::EngineMetrics;
use std::time::Instant;

#[derive(Default)]
pub(crate) struct HostGapClock {
    /// When the last device work ended, while the engine stayed busy.
    last_device_end: Option<Instant>,
    /// When the device work now running began.
    device_begin: Option<Instant>,
}

impl HostGapClock {
    /// Device work starts now: the time since the previous device work ended was host time.
    pub(crate) fn device_begins(&mut self, metrics: &EngineMetrics) {
        let now = Instant::now();
        if let Some(end) = self.last_device_end.take() {
            EngineMetrics::add(&metrics.host_gap_us, micros(now - end));
        }
        self.device_begin = Some(now);
    }

    /// The device work begun last has ended (its results are on the host).
    pub(crate) fn device_ends(&mut self, metrics: &EngineMetrics) {
        let now = Instant::now();
        if let Some(begin) = self.device_begin.take() {
            EngineMetrics::add(&metrics.device_work_us, micros(now - begin));
        }
        self.last_device_end = Some(now);
    }

    /// The engine goes idle (it waits for a request): what follows is not a host gap.
    pub(crate) fn idle(&mut self) {
        self.last_device_end = None;
        self.device_begin = None;
    }
}

fn micros(d: std::time::Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

/// The host's share of the busy time, `gap / (gap + device)`; `None` before any device work.
pub fn host_share(gap_us: u64, device_us: u64) -> Option<f64> {
    let busy = gap_us + device_us;
    (busy > 0).then(|| gap_us as f64 / busy as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    fn read(metrics: &EngineMetrics) -> (u64, u64) {
        (
            metrics.host_gap_us.load(Ordering::Relaxed),
            metrics.device_work_us.load(Ordering::Relaxed),
        )
    }

    #[test]
    fn the_gap_is_the_time_between_device_work_and_idle_time_is_not_counted() {
        let metrics = EngineMetrics::default();
        let mut clock = HostGapClock::default();
        clock.device_begins(&metrics);
        std::thread::sleep(Duration::from_millis(20));
        clock.device_ends(&metrics);
        let (gap, device) = read(&metrics);
        assert_eq!(gap, 0, "nothing ran before the first device work");
        assert!(device >= 20_000, "device work of 20 ms counted {device} us");

        std::thread::sleep(Duration::from_millis(10));
        clock.device_begins(&metrics);
        clock.device_ends(&metrics);
        let (gap, _) = read(&metrics);
        assert!(gap >= 10_000, "a 10 ms host gap counted {gap} us");

        clock.idle();
        std::thread::sleep(Duration::from_millis(30));
        clock.device_begins(&metrics);
        let (after_idle, _) = read(&metrics);
        assert_eq!(after_idle, gap, "waiting for requests is not a host gap");
    }

    #[test]
    fn the_share_is_the_gap_over_the_busy_time() {
        assert_eq!(host_share(0, 0), None);
        assert_eq!(host_share(1, 3), Some(0.25));
        assert_eq!(host_share(0, 5), Some(0.0));
    }
}
