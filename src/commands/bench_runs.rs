//! The timed runs behind `deltaserve bench`: one sequence's prefill and plain decode steps, and
//! speculative steps as the engine runs them for one sequence (verify k+1 tokens, then MTP drafting),
//! each optionally with the backend's per-op profile per phase. Reporting stays in `bench.rs`.

use super::bench_picks::Picker;
use deltaserve_engine::SamplingParams;
use deltaserve_model::{
    CacheGeometry, ForwardInput, HybridCache, Model, MtpError, MtpInput, StepGraphCounts,
};
use deltaserve_tensor::{Backend, BatchLayout, Device, OpTiming, SeqLayout};
use std::time::Instant;

/// Tokens per paged-KV block of the bench's private caches.
const BLOCK_SIZE: usize = 16;

/// One phase of a run (prefill, decode steps, verify forwards, MTP drafting): wall time of each
/// step and, in a profiled run, the backend's op times summed over all its steps.
#[derive(Default)]
pub struct Phase {
    pub step_s: Vec<f64>,
    pub ops: Vec<OpTiming>,
}

impl Phase {
    pub fn total_s(&self) -> f64 {
        self.step_s.iter().sum()
    }

    /// Median step time: robust to the first steps warming caches.
    pub fn median_s(&self) -> f64 {
        median(&self.step_s)
    }
}

pub fn median(xs: &[f64]) -> f64 {
    let mut sorted = xs.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A prefill followed by single-token greedy decode steps.
pub struct PlainRun {
    pub prefill: Phase,
    pub decode: Phase,
}

/// A prefill (with the hidden rows the MTP head needs) and speculative steps with forced acceptance.
pub struct SpeculativeRun {
    /// The trunk's prefill forward, asking for every prompt row's hidden state as the engine does.
    pub prefill: Phase,
    /// The MTP extend over the prompt's pairs and the first k drafts (before the first verify).
    pub mtp_prefill: Phase,
    /// Per step: the verify forward of k+1 tokens, its hidden rows to the host, the target's
    /// greedy token per row (`greedy_rows`, on the device where the backend samples), and the
    /// snapshot commit.
    pub verify: Phase,
    /// Per step: the MTP extend over the k+1 accepted pairs (which yields draft 1) and k-1 more
    /// single-token draft forwards, each with its hidden row to the host and a greedy pick.
    pub draft: Phase,
}

/// Clears and collects the device's op profile when profiling is on; does nothing otherwise.
struct Profiler<'a> {
    device: Option<&'a dyn Device>,
}

impl<'a> Profiler<'a> {
    fn start<B: Backend>(backend: &'a B, on: bool) -> Self {
        let device = backend.device().filter(|_| on);
        if let Some(device) = device {
            // Drop whatever was recorded before this run (a previous phase, a warm-up).
            device.take_op_profile();
        }
        Self { device }
    }

    fn take_into(&self, phase: &mut Phase) {
        if let Some(device) = self.device {
            merge_ops(&mut phase.ops, device.take_op_profile());
        }
    }
}

/// Adds `more` into `into` by op name, keeping the most expensive first.
fn merge_ops(into: &mut Vec<OpTiming>, more: Vec<OpTiming>) {
    for op in more {
        match into.iter_mut().find(|o| o.name == op.name) {
            Some(o) => {
                o.calls += op.calls;
                o.seconds += op.seconds;
            }
            None => into.push(op),
        }
    }
    into.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
}

/// Deterministic prompt token ids spread over the vocabulary.
fn prompt_tokens(vocab: usize, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) % vocab as u32)
        .collect()
}

/// The greedy token of each of `rows` logits rows, picked as `serve` picks it (`Picker`).
fn greedy_rows<B: Backend>(m: &Model<B>, logits: &B::Buf, rows: usize) -> Vec<u32> {
    Picker::greedy().pick(m, logits, rows)
}

