//! The engine thread: owns the model and its cache, takes requests over a channel, and runs the
//! schedule -> forward -> sample loop, streaming each request's tokens to its own channel. The
//! `LocalEngine` handle is what the server and the CLI hold.

use crate::api::*;
use crate::host_gap::{host_share, HostGapClock};
use crate::metrics::EngineMetrics;
use crate::prefix_cache::{PrefixCacheConfig, SnapshotGrid};
use crate::scheduler::{Scheduled, Scheduler, SchedulerLimits};
use crate::sequence::{Sequence, SpecState};
use crate::speculative::SpecConfig;
use deltaserve_model::{CacheGeometry, ForwardInput, ForwardOutput, HybridCache, Model};
use deltaserve_tensor::{Backend, BatchLayout, SeqLayout};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

/// A constrained sequence's index, its constraint and the mask of its next token (or the
/// constraint's error).
type AheadMask = (
    usize,
    Box<dyn TokenConstraint>,
    Result<Option<TokenMask>, String>,
);

/// Each constrained sequence's mask of its next token, with its index and constraint.
fn next_masks(ahead: Vec<(usize, Box<dyn TokenConstraint>)>) -> Vec<AheadMask> {
    ahead
        .into_iter()
        .map(|(index, mut constraint)| {
            let mask = constraint.allowed();
            (index, constraint, mask)
        })
        .collect()
}

/// Sizes and limits of one engine, decided at start-up (see `plan_pools` in the server).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    pub max_running_requests: usize,
    pub num_kv_blocks: usize,
    pub block_size: usize,
    pub state_slots: usize,
    pub chunked_prefill_size: usize,
    pub context_length: usize,
    pub max_queued_requests: usize,
    /// Print a decode summary line every this many decode steps (0 = never).
    pub decode_log_interval: usize,
    /// Speculative decoding with the model's MTP head; ignored when the model has none.
    pub speculative: Option<SpecConfig>,
}

enum Command {
    Submit(Box<Sequence>),
    Abort(RequestId),
    FlushCache,
}

/// Handle to an engine running on its own thread.
pub struct LocalEngine {
    commands: Mutex<Sender<Command>>,
    next_id: AtomicU64,
    queued: Arc<AtomicUsize>,
    stats: Arc<Mutex<EngineStats>>,
    metrics: Arc<EngineMetrics>,
    config: EngineConfig,
    vocab_size: usize,
    prefix_cache: bool,
    lost: Arc<Mutex<Option<String>>>,
}

impl LocalEngine {
    /// Starts the engine thread for `model`, without a prefix cache. The cache is allocated here,
    /// from `config`.
    pub fn spawn<B: Backend + 'static>(model: Model<B>, config: EngineConfig) -> Arc<Self> {
        Self::spawn_with_cache(model, config, PrefixCacheConfig::disabled())
    }

    /// Starts the engine thread for `model` with the prefix cache `prefix` (docs/prefix-cache.md).
    pub fn spawn_with_cache<B: Backend + 'static>(
        model: Model<B>,
        config: EngineConfig,
        prefix: PrefixCacheConfig,
    ) -> Arc<Self> {
        let speculative = config.speculative.clone().filter(|_| model.has_mtp());
        let geometry = CacheGeometry {
            num_blocks: config.num_kv_blocks,
            block_size: config.block_size,
            state_slots: config.state_slots,
            mtp: speculative.is_some(),
        };
        let cache = HybridCache::new(&model.backend, &model.config, geometry);
        let (tx, rx) = std::sync::mpsc::channel();
        let stats = Arc::new(Mutex::new(EngineStats {
            kv_blocks_total: config.num_kv_blocks,
            state_slots_total: config.state_slots,
            ..Default::default()
        }));
        let metrics = Arc::new(EngineMetrics::default());
        let queued = Arc::new(AtomicUsize::new(0));
        let limits = SchedulerLimits {
            max_running: config.max_running_requests,
            snapshot_slots: speculative.as_ref().map_or(0, |s| s.num_steps + 1),
            block_size: config.block_size,
            chunk_size: config.chunked_prefill_size,
        };
        let vocab_size = model.config.vocab_size;
        let grid = SnapshotGrid::new(
            config.block_size,
            config.chunked_prefill_size,
            model.config.num_attention_heads,
            model.config.num_key_value_heads,
        );
        let prefix_cache = prefix.enabled;
        let lost = Arc::new(Mutex::new(None));
        let window = LogWindow::starting(&metrics, replayed_steps(&model));
        let worker = Worker {
            scheduler: Scheduler::new(limits, config.num_kv_blocks, config.state_slots)
                .with_prefix_cache(prefix, grid),
            model,
            cache,
            commands: rx,
            stats: stats.clone(),
            metrics: metrics.clone(),
            queued: queued.clone(),
            log_interval: config.decode_log_interval,
            window,
            clock: HostGapClock::default(),
            lost: lost.clone(),
            context_length: config.context_length,
            speculative,
        };
        std::thread::Builder::new()
            .name("deltaserve-engine".into())
            .spawn(move || worker.run())
            .expect("spawning the engine thread");
        Arc::new(Self {
            commands: Mutex::new(tx),
            next_id: AtomicU64::new(1),
            queued,
            stats,
            metrics,
            config,
            vocab_size,
            prefix_cache,
            lost,
        })
    }

    pub fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Requests running or waiting, counting a submission at once (the published statistics
    /// follow only after the engine's next step).
    pub fn load(&self) -> usize {
        let running = self.stats.lock().map_or(0, |s| s.running);
        running + self.queued.load(Ordering::Relaxed)
    }

    fn send(&self, command: Command) -> bool {
        self.commands
            .lock()
            .map(|tx| tx.send(command).is_ok())
            .unwrap_or(false)
    }
}

