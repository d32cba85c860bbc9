//! Allocators of the hybrid cache: paged KV blocks for the full-attention layers and state slots for
//! the Gated DeltaNet layers. They only hand out ids; the memory lives in `HybridCache`. A request is
//! admitted only when BOTH pools can hold it, and a full pool means waiting, never a crash.

/// A free list of ids `0..total`.
#[derive(Debug)]
pub struct IdPool {
    free: Vec<u32>,
    total: usize,
}

impl IdPool {
    pub fn new(total: usize) -> Self {
        // Reversed so that low ids are handed out first (easier to read in logs and tests).
        Self {
            free: (0..total as u32).rev().collect(),
            total,
        }
    }

    pub fn total(&self) -> usize {
        self.total
    }

    pub fn available(&self) -> usize {
        self.free.len()
    }

    pub fn used(&self) -> usize {
        self.total - self.free.len()
    }

    /// Takes `n` ids, or none at all when fewer are free.
    pub fn take(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
        }
        Some(
            self.free
                .split_off(self.free.len() - n)
                .into_iter()
                .rev()
                .collect(),
        )
    }

    pub fn take_one(&mut self) -> Option<u32> {
        self.free.pop()
    }

    pub fn give_back(&mut self, ids: impl IntoIterator<Item = u32>) {
        for id in ids {
            debug_assert!(!self.free.contains(&id), "id {id} returned twice");
            self.free.push(id);
        }
    }
}

/// Number of blocks needed to hold `tokens` positions.
pub fn blocks_for(tokens: usize, block_size: usize) -> usize {
    tokens.div_ceil(block_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_is_all_or_nothing() {
        let mut pool = IdPool::new(4);
        let a = pool.take(3).unwrap();
        assert_eq!(a, vec![0, 1, 2]);
        assert!(pool.take(2).is_none());
        assert_eq!(pool.available(), 1);
        pool.give_back(a);
        assert_eq!(pool.used(), 0);
        assert_eq!(blocks_for(17, 16), 2);
    }
}
