//! Tensor parallelism (`--tp-size N`, docs/tensor-parallel.md): which part of each weight a rank
//! owns, the rank-local config that follows from it, and the group of ranks behind one `Model`.
//!
//! The model is split Megatron-style at load time (`weights.rs` slices host tensors before they
//! reach the backend), so each rank's forward pass is the ordinary one on smaller shapes plus a
//! sum over ranks after every row-parallel projection and a gather of the vocabulary-split logits
//! (`forward.rs`). Rank 0 is the `Model` the caller holds (the leader); ranks 1.. are followers,
//! each a `Model` on its own thread with its own backend and caches. Every forward or MTP step the
//! leader runs is sent to the followers first, so all ranks run the same ops in the same order;
//! the collectives inside keep them in lock step. Callers see one model: the logits every rank
//! computes are the whole vocabulary's, and only the leader's are returned.

use crate::cache::{CacheGeometry, HybridCache};
use crate::config::ModelConfig;
use crate::error::LoadError;
use crate::forward::{ForwardInput, Model};
use crate::mtp::MtpInput;
use crate::source::TensorSource;
use crate::weights::Weights;
use deltaserve_tensor::comm::GROUP_ABORTED;
use deltaserve_tensor::{Backend, BatchLayout, Communicator};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Mutex, Weak};
use std::thread::JoinHandle;

/// The part of the model one rank holds: rank `rank` of `size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub rank: usize,
    pub size: usize,
}

impl Shard {
    /// The whole model (no tensor parallelism).
    pub const WHOLE: Shard = Shard { rank: 0, size: 1 };

    pub fn is_whole(&self) -> bool {
        self.size == 1
    }

    /// This rank's contiguous `[from, to)` of `total` items split evenly (`total` divisible by
    /// `size`, checked by `rank_config`).
    pub fn range(&self, total: usize) -> (usize, usize) {
        let n = total / self.size;
        (self.rank * n, (self.rank + 1) * n)
    }

    /// This rank's KV heads of `total`: an even share, or with fewer KV heads than ranks (`size`
    /// a multiple of `total`, checked by `rank_config`) a copy of the one KV head its query heads
    /// read: consecutive ranks hold consecutive query heads, so `size / total` of them share it.
    pub fn kv_range(&self, total: usize) -> (usize, usize) {
        if total >= self.size {
            return self.range(total);
        }
        let head = self.rank / (self.size / total);
        (head, head + 1)
    }
}