/// A seed for requests that did not bring one.
fn fresh_seed(id: RequestId) -> u64 {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl EngineHandle for LocalEngine {
    fn submit(
        &self,
        request: GenerationRequest,
    ) -> Result<(RequestId, EventReceiver), SubmitError> {
        self.submit_constrained(request, None)
    }

    fn submit_constrained(
        &self,
        request: GenerationRequest,
        constraint: Option<Box<dyn TokenConstraint>>,
    ) -> Result<(RequestId, EventReceiver), SubmitError> {
        if request.prompt_ids.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        if let Some(&id) = request
            .prompt_ids
            .iter()
            .find(|&&id| id as usize >= self.vocab_size)
        {
            return Err(SubmitError::BadToken {
                id,
                vocab: self.vocab_size,
            });
        }
        let total = request.prompt_ids.len() + request.max_new_tokens;
        if total > self.config.context_length {
            return Err(SubmitError::TooLong {
                prompt: request.prompt_ids.len(),
                max_new: request.max_new_tokens,
                total,
                context: self.config.context_length,
            });
        }
        let queued = self.queued.load(Ordering::Relaxed);
        if queued >= self.config.max_queued_requests {
            return Err(SubmitError::QueueFull(queued));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let seed = request.sampling.seed.unwrap_or_else(|| fresh_seed(id));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.queued.fetch_add(1, Ordering::Relaxed);
        let mut seq = Box::new(Sequence::new(id, request, seed, tx));
        seq.constrained = constraint.is_some();
        seq.constraint = constraint;
        if !self.send(Command::Submit(seq)) {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(SubmitError::Stopped);
        }
        Ok((id, rx))
    }

    fn abort(&self, id: RequestId) {
        self.send(Command::Abort(id));
    }

    fn stats(&self) -> EngineStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn context_length(&self) -> usize {
        self.config.context_length
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn prometheus_metrics(&self) -> String {
        self.metrics.render(&self.stats())
    }

    fn flush_cache(&self) -> bool {
        self.prefix_cache && self.send(Command::FlushCache)
    }

    fn generated_tokens(&self) -> u64 {
        self.metrics.generated_tokens.load(Ordering::Relaxed)
    }

    fn device_lost(&self) -> Option<String> {
        self.lost
            .lock()
            .map_or_else(|p| p.into_inner().clone(), |l| l.clone())
    }
}

/// Decode statistics since the last log line.
pub(crate) struct LogWindow {
    since: Instant,
    decode_steps: usize,
    generated: usize,
    pub(crate) verify_steps: usize,
    pub(crate) drafted: usize,
    pub(crate) accepted: usize,
    cache_queried: u64,
    cache_hits: u64,
    /// The host-gap and device-work counters when the window began.
    host_gap_us: u64,
    device_work_us: u64,
    /// The forward and batch-token counters, and the replayed recordings, when it began.
    forward_steps: u64,
    batch_tokens: u64,
    replayed: u64,
}

impl LogWindow {
    fn starting(metrics: &EngineMetrics, replayed: u64) -> Self {
        Self {
            since: Instant::now(),
            decode_steps: 0,
            generated: 0,
            verify_steps: 0,
            drafted: 0,
            accepted: 0,
            cache_queried: 0,
            cache_hits: 0,
            host_gap_us: metrics.host_gap_us.load(Ordering::Relaxed),
            device_work_us: metrics.device_work_us.load(Ordering::Relaxed),
            forward_steps: metrics.forward_steps.load(Ordering::Relaxed),
            batch_tokens: metrics.batch_tokens.load(Ordering::Relaxed),
            replayed,
        }
    }
}

/// Steps replayed from recordings (CUDA graphs) since start; 0 where nothing records.
fn replayed_steps<B: Backend>(model: &Model<B>) -> u64 {
    model.step_graph_counts().map_or(0, |c| c.replayed)
}

pub(crate) struct Worker<B: Backend> {
    pub(crate) model: Model<B>,
    pub(crate) cache: HybridCache<B>,
    pub(crate) scheduler: Scheduler,
    commands: Receiver<Command>,
    stats: Arc<Mutex<EngineStats>>,
    pub(crate) metrics: Arc<EngineMetrics>,
    queued: Arc<AtomicUsize>,
    log_interval: usize,
    pub(crate) window: LogWindow,
    pub(crate) context_length: usize,
    pub(crate) speculative: Option<SpecConfig>,
    pub(crate) clock: HostGapClock,
    /// Set, with its cause, when the device is lost; the engine thread then ends.
    lost: Arc<Mutex<Option<String>>>,
}

impl<B: Backend> Worker<B> {
    fn run(mut self) {
        loop {
            if self.scheduler.is_idle() {
                self.clock.idle();
                match self.commands.recv() {
                    Ok(command) => self.handle(command),
                    Err(_) => return,
                }
            }
            while let Ok(command) = self.commands.try_recv() {
                self.handle(command);
            }
            // A failing step (a device error surfaces as a panic inside an op) ends the requests
            // it ran, not the server, unless it took the device with it.
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| self.step())) {
                if let Err(lost) = self.fail_running(&panic_message(payload.as_ref())) {
                    self.stop_for_good(&lost);
                    return;
                }
            }
            self.publish_stats();
        }
    }

    /// After the device was lost: every queued request (and any still in the command channel)
    /// ends with an error saying so, the loss is published for `/health` and the server, and the
    /// engine thread ends; later submissions are refused as `Stopped`.
    fn stop_for_good(&mut self, lost: &str) {
        eprintln!(
            "engine: the device is lost ({lost}); failing the {} queued request(s) and stopping: restart the server",
            self.scheduler.queued_count()
        );
        match self.lost.lock() {
            Ok(mut slot) => *slot = Some(lost.to_string()),
            Err(poisoned) => *poisoned.into_inner() = Some(lost.to_string()),
        }
        let message = format!("the device is lost ({lost}); this server can no longer generate");
        let mut waiting = self.scheduler.take_waiting();
        while let Ok(command) = self.commands.try_recv() {
            if let Command::Submit(seq) = command {
                waiting.push(*seq);
            }
        }
        self.publish_stats();
        for seq in waiting {
            seq.send(EngineEvent::Error {
                message: message.clone(),
            });
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Submit(mut seq) => {
                if self.speculative.is_some() && !seq.request.disable_speculation {
                    seq.spec = Some(SpecState::default());
                }
                self.scheduler.submit(*seq)
            }
            Command::Abort(id) => self.finish_by_id(id, FinishReason::Abort),
            Command::FlushCache => self.scheduler.flush_cache(),
        }
    }

    fn publish_stats(&self) {
        let now = self.scheduler.stats();
        self.queued.store(now.queued, Ordering::Relaxed);
        if let Ok(mut stats) = self.stats.lock() {
            *stats = now;
        }
        let c = self.scheduler.cache_counters();
        let m = &self.metrics;
        for (gauge, value) in [
            (&m.prefix_cache_queried_tokens, c.queried_tokens),
            (&m.prefix_cache_hit_tokens, c.hit_tokens),
            (&m.prefix_cache_snapshots_taken, c.snapshots_taken),
            (&m.prefix_cache_evicted_pages, c.evicted_pages),
            (&m.prefix_cache_evicted_snapshots, c.evicted_snapshots),
        ] {
            gauge.store(value, Ordering::Relaxed);
        }
    }

    /// After a failed step: every running request ends with an error event and frees its blocks
    /// and slot (their cached state may be half-written); queued requests run in later steps.
    /// `Err(cause)` when the backend finds the device lost for good.
    fn fail_running(&mut self, cause: &str) -> Result<(), String> {
        let recovered = self.model.backend.recover_after_failure();
        let next = match recovered {
            Ok(()) => "serving on",
            Err(_) => "the device is lost",
        };
        eprintln!(
            "engine: a step failed ({cause}); ending its {} running request(s) with an error, {next}",
            self.scheduler.running_count()
        );
        EngineMetrics::add(&self.metrics.failed_steps, 1);
        for seq in self.scheduler.fail_running() {
            seq.send(EngineEvent::Error {
                message: format!("the engine step running this request failed: {cause}"),
            });
        }
        recovered
    }

    /// Ends a running request with an error event (its constraint failed) and frees what it holds.
    pub(crate) fn fail_by_id(&mut self, id: RequestId, message: &str) {
        if let Some(seq) = self.scheduler.finish(id) {
            seq.send(EngineEvent::Error {
                message: format!("constrained decoding failed: {message}"),
            });
        }
    }

    /// Ends a request wherever it is (queued or running) and frees what it holds.
    fn finish_by_id(&mut self, id: RequestId, reason: FinishReason) {
        self.finish_all([(id, reason)]);
    }

    /// Ends these requests and frees what they hold. The statistics are published once, after
    /// every release and before any client hears of its end, so whatever a client asks next
    /// (/metrics, the pool gauges) already counts its request as gone.
    pub(crate) fn finish_all(
        &mut self,
        ended: impl IntoIterator<Item = (RequestId, FinishReason)>,
    ) {
        let ended: Vec<(Sequence, FinishReason)> = ended
            .into_iter()
            .filter_map(|(id, reason)| self.scheduler.finish(id).map(|seq| (seq, reason)))
            .collect();
        if ended.is_empty() {
            return;
        }
        self.publish_stats();
        for (seq, reason) in ended {
            seq.send(EngineEvent::Finished {
                reason,
                usage: seq.usage.clone(),
            });
        }
    }

    fn step(&mut self) {
        let before = self.scheduler.cache_counters();
        let (work, events) = self.scheduler.schedule();
        let after = self.scheduler.cache_counters();
        self.window.cache_queried += after.queried_tokens - before.queried_tokens;
        self.window.cache_hits += after.hit_tokens - before.hit_tokens;
        EngineMetrics::add(&self.metrics.preemptions, events.preempted as u64);
        for seq in events.impossible {
            seq.send(EngineEvent::Error {
                message: format!(
                    "the request needs more KV blocks than the whole pool holds ({} blocks)",
                    self.scheduler.kv_blocks_total()
                ),
            });
        }
        if work.is_empty() {
            return;
        }
        for slot in events.fresh_slots {
            self.cache.reset_slot(&self.model.backend, slot as usize);
        }
        for r in events.restores {
            self.cache
                .copy_slot(&self.model.backend, r.from as usize, r.to as usize);
            self.scheduler.unlock(r.node);
        }
        let out = self.forward_with_masks(&work);
        let extends = self.commit(&work, &out);
        if self.speculative.is_some() {
            self.draft(extends);
        }
    }

    /// `forward`, with the grammar masks of the constrained rows this step samples (without drafts)
    /// computed ahead of sampling; each lands in its sequence's `mask_ahead`, where the device
    /// sampler or the host one finds it. With a device backend they are computed on another
    /// thread while the device runs the forward. A host backend's forward already keeps every
    /// core busy, so there a mask thread would only take turns with it and add a thread start to
    /// every step: the masks are computed first (on the demo model at batch 1, 12 % slower
    /// decoding with the thread, none measurable without; docs/benchmarks.md).
    fn forward_with_masks(&mut self, work: &[Scheduled]) -> StepOutput {
        let mut ahead: Vec<(usize, Box<dyn TokenConstraint>)> = Vec::new();
        for w in work.iter().filter(|w| w.samples && w.drafts == 0) {
            if let Some(constraint) = self.scheduler.seq_mut(w.index).constraint.take() {
                ahead.push((w.index, constraint));
            }
        }
        let forwarded = if ahead.is_empty() {
            self.forward(work)
        } else if self.model.backend.device().is_none() {
            self.keep_masks(next_masks(ahead));
            self.forward(work)
        } else {
            std::thread::scope(|scope| {
                let masks = scope.spawn(move || next_masks(ahead));
                let forwarded = self.forward(work);
                let masks = masks
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                self.keep_masks(masks);
                forwarded
            })
        };
        let output = self.sample_or_fetch(work, forwarded);
        self.clock.device_ends(&self.metrics);
        output
    }

    /// Gives each constrained sequence back its constraint, with the mask of its next token.
    fn keep_masks(&mut self, masks: Vec<AheadMask>) {
        for (index, constraint, mask) in masks {
            let seq = self.scheduler.seq_mut(index);
            seq.constraint = Some(constraint);
            seq.mask_ahead = Some(mask);
        }
    }

    /// Runs one ragged forward over the scheduled work; its outputs stay on the device.
    fn forward(&mut self, work: &[Scheduled]) -> Forwarded<B> {
        let mut tokens = Vec::new();
        let mut seqs = Vec::with_capacity(work.len());
        let mut logit_rows = Vec::new();
        let mut hidden_rows = Vec::new();
        let mut rows = Vec::with_capacity(work.len());
        for w in work {
            let seq = self.scheduler.seq(w.index);
            let start = tokens.len();
            let real = w.len - w.drafts;
            tokens.extend_from_slice(&seq.tokens[seq.computed..seq.computed + real]);
            let mut snapshot_slots = Vec::new();
            if let Some(spec) = &seq.spec {
                tokens.extend_from_slice(&spec.drafts[..w.drafts]);
                hidden_rows.extend(start as u32..(start + w.len) as u32);
                if w.drafts > 0 {
                    snapshot_slots = spec.snapshot_slots[..w.len]
                        .iter()
                        .map(|&s| s as usize)
                        .collect();
                }
            }
            let first_logit = logit_rows.len();
            if w.drafts > 0 {
                logit_rows.extend(start as u32..(start + w.len) as u32);
            } else if w.samples {
                logit_rows.push((start + w.len - 1) as u32);
            }
            rows.push(WorkRows {
                first_logit,
                first_hidden: hidden_rows.len() - if seq.spec.is_some() { w.len } else { 0 },
            });
            seqs.push(SeqLayout {
                start,
                len: w.len,
                pos: seq.computed,
                blocks: seq.blocks.clone(),
                slot: seq.slot.expect("running sequences hold a slot") as usize,
                snapshot_slots,
            });
        }
        let batch = BatchLayout {
            seqs,
            block_size: self.scheduler.block_size(),
        };
        EngineMetrics::add(&self.metrics.forward_steps, 1);
        EngineMetrics::add(&self.metrics.batch_tokens, tokens.len() as u64);
        self.clock.device_begins(&self.metrics);
        let out = self.model.forward(
            &ForwardInput {
                tokens: &tokens,
                batch: &batch,
                logit_rows: &logit_rows,
                hidden_rows: &hidden_rows,
            },
            &mut self.cache,
        );
        Forwarded { out, rows }
    }

    /// The step's tokens picked on the device where it can (only ids come to the host), else its
    /// logits brought to the host for the host sampler; the hidden states to the host either way.
    fn sample_or_fetch(&mut self, work: &[Scheduled], forwarded: Forwarded<B>) -> StepOutput {
        let Forwarded { out, rows } = forwarded;
        let first_logits: Vec<usize> = rows.iter().map(|r| r.first_logit).collect();
        let sampled = self.sample_step_on_device(work, &first_logits, &out.logits);
        StepOutput {
            logits: match sampled {
                Some(_) => Vec::new(),
                None => self.model.backend.to_host(&out.logits),
            },
            sampled,
            hidden: self.model.backend.to_host(&out.hidden),
            rows,
        }
    }

    pub(crate) fn log_decode(&mut self, decoded: usize) {
        if decoded == 0 || self.log_interval == 0 {
            return;
        }
        self.window.decode_steps += 1;
        self.window.generated += decoded;
        if self.window.decode_steps < self.log_interval {
            return;
        }
        let s = self.scheduler.stats();
        let secs = self.window.since.elapsed().as_secs_f64().max(1e-9);
        let w = &self.window;
        let (accept_len, draft_accept) = if w.verify_steps > 0 {
            (
                format!(
                    "{:.2}",
                    (w.accepted + w.verify_steps) as f64 / w.verify_steps as f64
                ),
                format!("{:.2}", w.accepted as f64 / w.drafted.max(1) as f64),
            )
        } else {
            ("-".to_string(), "-".to_string())
        };
        let hit_rate = match self.scheduler.prefix_cache_enabled() {
            true if w.cache_queried > 0 => {
                format!("{:.2}", w.cache_hits as f64 / w.cache_queried as f64)
            }
            _ => "-".to_string(),
        };
        let m = &self.metrics;
        let host = host_share(
            m.host_gap_us.load(Ordering::Relaxed) - w.host_gap_us,
            m.device_work_us.load(Ordering::Relaxed) - w.device_work_us,
        )
        .map_or("-".to_string(), |share| format!("{share:.3}"));
        // Every forward of the window (decode, verify, prefill chunks), so a slow window shows
        // whether its steps were long, large or not replayed.
        let steps = (m.forward_steps.load(Ordering::Relaxed) - w.forward_steps).max(1);
        let tokens = m.batch_tokens.load(Ordering::Relaxed) - w.batch_tokens;
        let replayed = replayed_steps(&self.model) - w.replayed;
        eprintln!(
            "decode: running={} queued={} kv_usage={:.2} state_slots={}/{} cache_hit_rate={hit_rate} accept_len={accept_len} draft_accept={draft_accept} gen_tok/s={:.1} host_share={host} step_ms={:.1} tokens/step={:.1} replayed={:.2}",
            s.running,
            s.queued,
            s.kv_blocks_used as f64 / s.kv_blocks_total.max(1) as f64,
            s.state_slots_used,
            s.state_slots_total,
            w.generated as f64 / secs,
            secs * 1e3 / steps as f64,
            tokens as f64 / steps as f64,
            replayed as f64 / steps as f64
        );
        self.window = LogWindow::starting(&self.metrics, replayed_steps(&self.model));
    }
}

/// Where a work item's rows landed in the step's logits and hidden outputs.
pub(crate) struct WorkRows {
    pub(crate) first_logit: usize,
    pub(crate) first_hidden: usize,
}

/// A step's forward outputs, still on the device, and where each work item's rows are in them.
struct Forwarded<B: Backend> {
    out: ForwardOutput<B>,
    rows: Vec<WorkRows>,
}

pub(crate) struct StepOutput {
    /// `[logit rows, vocab]` on the host; empty when the device sampled.
    pub(crate) logits: Vec<f32>,
    /// One token per logit row, when the device sampled the whole step.
    pub(crate) sampled: Option<Vec<u32>>,
    /// `[hidden rows, hidden]` on the host: post-norm hidden states of speculating sequences.
    pub(crate) hidden: Vec<f32>,
    pub(crate) rows: Vec<WorkRows>,
}

/// MTP work for one speculating sequence after a step: pairs (hidden of position `pos + i`,
/// token at `pos + i + 1`).
pub(crate) struct Extend {
    pub(crate) id: RequestId,
    pub(crate) pos: usize,
    /// `[pairs, hidden]`
    pub(crate) hidden: Vec<f32>,
    pub(crate) next_tokens: Vec<u32>,
}

/// The text of a panic's payload (a `String` or `&str` message, as `panic!` makes them).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".to_string())
}
