//! Streaming periodicity of a symbol sequence (characters or token ids): for every period up to a
//! maximum, how long the current suffix has been periodic. Owns the symbol history; it knows nothing
//! about what counts as a loop (that is `Config::loop_rule`, applied by the detector).

/// History slots start with this value. It is neither a `char` nor a token id any vocabulary uses
/// (vocabularies stay far below 2^31), so nothing matches the empty history.
const NO_SYMBOL: u32 = u32::MAX;

/// Tracks, for each period `p` in `1..=max_period`, the number of consecutive most recent positions
/// `i` with `s[i] == s[i - p]` (the "run" of `p`). The suffix of length `run + p` is then exactly
/// periodic with period `p`.
///
/// One push costs `max_period` compare-and-update steps over contiguous memory (the compiler
/// vectorises them) and never allocates.
#[derive(Debug, Clone)]
pub(crate) struct PeriodicTracker {
    max_period: usize,
    /// Symbols kept for look-ups; at least `max_period`.
    capacity: usize,
    /// Doubled ring written backwards: `history[head..head + capacity]` is the most recent symbol
    /// first, so the symbol at distance `d` is `history[head + d]` without wrapping.
    history: Vec<u32>,
    head: usize,
    /// `runs[p - 1]` is the run of period `p` (signed only because SSE2 compares signed lanes).
    runs: Vec<i32>,
    /// `thresholds[p - 1]`: the run at which period `p` becomes a candidate worth a closer look.
    thresholds: Vec<i32>,
    pushed: u64,
}

impl PeriodicTracker {
    /// `min_len(p)` is the shortest periodic suffix (in symbols) worth a closer look for period `p`.
    pub(crate) fn new(
        max_period: usize,
        capacity: usize,
        min_len: impl Fn(usize) -> usize,
    ) -> Self {
        let capacity = capacity.max(max_period).max(1);
        let thresholds = (1..=max_period)
            .map(|p| {
                let run = min_len(p).saturating_sub(p).max(1);
                i32::try_from(run).unwrap_or(i32::MAX)
            })
            .collect();
        Self {
            max_period,
            capacity,
            history: vec![NO_SYMBOL; 2 * capacity],
            head: 0,
            runs: vec![0; max_period],
            thresholds,
            pushed: 0,
        }
    }

    /// Forgets every symbol; keeps the buffers.
    pub(crate) fn reset(&mut self) {
        self.history.fill(NO_SYMBOL);
        self.runs.fill(0);
        self.head = 0;
        self.pushed = 0;
    }

    /// Appends a symbol; returns whether some period's run reached its threshold.
    pub(crate) fn push(&mut self, symbol: u32) -> bool {
        let previous = &self.history[self.head..self.head + self.max_period];
        let mut any = 0i32;
        // Written so that it vectorises with plain SSE2 (a select, signed lanes, no early exit). A
        // run would only wrap after 2^31 equal symbols (then it reads as negative, below every
        // threshold), far beyond any request.
        for ((run, &prev), &threshold) in self.runs.iter_mut().zip(previous).zip(&self.thresholds) {
            *run = if prev == symbol {
                run.wrapping_add(1)
            } else {
                0
            };
            any |= i32::from(*run >= threshold);
        }
        self.head = if self.head == 0 {
            self.capacity - 1
        } else {
            self.head - 1
        };
        self.history[self.head] = symbol;
        self.history[self.head + self.capacity] = symbol;
        self.pushed += 1;
        any != 0
    }

    pub(crate) fn max_period(&self) -> usize {
        self.max_period
    }

    /// Length of the periodic suffix for period `period` (at least `period` once that many symbols
    /// exist; one occurrence is trivially periodic).
    pub(crate) fn covered(&self, period: usize) -> u64 {
        let run = self.runs[period - 1] as u64;
        (run + period as u64).min(self.pushed)
    }

    /// Periods whose run reached its threshold, shortest first.
    pub(crate) fn candidates(&self) -> impl Iterator<Item = usize> + '_ {
        self.runs
            .iter()
            .zip(&self.thresholds)
            .enumerate()
            .filter(|(_, (run, threshold))| run >= threshold)
            .map(|(i, _)| i + 1)
    }

    /// Periods with a suffix of at least `min_repeats` whole periods and at least `min_len` symbols,
    /// shortest first (used at the end of a stream, where thresholds are lower).
    pub(crate) fn periods_with(
        &self,
        min_repeats: u64,
        min_len: u64,
    ) -> impl Iterator<Item = (usize, u64)> + '_ {
        (1..=self.max_period).filter_map(move |p| {
            let covered = self.covered(p);
            (covered >= min_repeats * p as u64 && covered >= min_len).then_some((p, covered))
        })
    }

    /// The symbol at `distance` back (0 = the latest), if still remembered.
    pub(crate) fn symbol_back(&self, distance: u64) -> Option<u32> {
        if distance >= self.pushed || distance >= self.capacity as u64 {
            return None;
        }
        Some(self.history[self.head + distance as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Periodic-suffix length by definition, for comparison.
    fn naive_covered(seq: &[u32], p: usize) -> u64 {
        let n = seq.len();
        if n < p {
            return n as u64;
        }
        let mut run = 0;
        while run + p < n && seq[n - 1 - run] == seq[n - 1 - run - p] {
            run += 1;
        }
        (run + p) as u64
    }

    #[test]
    fn matches_the_definition_on_mixed_sequences() {
        // A deterministic sequence with loops of several periods and breaks between them.
        let mut seq = Vec::new();
        let mut state = 12345u32;
        for block in 0..40u32 {
            let period = 1 + (block % 7) as usize;
            let unit: Vec<u32> = (0..period)
                .map(|_| {
                    state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (state >> 16) % 5
                })
                .collect();
            for i in 0..(3 + block as usize % 11) {
                seq.push(unit[i % period]);
            }
        }
        let mut tracker = PeriodicTracker::new(16, 32, |_| usize::MAX);
        for (i, &s) in seq.iter().enumerate() {
            tracker.push(s);
            for p in 1..=16 {
                assert_eq!(
                    tracker.covered(p),
                    naive_covered(&seq[..=i], p),
                    "period {p} after {} symbols",
                    i + 1
                );
            }
        }
    }

    #[test]
    fn candidates_appear_once_the_threshold_is_reached() {
        let mut tracker = PeriodicTracker::new(8, 8, |p| 6 * p);
        let word = [7u32, 8, 9];
        let mut first_hit = None;
        for i in 0..30 {
            if tracker.push(word[i % 3]) && first_hit.is_none() {
                first_hit = Some(i + 1);
            }
        }
        // Period 3 needs a suffix of 18 symbols.
        assert_eq!(first_hit, Some(18));
        assert_eq!(tracker.candidates().next(), Some(3));
        assert_eq!(tracker.periods_with(4, 12).next().map(|(p, _)| p), Some(3));
        tracker.push(1);
        assert_eq!(tracker.candidates().next(), None);
    }

    #[test]
    fn history_wraps_and_reads_back() {
        let mut tracker = PeriodicTracker::new(4, 5, |_| usize::MAX);
        for s in 0..12u32 {
            tracker.push(s);
        }
        assert_eq!(tracker.symbol_back(0), Some(11));
        assert_eq!(tracker.symbol_back(4), Some(7));
        assert_eq!(tracker.symbol_back(5), None);
        tracker.reset();
        assert_eq!(tracker.symbol_back(0), None);
        tracker.push(3);
        assert_eq!(tracker.covered(1), 1);
    }
}
