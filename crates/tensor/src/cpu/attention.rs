//! Causal paged attention with GQA over a ragged batch: parallel items of (sequence, KV head, query
//! chunk) whose Q heads share each K/V read; online softmax in f32, tile-kernel products for
//! prefill-sized items and dot products for decodes. Writes new K/V to the pool as `reference` does.

use super::isa::{multiversion, Isa};
use super::math::exp_f32;
use super::pack::transpose_f32;
use super::simd::dot;
use super::tile::{matmul_nn, matmul_strided};
use super::CpuBackend;
use crate::backend::AttnShape;
use crate::batch::{BatchLayout, SeqLayout};
use crate::cache::KvLayerPool;
use rayon::prelude::*;

/// Target number of (query, head) rows per work item (one tile width).
const ROWS_PER_ITEM: usize = 64;
/// Items with at least this many rows use the tile path.
const TILED_MIN_ROWS: usize = 16;
/// Positions per step of the tile path.
const SPAN: usize = 64;

/// One unit of parallel work: queries `first..first + count` of `seq` against KV head `kv_head`.
struct Item<'a> {
    seq: &'a SeqLayout,
    kv_head: usize,
    first: usize,
    count: usize,
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    isa: Isa,
    threads: &rayon::ThreadPool,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    pool: &mut KvLayerPool<CpuBackend>,
    batch: &BatchLayout,
    shape: AttnShape,
    out: &mut [f32],
) {
    let AttnShape {
        q_heads,
        kv_heads,
        head_dim,
    } = shape;
    assert_eq!(
        pool.dtype,
        crate::KvDtype::F32,
        "the cpu backend's attention reads f32 KV pools only"
    );
    let kv_row = kv_heads * head_dim;
    for seq in &batch.seqs {
        for i in 0..seq.len {
            let at = pool.offset(&seq.blocks, seq.position(i));
            let row = seq.start + i;
            pool.k[at..at + kv_row].copy_from_slice(&k[row * kv_row..(row + 1) * kv_row]);
            pool.v[at..at + kv_row].copy_from_slice(&v[row * kv_row..(row + 1) * kv_row]);
        }
    }
    if kv_heads == 0 || head_dim == 0 {
        return;
    }
    let group = q_heads / kv_heads;
    let per_item = (ROWS_PER_ITEM / group.max(1)).max(1);
    let items: Vec<Item<'_>> = batch
        .seqs
        .iter()
        .flat_map(|seq| {
            (0..kv_heads).flat_map(move |kv_head| {
                (0..seq.len).step_by(per_item).map(move |first| Item {
                    seq,
                    kv_head,
                    first,
                    count: per_item.min(seq.len - first),
                })
            })
        })
        .collect();
    let pool = &*pool;
    let compute = |item: &Item<'_>| attend(isa, q, pool, shape, item);
    let results: Vec<Vec<f32>> = if items.len() == 1 {
        items.iter().map(compute).collect()
    } else {
        threads.install(|| items.par_iter().map(compute).collect())
    };
    let span = group * head_dim;
    for (item, o) in items.iter().zip(&results) {
        for i in 0..item.count {
            let row = item.seq.start + item.first + i;
            let at = (row * q_heads + item.kv_head * group) * head_dim;
            out[at..at + span].copy_from_slice(&o[i * span..(i + 1) * span]);
        }
    }
}

/// Attention of one item; returns `[count, group, head_dim]`.
fn attend(
    isa: Isa,
    q: &[f32],
    pool: &KvLayerPool<CpuBackend>,
    shape: AttnShape,
    item: &Item<'_>,
) -> Vec<f32> {
    let group = shape.q_heads / shape.kv_heads;
    if item.count * group >= TILED_MIN_ROWS {
        attend_tiled(isa, q, pool, shape, item)
    } else {
        attend_by_dots(isa, q, pool, shape, item)
    }
}

