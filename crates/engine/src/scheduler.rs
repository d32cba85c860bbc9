//! Continuous batching: every step, running sequences advance (one decode token, or their next
//! prefill chunk) and waiting ones are admitted while both pools and the token budget allow. When
//! KV blocks run out mid-generation, the youngest sequence is preempted and later recomputed.
//!
//! Batch invariance: a sequence's prefill is always cut at the same absolute positions (multiples of
//! the chunk size) and a chunk is scheduled whole or not at all, so what a sequence computes does not
//! depend on what else is in the batch.

use crate::pools::{blocks_for, IdPool};
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
    /// Index into `Scheduler::running`.
    pub index: usize,
    pub len: usize,
    pub drafts: usize,
    /// The step reaches the end of the sequence's tokens, so a new token is sampled from it.
    pub samples: bool,
}

pub struct Scheduler {
    pub limits: SchedulerLimits,
    pub waiting: VecDeque<Sequence>,
    pub running: Vec<Sequence>,
    pub kv: IdPool,
    pub slots: IdPool,
}

/// What a plan did besides scheduling work.
#[derive(Default)]
pub struct PlanEvents {
    /// State slots of newly admitted sequences: their GDN state must be zeroed before the forward.
    pub fresh_slots: Vec<u32>,
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
        }
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Tokens of `seq` to run next: up to the next multiple of the chunk size.
    fn chunk_len(&self, seq: &Sequence) -> usize {
        let c = self.limits.chunk_size;
        let end = seq.tokens.len().min((seq.computed / c + 1) * c);
        end - seq.computed
    }

    /// Gives a sequence's blocks and slots back to the pools.
    pub fn release(&mut self, seq: &mut Sequence) {
        self.kv.give_back(seq.blocks.drain(..));
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
        match self.kv.take(need) {
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
            if let Some(ids) = self.kv.take(need) {
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
    pub fn plan(&mut self) -> (Vec<Scheduled>, PlanEvents) {
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
            let len = self.chunk_len(head);
            let slots = head.slots_needed(self.limits.snapshot_slots);
            if len > prefill_budget || whole > self.kv.available() || self.slots.available() < slots
            {
                break;
            }
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            // Invariant: availability of both pools was checked just above.
            let slot = self.slots.take_one().expect("a free state slot");
            let blocks = self
                .kv
                .take(blocks_for(len, self.limits.block_size))
                .expect("free KV blocks");
            if let Some(spec) = &mut seq.spec {
                spec.snapshot_slots = self
                    .slots
                    .take(self.limits.snapshot_slots)
                    .expect("free snapshot slots");
            }
            seq.slot = Some(slot);
            seq.blocks = blocks;
            events.fresh_slots.push(slot);
            prefill_budget -= len;
            self.running.push(seq);
            let index = self.running.len() - 1;
            work.push(Scheduled {
                index,
                len,
                drafts: 0,
                samples: len == self.running[index].tokens.len(),
            });
        }
        (work, events)
    }
}
