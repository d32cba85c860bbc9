//! What a backend's own device is and does apart from computing the model: how much memory it has,
//! how fast it reads it, how long each op takes on it. The cache planner, `bench --profile` and
//! `bench --measure-bandwidth` ask; the forward pass never does. A backend that runs from host
//! memory has no device (`Backend::device` is `None`) and its callers measure the host themselves.

use crate::op_profile::OpTiming;

/// A backend's own device (a GPU).
pub trait Device: Send + Sync {
    /// `(free, total)` bytes of the device's memory; the cache pools are planned from the free part.
    fn memory(&self) -> (usize, usize);

    /// The measured read bandwidth of the device's memory in bytes/s.
    fn measure_read_bandwidth(&self) -> f64;

    /// Starts (or stops) timing every op on the device.
    fn set_op_profiling(&self, on: bool);

    /// The device time per op since profiling started (and resets it), most expensive first.
    fn take_op_profile(&self) -> Vec<OpTiming>;
}
