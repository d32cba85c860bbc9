//! Continuous batching: every step, running sequences advance (one decode token, or their next
//! prefill chunk) and waiting ones are admitted while both pools and the token budget allow. When
//! KV blocks run out mid-generation, the youngest sequence is preempted and later recomputed.
//!
//! Batch invariance: a sequence's prefill is always cut at the same absolute positions (multiples of
//! the chunk size) and a chunk is scheduled whole or not at all, so what a sequence computes does not
//! depend on what else is in the batch.
//!
//! With the prefix cache (docs/prefix-cache.md) an admitted sequence first looks up its prompt in
//! the radix tree: it shares the KV pages of the deepest prefix with a GDN snapshot, starts with a
//! copy of that snapshot in its own slot and computes only the rest. Prefill is then also cut at the
//! sequence's snapshot points (only where `SnapshotGrid` says the cut changes no bit). KV blocks are
//! reference counted: a sequence holds one reference per block of its table, the tree one per page
//! it owns. Whenever a pool is short, the cache yields first (LRU eviction), before any waiting or
//! preemption.

use crate::api::{EngineStats, RequestId};
use crate::pools::{blocks_for, IdPool};
use crate::prefix_cache::{snapshot_points, PrefixCacheConfig, PrefixTree, Released, SnapshotGrid};
use crate::sequence::Sequence;
use std::collections::VecDeque;

/// What the scheduler may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerLimits {
    pub max_running: usize,
    /// Snapshot slots a speculating sequence holds besides its own slot (k + 1; 0 without MTP).
    pub snapshot_slots: usize,
    pub block_size: usize,
    /// Prefill tokens per step; also the chunk length prefills are cut into.
    pub chunk_size: usize,
}

/// One sequence's work in a step: `len` tokens starting at its `computed` position, the last
/// `drafts` of which are speculative drafts to verify (they are not in `Sequence::tokens`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scheduled {
    /// The running sequence's index (`Scheduler::seq`).
    pub index: usize,
    pub len: usize,
    pub drafts: usize,
    /// The step reaches the end of the sequence's tokens, so a new token is sampled from it.
    pub samples: bool,
}

/// Owns every request from submission to its end: the queue, the running set, both pools and the
/// prefix cache. The engine submits and finishes requests, asks for a step's schedule and reads the
/// statistics; what it changes in a running sequence (its tokens, its sampler) goes through `seq_mut`.
pub struct Scheduler {
    limits: SchedulerLimits,
    waiting: VecDeque<Sequence>,
    /// Running sequences, oldest first (`Scheduled::index` points here).
    running: Vec<Sequence>,
    kv: IdPool,
    slots: IdPool,
    /// References on each KV block (sequences holding it in their table, plus the tree).
    refs: Vec<u32>,
    /// The prefix cache; None with `--disable-radix-cache`.
    tree: Option<PrefixTree>,
    cache_config: PrefixCacheConfig,
    grid: SnapshotGrid,
    /// Whether the engine speculates with MTP: then only speculating sequences (whose pages hold
    /// the MTP layer's KV too) insert into the tree.
    mtp: bool,
    /// Prefix-cache events since start.
    cache_counters: CacheCounters,
}

/// Prefix-cache counters since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounters {
    /// Prompt tokens of admitted sequences (looked up in the tree).
    pub queried_tokens: u64,
    /// Of those, tokens reused from the cache.
    pub hit_tokens: u64,
    pub snapshots_taken: u64,
    pub evicted_pages: u64,
    pub evicted_snapshots: u64,
}

/// A newly admitted sequence that resumes from a cached snapshot: copy state slot `from` into
/// `to`, then unlock tree node `node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restore {
    pub from: u32,
    pub to: u32,
    pub node: usize,
}

