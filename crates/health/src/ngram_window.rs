//! Distinct n-grams over a sliding window of units (distinct-n), updated in O(n) per unit without
//! allocation. Owns the window and its counts; which units feed it and what ratio is alarming is the
//! collapse detector's business.

use crate::count_table::CountTable;

/// The last `window` n-grams of a unit stream and how many of them are distinct.
#[derive(Debug, Clone)]
pub(crate) struct NgramWindow {
    n: usize,
    window: usize,
    /// The last `n` units, ring-ordered; `units_seen` says how many are real.
    recent: Vec<u64>,
    units_seen: u64,
    /// The n-gram keys in the window, ring-ordered by `grams_seen`.
    grams: Vec<u64>,
    grams_seen: u64,
    counts: CountTable,
}

impl NgramWindow {
    pub(crate) fn new(n: usize, window: usize) -> Self {
        Self {
            n,
            window,
            recent: vec![0; n],
            units_seen: 0,
            grams: vec![0; window],
            grams_seen: 0,
            counts: CountTable::with_max_keys(window),
        }
    }

    pub(crate) fn reset(&mut self) {
        self.recent.fill(0);
        self.units_seen = 0;
        self.grams.fill(0);
        self.grams_seen = 0;
        self.counts.clear();
    }

    /// Appends a unit; once the window holds `window` n-grams, returns how many are distinct.
    pub(crate) fn push(&mut self, unit: u64) -> Option<usize> {
        let n = self.n;
        self.recent[(self.units_seen % n as u64) as usize] = unit;
        self.units_seen += 1;
        if self.units_seen < n as u64 {
            return None;
        }
        // Order-sensitive combination of the last n units, oldest first.
        let mut key = n as u64;
        for back in (0..n as u64).rev() {
            let slot = ((self.units_seen - 1 - back) % n as u64) as usize;
            key = (key.rotate_left(23) ^ self.recent[slot]).wrapping_mul(0x2545_F491_4F6C_DD1D);
        }
        let slot = (self.grams_seen % self.window as u64) as usize;
        if self.grams_seen >= self.window as u64 {
            self.counts.remove(self.grams[slot]);
        }
        self.grams[slot] = key;
        self.counts.insert(key);
        self.grams_seen += 1;
        (self.grams_seen >= self.window as u64).then(|| self.counts.distinct())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn distinct_counts_match_a_recount() {
        let mut state = 7u64;
        let units: Vec<u64> = (0..3000)
            .map(|i| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                // Phases of small and large vocabularies.
                let vocab = if (i / 300) % 2 == 0 { 3 } else { 50 };
                (state >> 40) % vocab
            })
            .collect();
        for n in [1usize, 2, 4] {
            let window = 32;
            let mut ngrams = NgramWindow::new(n, window);
            for i in 0..units.len() {
                let got = ngrams.push(units[i]);
                let grams_so_far = (i + 1).saturating_sub(n - 1);
                if grams_so_far < window {
                    assert_eq!(got, None);
                    continue;
                }
                let expected: HashSet<&[u64]> = (i + 1 - window..=i)
                    .map(|end| &units[end + 1 - n..=end])
                    .collect();
                assert_eq!(got, Some(expected.len()), "n={n} at unit {i}");
            }
        }
    }

    #[test]
    fn order_matters_in_ngrams() {
        let mut ab = NgramWindow::new(2, 2);
        // Grams (1,2) and (2,1) are different.
        ab.push(1);
        ab.push(2);
        assert_eq!(ab.push(1), Some(2));
        ab.reset();
        assert_eq!(ab.push(1), None);
    }
}
