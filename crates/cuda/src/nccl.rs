//! The tensor-parallel collectives on GPUs, over NCCL (docs/tensor-parallel.md): one process, one
//! thread per GPU, each rank with its own `CudaBackend` (context, stream, weights, pools) and its
//! own NCCL communicator, all made at once by `ncclCommInitAll` over the backends' streams. Every
//! collective is queued on the rank's own stream, in order with its ops, so no extra
//! synchronisation is needed. NCCL is loaded at run time like the other CUDA libraries; without a
//! driver or without NCCL, `NcclCommunicator::group` returns an error (nothing panics).

use crate::backend::{device_failure, CudaBackend};
use crate::buffer::CudaBuf;
use crate::error::CudaError;
use crate::libraries;
use cudarc::nccl::{Comm, ReduceOp};
use deltaserve_tensor::{Backend, Communicator};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// An NCCL communicator. `Comm` holds a raw handle, so it is not `Send` by itself; each one is
/// used by its own rank's thread only (the mutex keeps even a misuse from racing).
struct RankComm(Comm);

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it do not overlap;
// the mutex in `NcclCommunicator` serialises them, and its stream is the rank's own.
unsafe impl Send for RankComm {}

/// One rank's end of an NCCL group.
pub struct NcclCommunicator {
    comm: Mutex<RankComm>,
    rank: usize,
    size: usize,
    /// Set when a rank failed: collectives then panic instead of hanging on the others.
    aborted: Arc<AtomicBool>,
}

impl NcclCommunicator {
    /// The NCCL group of these backends: one communicator per backend (rank `r` on `backends[r]`'s GPU and stream). The backends
    /// must be on distinct GPUs.
    pub fn group(backends: &[CudaBackend]) -> Result<Vec<NcclCommunicator>, CudaError> {
        let mut ordinals: Vec<usize> = backends.iter().map(|b| b.ctx.ordinal()).collect();
        ordinals.sort_unstable();
        ordinals.dedup();
        if ordinals.len() != backends.len() {
            return Err(CudaError::Driver {
                what: "making the NCCL group".into(),
                message: "every tensor-parallel rank needs its own GPU".into(),
            });
        }
        libraries::ensure(
            &libraries::NCCL,
            &crate::options::CudaOptions::default().library_dirs,
        )?;
        let streams = backends.iter().map(|b| b.stream.clone()).collect();
        let comms = catch_unwind(AssertUnwindSafe(|| Comm::from_devices(streams)))
            .map_err(|_| CudaError::Panicked {
                during: "making the NCCL group",
                message: "the NCCL bindings panicked".into(),
            })?
            .map_err(|e| CudaError::driver("ncclCommInitAll", e))?;
        let size = comms.len();
        let aborted = Arc::new(AtomicBool::new(false));
        Ok(comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| NcclCommunicator {
                comm: Mutex::new(RankComm(comm)),
                rank,
                size,
                aborted: aborted.clone(),
            })
            .collect())
    }
}

impl NcclCommunicator {
    fn with_comm<T>(&self, backend: &CudaBackend, f: impl FnOnce(&Comm) -> T) -> T {
        if self.aborted.load(Ordering::Relaxed) {
            panic!("{}", deltaserve_tensor::comm::GROUP_ABORTED);
        }
        if let Err(e) = backend.ctx.bind_to_thread() {
            device_failure("binding the context for NCCL", e);
        }
        let guard = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        f(&guard.0)
    }
}

impl Communicator<CudaBackend> for NcclCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce_sum(&self, backend: &CudaBackend, buf: &mut CudaBuf) {
        // A one-rank group still calls NCCL: that is how its plumbing is checked on one GPU.
        if buf.len == 0 {
            return;
        }
        let len = buf.len;
        self.with_comm(backend, |comm| {
            let mut view = buf.data_mut().slice_mut(0..len);
            comm.all_reduce_in_place(&mut view, &ReduceOp::Sum)
                .unwrap_or_else(|e| device_failure("NCCL all-reduce", e));
        });
    }

    fn all_gather_cols(
        &self,
        backend: &CudaBackend,
        buf: &CudaBuf,
        rows: usize,
        cols: usize,
    ) -> CudaBuf {
        let n = rows * cols;
        assert_eq!(buf.len, n, "all-gather: buffer is not rows x cols");
        if n == 0 {
            return backend.copy_buf(buf);
        }
        // NCCL gathers rank-major, `[size, rows, cols]`; read as `[size * rows, cols]`, taking rows
        // in the order (row, rank) gives `[rows, size * cols]`.
        let mut gathered = backend.scratch(n * self.size);
        self.with_comm(backend, |comm| {
            let send = buf.data().slice(0..n);
            let mut recv = gathered.data_mut().slice_mut(0..n * self.size);
            comm.all_gather(&send, &mut recv)
                .unwrap_or_else(|e| device_failure("NCCL all-gather", e));
        });
        if rows == 1 {
            return gathered;
        }
        let order: Vec<u32> = (0..rows)
            .flat_map(|row| (0..self.size).map(move |r| (r * rows + row) as u32))
            .collect();
        backend.gather_rows(&gathered, cols, &order)
    }

    fn abort(&self) {
        self.aborted.store(true, Ordering::Relaxed);
    }

    // `recover` stays the default (false: the group stays aborted, every later step fails, the
    // server has to be restarted). The abort above is only a flag that keeps ranks from queueing
    // new collectives; it does not reach NCCL. A collective is queued on the rank's stream and
    // returns before it runs, so when a rank fails mid-step another rank's all-reduce may still be
    // queued or running on its GPU, waiting for a partner that will never come: every rank having
    // left the step on the host says nothing about the GPUs. Clearing the flag would queue the
    // next step's collectives behind that one and pair them with the wrong calls (a hang or wrong
    // sums). Recovering needs `ncclCommAbort` on every rank and a new `ncclCommInitAll`, which
    // cannot be tested without GPUs here.

    fn kind(&self) -> &'static str {
        "nccl"
    }
}