/// The config one rank of `tp_size` sees: attention heads, KV heads, GDN key and value heads and
/// MLP widths divided by `tp_size` (so the forward pass, the cache pools and the memory planner
/// all work on one rank's share); hidden size and vocabulary unchanged (the residual stream is
/// replicated and the logits are gathered whole). Fails naming the first field that does not
/// divide.
pub fn rank_config(config: &ModelConfig, tp_size: usize) -> Result<ModelConfig, LoadError> {
    if tp_size == 0 {
        return Err(LoadError::TensorParallel {
            tp_size,
            field: "(tp size)".into(),
            value: 0,
            message: "at least one rank is needed".into(),
        });
    }
    if tp_size == 1 {
        return Ok(config.clone());
    }
    let has_gdn = config
        .layer_types
        .contains(&crate::config::LayerKind::LinearAttention);
    let mut checks: Vec<(&str, usize, &str)> = vec![
        (
            "num_attention_heads",
            config.num_attention_heads,
            "each rank owns whole query heads",
        ),
        (
            "vocab_size",
            config.vocab_size,
            "the embedding and lm_head are split over the vocabulary",
        ),
    ];
    if has_gdn {
        checks.push((
            "linear_num_key_heads",
            config.linear_num_key_heads,
            "each rank owns whole Gated DeltaNet key-head groups",
        ));
        checks.push((
            "linear_num_value_heads",
            config.linear_num_value_heads,
            "each rank owns the value heads of its key-head groups",
        ));
    }
    if config.intermediate_size > 0 {
        checks.push((
            "intermediate_size",
            config.intermediate_size,
            "the dense MLP is split over its intermediate width",
        ));
    }
    if let Some(moe) = &config.moe {
        checks.push((
            "moe_intermediate_size",
            moe.moe_intermediate_size,
            "every expert is split over its intermediate width",
        ));
        if moe.shared_expert_intermediate_size > 0 {
            checks.push((
                "shared_expert_intermediate_size",
                moe.shared_expert_intermediate_size,
                "the shared expert is split over its intermediate width",
            ));
        }
    }
    let kv_heads = config.num_key_value_heads;
    if kv_heads == 0 || (!kv_heads.is_multiple_of(tp_size) && !tp_size.is_multiple_of(kv_heads)) {
        return Err(LoadError::TensorParallel {
            tp_size,
            field: "num_key_value_heads".into(),
            value: kv_heads,
            message: "each rank owns whole KV heads, or with fewer KV heads than ranks a copy of \
                      one, which needs the number of ranks to be a multiple of them"
                .into(),
        });
    }
    for (field, value, why) in checks {
        if value % tp_size != 0 || value < tp_size {
            return Err(LoadError::TensorParallel {
                tp_size,
                field: field.into(),
                value,
                message: why.into(),
            });
        }
    }
    let mut local = config.clone();
    local.num_attention_heads /= tp_size;
    // Fewer KV heads than ranks: each rank keeps a copy of the one its query heads read.
    local.num_key_value_heads = (kv_heads / tp_size).max(1);
    local.intermediate_size /= tp_size;
    if has_gdn {
        local.linear_num_key_heads /= tp_size;
        local.linear_num_value_heads /= tp_size;
    }
    if let Some(moe) = &mut local.moe {
        moe.moe_intermediate_size /= tp_size;
        moe.shared_expert_intermediate_size /= tp_size;
    }
    Ok(local)
}

/// One GDN state-slot operation the leader applied to a cache; followers apply it to theirs before
/// their next step on that cache.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SlotOp {
    Reset(usize),
    Copy { src: usize, dst: usize },
}

/// Which of the leader's caches a step runs on, so a follower can find (or make) its own.
pub(crate) struct CacheLink {
    pub id: u64,
    pub geometry: CacheGeometry,
    /// Dead once the leader dropped the cache: the follower then drops its own.
    pub alive: Weak<()>,
    pub slot_ops: Vec<SlotOp>,
}

/// A step a follower runs, with owned copies of the leader's inputs.
pub(crate) enum RankCommand {
    Forward {
        cache: CacheLink,
        tokens: Vec<u32>,
        batch: BatchLayout,
        logit_rows: Vec<u32>,
        hidden_rows: Vec<u32>,
    },
    Mtp {
        cache: CacheLink,
        hidden: Vec<f32>,
        next_tokens: Vec<u32>,
        batch: BatchLayout,
        logit_rows: Vec<u32>,
        hidden_rows: Vec<u32>,
    },
}

/// The leader's handle on one follower thread.
struct Follower {
    commands: Option<Sender<RankCommand>>,
    acks: Receiver<Result<(), String>>,
    thread: Option<JoinHandle<()>>,
}

/// A rank's place in its tensor-parallel group; the leader also holds the followers.
pub(crate) struct TpRank<B: Backend> {
    pub comm: Box<dyn Communicator<B>>,
    pub shard: Shard,
    followers: Mutex<Vec<Follower>>,
    /// `(free, total)` device memory of each follower's GPU right after its weights loaded.
    follower_memory: Vec<Option<(usize, usize)>>,
}

impl<B: Backend> TpRank<B> {
    pub(crate) fn new(comm: Box<dyn Communicator<B>>) -> Self {
        let shard = Shard {
            rank: comm.rank(),
            size: comm.size(),
        };
        Self {
            comm,
            shard,
            followers: Mutex::new(Vec::new()),
            follower_memory: Vec::new(),
        }
    }
}

