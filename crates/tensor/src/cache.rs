//! Cache storage a backend owns: the paged KV pool of one full-attention layer and the state pool
//! (conv window + recurrent state) of one Gated DeltaNet layer. Which block or slot belongs to whom
//! is the engine's business; these types only hold the memory and its geometry.

use crate::backend::Backend;
use crate::kv_dtype::KvDtype;

/// Offset (in elements) of token `position` of a sequence owning `blocks`, in a paged pool of
/// `block_size`-token blocks whose token rows hold `row_len` elements.
pub fn kv_offset(blocks: &[u32], position: usize, block_size: usize, row_len: usize) -> usize {
    let block = blocks[position / block_size] as usize;
    (block * block_size + position % block_size) * row_len
}

/// Paged K and V of one full-attention layer.
/// Element layout of `k` and `v`: `[num_blocks, block_size, kv_heads, head_dim]`, stored as `dtype`
/// says (`KvDtype`: f32 on the CPU backends). K is stored after q/k-norm and RoPE, V as projected.
pub struct KvLayerPool<B: Backend + ?Sized> {
    pub k: B::Buf,
    pub v: B::Buf,
    pub num_blocks: usize,
    pub block_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub dtype: KvDtype,
}

impl<B: Backend + ?Sized> KvLayerPool<B> {
    /// A zeroed pool in the backend's KV dtype (`Backend::kv_dtype`).
    pub fn new(
        backend: &B,
        num_blocks: usize,
        block_size: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        Self::with_dtype(
            backend,
            num_blocks,
            block_size,
            kv_heads,
            head_dim,
            backend.kv_dtype(),
        )
    }

    /// A zeroed pool stored as `dtype`, whatever the backend's default; only backends whose
    /// attention reads `dtype` may be given one (the GPU backend reads both).
    pub fn with_dtype(
        backend: &B,
        num_blocks: usize,
        block_size: usize,
        kv_heads: usize,
        head_dim: usize,
        dtype: KvDtype,
    ) -> Self {
        let words = dtype.storage_words(num_blocks * block_size * kv_heads * head_dim);
        Self {
            k: backend.zeros(words),
            v: backend.zeros(words),
            num_blocks,
            block_size,
            kv_heads,
            head_dim,
            dtype,
        }
    }

    /// Elements of `k` (and of `v`).
    pub fn elements(&self) -> usize {
        self.num_blocks * self.block_size * self.kv_heads * self.head_dim
    }

    /// Offset (in elements) of token `position` of a sequence owning `blocks`.
    pub fn offset(&self, blocks: &[u32], position: usize) -> usize {
        kv_offset(
            blocks,
            position,
            self.block_size,
            self.kv_heads * self.head_dim,
        )
    }

    pub fn bytes(&self) -> usize {
        2 * self.elements() * self.dtype.bytes()
    }
}

/// Conv windows and recurrent states of one GDN layer, one slot per sequence (plus snapshot slots).
/// `conv`: `[slots, kernel-1, conv_dim]` (the last kernel-1 pre-conv inputs, oldest first).
/// `ssm`: `[slots, value_heads, key_dim, value_dim]`, always f32.
pub struct StateLayerPool<B: Backend + ?Sized> {
    pub conv: B::Buf,
    pub ssm: B::Buf,
    pub slots: usize,
    pub conv_dim: usize,
    pub conv_history: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
}

impl<B: Backend + ?Sized> StateLayerPool<B> {
    pub fn new(
        backend: &B,
        slots: usize,
        conv_dim: usize,
        conv_kernel: usize,
        value_heads: usize,
        key_dim: usize,
        value_dim: usize,
    ) -> Self {
        let conv_history = conv_kernel - 1;
        Self {
            conv: backend.zeros(slots * conv_history * conv_dim),
            ssm: backend.zeros(slots * value_heads * key_dim * value_dim),
            slots,
            conv_dim,
            conv_history,
            value_heads,
            key_dim,
            value_dim,
        }
    }

    pub fn conv_slot_len(&self) -> usize {
        self.conv_history * self.conv_dim
    }

    pub fn ssm_slot_len(&self) -> usize {
        self.value_heads * self.key_dim * self.value_dim
    }

    /// Bytes one slot holds (conv window at 4 bytes per element plus the f32 state).
    pub fn slot_bytes(&self) -> usize {
        (self.conv_slot_len() + self.ssm_slot_len()) * 4
    }
}
