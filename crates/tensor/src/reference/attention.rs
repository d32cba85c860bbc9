//! Reference paged causal attention with GQA (docs/model.md, "Gated attention", step 5; the output
//! gate of step 6 is not here).

use crate::backend::AttnShape;
use crate::batch::BatchLayout;
use crate::cache::KvLayerPool;

/// Writes each sequence's new K/V into its blocks, then attends every new query over positions
/// `0..=its own position` of its sequence.
pub fn paged_attention<B>(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    pool: &mut KvLayerPool<B>,
    batch: &BatchLayout,
    shape: AttnShape,
    out: &mut [f32],
) where
    B: crate::Backend<Buf = Vec<f32>> + ?Sized,
{
    let AttnShape {
        q_heads,
        kv_heads,
        head_dim,
    } = shape;
    assert_eq!(
        pool.dtype,
        crate::KvDtype::F32,
        "the reference backend's attention reads f32 KV pools only"
    );
    let kv_row = kv_heads * head_dim;
    let group = q_heads / kv_heads;
    let scale = 1.0 / (head_dim as f64).sqrt();
    for seq in &batch.seqs {
        for i in 0..seq.len {
            let at = pool.offset(&seq.blocks, seq.position(i));
            let row = seq.start + i;
            pool.k[at..at + kv_row].copy_from_slice(&k[row * kv_row..(row + 1) * kv_row]);
            pool.v[at..at + kv_row].copy_from_slice(&v[row * kv_row..(row + 1) * kv_row]);
        }
        for i in 0..seq.len {
            let row = seq.start + i;
            let visible = seq.position(i) + 1;
            for h in 0..q_heads {
                let kvh = h / group;
                let qv = &q[(row * q_heads + h) * head_dim..][..head_dim];
                let scores: Vec<f64> = (0..visible)
                    .map(|p| {
                        let kp =
                            &pool.k[pool.offset(&seq.blocks, p) + kvh * head_dim..][..head_dim];
                        qv.iter()
                            .zip(kp)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let max = scores.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
                let exps: Vec<f64> = scores.iter().map(|&s| (s - max).exp()).collect();
                let total: f64 = exps.iter().sum();
                let o = &mut out[(row * q_heads + h) * head_dim..][..head_dim];
                for (d, od) in o.iter_mut().enumerate() {
                    let acc: f64 = (0..visible)
                        .map(|p| {
                            exps[p]
                                * pool.v[pool.offset(&seq.blocks, p) + kvh * head_dim + d] as f64
                        })
                        .sum();
                    *od = (acc / total) as f32;
                }
            }
        }
    }
}