/// What a plan did besides scheduling work.
#[derive(Default)]
pub struct PlanEvents {
    /// State slots of newly admitted sequences: their GDN state must be zeroed before the forward.
    pub fresh_slots: Vec<u32>,
    /// Newly admitted sequences resuming from a snapshot.
    pub restores: Vec<Restore>,
    pub preempted: usize,
    /// Sequences that can never fit (more KV than the whole pool); to be failed by the engine.
    pub impossible: Vec<Sequence>,
}

impl Scheduler {
    pub fn new(limits: SchedulerLimits, kv_blocks: usize, state_slots: usize) -> Self {
        Self {
            limits,
            waiting: VecDeque::new(),
            running: Vec::new(),
            kv: IdPool::new(kv_blocks),
            slots: IdPool::new(state_slots),
            refs: vec![0; kv_blocks],
            tree: None,
            cache_config: PrefixCacheConfig::disabled(),
            grid: SnapshotGrid::new(limits.block_size, limits.chunk_size, 1, 1),
            mtp: limits.snapshot_slots > 0,
            cache_counters: CacheCounters::default(),
        }
    }

    /// Turns the prefix cache on (when `config.enabled`), cutting prefills on `grid`.
    pub fn with_prefix_cache(mut self, config: PrefixCacheConfig, grid: SnapshotGrid) -> Self {
        self.tree = config
            .enabled
            .then(|| PrefixTree::new(self.limits.block_size));
        self.cache_config = config;
        self.grid = grid;
        self
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Queues a new request; it is admitted by a later `schedule`.
    pub fn submit(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    /// Takes a request out wherever it is (queued or running), its blocks and slots freed: it
    /// finished, was aborted or failed. None when no such request is here.
    pub fn finish(&mut self, id: RequestId) -> Option<Sequence> {
        if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            return self.waiting.remove(i);
        }
        let i = self.index_of(id)?;
        let mut seq = self.running.remove(i);
        self.release(&mut seq);
        Some(seq)
    }

    /// After a failed step: takes every running sequence out, frees what they hold and lets the
    /// prefix cache go (the step may have left cached pages or snapshots half-written). Queued
    /// requests stay queued.
    pub fn fail_running(&mut self) -> Vec<Sequence> {
        let mut running = std::mem::take(&mut self.running);
        self.flush_cache();
        for seq in &mut running {
            self.release(seq);
        }
        running
    }

    /// Takes every queued request out (they hold no blocks or slots yet).
    pub fn take_waiting(&mut self) -> Vec<Sequence> {
        self.waiting.drain(..).collect()
    }

    /// The running sequence `Scheduled::index` points at.
    pub fn seq(&self, index: usize) -> &Sequence {
        &self.running[index]
    }

    /// The running sequence `Scheduled::index` points at, for the engine to record what a step
    /// computed and sampled.
    pub fn seq_mut(&mut self, index: usize) -> &mut Sequence {
        &mut self.running[index]
    }

    /// Where the running request `id` is in the running set.
    pub fn index_of(&self, id: RequestId) -> Option<usize> {
        self.running.iter().position(|s| s.id == id)
    }

    pub fn running_count(&self) -> usize {
        self.running.len()
    }

    pub fn queued_count(&self) -> usize {
        self.waiting.len()
    }

    /// Tokens per KV block.
    pub fn block_size(&self) -> usize {
        self.limits.block_size
    }

    /// KV blocks in the whole pool.
    pub fn kv_blocks_total(&self) -> usize {
        self.kv.total()
    }

    pub fn prefix_cache_enabled(&self) -> bool {
        self.tree.is_some()
    }

    /// Prefix-cache events since start.
    pub fn cache_counters(&self) -> CacheCounters {
        self.cache_counters
    }

    /// Requests and pool occupancy now. Walks the prefix tree's pages (`evictable_blocks`).
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            running: self.running.len(),
            queued: self.waiting.len(),
            kv_blocks_used: self.kv.used(),
            kv_blocks_total: self.kv.total(),
            state_slots_used: self.slots.used(),
            state_slots_total: self.slots.total(),
            cached_kv_blocks: self.evictable_blocks(),
            cached_snapshots: self.tree.as_ref().map_or(0, |t| t.snapshots_held()),
        }
    }

    /// Where the step of a sequence at `from` ends: the next multiple of the chunk size, or the
    /// next snapshot point if sooner.
    fn chunk_end(&self, seq: &Sequence, from: usize) -> usize {
        let c = self.limits.chunk_size;
        let mut end = seq.tokens.len().min((from / c + 1) * c);
        if let Some(&p) = seq.snapshot_points.iter().find(|&&p| p > from) {
            end = end.min(p);
        }
        end
    }

    /// Tokens of `seq` to run next: up to the next multiple of the chunk size (or snapshot point).
    fn chunk_len(&self, seq: &Sequence) -> usize {
        self.chunk_end(seq, seq.computed) - seq.computed
    }

    /// Drops one reference on each block; blocks nobody references go back to the pool.
    fn unref_blocks(&mut self, blocks: impl IntoIterator<Item = u32>) {
        for b in blocks {
            let r = &mut self.refs[b as usize];
            debug_assert!(*r > 0, "block {b} released twice");
            *r = r.saturating_sub(1);
            if *r == 0 {
                self.kv.give_back([b]);
            }
        }
    }

    fn give_back_released(&mut self, released: Released) {
        self.unref_blocks(released.pages);
        self.slots.give_back(released.slots);
    }

    /// Evicts cached leaves until `need` KV blocks are free; false when even that is not enough.
    fn evict_for_blocks(&mut self, need: usize) -> bool {
        while self.kv.available() < need {
            let Some(released) = self.tree.as_mut().and_then(PrefixTree::evict_leaf) else {
                return false;
            };
            self.cache_counters.evicted_pages += released.pages.len() as u64;
            self.cache_counters.evicted_snapshots += released.slots.len() as u64;
            self.give_back_released(released);
        }
        true
    }

    /// Evicts cached snapshots until `need` state slots are free; false when not enough.
    fn evict_for_slots(&mut self, need: usize) -> bool {
        while self.slots.available() < need {
            let Some(released) = self.tree.as_mut().and_then(PrefixTree::evict_snapshot) else {
                return false;
            };
            self.cache_counters.evicted_pages += released.pages.len() as u64;
            self.cache_counters.evicted_snapshots += released.slots.len() as u64;
            self.give_back_released(released);
        }
        true
    }

    /// Takes `n` fresh blocks (one reference each), evicting from the cache when short.
    fn take_blocks(&mut self, n: usize) -> Option<Vec<u32>> {
        if !self.evict_for_blocks(n) {
            return None;
        }
        let ids = self.kv.take(n)?;
        for &b in &ids {
            self.refs[b as usize] = 1;
        }
        Some(ids)
    }

    /// Lets the tree go of everything (`/flush_cache`, or after a failed step).
    pub fn flush_cache(&mut self) {
        if let Some(released) = self.tree.as_mut().map(PrefixTree::flush) {
            self.give_back_released(released);
        }
    }

    /// KV blocks only the prefix cache holds (no running sequence shares them): what eviction can
    /// free at once.
    fn evictable_blocks(&self) -> usize {
        self.tree.as_ref().map_or(0, |t| {
            t.pages().filter(|&b| self.refs[b as usize] == 1).count()
        })
    }

    /// Unlocks a tree node after its snapshot was copied.
    pub fn unlock(&mut self, node: usize) {
        if let Some(tree) = &mut self.tree {
            tree.unlock(node);
        }
    }

    /// After a step that left `running[index]` at one of its snapshot points: inserts its prefix
    /// into the tree and returns `(its slot, snapshot slot)` for the caller to copy the GDN state
    /// into. None when nothing is to be copied (no point here, already cached, no slot to spare).
    pub fn insert_prefix(&mut self, index: usize) -> Option<(u32, u32)> {
        let seq = &self.running[index];
        let p = seq.computed;
        if self.tree.is_none()
            || !seq.snapshot_points.contains(&p)
            || (self.mtp && seq.spec.is_none())
        {
            return None;
        }
        let own = seq.slot?;
        if self.tree.as_mut()?.has_snapshot_at(&seq.tokens, p) {
            return None;
        }
        if !self.evict_for_slots(1) {
            return None;
        }
        let slot = self.slots.take_one()?;
        let seq = &self.running[index];
        let tree = self.tree.as_mut()?;
        let (taken, released) = tree.insert(&seq.tokens, p, &seq.blocks, slot);
        for b in taken {
            self.refs[b as usize] += 1;
        }
        let kept = !released.slots.contains(&slot);
        self.give_back_released(released);
        if !kept {
            return None;
        }
        self.cache_counters.snapshots_taken += 1;
        Some((own, slot))
    }

    /// Gives a sequence's blocks and slots back to the pools.
    fn release(&mut self, seq: &mut Sequence) {
        let blocks: Vec<u32> = seq.blocks.drain(..).collect();
        self.unref_blocks(blocks);
        if let Some(slot) = seq.slot.take() {
            self.slots.give_back([slot]);
        }
        if let Some(spec) = &mut seq.spec {
            self.slots.give_back(spec.snapshot_slots.drain(..));
            spec.drafts.clear();
            spec.draft_dists.clear();
        }
    }

    /// Grows `running[index]`'s block table to cover `upto` positions if the pool allows it now,
    /// without preempting anyone.
    pub fn try_reserve(&mut self, index: usize, upto: usize) -> bool {
        let need = blocks_for(upto, self.limits.block_size)
            .saturating_sub(self.running[index].blocks.len());
        match self.take_blocks(need) {
            Some(ids) => {
                self.running[index].blocks.extend(ids);
                true
            }
            None => false,
        }
    }

    /// Drops the youngest running sequence's cache and puts it at the head of the queue.
    fn preempt_youngest(&mut self) {
        if let Some(mut seq) = self.running.pop() {
            self.release(&mut seq);
            seq.computed = 0;
            seq.preemptions += 1;
            self.waiting.push_front(seq);
        }
    }

    /// Grows `running[index]`'s block table to cover `upto` positions, preempting younger sequences
    /// when the pool is short. False when `running[index]` itself had to be preempted.
    fn reserve_blocks(&mut self, index: usize, upto: usize, events: &mut PlanEvents) -> bool {
        loop {
            let need = blocks_for(upto, self.limits.block_size)
                .saturating_sub(self.running[index].blocks.len());
            if let Some(ids) = self.take_blocks(need) {
                self.running[index].blocks.extend(ids);
                return true;
            }
            let is_youngest = index + 1 == self.running.len();
            self.preempt_youngest();
            events.preempted += 1;
            if is_youngest {
                return false;
            }
        }
    }

    /// Plans one step. Running sequences first (oldest first), then admissions in arrival order.
    pub fn schedule(&mut self) -> (Vec<Scheduled>, PlanEvents) {
        let mut events = PlanEvents::default();
        let mut work = Vec::new();
        let mut prefill_budget = self.limits.chunk_size;
        let mut index = 0;
        while index < self.running.len() {
            let seq = &self.running[index];
            let is_prefill = seq.pending() > 1 || seq.computed < seq.prompt_len;
            let drafts = if is_prefill { 0 } else { seq.draft_count() };
            let len = self.chunk_len(seq) + drafts;
            if is_prefill && len > prefill_budget {
                index += 1;
                continue;
            }
            let upto = self.running[index].computed + len;
            if !self.reserve_blocks(index, upto, &mut events) {
                break;
            }
            if is_prefill {
                prefill_budget -= len;
            }
            work.push(Scheduled {
                index,
                len,
                drafts,
                samples: upto - drafts == self.running[index].tokens.len(),
            });
            index += 1;
        }
        // Preemption may have removed sequences that were already scheduled.
        work.retain(|w| w.index < self.running.len());

        while self.running.len() < self.limits.max_running {
            let Some(head) = self.waiting.front() else {
                break;
            };
            let whole = blocks_for(head.tokens.len() + 1, self.limits.block_size);
            if whole > self.kv.total() {
                if let Some(seq) = self.waiting.pop_front() {
                    events.impossible.push(seq);
                }
                continue;
            }
            let hit = self.lookup_head();
            let Some(head) = self.waiting.front() else {
                break;
            };
            let start = hit.as_ref().map_or(0, |m| m.len);
            let shared = hit.as_ref().map_or(0, |m| m.pages.len());
            let points = match &self.tree {
                Some(_) => snapshot_points(&self.cache_config, &self.grid, &head.tokens),
                None => Vec::new(),
            };
            let c = self.limits.chunk_size;
            let mut end = head.tokens.len().min((start / c + 1) * c);
            if let Some(&p) = points.iter().find(|&&p| p > start) {
                end = end.min(p);
            }
            let len = end - start;
            let slots = head.slots_needed(self.limits.snapshot_slots);
            if len > prefill_budget
                || !self.evict_for_blocks(whole - shared)
                || !self.evict_for_slots(slots)
            {
                if let Some(m) = hit {
                    self.unlock(m.node);
                }
                break;
            }
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            // Invariant: availability of both pools was made sure of just above.
            let slot = self.slots.take_one().expect("a free state slot");
            let mut blocks = Vec::with_capacity(blocks_for(end, self.limits.block_size));
            if let Some(m) = &hit {
                for &b in &m.pages {
                    self.refs[b as usize] += 1;
                }
                blocks.extend_from_slice(&m.pages);
            }
            let fresh = self
                .take_blocks(blocks_for(end, self.limits.block_size) - shared)
                .expect("free KV blocks");
            blocks.extend(fresh);
            if let Some(spec) = &mut seq.spec {
                spec.snapshot_slots = self
                    .slots
                    .take(self.limits.snapshot_slots)
                    .expect("free snapshot slots");
            }
            if self.tree.is_some() {
                self.cache_counters.queried_tokens += seq.prompt_len as u64;
                self.cache_counters.hit_tokens += start.min(seq.prompt_len) as u64;
            }
            seq.slot = Some(slot);
            seq.blocks = blocks;
            seq.computed = start;
            seq.usage.cached_tokens = start.min(seq.prompt_len);
            seq.snapshot_points = points;
            match hit {
                Some(m) => events.restores.push(Restore {
                    from: m.snapshot,
                    to: slot,
                    node: m.node,
                }),
                None => events.fresh_slots.push(slot),
            }
            prefill_budget -= len;
            self.running.push(seq);
            let index = self.running.len() - 1;
            work.push(Scheduled {
                index,
                len,
                drafts: 0,
                samples: end == self.running[index].tokens.len(),
            });
        }
        (work, events)
    }

    /// Looks the head of the queue up in the tree: the deepest cached prefix it may resume from
    /// (exact cut, at least one token left to run, and for a speculating sequence the MTP pairing
    /// token equal). The matched node is locked until its snapshot is copied.
    fn lookup_head(&mut self) -> Option<crate::prefix_cache::PrefixMatch> {
        let head = self.waiting.front()?;
        let tree = self.tree.as_mut()?;
        if head.computed != 0 {
            return None;
        }
        let grid = self.grid;
        let n = head.tokens.len();
        let speculating = head.spec.is_some();
        let tokens = &head.tokens;
        let m = tree.match_prefix(tokens, |end, next| {
            grid.allows(end, n) && (!speculating || tokens.get(end) == Some(&next))
        })?;
        tree.lock(m.node);
        Some(m)
    }
}
