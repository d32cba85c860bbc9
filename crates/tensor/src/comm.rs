//! Collectives between the ranks of a tensor-parallel group (docs/tensor-parallel.md). The sharded
//! forward needs two: a sum over ranks after each row-parallel layer (and after the vocabulary-split
//! embedding), and a gather of the vocabulary-split logits so that sampling sees the whole
//! vocabulary. `InProcessGroup` implements them for backends whose buffers live in host memory
//! (ranks are threads of one process); the cuda crate implements them over NCCL.

use crate::backend::Backend;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// One rank's end of a tensor-parallel group. Every rank calls the same collectives in the same
/// order with buffers of the same size; each call returns when this rank's result is in place.
pub trait Communicator<B: Backend>: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// `buf` becomes the elementwise sum of every rank's `buf`; every rank gets the same values.
    fn all_reduce_sum(&self, backend: &B, buf: &mut B::Buf);
    /// `buf [rows, cols]` on every rank gives `[rows, size * cols]` on every rank, rank `r`'s
    /// columns at `r * cols`.
    fn all_gather_cols(&self, backend: &B, buf: &B::Buf, rows: usize, cols: usize) -> B::Buf;
    /// Tells the other ranks that this one failed: collectives they are in (or enter later) panic
    /// instead of waiting forever.
    fn abort(&self) {}
    /// Makes an aborted group usable again; called on one rank (rank 0) after a failed step, once
    /// every rank has left that step (so no rank is inside a collective). Returns whether the group
    /// can run collectives again; the default cannot, and the group stays aborted (every later
    /// collective panics).
    fn recover(&self) -> bool {
        false
    }
    /// What this communicator is, for start-up summaries (e.g. `in-process`, `nccl`).
    fn kind(&self) -> &'static str;
}

/// The panic message of a collective on a rank whose group was aborted (another rank failed): a
/// consequence of a failure, not its cause.
pub const GROUP_ABORTED: &str = "tensor-parallel group aborted: another rank failed";

/// How long a rank waits at a collective before checking again whether the group was aborted.
const POLL: Duration = Duration::from_millis(50);

/// The shared meeting point of an in-process group: each collective is one round in which every
/// rank contributes its host copy and every rank reads all contributions.
struct Rounds {
    size: usize,
    state: Mutex<RoundState>,
    changed: Condvar,
}

#[derive(Default)]
struct RoundState {
    /// Contributions of the round being filled, by rank.
    contributions: Vec<Option<Vec<f32>>>,
    arrived: usize,
    /// Set when every rank has contributed; cleared when every rank has read it.
    complete: Option<Arc<Vec<Vec<f32>>>>,
    read: usize,
    aborted: bool,
}

