//! The per-call device copies of a `BatchLayout`: the flat tables the conv, delta-rule and attention
//! kernels index with. Built on the host from the layout, after checking it against the pools.

use deltaserve_tensor::BatchLayout;

/// `[n_seqs, 4]` = (start row, new tokens, state slot, index of the first snapshot slot in `snaps`
/// or -1), and every sequence's snapshot slots back to back.
pub(crate) struct SeqTable {
    pub seqs: Vec<i32>,
    pub snaps: Vec<i32>,
}

pub(crate) fn seq_table(batch: &BatchLayout) -> SeqTable {
    let mut seqs = Vec::with_capacity(4 * batch.seqs.len());
    let mut snaps = Vec::new();
    for s in &batch.seqs {
        let first_snap = if s.snapshot_slots.is_empty() {
            -1
        } else {
            snaps.len() as i32
        };
        snaps.extend(s.snapshot_slots.iter().map(|&x| x as i32));
        seqs.extend([s.start as i32, s.len as i32, s.slot as i32, first_snap]);
    }
    SeqTable { seqs, snaps }
}

/// Per row of the batch: (visible positions = own position + 1, offset of its sequence's block
/// table in `blocks`); the block tables back to back; and each row's element offset in the pool.
pub(crate) struct AttentionTable {
    pub rows: Vec<i32>,
    pub blocks: Vec<u32>,
    pub offsets: Vec<i64>,
}

/// `row_offset(blocks, position)` is the pool's element offset of a position (`KvLayerPool::offset`).
pub(crate) fn attention_table(
    batch: &BatchLayout,
    row_offset: impl Fn(&[u32], usize) -> usize,
) -> AttentionTable {
    let tokens = batch.total_tokens();
    let mut rows = vec![0i32; 2 * tokens];
    let mut offsets = vec![0i64; tokens];
    let mut blocks = Vec::new();
    for s in &batch.seqs {
        let table = blocks.len() as i32;
        blocks.extend_from_slice(&s.blocks);
        for i in 0..s.len {
            let row = s.start + i;
            rows[2 * row] = (s.position(i) + 1) as i32;
            rows[2 * row + 1] = table;
            offsets[row] = row_offset(&s.blocks, s.position(i)) as i64;
        }
    }
    AttentionTable {
        rows,
        blocks,
        offsets,
    }
}

/// Panics with the broken invariant when `batch` does not fit a KV pool of `num_blocks` blocks: a
/// kernel would otherwise write outside it.
pub(crate) fn check_kv(op: &str, batch: &BatchLayout, num_blocks: usize) {
    if let Err(message) = batch.validate(num_blocks, usize::MAX) {
        panic!("{op}: invalid batch layout: {message}");
    }
    check_rows(op, batch);
}

/// Panics with the broken invariant when `batch` names a state slot outside `num_slots` or its
/// snapshot lists do not match its lengths (block tables do not matter to the GDN ops).
pub(crate) fn check_state(op: &str, batch: &BatchLayout, num_slots: usize) {
    check_rows(op, batch);
    for (i, s) in batch.seqs.iter().enumerate() {
        if s.slot >= num_slots || s.snapshot_slots.iter().any(|&x| x >= num_slots) {
            panic!("{op}: sequence {i} names a state slot outside the {num_slots} slots");
        }
        if !s.snapshot_slots.is_empty() && s.snapshot_slots.len() != s.len {
            panic!(
                "{op}: sequence {i} has {} snapshot slots for {} tokens",
                s.snapshot_slots.len(),
                s.len
            );
        }
    }
}

/// Sequences must be packed back to back, in 32-bit row indices.
fn check_rows(op: &str, batch: &BatchLayout) {
    let mut next = 0;
    for (i, s) in batch.seqs.iter().enumerate() {
        if s.start != next {
            panic!(
                "{op}: sequence {i} starts at row {} but row {next} is next",
                s.start
            );
        }
        next += s.len;
    }
    if i32::try_from(next).is_err() {
        panic!("{op}: {next} tokens exceed the kernels' 32-bit row indices");
    }
}
