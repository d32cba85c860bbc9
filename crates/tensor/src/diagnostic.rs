//! A diagnostic backend that reproduces the failure deltaserve was founded on (docs/serving.md,
//! "The founding failure"): it wraps a correct backend and computes full attention WRONGLY (each
//! query sees only the most recent positions, as a kernel with a broken mask or page table would),
//! while every other op stays right. It exists so that tests, `doctor` and the canary can be shown
//! catching such a kernel; it is selected only through the diagnostic attention-backend name and
//! never by default.

use crate::backend::{AttnShape, Backend};
use crate::batch::{BatchLayout, SeqLayout};
use crate::cache::KvLayerPool;

/// The attention-backend name that selects this fault.
pub const BROKEN_ATTENTION_NAME: &str = "diagnostic-broken-attention";

/// Positions each query still sees: itself only.
const VISIBLE_POSITIONS: usize = 1;

/// `inner` with a broken attention op.
pub struct BrokenAttention<B> {
    pub inner: B,
}

impl<B: Backend> Backend for BrokenAttention<B> {
    type Buf = B::Buf;
    type Mat = B::Mat;

    fn name(&self) -> &'static str {
        BROKEN_ATTENTION_NAME
    }

    /// The fault: the cache is written correctly, but each query attends as if its sequence
    /// started `VISIBLE_POSITIONS` tokens ago (a page table that only maps the newest block).
    fn attention(
        &self,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        pool: &mut KvLayerPool<Self>,
        batch: &BatchLayout,
        shape: AttnShape,
        out: &mut Self::Buf,
    ) {
        // First let the inner kernel write the new K/V at their true positions.
        pool.lend(&self.inner, |p| {
            self.inner.attention(q, k, v, p, batch, shape, out)
        });
        // Then recompute each new token's output over only its own K/V: one-token "sequences" at
        // position 0 of a scratch pool.
        let mut scratch = KvLayerPool::<B>::with_dtype(
            &self.inner,
            batch.total_tokens().max(1),
            pool.block_size,
            pool.kv_heads,
            pool.head_dim,
            pool.dtype,
        );
        let seqs: Vec<SeqLayout> = (0..batch.total_tokens())
            .map(|row| SeqLayout {
                start: row,
                len: 1,
                pos: VISIBLE_POSITIONS - 1,
                blocks: vec![row as u32],
                slot: 0,
                snapshot_slots: Vec::new(),
            })
            .collect();
        let one_token_batch = BatchLayout {
            seqs,
            block_size: pool.block_size,
        };
        self.inner
            .attention(q, k, v, &mut scratch, &one_token_batch, shape, out);
    }

    crate::forward_ops!(inner;
        zeros, kv_dtype, scratch, upload, to_host, buf_len, load_mat, load_vec, mat_shape,
        mat_bytes, embedding, matmul, matmul_group, add_rms_norm, rms_norm, gated_rms_norm,
        add_inplace, silu_mul, dense_mlp, sigmoid_mul_inplace, rope, concat_cols, gather_rows,
        scatter_add_rows, sigmoid_scale_rows, causal_conv1d, gdn_gates, gated_delta_rule,
        reset_state_slot, copy_state_slot, route_top_k, load_experts, generate_experts,
        moe_experts, generate_mat, samples_on_device, sample_rows, device, run_step);
}
