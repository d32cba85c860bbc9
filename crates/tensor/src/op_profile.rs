//! Per-op device time, as a backend that can time its own ops reports it (`bench --profile`): the
//! record of where a forward pass spends its time. Backends that cannot time ops report nothing.

/// Total device time of one kind of op over the profiled span.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTiming {
    /// The op and, where it matters, its shape (e.g. `matmul 5120x17408`).
    pub name: String,
    pub calls: u64,
    pub seconds: f64,
}
