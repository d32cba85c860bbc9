//! The hybrid cache of one model on one backend: a paged KV pool per full-attention layer (plus one
//! for the MTP layer) and a state pool per Gated DeltaNet layer. All pools share block ids and slot
//! ids, so one block table and one slot describe a sequence everywhere. Allocation is the engine's.

use crate::config::ModelConfig;
use crate::tp::SlotOp;
use deltaserve_tensor::{Backend, KvLayerPool, StateLayerPool};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How big the pools are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheGeometry {
    pub num_blocks: usize,
    pub block_size: usize,
    /// State-pool slots (one per running sequence, plus snapshot slots for speculation).
    pub state_slots: usize,
    /// Whether to hold a KV pool for the MTP layer.
    pub mtp: bool,
}

pub struct HybridCache<B: Backend> {
    /// One per full-attention layer, in layer order.
    pub kv: Vec<KvLayerPool<B>>,
    /// One per GDN layer, in layer order.
    pub state: Vec<StateLayerPool<B>>,
    pub mtp_kv: Option<KvLayerPool<B>>,
    pub geometry: CacheGeometry,
    /// Unique per cache made in this process (recorded steps are bound to one cache's pools).
    pub id: u64,
    /// Tensor parallelism: a follower rank keeps its own copy of this cache while this lives.
    pub(crate) alive: Arc<()>,
    /// Set once the cache was used by a tensor-parallel step: its slot operations are then logged
    /// for the follower ranks.
    pub(crate) mirrored: bool,
    /// Slot operations the followers have not applied yet.
    pub(crate) slot_ops: Vec<SlotOp>,
}

/// The next `HybridCache::id`.
static NEXT_CACHE_ID: AtomicU64 = AtomicU64::new(1);

impl<B: Backend> HybridCache<B> {
    pub fn new(backend: &B, config: &ModelConfig, geometry: CacheGeometry) -> Self {
        let attn = config.attn_shape();
        let gdn = config.gdn_shape();
        let kv_pool = || {
            KvLayerPool::new(
                backend,
                geometry.num_blocks,
                geometry.block_size,
                attn.kv_heads,
                attn.head_dim,
            )
        };
        let full = (0..config.num_hidden_layers)
            .filter(|&i| config.is_full_attention(i))
            .count();
        let linear = config.num_hidden_layers - full;
        Self {
            kv: (0..full).map(|_| kv_pool()).collect(),
            state: (0..linear)
                .map(|_| {
                    StateLayerPool::new(
                        backend,
                        geometry.state_slots,
                        gdn.conv_dim(),
                        config.linear_conv_kernel_dim,
                        gdn.value_heads,
                        gdn.key_dim,
                        gdn.value_dim,
                    )
                })
                .collect(),
            mtp_kv: geometry.mtp.then(kv_pool),
            geometry,
            id: NEXT_CACHE_ID.fetch_add(1, Ordering::Relaxed),
            alive: Arc::new(()),
            mirrored: false,
            slot_ops: Vec::new(),
        }
    }

    /// Bytes of KV per token over all full-attention layers (MTP included).
    pub fn kv_bytes_per_token(&self) -> usize {
        let per_layer = |p: &KvLayerPool<B>| 2 * p.kv_heads * p.head_dim * p.dtype.bytes();
        self.kv
            .iter()
            .chain(self.mtp_kv.iter())
            .map(per_layer)
            .sum()
    }

    /// Bytes of GDN state per slot over all layers.
    pub fn state_bytes_per_slot(&self) -> usize {
        self.state.iter().map(|p| p.slot_bytes()).sum()
    }

    /// Empties a slot in every GDN layer, for a sequence that starts from scratch.
    pub fn reset_slot(&mut self, backend: &B, slot: usize) {
        for pool in &mut self.state {
            backend.reset_state_slot(pool, slot);
        }
        if self.mirrored {
            self.slot_ops.push(SlotOp::Reset(slot));
        }
    }

    /// Copies the GDN state of slot `src` into `dst` in every layer (commit a snapshot, fork).
    pub fn copy_slot(&mut self, backend: &B, src: usize, dst: usize) {
        for pool in &mut self.state {
            backend.copy_state_slot(pool, src, dst);
        }
        if self.mirrored {
            self.slot_ops.push(SlotOp::Copy { src, dst });
        }
    }
}