/// The greedy draft of each of `rows` MTP logits rows, as token ids (the draft head may keep only
/// `--speculative-token-map`'s rows).
fn greedy_drafts<B: Backend>(m: &Model<B>, logits: &B::Buf, rows: usize) -> Vec<u32> {
    let columns = Picker::greedy().pick_columns(m, logits, rows, m.config.draft_vocab_size());
    columns
        .into_iter()
        .map(|c| m.config.draft_token(c))
        .collect()
}

/// Prefill of `prefill_len` tokens then `decode_len` single-token steps, each picking its token
/// with `sampling` as `serve` does (`Picker`).
pub fn plain_run<B: Backend>(
    m: &Model<B>,
    prefill_len: usize,
    decode_len: usize,
    sampling: &SamplingParams,
    profile: bool,
) -> PlainRun {
    let picker = Picker::new(sampling.clone());
    let prompt = prompt_tokens(m.config.vocab_size, prefill_len);
    let mut cache = m.single_sequence_cache(prefill_len + decode_len + 1);
    let blocks: Vec<u32> = (0..cache.geometry.num_blocks as u32).collect();
    let bs = cache.geometry.block_size;
    let profiler = Profiler::start(&m.backend, profile);
    let mut prefill = Phase::default();
    let start = Instant::now();
    let batch = BatchLayout::packed(bs, [(prompt.len(), 0, blocks.clone(), 0)]);
    let out = m.forward(
        &ForwardInput {
            tokens: &prompt,
            batch: &batch,
            logit_rows: &[prompt.len() as u32 - 1],
            hidden_rows: &[],
        },
        &mut cache,
    );
    let mut next = picker.pick(m, &out.logits, 1)[0];
    prefill.step_s.push(start.elapsed().as_secs_f64());
    profiler.take_into(&mut prefill);
    let bar = indicatif::ProgressBar::new(decode_len as u64);
    let mut decode = Phase::default();
    for step in 0..decode_len {
        let t0 = Instant::now();
        let batch = BatchLayout::packed(bs, [(1, prefill_len + step, blocks.clone(), 0)]);
        let out = m.forward(
            &ForwardInput {
                tokens: &[next],
                batch: &batch,
                logit_rows: &[0],
                hidden_rows: &[],
            },
            &mut cache,
        );
        next = picker.pick(m, &out.logits, 1)[0];
        decode.step_s.push(t0.elapsed().as_secs_f64());
        bar.inc(1);
    }
    bar.finish_and_clear();
    profiler.take_into(&mut decode);
    PlainRun { prefill, decode }
}

/// Decode steps of `batch` sequences at once, as a serving engine runs them: each sequence is
/// prefilled with `prefill_len` tokens (one forward each, untimed), then every step feeds all of
/// them one token and picks each next token with `sampling` (on the device when the backend
/// samples there, so the logits stay put as in `serve`).
pub fn batched_decode_run<B: Backend>(
    m: &Model<B>,
    batch: usize,
    prefill_len: usize,
    decode_len: usize,
    sampling: &SamplingParams,
    profile: bool,
) -> Phase {
    let blocks_per_seq = (prefill_len + decode_len + 1).div_ceil(BLOCK_SIZE);
    let geometry = CacheGeometry {
        num_blocks: (batch * blocks_per_seq).max(1),
        block_size: BLOCK_SIZE,
        state_slots: batch,
        mtp: false,
    };
    let mut cache = HybridCache::new(&m.backend, &m.config, geometry);
    let seq_blocks = |i: usize| -> Vec<u32> {
        ((i * blocks_per_seq) as u32..((i + 1) * blocks_per_seq) as u32).collect()
    };
    let vocab = m.config.vocab_size;
    let picker = Picker::new(sampling.clone());
    let pick = |logits: &B::Buf, rows: usize| picker.pick(m, logits, rows);
    let mut next = Vec::with_capacity(batch);
    for i in 0..batch {
        cache.reset_slot(&m.backend, i);
        // Each sequence its own prompt, so the batch does not compute one row B times.
        let prompt: Vec<u32> = prompt_tokens(vocab, prefill_len + i)[i..].to_vec();
        let layout = BatchLayout::packed(BLOCK_SIZE, [(prefill_len, 0, seq_blocks(i), i)]);
        let out = m.forward(
            &ForwardInput {
                tokens: &prompt,
                batch: &layout,
                logit_rows: &[prefill_len as u32 - 1],
                hidden_rows: &[],
            },
            &mut cache,
        );
        next.push(pick(&out.logits, 1)[0]);
    }
    let rows: Vec<u32> = (0..batch as u32).collect();
    let mut phase = Phase::default();
    let profiler = Profiler::start(&m.backend, profile);
    for step in 0..decode_len {
        let t0 = Instant::now();
        let layout = BatchLayout::packed(
            BLOCK_SIZE,
            (0..batch).map(|i| (1, prefill_len + step, seq_blocks(i), i)),
        );
        let out = m.forward(
            &ForwardInput {
                tokens: &next,
                batch: &layout,
                logit_rows: &rows,
                hidden_rows: &[],
            },
            &mut cache,
        );
        next = pick(&out.logits, batch);
        phase.step_s.push(t0.elapsed().as_secs_f64());
    }
    profiler.take_into(&mut phase);
    phase
}

