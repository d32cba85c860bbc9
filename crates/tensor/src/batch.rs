//! The layout of one ragged batch: which rows of the flat `[tokens, ...]` activations belong to which
//! sequence, where each sequence stands in its cache, and which cache blocks and state slot it owns.
//! The engine fills it; backends read it; the model passes it through untouched.

/// One sequence's share of a batch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqLayout {
    /// First row of this sequence in the batch's flat token dimension.
    pub start: usize,
    /// Number of new tokens in this step (1 for a decode, more for a prefill chunk or a verify).
    pub len: usize,
    /// Tokens already in the cache before this step: the position of the first new token.
    pub pos: usize,
    /// Paged-KV block ids in order; block `i` holds positions `i*block_size .. (i+1)*block_size`.
    /// Must cover positions `0 .. pos + len`.
    pub blocks: Vec<u32>,
    /// State-pool slot holding this sequence's conv window and recurrent state.
    pub slot: usize,
    /// Empty, or exactly `len` state-pool slots: after new token `i` the GDN state (conv window and
    /// recurrent state) is also copied to `snapshot_slots[i]`. Used to roll back speculative tokens.
    pub snapshot_slots: Vec<usize>,
}

impl SeqLayout {
    /// Absolute position of the new token `i` of this sequence.
    pub fn position(&self, i: usize) -> usize {
        self.pos + i
    }

    pub fn rows(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.len
    }
}

/// A ragged batch: sequences packed back to back along the token dimension.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchLayout {
    pub seqs: Vec<SeqLayout>,
    /// Tokens per paged-KV block.
    pub block_size: usize,
}

impl BatchLayout {
    /// Packs sequences given as `(new tokens, cached tokens, blocks, slot)` back to back.
    pub fn packed(
        block_size: usize,
        seqs: impl IntoIterator<Item = (usize, usize, Vec<u32>, usize)>,
    ) -> Self {
        let mut start = 0;
        let seqs = seqs
            .into_iter()
            .map(|(len, pos, blocks, slot)| {
                let seq = SeqLayout {
                    start,
                    len,
                    pos,
                    blocks,
                    slot,
                    snapshot_slots: Vec::new(),
                };
                start += len;
                seq
            })
            .collect();
        Self { seqs, block_size }
    }

    pub fn total_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.len).sum()
    }

    /// Absolute position of every row, in row order.
    pub fn positions(&self) -> Vec<u32> {
        let mut out = vec![0u32; self.total_tokens()];
        for s in &self.seqs {
            for i in 0..s.len {
                out[s.start + i] = s.position(i) as u32;
            }
        }
        out
    }

    /// Checks the invariants every backend relies on; returns a message naming the broken one.
    pub fn validate(&self, num_blocks: usize, num_slots: usize) -> Result<(), String> {
        let mut next = 0;
        for (i, s) in self.seqs.iter().enumerate() {
            if s.start != next {
                return Err(format!(
                    "sequence {i} starts at row {} but row {next} is next",
                    s.start
                ));
            }
            next += s.len;
            let needed = (s.pos + s.len).div_ceil(self.block_size.max(1));
            if s.blocks.len() < needed {
                return Err(format!(
                    "sequence {i} needs {needed} KV blocks for {} positions but has {}",
                    s.pos + s.len,
                    s.blocks.len()
                ));
            }
            if let Some(b) = s.blocks.iter().find(|&&b| b as usize >= num_blocks) {
                return Err(format!("sequence {i} names KV block {b} of {num_blocks}"));
            }
            if s.slot >= num_slots || s.snapshot_slots.iter().any(|&x| x >= num_slots) {
                return Err(format!(
                    "sequence {i} names a state slot outside the {num_slots} slots"
                ));
            }
            if !s.snapshot_slots.is_empty() && s.snapshot_slots.len() != s.len {
                return Err(format!(
                    "sequence {i} has {} snapshot slots for {} tokens",
                    s.snapshot_slots.len(),
                    s.len
                ));
            }
        }
        Ok(())
    }
}
