//! Per-op device timing for `bench --profile`: a pair of CUDA events around every op on the stream,
//! read back when the profile is taken. Off by default, when an op pays one atomic load.

use crate::backend::{device_failure, CudaBackend};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaEvent;
use deltaserve_tensor::OpTiming;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Events still in flight are folded into the totals once this many pile up (bounds memory).
const MAX_PENDING: usize = 8192;

#[derive(Default)]
pub(crate) struct OpProfiler {
    on: AtomicBool,
    state: Mutex<ProfileState>,
}

#[derive(Default)]
struct ProfileState {
    pending: Vec<(String, CudaEvent, CudaEvent)>,
    totals: HashMap<String, (u64, f64)>,
}

impl ProfileState {
    fn fold_pending(&mut self) {
        for (name, start, end) in self.pending.drain(..) {
            let ms = start
                .elapsed_ms(&end)
                .unwrap_or_else(|e| device_failure("reading op timings", e));
            let entry = self.totals.entry(name).or_default();
            entry.0 += 1;
            entry.1 += ms as f64 / 1e3;
        }
    }
}

/// An op's name in the profile: a fixed one, or a closure that builds it (from the op's shapes)
/// only when profiling is on.
pub(crate) trait OpName {
    fn op_name(self) -> String;
}

impl OpName for &'static str {
    fn op_name(self) -> String {
        self.to_string()
    }
}

impl<F: FnOnce() -> String> OpName for F {
    fn op_name(self) -> String {
        self()
    }
}

impl CudaBackend {
    /// Runs `op`, timing it on the device when profiling is on; `name` is only built then.
    pub(crate) fn timed<R>(&self, name: impl OpName, op: impl FnOnce() -> R) -> R {
        if !self.profiler.on.load(Ordering::Relaxed) {
            return op();
        }
        let event = || {
            self.stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .unwrap_or_else(|e| device_failure("recording a timing event", e))
        };
        let start = event();
        let result = op();
        let end = event();
        let mut state = self
            .profiler
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        state.pending.push((name.op_name(), start, end));
        if state.pending.len() >= MAX_PENDING {
            state.fold_pending();
        }
        result
    }

    pub(crate) fn profiler_on(&self) -> bool {
        self.profiler.on.load(Ordering::Relaxed)
    }

    pub(crate) fn set_op_profiling_op(&self, on: bool) -> bool {
        self.profiler.on.store(on, Ordering::Relaxed);
        true
    }

    pub(crate) fn take_op_profile_op(&self) -> Vec<OpTiming> {
        let mut state = self
            .profiler
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        state.fold_pending();
        let mut timings: Vec<OpTiming> = state
            .totals
            .drain()
            .map(|(name, (calls, seconds))| OpTiming {
                name,
                calls,
                seconds,
            })
            .collect();
        timings.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then(a.name.cmp(&b.name)));
        timings
    }
}

#[cfg(test)]
mod tests {
    use super::OpName;

    #[test]
    fn a_fixed_name_and_a_built_one_are_the_same_string() {
        assert_eq!("rms_norm".op_name(), "rms_norm");
        let (rows, cols) = (2, 3);
        assert_eq!((|| format!("matmul {rows}x{cols}")).op_name(), "matmul 2x3");
    }
}