impl<B: Backend> Drop for TpRank<B> {
    fn drop(&mut self) {
        let followers = self.followers.get_mut().unwrap_or_else(|p| p.into_inner());
        for f in followers.iter_mut() {
            // Closing the channel ends the follower's loop.
            f.commands.take();
        }
        for f in followers.iter_mut() {
            if let Some(t) = f.thread.take() {
                let _ = t.join();
            }
        }
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

impl<B: Backend> HybridCache<B> {
    /// Marks the cache as mirrored on the followers and hands over the slot operations they have
    /// not seen yet.
    pub(crate) fn link(&mut self) -> CacheLink {
        self.mirrored = true;
        CacheLink {
            id: self.id,
            geometry: self.geometry,
            alive: std::sync::Arc::downgrade(&self.alive),
            slot_ops: std::mem::take(&mut self.slot_ops),
        }
    }
}

impl<B: Backend> Model<B> {
    /// How this model is split: `Shard::WHOLE` without tensor parallelism.
    pub fn shard(&self) -> Shard {
        self.tp.as_ref().map_or(Shard::WHOLE, |tp| tp.shard)
    }

    /// The communicator's kind (`in-process`, `nccl`), when the model is split.
    pub fn communicator_kind(&self) -> Option<&'static str> {
        self.tp.as_ref().map(|tp| tp.comm.kind())
    }

    /// `(free, total)` bytes of device memory on the tightest rank (the least free, the smallest
    /// total): what the cache pools of every rank are planned from, since every rank holds pools of
    /// the same size. Followers report what they had right after loading. `None` for backends that
    /// run from host memory.
    pub fn device_memory(&self) -> Option<(usize, usize)> {
        let mut memory = self.backend.device()?.memory();
        if let Some(tp) = &self.tp {
            for (free, total) in tp.follower_memory.iter().flatten() {
                memory = (memory.0.min(*free), memory.1.min(*total));
            }
        }
        Some(memory)
    }

    /// Runs `local` on this rank after sending `command` to every follower, then waits for them.
    /// A rank that fails aborts the group so that no rank waits forever in a collective; the
    /// failure surfaces here as a panic (the engine ends the step's requests). Before it does,
    /// every follower's answer to this step is read (so a late one is never taken for the next
    /// step's) and, every rank having left the step, the communicator is reset where it can be
    /// (`Communicator::recover`): the next step runs on a working group.
    pub(crate) fn on_all_ranks<T>(
        &self,
        cache: &mut HybridCache<B>,
        command: impl Fn(CacheLink) -> RankCommand,
        local: impl FnOnce(&mut HybridCache<B>) -> T,
    ) -> T {
        let Some(tp) = &self.tp else {
            return local(cache);
        };
        let followers = tp.followers.lock().unwrap_or_else(|p| p.into_inner());
        if followers.is_empty() {
            return local(cache);
        }
        let ops = cache.link().slot_ops;
        let mut sent = 0;
        for f in followers.iter() {
            let link = CacheLink {
                id: cache.id,
                geometry: cache.geometry,
                alive: std::sync::Arc::downgrade(&cache.alive),
                slot_ops: ops.clone(),
            };
            let delivered = f
                .commands
                .as_ref()
                .is_some_and(|tx| tx.send(command(link)).is_ok());
            if !delivered {
                break;
            }
            sent += 1;
        }
        if sent < followers.len() {
            // A follower's thread ended: the group can never meet again. Release the followers
            // that got the step from its collectives and read their answers.
            tp.comm.abort();
            let _ = drain_acks(&followers[..sent]);
            panic!(
                "tensor-parallel rank {} stopped (its thread ended)",
                sent + 1
            );
        }
        let out = catch_unwind(AssertUnwindSafe(|| local(cache)));
        if out.is_err() {
            tp.comm.abort();
        }
        let acks = drain_acks(&followers);
        if out.is_ok() && acks.is_ok() {
            return out.unwrap_or_else(|_| unreachable!());
        }
        // Every rank has left the step: the leader's `local` returned and every follower answered
        // (after its step ended), so none is inside a collective and the group can be reset.
        let stopped = acks.as_ref().err().and_then(|f| f.stopped);
        if !(stopped.is_none() && tp.comm.recover()) {
            eprintln!(
                "tensor-parallel: the {} group cannot be reset after a failed step; later steps \
                 fail too (restart the server)",
                tp.comm.kind()
            );
        }
        if let Some(rank) = stopped {
            panic!("tensor-parallel rank {rank} stopped (its thread ended)");
        }
        // The step fails with its cause: the rank whose own op failed, not one that only left a
        // collective because the group was aborted.
        let follower = acks.err().and_then(|f| {
            let first = f.failed.first().cloned();
            f.failed
                .into_iter()
                .find(|(_, m)| !m.contains(GROUP_ABORTED))
                .or(first)
        });
        match (out, follower) {
            (Err(payload), Some((rank, message)))
                if panic_text(payload.as_ref()).contains(GROUP_ABORTED)
                    && !message.contains(GROUP_ABORTED) =>
            {
                panic!("tensor-parallel rank {rank} failed: {message}")
            }
            (Err(payload), _) => resume_unwind(payload),
            (Ok(_), Some((rank, message))) => {
                panic!("tensor-parallel rank {rank} failed: {message}")
            }
            (Ok(_), None) => unreachable!("no rank failed"),
        }
    }
}

/// What went wrong on the followers in one step.
struct FollowerFailures {
    /// Ranks whose step panicked, with the panic's text, in rank order.
    failed: Vec<(usize, String)>,
    /// The first rank whose thread ended: the group cannot meet again.
    stopped: Option<usize>,
}

/// Reads exactly one answer from each of `followers` (ranks 1..), all of them even after one
/// failed, so that no answer to this step is left to be taken for the next step's.
fn drain_acks(followers: &[Follower]) -> Result<(), FollowerFailures> {
    let mut failures = FollowerFailures {
        failed: Vec::new(),
        stopped: None,
    };
    for (i, f) in followers.iter().enumerate() {
        match f.acks.recv() {
            Ok(Ok(())) => {}
            Ok(Err(message)) => failures.failed.push((i + 1, message)),
            Err(_) => {
                failures.stopped.get_or_insert(i + 1);
            }
        }
    }
    if failures.failed.is_empty() && failures.stopped.is_none() {
        Ok(())
    } else {
        Err(failures)
    }
}

/// A follower's caches, by the leader's cache id.
struct FollowerCaches<B: Backend> {
    caches: Vec<(u64, Weak<()>, HybridCache<B>)>,
}

impl<B: Backend> FollowerCaches<B> {
    fn get(&mut self, model: &Model<B>, link: CacheLink) -> &mut HybridCache<B> {
        self.caches.retain(|(_, alive, _)| alive.strong_count() > 0);
        let index = match self.caches.iter().position(|(id, _, _)| *id == link.id) {
            Some(i) => i,
            None => {
                let cache = HybridCache::new(&model.backend, &model.config, link.geometry);
                self.caches.push((link.id, link.alive, cache));
                self.caches.len() - 1
            }
        };
        let cache = &mut self.caches[index].2;
        for op in link.slot_ops {
            match op {
                SlotOp::Reset(slot) => cache.reset_slot(&model.backend, slot),
                SlotOp::Copy { src, dst } => cache.copy_slot(&model.backend, src, dst),
            }
        }
        cache
    }
}

fn run_follower<B: Backend>(
    model: Model<B>,
    commands: Receiver<RankCommand>,
    acks: Sender<Result<(), String>>,
) {
    let mut caches = FollowerCaches { caches: Vec::new() };
    for command in commands {
        let result = catch_unwind(AssertUnwindSafe(|| match command {
            RankCommand::Forward {
                cache,
                tokens,
                batch,
                logit_rows,
                hidden_rows,
            } => {
                let cache = caches.get(&model, cache);
                let input = ForwardInput {
                    tokens: &tokens,
                    batch: &batch,
                    logit_rows: &logit_rows,
                    hidden_rows: &hidden_rows,
                };
                model.forward_plain(&input, cache);
            }
            RankCommand::Mtp {
                cache,
                hidden,
                next_tokens,
                batch,
                logit_rows,
                hidden_rows,
            } => {
                let cache = caches.get(&model, cache);
                let input = MtpInput {
                    hidden: &hidden,
                    next_tokens: &next_tokens,
                    batch: &batch,
                    logit_rows: &logit_rows,
                    hidden_rows: &hidden_rows,
                };
                if let Err(e) = model.mtp_forward(&input, cache) {
                    panic!("{e}");
                }
            }
        }));
        let result = result.map_err(|payload| {
            if let Some(tp) = &model.tp {
                tp.comm.abort();
            }
            // As the engine does for rank 0's backend after a failed step.
            match model.backend.recover_after_failure() {
                Ok(()) => panic_text(payload.as_ref()),
                Err(lost) => format!(
                    "{}; the device is lost: {lost}",
                    panic_text(payload.as_ref())
                ),
            }
        });
        if acks.send(result).is_err() {
            return;
        }
    }
}

/// Loads `config` split over one rank per backend (`comms[r]` is rank `r`'s end of the group) and
/// starts the followers: the returned model is rank 0, and drives the others. `progress` follows
/// rank 0's loading. With one backend the model is whole but still runs its collectives (no-ops
/// on one rank), which checks a communicator's plumbing on one device.
pub fn load_tensor_parallel<B: Backend + 'static>(
    backends: Vec<B>,
    comms: Vec<Box<dyn Communicator<B>>>,
    config: &ModelConfig,
    source: &dyn TensorSource,
    load_mtp: bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Model<B>, LoadError> {
    assert_eq!(backends.len(), comms.len(), "one communicator per backend");
    let size = backends.len();
    let local = rank_config(config, size)?;
    if size == 1 {
        // A one-rank group: the whole model, through the communicator all the same.
        let backend = backends.into_iter().next().expect("one backend");
        let comm = comms.into_iter().next().expect("one communicator");
        let weights = Weights::load(&backend, config, source, load_mtp, progress)?;
        return Ok(Model::with_rank(local, backend, weights, comm));
    }
    // Rank 0 loads on this thread (with progress), the others on their own threads at once.
    let mut ranks: Vec<(B, Box<dyn Communicator<B>>)> = backends.into_iter().zip(comms).collect();
    let rest = ranks.split_off(1);
    let (backend0, comm0) = ranks.pop().expect("rank 0");
    let (leader, others) = std::thread::scope(|s| {
        let handles: Vec<_> = rest
            .into_iter()
            .map(|(backend, comm)| {
                let local = local.clone();
                s.spawn(move || {
                    let shard = Shard {
                        rank: comm.rank(),
                        size,
                    };
                    let weights = Weights::load_shard(
                        &backend,
                        config,
                        source,
                        load_mtp,
                        shard,
                        &mut |_, _| {},
                    )?;
                    Ok::<_, LoadError>(Model::with_rank(local, backend, weights, comm))
                })
            })
            .collect();
        let shard = Shard {
            rank: comm0.rank(),
            size,
        };
        let leader = Weights::load_shard(&backend0, config, source, load_mtp, shard, progress)
            .map(|w| Model::with_rank(local.clone(), backend0, w, comm0));
        let others: Vec<Result<Model<B>, LoadError>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| resume_unwind(p)))
            .collect();
        (leader, others)
    });
    let leader = leader?;
    let others = others.into_iter().collect::<Result<Vec<_>, _>>()?;
    let mut leader = leader;
    let follower_memory = others
        .iter()
        .map(|m| m.backend.device().map(|d| d.memory()))
        .collect();
    if let Some(tp) = &mut leader.tp {
        tp.follower_memory = follower_memory;
    }
    let mut followers = Vec::with_capacity(others.len());
    for model in others {
        let rank = model.shard().rank;
        let (tx, rx) = channel();
        let (ack_tx, ack_rx) = channel();
        let thread = std::thread::Builder::new()
            .name(format!("deltaserve-tp-rank-{rank}"))
            .spawn(move || run_follower(model, rx, ack_tx))
            .map_err(|e| LoadError::TensorParallel {
                tp_size: size,
                field: "(threads)".into(),
                value: size,
                message: format!("starting the thread of rank {rank}: {e}"),
            })?;
        followers.push(Follower {
            commands: Some(tx),
            acks: ack_rx,
            thread: Some(thread),
        });
    }
    if let Some(tp) = &leader.tp {
        *tp.followers.lock().unwrap_or_else(|p| p.into_inner()) = followers;
    }
    Ok(leader)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demo_like() -> ModelConfig {
        let json = include_str!("../../../models/demo/config.json");
        ModelConfig::from_json_str(json, std::path::Path::new("demo/config.json")).unwrap()
    }

    #[test]
    fn rank_config_divides_heads_and_widths() {
        let c = demo_like();
        let local = rank_config(&c, 2).unwrap();
        assert_eq!(local.num_attention_heads, c.num_attention_heads / 2);
        assert_eq!(local.num_key_value_heads, c.num_key_value_heads / 2);
        assert_eq!(local.linear_num_key_heads, c.linear_num_key_heads / 2);
        assert_eq!(local.linear_num_value_heads, c.linear_num_value_heads / 2);
        assert_eq!(local.intermediate_size, c.intermediate_size / 2);
        assert_eq!(local.vocab_size, c.vocab_size);
        assert_eq!(local.hidden_size, c.hidden_size);
        assert_eq!(rank_config(&c, 1).unwrap(), c);
    }

    #[test]
    fn unsupported_split_names_the_field() {
        // The demo model has 2 KV heads (4 ranks would each copy one) but 2 GDN key heads, which
        // are never copied.
        let err = rank_config(&demo_like(), 4).unwrap_err().to_string();
        assert!(
            err.contains("`linear_num_key_heads`") && err.contains("--tp-size 4"),
            "{err}"
        );
        // 2 KV heads neither split 3 ways nor share out evenly over 3 ranks.
        let mut c = demo_like();
        c.num_attention_heads = 6;
        let err = rank_config(&c, 3).unwrap_err().to_string();
        assert!(
            err.contains("`num_key_value_heads`") && err.contains("--tp-size 3"),
            "{err}"
        );
        let mut c = demo_like();
        c.vocab_size = 3585;
        let err = rank_config(&c, 2).unwrap_err().to_string();
        assert!(err.contains("`vocab_size`"), "{err}");
    }

    #[test]
    fn fewer_kv_heads_than_ranks_are_copied_to_the_ranks_that_read_them() {
        let mut c = demo_like();
        c.num_attention_heads = 8;
        c.linear_num_key_heads = 4;
        c.linear_num_value_heads = 12;
        assert_eq!(c.num_key_value_heads, 2);
        assert_eq!(rank_config(&c, 4).unwrap().num_key_value_heads, 1);
        // 8 query heads, 2 per rank; KV head 0 serves query heads 0-3 (ranks 0, 1), head 1 4-7.
        let heads: Vec<_> = (0..4)
            .map(|rank| Shard { rank, size: 4 }.kv_range(2))
            .collect();
        assert_eq!(heads, [(0, 1), (0, 1), (1, 2), (1, 2)]);
        assert_eq!(Shard { rank: 1, size: 2 }.kv_range(4), (2, 4));
    }

    #[test]
    fn shard_ranges_tile_the_whole() {
        let ranges: Vec<_> = (0..4)
            .map(|rank| Shard { rank, size: 4 }.range(16))
            .collect();
        assert_eq!(ranges, [(0, 4), (4, 8), (8, 12), (12, 16)]);
        assert_eq!(Shard::WHOLE.range(7), (0, 7));
    }
}
