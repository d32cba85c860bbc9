//! Ring of per-item records of the recent past (tokens, word units): where each began in the text,
//! so evidence can translate between token or unit indices and char offsets. Owns no detection.

/// The last `capacity` records of a sequence, indexed by their position in the whole sequence.
#[derive(Debug, Clone)]
pub(crate) struct Ledger<T> {
    records: Vec<T>,
    len: u64,
}

impl<T: Copy + Default> Ledger<T> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            records: vec![T::default(); capacity.max(1)],
            len: 0,
        }
    }

    pub(crate) fn reset(&mut self) {
        self.len = 0;
    }

    /// Records the next item.
    pub(crate) fn push(&mut self, record: T) {
        let slot = (self.len % self.records.len() as u64) as usize;
        self.records[slot] = record;
        self.len += 1;
    }

    /// Items recorded since the last reset.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Index of the oldest item still remembered.
    pub(crate) fn oldest(&self) -> u64 {
        self.len.saturating_sub(self.records.len() as u64)
    }

    pub(crate) fn get(&self, index: u64) -> Option<T> {
        (index >= self.oldest() && index < self.len)
            .then(|| self.records[(index % self.records.len() as u64) as usize])
    }

    /// The last remembered item whose `key` is at most `value`, for a key that never decreases
    /// along the sequence; the oldest remembered item when none is.
    pub(crate) fn last_at_or_before(&self, value: u64, key: impl Fn(&T) -> u64) -> u64 {
        let (mut low, mut high) = (self.oldest(), self.len);
        if low >= high {
            return low;
        }
        // Invariant: the answer is in [low, high).
        while high - low > 1 {
            let mid = low + (high - low) / 2;
            match self.get(mid) {
                Some(record) if key(&record) <= value => low = mid,
                _ => high = mid,
            }
        }
        low
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_item_containing_an_offset_with_empty_items() {
        let mut ledger = Ledger::new(8);
        // Items starting at chars: "ab" (0), "" (1), "c" (2), "" (3), "de" (4).
        for start in [0u64, 2, 2, 3, 3] {
            ledger.push(start);
        }
        let at = |c| ledger.last_at_or_before(c, |&s| s);
        assert_eq!(at(0), 0);
        assert_eq!(at(1), 0);
        assert_eq!(at(2), 2);
        assert_eq!(at(4), 4);
        assert_eq!(ledger.len(), 5);
    }

    #[test]
    fn forgets_old_items() {
        let mut ledger = Ledger::new(4);
        for t in 0..10u64 {
            ledger.push(10 * t);
        }
        assert_eq!(ledger.get(5), None);
        assert_eq!(ledger.get(6), Some(60));
        assert_eq!(ledger.oldest(), 6);
        assert_eq!(ledger.last_at_or_before(0, |&s| s), 6);
        assert_eq!(ledger.last_at_or_before(75, |&s| s), 7);
        ledger.reset();
        assert_eq!(ledger.get(6), None);
    }
}