/// The single sequence of a speculative run: its cache, block table and snapshot slots.
struct SpecSequence<B: Backend> {
    cache: HybridCache<B>,
    blocks: Vec<u32>,
    /// State slot 0 is the sequence's own; slots 1..=k+1 hold the verify snapshots.
    snapshot_slots: Vec<usize>,
    k: usize,
}

impl<B: Backend> SpecSequence<B> {
    fn layout(&self, len: usize, pos: usize, snapshots: bool) -> BatchLayout {
        BatchLayout {
            seqs: vec![SeqLayout {
                start: 0,
                len,
                pos,
                blocks: self.blocks.clone(),
                slot: 0,
                snapshot_slots: if snapshots {
                    self.snapshot_slots.clone()
                } else {
                    Vec::new()
                },
            }],
            block_size: BLOCK_SIZE,
        }
    }

    /// The engine's MTP work after a step that computed positions `pos..pos + pairs`: one extend
    /// forward over the pairs (hidden of t, token t+1) whose last row gives draft 1, then k-1
    /// single-token forwards, each feeding the previous draft and the MTP's own hidden state.
    fn draft(
        &mut self,
        m: &Model<B>,
        hidden: &[f32],
        next_tokens: &[u32],
        pos: usize,
    ) -> Result<Vec<u32>, MtpError> {
        let pairs = next_tokens.len();
        let last = [pairs as u32 - 1];
        let batch = self.layout(pairs, pos, false);
        let out = m.mtp_forward(
            &MtpInput {
                hidden,
                next_tokens,
                batch: &batch,
                logit_rows: &last,
                hidden_rows: &last,
            },
            &mut self.cache,
        )?;
        let mut drafts = vec![greedy_drafts(m, &out.logits, 1)[0]];
        let mut step_hidden = m.backend.to_host(&out.hidden);
        let computed = pos + pairs;
        for step in 2..=self.k {
            // The previous draft sits at position computed + step - 2; its pair is keyed by the
            // position of the hidden state that precedes it, as in the engine.
            let batch = self.layout(1, computed - 1 + (step - 1), false);
            let token = drafts[drafts.len() - 1];
            let out = m.mtp_forward(
                &MtpInput {
                    hidden: &step_hidden,
                    next_tokens: &[token],
                    batch: &batch,
                    logit_rows: &[0],
                    hidden_rows: &[0],
                },
                &mut self.cache,
            )?;
            drafts.push(greedy_drafts(m, &out.logits, 1)[0]);
            step_hidden = m.backend.to_host(&out.hidden);
        }
        Ok(drafts)
    }
}