multiversion! {
    /// `max[r] = max_j s[j*rows + r]` over `j < n`.
    fn column_max(s: &[f32], rows: usize, n: usize, max: &mut [f32]) {
        max.fill(f32::NEG_INFINITY);
        for j in 0..n {
            for (m, &v) in max.iter_mut().zip(&s[j * rows..(j + 1) * rows]) {
                *m = m.max(v);
            }
        }
    }
}

multiversion! {
    /// `s[j*rows + r] = exp(s[j*rows + r] - max[r])`, `sum[r] = sum_j` of those, over `j < n`.
    fn exp_columns(s: &mut [f32], rows: usize, n: usize, max: &[f32], sum: &mut [f32]) {
        sum.fill(0.0);
        for j in 0..n {
            for ((v, &m), t) in s[j * rows..(j + 1) * rows].iter_mut().zip(max).zip(sum.iter_mut()) {
                let p = exp_f32(*v - m);
                *v = p;
                *t += p;
            }
        }
    }
}

/// The tile path: per span of positions, `S^T [n, rows] = K_span Q^T` and `O += S^T^T V_span`.
fn attend_tiled(
    isa: Isa,
    q: &[f32],
    pool: &KvLayerPool<CpuBackend>,
    shape: AttnShape,
    item: &Item<'_>,
) -> Vec<f32> {
    let AttnShape {
        q_heads,
        kv_heads,
        head_dim: hd,
    } = shape;
    let group = q_heads / kv_heads;
    let seq = item.seq;
    let rows = item.count * group;
    let scale = 1.0 / (hd as f32).sqrt();
    // Q^T, pre-scaled: [hd, rows], row r = (query r / group, head r % group) of the item; the
    // `group` heads of one query are adjacent in `q`, so each query is one [group, hd] block.
    let mut qt = vec![0.0f32; hd * rows];
    for i in 0..item.count {
        let at = ((seq.start + item.first + i) * q_heads + item.kv_head * group) * hd;
        transpose_f32(
            isa,
            &q[at..at + group * hd],
            hd,
            group,
            hd,
            &mut qt[i * group..],
            rows,
        );
    }
    qt.iter_mut().for_each(|v| *v *= scale);
    let visible = |r: usize| seq.position(item.first + r / group) + 1;
    let horizon = visible(rows - 1);
    let first_limit = visible(0);

    let mut o = vec![0.0f32; rows * hd];
    let mut max = vec![f32::NEG_INFINITY; rows];
    let mut total = vec![0.0f32; rows];
    let mut span_max = vec![0.0f32; rows];
    let mut span_sum = vec![0.0f32; rows];
    let mut kbuf = vec![0.0f32; SPAN * hd];
    let mut vbuf = vec![0.0f32; SPAN * hd];
    let mut s = vec![0.0f32; SPAN * rows];
    for p0 in (0..horizon).step_by(SPAN) {
        let n = SPAN.min(horizon - p0);
        for j in 0..n {
            let at = pool.offset(&seq.blocks, p0 + j) + item.kv_head * hd;
            kbuf[j * hd..(j + 1) * hd].copy_from_slice(&pool.k[at..at + hd]);
            vbuf[j * hd..(j + 1) * hd].copy_from_slice(&pool.v[at..at + hd]);
        }
        matmul_nn(isa, n, rows, hd, &kbuf, hd, &qt, rows, &mut s, rows, false);
        if p0 + n > first_limit {
            // Causal mask: row r sees positions below visible(r).
            for j in 0..n {
                for (r, v) in s[j * rows..(j + 1) * rows].iter_mut().enumerate() {
                    if p0 + j >= visible(r) {
                        *v = f32::NEG_INFINITY;
                    }
                }
            }
        }
        column_max(isa, &s, rows, n, &mut span_max);
        for r in 0..rows {
            // Position 0 is visible to every row, so after the first span `max` is finite and
            // `new_max - max` is never inf - inf.
            let new_max = max[r].max(span_max[r]);
            let correction = exp_f32(max[r] - new_max);
            max[r] = new_max;
            span_max[r] = new_max;
            total[r] *= correction;
            if correction != 1.0 {
                o[r * hd..(r + 1) * hd]
                    .iter_mut()
                    .for_each(|x| *x *= correction);
            }
        }
        exp_columns(isa, &mut s, rows, n, &span_max, &mut span_sum);
        for (t, &add) in total.iter_mut().zip(&span_sum) {
            *t += add;
        }
        // O [rows, hd] += P [rows, n] V [n, hd], with P read transposed from s [n, rows].
        matmul_strided(isa, rows, hd, n, &s, 1, rows, &vbuf, hd, &mut o, hd, true);
    }
    for (r, row) in o.chunks_mut(hd).enumerate() {
        let inv = 1.0 / total[r];
        row.iter_mut().for_each(|x| *x *= inv);
    }
    o
}

