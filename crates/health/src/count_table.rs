//! A fixed-capacity multiset of 64-bit hash keys with a live count of distinct keys (open addressing,
//! linear probing, backward-shift deletion). Owns only counting; what the keys mean is the caller's.

/// Marks an empty slot; a real key equal to it is remapped by [`normalize`].
const EMPTY: u64 = 0;

fn normalize(key: u64) -> u64 {
    if key == EMPTY {
        0x9E37_79B9_7F4A_7C15
    } else {
        key
    }
}

/// Multiset of keys; never grows past the size given at construction (at most half full), so
/// inserting and removing never allocate.
#[derive(Debug, Clone)]
pub(crate) struct CountTable {
    keys: Vec<u64>,
    counts: Vec<u32>,
    mask: usize,
    distinct: usize,
    total: usize,
    max_keys: usize,
}

impl CountTable {
    /// A table for at most `max_keys` keys present at once (counting repeats).
    pub(crate) fn with_max_keys(max_keys: usize) -> Self {
        let slots = (2 * max_keys.max(1)).next_power_of_two().max(8);
        Self {
            keys: vec![EMPTY; slots],
            counts: vec![0; slots],
            mask: slots - 1,
            distinct: 0,
            total: 0,
            max_keys: max_keys.max(1),
        }
    }

    pub(crate) fn clear(&mut self) {
        self.keys.fill(EMPTY);
        self.counts.fill(0);
        self.distinct = 0;
        self.total = 0;
    }

    /// Number of distinct keys present.
    pub(crate) fn distinct(&self) -> usize {
        self.distinct
    }

    fn home(&self, key: u64) -> usize {
        // Keys are hashes already; the multiply spreads their high bits into the slot index.
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & self.mask
    }

    fn find(&self, key: u64) -> Result<usize, usize> {
        let mut slot = self.home(key);
        loop {
            match self.keys[slot] {
                k if k == key => return Ok(slot),
                EMPTY => return Err(slot),
                _ => slot = (slot + 1) & self.mask,
            }
        }
    }

    /// Adds one occurrence of `key`. Holding more than `max_keys` occurrences breaks the caller's
    /// contract; the extra key is then ignored rather than overfilling the table.
    pub(crate) fn insert(&mut self, key: u64) {
        let key = normalize(key);
        if self.total >= self.max_keys {
            debug_assert!(false, "CountTable holds more than max_keys occurrences");
            return;
        }
        self.total += 1;
        match self.find(key) {
            Ok(slot) => self.counts[slot] += 1,
            Err(slot) => {
                self.keys[slot] = key;
                self.counts[slot] = 1;
                self.distinct += 1;
            }
        }
    }

    /// Removes one occurrence of `key`; a key that is not present is ignored.
    pub(crate) fn remove(&mut self, key: u64) {
        let key = normalize(key);
        let Ok(slot) = self.find(key) else {
            debug_assert!(false, "CountTable::remove of a key that is not present");
            return;
        };
        self.total -= 1;
        self.counts[slot] -= 1;
        if self.counts[slot] > 0 {
            return;
        }
        self.distinct -= 1;
        // Backward-shift deletion: pull later entries of the probe chain into the hole when the hole
        // lies between their home slot and their current slot, so lookups never stop early.
        let mut hole = slot;
        let mut next = (slot + 1) & self.mask;
        while self.keys[next] != EMPTY {
            let home = self.home(self.keys[next]);
            let from_home = next.wrapping_sub(home) & self.mask;
            let from_hole = next.wrapping_sub(hole) & self.mask;
            if from_home >= from_hole {
                self.keys[hole] = self.keys[next];
                self.counts[hole] = self.counts[next];
                hole = next;
            }
            next = (next + 1) & self.mask;
        }
        self.keys[hole] = EMPTY;
        self.counts[hole] = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn agrees_with_a_hash_map_under_churn() {
        // Few distinct keys with colliding home slots exercise the probe chains and the shifts.
        let mut table = CountTable::with_max_keys(64);
        let mut reference: HashMap<u64, u32> = HashMap::new();
        let mut live: Vec<u64> = Vec::new();
        let mut state = 99u64;
        for step in 0..20_000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let key = (state >> 33) % 40 * 0x1000_0000_0000; // many share a home slot
            let remove = live.len() == 64 || (!live.is_empty() && (state >> 7).is_multiple_of(2));
            if remove {
                let victim = live.swap_remove((state >> 11) as usize % live.len());
                table.remove(victim);
                let count = reference.get_mut(&victim).unwrap();
                *count -= 1;
                if *count == 0 {
                    reference.remove(&victim);
                }
            } else {
                table.insert(key);
                live.push(key);
                *reference.entry(key).or_insert(0) += 1;
            }
            assert_eq!(table.distinct(), reference.len(), "step {step}");
        }
        for (&key, &count) in &reference {
            let slot = table.find(normalize(key)).expect("present key is found");
            assert_eq!(table.counts[slot], count);
        }
    }

    #[test]
    fn zero_key_is_counted() {
        let mut table = CountTable::with_max_keys(4);
        table.insert(0);
        table.insert(0);
        assert_eq!(table.distinct(), 1);
        table.remove(0);
        assert_eq!(table.distinct(), 1);
        table.remove(0);
        assert_eq!(table.distinct(), 0);
        table.insert(5);
        table.clear();
        assert_eq!(table.distinct(), 0);
    }
}
