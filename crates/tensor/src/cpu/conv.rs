//! Depthwise causal conv1d + SiLU over the GDN input, with each sequence's conv window in the state
//! pool as history. Output rows are computed in parallel (they only read the old window and `x`);
//! windows and snapshot slots are written afterwards, in sequence order, with `reference` semantics.

use super::isa::{multiversion, Isa};
use super::math::silu_f32;
use crate::batch::{BatchLayout, SeqLayout};
use rayon::prelude::*;

/// Output rows per parallel task.
const ROWS_PER_TASK: usize = 16;

multiversion! {
    /// `conv_row` for the kernel of 4 every supported model uses, in one pass over the channels.
    fn conv_row4(sources: &[&[f32]], taps: &[f32], out: &mut [f32]) {
        let dim = out.len();
        let (s0, s1, s2, s3) = (&sources[0][..dim], &sources[1][..dim], &sources[2][..dim], &sources[3][..dim]);
        let (t0, t1, t2, t3) = (&taps[..dim], &taps[dim..2 * dim], &taps[2 * dim..3 * dim], &taps[3 * dim..4 * dim]);
        for c in 0..dim {
            let acc = t0[c] * s0[c] + t1[c] * s1[c] + t2[c] * s2[c] + t3[c] * s3[c];
            out[c] = silu_f32(acc);
        }
    }
}

multiversion! {
    /// `out[c] = silu(sum_j taps[j][c] * sources[j][c])`.
    fn conv_row(sources: &[&[f32]], taps: &[f32], out: &mut [f32]) {
        let dim = out.len();
        out.fill(0.0);
        for (j, src) in sources.iter().enumerate() {
            let tap = &taps[j * dim..(j + 1) * dim];
            for ((o, &w), &s) in out.iter_mut().zip(tap).zip(src.iter()) {
                *o += w * s;
            }
        }
        for o in out.iter_mut() {
            *o = silu_f32(*o);
        }
    }
}

/// Row `index` of a sequence's timeline: the stored window (`history` rows, oldest first) followed
/// by its new inputs.
fn timeline_row<'a>(
    window: &'a [f32],
    x: &'a [f32],
    seq: &SeqLayout,
    history: usize,
    dim: usize,
    index: usize,
) -> &'a [f32] {
    if index < history {
        &window[index * dim..(index + 1) * dim]
    } else {
        let row = seq.start + index - history;
        &x[row * dim..(row + 1) * dim]
    }
}

/// See `Backend::causal_conv1d`. `conv_state`: `[slots, history, dim]`; `w`: `[dim, history + 1]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn causal_conv1d(
    isa: Isa,
    pool: &rayon::ThreadPool,
    x: &[f32],
    w: &[f32],
    conv_state: &mut [f32],
    dim: usize,
    history: usize,
    batch: &BatchLayout,
    out: &mut [f32],
) {
    let kernel = history + 1;
    let slot_len = history * dim;
    // Taps transposed to [kernel, dim] so that each tap is a contiguous row.
    let mut taps = vec![0.0f32; kernel * dim];
    for c in 0..dim {
        for j in 0..kernel {
            taps[j * dim + c] = w[c * kernel + j];
        }
    }
    // Split `out` into (sequence, first token, rows) pieces, in row order.
    let mut pieces: Vec<(&SeqLayout, usize, &mut [f32])> = Vec::new();
    let mut rest = &mut out[..batch.total_tokens() * dim];
    for seq in &batch.seqs {
        for first in (0..seq.len).step_by(ROWS_PER_TASK) {
            let count = ROWS_PER_TASK.min(seq.len - first);
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(count * dim);
            pieces.push((seq, first, piece));
            rest = tail;
        }
    }
    let state = &*conv_state;
    let compute = |(seq, first, piece): &mut (&SeqLayout, usize, &mut [f32])| {
        let window = &state[seq.slot * slot_len..(seq.slot + 1) * slot_len];
        let mut sources: Vec<&[f32]> = Vec::with_capacity(kernel);
        for (i, row) in piece.chunks_mut(dim).enumerate() {
            // New token t sits at timeline index history + t; its taps cover the `kernel` rows ending
            // there, i.e. timeline rows t ..= t + history.
            let t = *first + i;
            sources.clear();
            sources.extend((0..kernel).map(|j| timeline_row(window, x, seq, history, dim, t + j)));
            if kernel == 4 {
                conv_row4(isa, &sources, &taps, row);
            } else {
                conv_row(isa, &sources, &taps, row);
            }
        }
    };
    if pieces.len() <= 1 {
        pieces.iter_mut().for_each(compute);
    } else {
        pool.install(|| pieces.par_iter_mut().for_each(compute));
    }

    let mut window = vec![0.0f32; slot_len];
    let mut next = vec![0.0f32; slot_len];
    for seq in &batch.seqs {
        window.copy_from_slice(&conv_state[seq.slot * slot_len..(seq.slot + 1) * slot_len]);
        // The window after new token i is timeline rows i+1 ..= i+history.
        let window_after = |i: usize, dst: &mut [f32]| {
            for (r, d) in dst.chunks_mut(dim).enumerate() {
                d.copy_from_slice(timeline_row(&window, x, seq, history, dim, i + 1 + r));
            }
        };
        for (i, &snap) in seq.snapshot_slots.iter().enumerate().take(seq.len) {
            window_after(i, &mut conv_state[snap * slot_len..(snap + 1) * slot_len]);
        }
        if seq.len > 0 {
            window_after(seq.len - 1, &mut next);
            conv_state[seq.slot * slot_len..(seq.slot + 1) * slot_len].copy_from_slice(&next);
        }
    }
}
