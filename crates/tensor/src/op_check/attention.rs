//! Attention in the op harness: the paged KV pools of one layer on a backend and on the reference,
//! carried from step to step (a prefill chunk, then decodes over the cached context).

use super::{poisoned, Operands, Outputs};
use crate::backend::{AttnShape, Backend};
use crate::batch::BatchLayout;
use crate::cache::KvLayerPool;
use crate::kv_dtype::KvDtype;
use crate::reference::ReferenceBackend;

/// The KV pools of one attention layer on both backends. The reference sees K and V as the
/// backend's pool stores them (rounded to bf16 for a bf16 pool), and every input as `operands`
/// says, so the comparison measures the attention kernel; the pools themselves must then hold the
/// same values bit for bit.
pub struct AttentionPools<B: Backend> {
    pub ours: KvLayerPool<B>,
    pub reference: KvLayerPool<ReferenceBackend>,
    operands: Operands,
}

impl<B: Backend> AttentionPools<B> {
    /// Zeroed pools; ours stored as `dtype` (the backend must read it: `Backend::kv_dtype` does).
    pub fn new(
        be: &B,
        num_blocks: usize,
        block_size: usize,
        kv_heads: usize,
        head_dim: usize,
        dtype: KvDtype,
    ) -> Self {
        Self {
            ours: KvLayerPool::with_dtype(be, num_blocks, block_size, kv_heads, head_dim, dtype),
            reference: KvLayerPool::new(
                &ReferenceBackend,
                num_blocks,
                block_size,
                kv_heads,
                head_dim,
            ),
            operands: Operands::Exact,
        }
    }

    /// The same pools, the reference seeing q, k, v and the cached context as `operands` says.
    pub fn seen_as(mut self, operands: Operands) -> Self {
        self.operands = operands;
        self
    }

    /// Fills both pools with `k` and `v` (every element of a pool): cached context from earlier
    /// steps that the next steps attend over.
    pub fn hold(&mut self, be: &B, k: &[f32], v: &[f32]) {
        let dtype = self.ours.dtype;
        self.ours.k = be.upload(&dtype.encode(k));
        self.ours.v = be.upload(&dtype.encode(v));
        self.reference.k = self.kv_seen(k);
        self.reference.v = self.kv_seen(v);
    }

    /// K or V values as the reference sees them: stored in our pool's dtype, then as `operands`.
    fn kv_seen(&self, x: &[f32]) -> Vec<f32> {
        let dtype = self.ours.dtype;
        self.operands.seen(&dtype.decode(&dtype.encode(x), x.len()))
    }

    /// One step: writes the batch's new `k`, `v` (`[T, kv_heads, head_dim]`) into the pools and
    /// attends `q` (`[T, q_heads, head_dim]`) over each sequence's cached keys.
    pub fn attend(
        &mut self,
        be: &B,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        batch: &BatchLayout,
        shape: AttnShape,
    ) -> Outputs {
        let mut want = vec![0.0; q.len()];
        ReferenceBackend.attention(
            &self.operands.seen(q),
            &self.kv_seen(k),
            &self.kv_seen(v),
            &mut self.reference,
            batch,
            shape,
            &mut want,
        );
        let mut out = poisoned(be, q.len());
        be.attention(
            &be.upload(q),
            &be.upload(k),
            &be.upload(v),
            &mut self.ours,
            batch,
            shape,
            &mut out,
        );
        (be.to_host(&out), want)
    }

    /// The pools' K and V values: `(k, v)`, each `(ours, reference)`.
    pub fn contents(&self, be: &B) -> (Outputs, Outputs) {
        let (dtype, n) = (self.ours.dtype, self.ours.elements());
        (
            (
                dtype.decode(&be.to_host(&self.ours.k), n),
                self.reference.k.clone(),
            ),
            (
                dtype.decode(&be.to_host(&self.ours.v), n),
                self.reference.v.clone(),
            ),
        )
    }
}
