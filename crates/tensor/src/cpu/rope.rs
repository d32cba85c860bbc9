//! Rotate-half (NeoX) rotary embedding on the first `rotary_dim` dims of each head. Angles come
//! from `reference::rope_cos_sin` (f32 angle, as transformers computes it); the rotation is f32.

use crate::reference::rope_cos_sin;
use rayon::prelude::*;

/// Token rows per parallel task.
const ROWS_PER_TASK: usize = 32;

/// `x [T, heads, head_dim]` rotated in place at `positions [T]`.
pub(crate) fn rope(
    pool: &rayon::ThreadPool,
    x: &mut [f32],
    positions: &[u32],
    heads: usize,
    head_dim: usize,
    rotary_dim: usize,
    theta: f32,
) {
    let row_len = heads * head_dim;
    let half = rotary_dim / 2;
    if row_len == 0 || half == 0 {
        return;
    }
    let rotate = |(row, &p): (&mut [f32], &u32)| {
        let (cos, sin): (Vec<f32>, Vec<f32>) = rope_cos_sin(p, rotary_dim, theta)
            .into_iter()
            .map(|(c, s)| (c as f32, s as f32))
            .unzip();
        for head in row.chunks_mut(head_dim) {
            let (lo, hi) = head[..rotary_dim].split_at_mut(half);
            for i in 0..half {
                let (a, b) = (lo[i], hi[i]);
                lo[i] = a * cos[i] - b * sin[i];
                hi[i] = b * cos[i] + a * sin[i];
            }
        }
    };
    if positions.len() <= ROWS_PER_TASK {
        x.chunks_mut(row_len).zip(positions).for_each(rotate);
    } else {
        pool.install(|| {
            x.par_chunks_mut(row_len)
                .zip(positions.par_iter())
                .with_min_len(ROWS_PER_TASK)
                .for_each(rotate)
        });
    }
}
