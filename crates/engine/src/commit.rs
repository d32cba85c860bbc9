//! What a step's outputs do to the sequences it ran (`Worker::commit`): verify a speculating
//! sequence's drafts (rolling its GDN state back to the last accepted token), or advance a sequence
//! by its chunk and sample its next token; then stream the new tokens and stop the sequence at a
//! stop token, its token budget or the context length.

use crate::api::{EngineEvent, FinishReason, RequestId, TokenLogprob};
use crate::engine::{Extend, LogWindow, StepOutput, WorkRows, Worker};
use crate::metrics::EngineMetrics;
use crate::sampler;
use crate::scheduler::Scheduled;
use crate::sequence::Sequence;
use crate::speculative;
use deltaserve_tensor::Backend;
use std::time::Instant;

/// A token a step produced for its sequence, with its log-probabilities when the request asked.
type Emitted = (u32, Option<TokenLogprob>);

/// What the step did to every sequence it ran, gathered before any sequence leaves the running set
/// (their indices stay valid until then).
#[derive(Default)]
struct StepResults {
    finished: Vec<(RequestId, FinishReason)>,
    /// Sequences whose constraint failed, with its message.
    failed: Vec<(RequestId, String)>,
    extends: Vec<Extend>,
    /// Tokens streamed in this step.
    decoded: usize,
    /// Sequences whose prefill reached one of their snapshot points.
    snapshot_at: Vec<usize>,
}

impl<B: Backend> Worker<B> {
    /// Advances every scheduled sequence: samples where a step reached the end of its tokens,
    /// verifies drafts, streams tokens and finishes sequences that hit a stop condition. Returns the
    /// MTP extend work of speculating sequences that go on.
    pub(crate) fn commit(&mut self, work: &[Scheduled], out: &StepOutput) -> Vec<Extend> {
        let mut results = StepResults::default();
        for (w, rows) in work.iter().zip(&out.rows) {
            let seq = self.scheduler.seq(w.index);
            let (id, old_computed) = (seq.id, seq.computed);
            if seq.computed < seq.prompt_len {
                EngineMetrics::add(
                    &self.metrics.prompt_tokens_computed,
                    w.len.min(seq.prompt_len - seq.computed) as u64,
                );
            }
            let emitted = if w.drafts > 0 {
                self.verify_drafts(w, rows, out)
            } else {
                self.advance(w, &mut results.snapshot_at);
                match w.samples {
                    true => self
                        .sample_next(w.index, rows, out)
                        .map(|token| vec![token]),
                    false => Ok(Vec::new()),
                }
            };
            let emitted = match emitted {
                Ok(emitted) => emitted,
                Err(message) => {
                    results.failed.push((id, message));
                    continue;
                }
            };
            let seq = self.scheduler.seq_mut(w.index);
            let (streamed, stop) = stream_until_stop(seq, emitted, self.context_length);
            results.decoded += streamed;
            match stop {
                Some(reason) => results.finished.push((id, reason)),
                None if seq.spec.is_some() => {
                    let hidden_size = self.model.config.hidden_size;
                    results
                        .extends
                        .push(mtp_extend(seq, old_computed, rows, out, hidden_size));
                }
                None => {}
            }
        }
        self.conclude(results)
    }

    /// Verifies a speculating sequence's drafts against this step's target rows, rolls its GDN
    /// state back to just after the last accepted token and returns the tokens it emits (the
    /// accepted drafts and one token of the target's own).
    fn verify_drafts(
        &mut self,
        w: &Scheduled,
        rows: &WorkRows,
        out: &StepOutput,
    ) -> Result<Vec<Emitted>, String> {
        let vocab = self.model.config.vocab_size;
        let context = self.context_length;
        let seq = self.scheduler.seq_mut(w.index);
        // What the request may still generate: verification emits no more.
        let budget = (seq.request.max_new_tokens.saturating_sub(seq.generated()))
            .min(context.saturating_sub(seq.tokens.len()));
        let spec = seq
            .spec
            .as_mut()
            .expect("verify work belongs to a speculating sequence");
        let target: Vec<&[f32]> = match out.sampled {
            Some(_) => Vec::new(),
            None => (0..w.len)
                .map(|i| &out.logits[(rows.first_logit + i) * vocab..][..vocab])
                .collect(),
        };
        let drafts = std::mem::take(&mut spec.drafts);
        let dists = std::mem::take(&mut spec.draft_dists);
        let v = match &out.sampled {
            Some(argmaxes) => speculative::verify_greedy(
                &argmaxes[rows.first_logit..][..w.len],
                &drafts,
                &mut seq.history,
            ),
            None => speculative::verify_constrained(
                &target,
                &drafts,
                &dists,
                &seq.request.sampling,
                &mut seq.history,
                &mut seq.rng,
                seq.constraint.as_deref_mut(),
                budget,
            )?,
        };
        let snapshot = spec.snapshot_slots[v.accepted] as usize;
        let own = seq.slot.expect("running sequences hold a slot") as usize;
        self.cache.copy_slot(&self.model.backend, snapshot, own);
        seq.computed += 1 + v.accepted;
        // Drafts past the request's end were never verified: they count as neither.
        let verified = drafts.len().min(v.emitted.len());
        seq.usage.draft_tokens += verified;
        seq.usage.accepted_draft_tokens += v.accepted;
        record_verify(&self.metrics, &mut self.window, verified, v.accepted);
        let k = seq.request.sampling.logprobs;
        Ok(v.emitted
            .iter()
            .enumerate()
            .map(|(i, &t)| (t, k.map(|k| sampler::logprobs(target[i], t, k))))
            .collect())
    }

