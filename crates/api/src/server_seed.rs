//! `--random-seed`: the seeds given to requests that bring none, one after another from the server's
//! seed, so that a run's sampled outputs can be reproduced by sending the same requests in the same
//! order to a server started with the same seed.

use std::sync::atomic::{AtomicU64, Ordering};

/// A sequence of request seeds derived from one server seed.
#[derive(Debug)]
pub struct SeedSequence {
    base: u64,
    next: AtomicU64,
}

impl SeedSequence {
    pub fn new(base: u64) -> Self {
        Self {
            base,
            next: AtomicU64::new(0),
        }
    }

    /// The next request's seed (splitmix64 of base + index: neighbouring indices give unrelated seeds).
    pub fn next_seed(&self) -> u64 {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        let mut z = self
            .base
            .wrapping_add(index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence() {
        let a = SeedSequence::new(42);
        let b = SeedSequence::new(42);
        let first: Vec<u64> = (0..4).map(|_| a.next_seed()).collect();
        let second: Vec<u64> = (0..4).map(|_| b.next_seed()).collect();
        assert_eq!(first, second);
        assert_ne!(first[0], first[1]);
        assert_ne!(SeedSequence::new(43).next_seed(), first[0]);
    }
}