/// Prefill then `steps` speculative steps of `k` drafts, as the engine runs them for one greedy
/// sequence, except that every draft is accepted whatever the target predicts (forced acceptance:
/// the dummy model's drafts are random), so each step commits k+1 tokens.
pub fn speculative_run<B: Backend>(
    m: &Model<B>,
    prefill_len: usize,
    steps: usize,
    k: usize,
    profile: bool,
) -> Result<SpeculativeRun, MtpError> {
    let vocab = m.config.vocab_size;
    let prompt = prompt_tokens(vocab, prefill_len);
    // The prompt, k+1 tokens per step, and the next step's verify span (k+1 positions) that the
    // last drafting already writes into the MTP KV cache.
    let max_tokens = prefill_len + (k + 1) * (steps + 1);
    let geometry = CacheGeometry {
        num_blocks: max_tokens.div_ceil(BLOCK_SIZE).max(1),
        block_size: BLOCK_SIZE,
        state_slots: 1 + (k + 1),
        mtp: true,
    };
    let mut seq = SpecSequence {
        cache: HybridCache::new(&m.backend, &m.config, geometry),
        blocks: (0..geometry.num_blocks as u32).collect(),
        snapshot_slots: (1..=k + 1).collect(),
        k,
    };
    seq.cache.reset_slot(&m.backend, 0);
    let profiler = Profiler::start(&m.backend, profile);

    let mut prefill = Phase::default();
    let start = Instant::now();
    let prompt_rows: Vec<u32> = (0..prefill_len as u32).collect();
    let batch = seq.layout(prefill_len, 0, false);
    let out = m.forward(
        &ForwardInput {
            tokens: &prompt,
            batch: &batch,
            logit_rows: &[prefill_len as u32 - 1],
            hidden_rows: &prompt_rows,
        },
        &mut seq.cache,
    );
    let mut last = greedy_rows(m, &out.logits, 1)[0];
    let hidden = m.backend.to_host(&out.hidden);
    prefill.step_s.push(start.elapsed().as_secs_f64());
    profiler.take_into(&mut prefill);

    let mut mtp_prefill = Phase::default();
    let start = Instant::now();
    let next_tokens: Vec<u32> = prompt[1..].iter().copied().chain([last]).collect();
    let mut drafts = seq.draft(m, &hidden, &next_tokens, 0)?;
    mtp_prefill.step_s.push(start.elapsed().as_secs_f64());
    profiler.take_into(&mut mtp_prefill);

    let (mut verify, mut draft) = (Phase::default(), Phase::default());
    let rows: Vec<u32> = (0..=k as u32).collect();
    let mut computed = prefill_len;
    let bar = indicatif::ProgressBar::new(steps as u64);
    for _ in 0..steps {
        let t0 = Instant::now();
        let tokens: Vec<u32> = std::iter::once(last)
            .chain(drafts.iter().copied())
            .collect();
        let batch = seq.layout(k + 1, computed, true);
        let out = m.forward(
            &ForwardInput {
                tokens: &tokens,
                batch: &batch,
                logit_rows: &rows,
                hidden_rows: &rows,
            },
            &mut seq.cache,
        );
        let hidden = m.backend.to_host(&out.hidden);
        // Greedy verification computes the target's choice at every row; forced acceptance then
        // keeps all k drafts anyway and takes the last row's choice as the bonus token.
        let targets = greedy_rows(m, &out.logits, k + 1);
        let bonus = targets[k];
        seq.cache.copy_slot(&m.backend, seq.snapshot_slots[k], 0);
        verify.step_s.push(t0.elapsed().as_secs_f64());
        profiler.take_into(&mut verify);

        let t1 = Instant::now();
        let next_tokens: Vec<u32> = drafts.iter().copied().chain([bonus]).collect();
        drafts = seq.draft(m, &hidden, &next_tokens, computed)?;
        draft.step_s.push(t1.elapsed().as_secs_f64());
        profiler.take_into(&mut draft);
        computed += k + 1;
        last = bonus;
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(SpeculativeRun {
        prefill,
        mtp_prefill,
        verify,
        draft,
    })
}

/// What `bench` runs, from its flags.
pub struct RunPlan {
    pub prefill_len: usize,
    pub decode_len: usize,
    pub speculative_num_steps: usize,
    pub warmup: usize,
    pub profile: bool,
    pub measure_bandwidth: bool,
    /// Batch sizes of the batched decode runs (empty: none).
    pub batches: Vec<usize>,
    /// How the plain and batched decode steps pick their tokens.
    pub sampling: SamplingParams,
}

/// The runs of the profiled pass (`--profile` on a backend that can time its ops).
pub struct Profiled {
    pub plain: PlainRun,
    pub speculative: Option<SpeculativeRun>,
    /// `(batch size, its decode steps)` for each batched run above batch 1.
    pub batched: Vec<(usize, Phase)>,
}

/// Everything measured on the model, backend-independent from here on.
pub struct Measured {
    pub backend: &'static str,
    pub plain: PlainRun,
    pub speculative: Option<SpeculativeRun>,
    /// `None`: not asked; `Some(None)`: asked, the backend cannot profile.
    pub profiled: Option<Option<Profiled>>,
    pub device_bandwidth: Option<f64>,
    /// `(batch size, its decode steps)` for each batched run, batch 1 first.
    pub batched: Vec<(usize, Phase)>,
    /// Recorded-step (CUDA graph) counts over the timed runs; `None` when recording is off.
    pub step_graphs: Option<StepGraphCounts>,
}

/// Warm-up, then the un-profiled runs whose timings are reported, then (with `--profile`) the same
/// runs profiled, then the device's read bandwidth: profiling never slows the reported timings.
pub fn measure<B: Backend>(m: &Model<B>, plan: &RunPlan) -> anyhow::Result<Measured> {
    let (prefill, steps, k) = (
        plan.prefill_len,
        plan.decode_len,
        plan.speculative_num_steps,
    );
    if k > 0 && !m.has_mtp() {
        anyhow::bail!("--speculative-num-steps {k}: the model's MTP head was not loaded");
    }
    let spec_err = |e| anyhow::anyhow!("--speculative-num-steps {k}: {e}");
    let sampling = &plan.sampling;
    for _ in 0..plan.warmup {
        plain_run(m, prefill, steps.min(2), sampling, false);
    }
    let plain = plain_run(m, prefill, steps, sampling, false);
    let speculative = (k > 0)
        .then(|| speculative_run(m, prefill, steps, k, false))
        .transpose()
        .map_err(spec_err)?;
    let profiled = if !plan.profile {
        None
    } else if let Some(device) = m.backend.device() {
        device.set_op_profiling(true);
        let plain = plain_run(m, prefill, steps, sampling, true);
        let speculative = (k > 0)
            .then(|| speculative_run(m, prefill, steps, k, true))
            .transpose();
        let batched = plan
            .batches
            .iter()
            .filter(|&&b| b > 1)
            .map(|&b| (b, batched_decode_run(m, b, prefill, steps, sampling, true)))
            .collect();
        device.set_op_profiling(false);
        Some(Some(Profiled {
            plain,
            speculative: speculative.map_err(spec_err)?,
            batched,
        }))
    } else {
        Some(None)
    };
    let mut batches: Vec<usize> = plan.batches.clone();
    if !batches.is_empty() {
        // Batch 1 through the same path is the baseline each batch size is compared with.
        batches.push(1);
    }
    batches.sort_unstable();
    batches.dedup();
    let batched = batches
        .into_iter()
        .map(|b| (b, batched_decode_run(m, b, prefill, steps, sampling, false)))
        .collect();
    // Over every run above; profiled runs cannot record (their shapes count as failed).
    let step_graphs = m.step_graph_counts();
    let device_bandwidth = if plan.measure_bandwidth {
        m.backend.device().map(|d| d.measure_read_bandwidth())
    } else {
        None
    };
    Ok(Measured {
        backend: m.backend.name(),
        plain,
        speculative,
        profiled,
        device_bandwidth,
        batched,
        step_graphs,
    })
}