    /// Marks the step's tokens of a non-speculative work item computed, noting a prefill that
    /// reached one of its snapshot points.
    fn advance(&mut self, w: &Scheduled, snapshot_at: &mut Vec<usize>) {
        let seq = self.scheduler.seq_mut(w.index);
        seq.computed += w.len;
        if seq.snapshot_points.contains(&seq.computed) {
            snapshot_at.push(w.index);
        }
    }

    /// The next token of a sequence whose step reached the end of its tokens: picked on the device,
    /// or sampled here from its logits under its grammar's mask; the grammar is told either way.
    fn sample_next(
        &mut self,
        index: usize,
        rows: &WorkRows,
        out: &StepOutput,
    ) -> Result<Emitted, String> {
        let vocab = self.model.config.vocab_size;
        let seq = self.scheduler.seq_mut(index);
        let (token, logprob) = match &out.sampled {
            Some(tokens) => {
                // Drawn under the mask computed ahead (device_sampling.rs).
                seq.mask_ahead = None;
                (tokens[rows.first_logit], None)
            }
            None => {
                let row_logits = &out.logits[rows.first_logit * vocab..][..vocab];
                let token = sample_on_host(seq, row_logits)?;
                let logprob = seq
                    .request
                    .sampling
                    .logprobs
                    .map(|k| sampler::logprobs(row_logits, token, k));
                (token, logprob)
            }
        };
        if let Some(constraint) = seq.constraint.as_mut() {
            constraint.commit(token)?;
        }
        seq.history.record(token);
        Ok((token, logprob))
    }

    /// After every sequence of the step was advanced: takes the prefix snapshots, ends finished and
    /// failed requests and logs; returns the MTP extend work.
    fn conclude(&mut self, results: StepResults) -> Vec<Extend> {
        EngineMetrics::add(&self.metrics.generated_tokens, results.decoded as u64);
        // Snapshots of prefill states only: a step that ended at a snapshot point did not sample.
        for index in results.snapshot_at {
            if let Some((own, snapshot)) = self.scheduler.insert_prefix(index) {
                self.cache
                    .copy_slot(&self.model.backend, own as usize, snapshot as usize);
            }
        }
        self.finish_all(results.finished);
        for (id, message) in results.failed {
            self.fail_by_id(id, &message);
        }
        self.log_decode(results.decoded);
        results.extends
    }
}

/// Samples one token from a row of logits with the request's settings, under its grammar's mask
/// (computed during the forward, or now).
fn sample_on_host(seq: &mut Sequence, row_logits: &[f32]) -> Result<u32, String> {
    let mask = match seq.mask_ahead.take() {
        Some(mask) => mask,
        None => seq.constraint.as_mut().map_or(Ok(None), |c| c.allowed()),
    };
    mask.and_then(|mask| sampler::apply_mask(row_logits, mask))
        .map(|row| sampler::sample(&row, &seq.request.sampling, &seq.history, &mut seq.rng))
}

/// Appends the tokens and streams them, up to the first that ends the request; returns how many
/// it streamed and why the request ended, if it did.
fn stream_until_stop(
    seq: &mut Sequence,
    emitted: Vec<Emitted>,
    context: usize,
) -> (usize, Option<FinishReason>) {
    let mut streamed = 0;
    for (token, logprob) in emitted {
        seq.tokens.push(token);
        seq.usage.completion_tokens += 1;
        seq.first_token_at.get_or_insert_with(Instant::now);
        streamed += 1;
        if !seq.send(EngineEvent::Token { id: token, logprob }) {
            return (streamed, Some(FinishReason::Abort));
        }
        if let Some(reason) = stop_reason(seq, token, context) {
            return (streamed, Some(reason));
        }
    }
    (streamed, None)
}

/// Whether `token`, just appended, ends the request: a stop token, or its token budget or the
/// context length reached.
fn stop_reason(seq: &Sequence, token: u32, context: usize) -> Option<FinishReason> {
    if seq.request.stop_token_ids.contains(&token) {
        Some(FinishReason::Stop)
    } else if seq.generated() >= seq.request.max_new_tokens || seq.tokens.len() >= context {
        Some(FinishReason::Length)
    } else {
        None
    }
}

/// The MTP head's work for a speculating sequence that goes on: pairs (hidden of t, token t+1) for
/// every position t the step computed.
fn mtp_extend(
    seq: &Sequence,
    old_computed: usize,
    rows: &WorkRows,
    out: &StepOutput,
    hidden_size: usize,
) -> Extend {
    let positions = seq.computed - old_computed;
    let hidden = out.hidden
        [rows.first_hidden * hidden_size..(rows.first_hidden + positions) * hidden_size]
        .to_vec();
    Extend {
        id: seq.id,
        pos: old_computed,
        hidden,
        next_tokens: seq.tokens[old_computed + 1..=seq.computed].to_vec(),
    }
}

/// Counts a verify step: drafts verified and accepted, in the metrics and the log window.
fn record_verify(m: &EngineMetrics, window: &mut LogWindow, drafted: usize, accepted: usize) {
    EngineMetrics::add(&m.spec_verify_steps, 1);
    EngineMetrics::add(&m.spec_draft_tokens, drafted as u64);
    EngineMetrics::add(&m.spec_accepted_tokens, accepted as u64);
    for counter in m.spec_accepted_at.iter().take(accepted) {
        EngineMetrics::add(counter, 1);
    }
    window.verify_steps += 1;
    window.drafted += drafted;
    window.accepted += accepted;
}