/// The dot path, block by block of the cache, for items of a few rows (decode).
fn attend_by_dots(
    isa: Isa,
    q: &[f32],
    pool: &KvLayerPool<CpuBackend>,
    shape: AttnShape,
    item: &Item<'_>,
) -> Vec<f32> {
    let AttnShape {
        q_heads,
        kv_heads,
        head_dim: hd,
    } = shape;
    let group = q_heads / kv_heads;
    let kv_row = kv_heads * hd;
    let bs = pool.block_size;
    let seq = item.seq;
    let rows = item.count * group;
    let scale = 1.0 / (hd as f32).sqrt();
    let q_row = |r: usize| {
        let (i, g) = (r / group, r % group);
        let at = ((seq.start + item.first + i) * q_heads + item.kv_head * group + g) * hd;
        &q[at..at + hd]
    };
    let visible = |r: usize| seq.position(item.first + r / group) + 1;
    let horizon = seq.position(item.first + item.count - 1) + 1;

    let mut o = vec![0.0f32; rows * hd];
    let mut max = vec![f32::NEG_INFINITY; rows];
    let mut total = vec![0.0f32; rows];
    let mut p = vec![0.0f32; rows * bs];
    for (b, &block) in seq.blocks.iter().enumerate().take(horizon.div_ceil(bs)) {
        let p0 = b * bs;
        let n = bs.min(horizon - p0);
        let base = block as usize * bs * kv_row + item.kv_head * hd;
        for r in 0..rows {
            let seen = visible(r).saturating_sub(p0).min(n);
            let scores = &mut p[r * bs..r * bs + n];
            let qr = q_row(r);
            let mut block_max = f32::NEG_INFINITY;
            for (j, s) in scores.iter_mut().enumerate() {
                *s = if j < seen {
                    let kj = &pool.k[base + j * kv_row..][..hd];
                    dot(isa, qr, kj) * scale
                } else {
                    f32::NEG_INFINITY
                };
                block_max = block_max.max(*s);
            }
            if seen == 0 {
                scores.fill(0.0);
                continue;
            }
            let new_max = max[r].max(block_max);
            let correction = exp_f32(max[r] - new_max);
            max[r] = new_max;
            let mut sum = 0.0;
            for s in scores.iter_mut() {
                *s = exp_f32(*s - new_max);
                sum += *s;
            }
            total[r] = total[r] * correction + sum;
            if correction != 1.0 {
                o[r * hd..(r + 1) * hd]
                    .iter_mut()
                    .for_each(|x| *x *= correction);
            }
        }
        matmul_nn(
            isa,
            rows,
            hd,
            n,
            &p,
            bs,
            &pool.v[base..],
            kv_row,
            &mut o,
            hd,
            true,
        );
    }
    for (r, row) in o.chunks_mut(hd).enumerate() {
        let inv = 1.0 / total[r];
        row.iter_mut().for_each(|x| *x *= inv);
    }
    o
}