impl Rounds {
    fn lock(&self) -> MutexGuard<'_, RoundState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits on the condition variable until `ready` holds; panics when the group was aborted.
    fn wait_until<'a>(
        &self,
        mut guard: MutexGuard<'a, RoundState>,
        ready: impl Fn(&RoundState) -> bool,
    ) -> MutexGuard<'a, RoundState> {
        loop {
            if guard.aborted {
                drop(guard);
                panic!("{GROUP_ABORTED}");
            }
            if ready(&guard) {
                return guard;
            }
            guard = self
                .changed
                .wait_timeout(guard, POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Contributes `data` as `rank` and returns every rank's contribution, in rank order.
    fn exchange(&self, rank: usize, data: Vec<f32>) -> Arc<Vec<Vec<f32>>> {
        // A rank that finished the previous round early waits until every rank has read it.
        let mut st = self.wait_until(self.lock(), |s| s.complete.is_none());
        assert!(
            st.contributions[rank].is_none(),
            "rank {rank} entered a collective twice"
        );
        st.contributions[rank] = Some(data);
        st.arrived += 1;
        if st.arrived == self.size {
            let all = st
                .contributions
                .iter_mut()
                .map(|c| c.take().unwrap_or_default())
                .collect();
            st.complete = Some(Arc::new(all));
            st.arrived = 0;
            st.read = 0;
            self.changed.notify_all();
        }
        let mut st = self.wait_until(st, |s| s.complete.is_some());
        let all = st.complete.clone().unwrap_or_default();
        st.read += 1;
        if st.read == self.size {
            st.complete = None;
            self.changed.notify_all();
        }
        all
    }

    fn abort(&self) {
        self.lock().aborted = true;
        self.changed.notify_all();
    }

    /// Clears the abort and whatever the failed round left half done (contributions of ranks that
    /// arrived before the failure, a complete round not every rank read). Only sound while no rank
    /// is inside `exchange`: the caller knows every rank has left the failed step.
    fn recover(&self) {
        let mut st = self.lock();
        st.contributions.iter_mut().for_each(|c| *c = None);
        st.arrived = 0;
        st.complete = None;
        st.read = 0;
        st.aborted = false;
        drop(st);
        self.changed.notify_all();
    }
}

/// A tensor-parallel group whose ranks are threads of this process and whose buffers can be
/// copied to the host (`to_host` / `upload`): the reference and cpu backends. Sums are taken in
/// rank order, so every rank gets bit-identical results.
pub struct InProcessGroup {
    rounds: Arc<Rounds>,
    rank: usize,
}

impl InProcessGroup {
    /// One communicator per rank, rank `r` at index `r`.
    pub fn new(size: usize) -> Vec<Self> {
        assert!(size > 0, "a group has at least one rank");
        let rounds = Arc::new(Rounds {
            size,
            state: Mutex::new(RoundState {
                contributions: vec![None; size],
                ..RoundState::default()
            }),
            changed: Condvar::new(),
        });
        (0..size)
            .map(|rank| Self {
                rounds: rounds.clone(),
                rank,
            })
            .collect()
    }
}

impl<B: Backend> Communicator<B> for InProcessGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.rounds.size
    }

    fn all_reduce_sum(&self, backend: &B, buf: &mut B::Buf) {
        if self.rounds.size == 1 {
            return;
        }
        let all = self.rounds.exchange(self.rank, backend.to_host(buf));
        let mut sum = all[0].clone();
        for other in &all[1..] {
            assert_eq!(other.len(), sum.len(), "all-reduce of different lengths");
            for (s, x) in sum.iter_mut().zip(other) {
                *s += x;
            }
        }
        *buf = backend.upload(&sum);
    }

    fn all_gather_cols(&self, backend: &B, buf: &B::Buf, rows: usize, cols: usize) -> B::Buf {
        let mine = backend.to_host(buf);
        assert_eq!(
            mine.len(),
            rows * cols,
            "all-gather: buffer is not rows x cols"
        );
        if self.rounds.size == 1 {
            return backend.upload(&mine);
        }
        let all = self.rounds.exchange(self.rank, mine);
        let width = cols * all.len();
        let mut out = vec![0f32; rows * width];
        for (r, part) in all.iter().enumerate() {
            for row in 0..rows {
                out[row * width + r * cols..row * width + (r + 1) * cols]
                    .copy_from_slice(&part[row * cols..(row + 1) * cols]);
            }
        }
        backend.upload(&out)
    }

    fn abort(&self) {
        self.rounds.abort();
    }

    fn recover(&self) -> bool {
        self.rounds.recover();
        true
    }

    fn kind(&self) -> &'static str {
        "in-process"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::ReferenceBackend;

    /// `f(group, rank)` on one thread per rank of `groups`, the results in rank order.
    fn on_every_rank<R: Send>(
        groups: &[InProcessGroup],
        f: impl Fn(&InProcessGroup, f32) -> R + Sync,
    ) -> Vec<R> {
        std::thread::scope(|s| {
            let handles: Vec<_> = groups
                .iter()
                .map(|g| {
                    let f = &f;
                    s.spawn(move || f(g, Communicator::<ReferenceBackend>::rank(g) as f32))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn all_reduce_and_gather_over_threads() {
        let groups = InProcessGroup::new(3);
        let results = on_every_rank(&groups, |g, r| {
            let be = ReferenceBackend;
            let mut last = (Vec::new(), Vec::new());
            // Many rounds in a row: ranks run ahead of each other between them.
            for round in 0..50 {
                let mut buf = be.upload(&[r, 10.0 * r + round as f32]);
                g.all_reduce_sum(&be, &mut buf);
                let parts = be.upload(&[r, r + 0.5, -r, -r - 0.5]);
                let gathered = g.all_gather_cols(&be, &parts, 2, 2);
                last = (buf, gathered);
            }
            last
        });
        for (sum, gathered) in &results {
            assert_eq!(sum, &vec![3.0, 30.0 + 3.0 * 49.0]);
            assert_eq!(
                gathered,
                &vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5, -0.0, -0.5, -1.0, -1.5, -2.0, -2.5]
            );
        }
    }

    #[test]
    fn abort_wakes_a_waiting_rank() {
        let groups = InProcessGroup::new(2);
        let waiting = &groups[0];
        let outcome = std::thread::scope(|s| {
            let h = s.spawn(|| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let be = ReferenceBackend;
                    let mut buf = be.upload(&[1.0]);
                    waiting.all_reduce_sum(&be, &mut buf);
                }))
            });
            std::thread::sleep(Duration::from_millis(20));
            Communicator::<ReferenceBackend>::abort(&groups[1]);
            h.join().unwrap()
        });
        assert!(outcome.is_err(), "the waiting rank panics once aborted");
    }

    /// A rank that failed mid-round leaves the round half filled (here rank 0's contribution to an
    /// all-reduce rank 1 never joined); once both have left it, `recover` clears it and the next
    /// collectives sum exactly what this round's ranks contribute.
    #[test]
    fn recover_clears_the_aborted_round() {
        let groups = InProcessGroup::new(2);
        let be = ReferenceBackend;
        let left = std::thread::scope(|s| {
            let h = s.spawn(|| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut buf = be.upload(&[1.0, 2.0]);
                    groups[0].all_reduce_sum(&be, &mut buf);
                }))
            });
            // Rank 1 fails only once rank 0's contribution is in (checked on the shared state,
            // not by waiting some time).
            while groups[0].rounds.lock().arrived == 0 {
                std::thread::yield_now();
            }
            Communicator::<ReferenceBackend>::abort(&groups[1]);
            h.join().unwrap()
        });
        assert!(
            left.is_err(),
            "rank 0 leaves the aborted round with a panic"
        );
        assert!(Communicator::<ReferenceBackend>::recover(&groups[0]));
        let sums = on_every_rank(&groups, |g, r| {
            let be = ReferenceBackend;
            let mut buf = be.upload(&[r, 10.0]);
            g.all_reduce_sum(&be, &mut buf);
            buf
        });
        assert_eq!(sums, vec![vec![1.0, 20.0]; 2]);
    }
}
