//! Sampling on the backend's device when it has a sampler (the cuda backend): a step's logits stay
//! on the GPU and only token ids come back. A grammar's token mask goes to the device with its row
//! (computed during the forward pass, `Worker::forward_with_masks`). Used only when no request in
//! the step needs the logits themselves (logprobs, penalties, a sampled speculative verify, which
//! compares distributions, or a constrained verify, whose masks follow the accepted drafts one by
//! one) and every mask allows some token (a failed or empty mask ends its request on the host
//! path, with its message); otherwise the logits come to the host and the host sampler runs,
//! exactly as on the CPU backends.

use crate::api::SamplingParams;
use crate::engine::Worker;
use crate::sampler::has_penalties;
use crate::scheduler::Scheduled;
use crate::sequence::Sequence;
use deltaserve_tensor::{Backend, RowSampling};

/// Whether a row of this request must be sampled from host logits: logprobs and penalties need the
/// whole row, and a sampled (not greedy) verify or draft needs distributions, not one token.
pub(crate) fn needs_host_logits(p: &SamplingParams, speculative: bool) -> bool {
    p.logprobs.is_some() || has_penalties(p) || (speculative && p.temperature != 0.0)
}

/// The device sampler's settings for one row of request `p`.
pub fn row_sampling<'a>(
    row: u32,
    p: &SamplingParams,
    uniform: f64,
    allowed: Option<&'a [u32]>,
) -> RowSampling<'a> {
    RowSampling {
        row,
        temperature: p.temperature,
        top_k: p.top_k.min(u32::MAX as usize) as u32,
        top_p: p.top_p,
        min_p: p.min_p,
        uniform,
        allowed,
    }
}

/// Whether a constrained sequence's next token can be sampled on the device: its mask was
/// computed ahead and allows some token of a `vocab`-sized row (`Ok(None)`: any token). A failed
/// or empty mask, which the host sampler reports, keeps the row on the host path.
fn device_can_mask(seq: &Sequence, vocab: usize) -> bool {
    match &seq.mask_ahead {
        Some(Ok(None)) => true,
        Some(Ok(Some(mask))) => !mask.allows_none(vocab),
        _ => false,
    }
}

impl<B: Backend> Worker<B> {
    /// One token per logit row of the step (in logit-row order) picked on the device, or `None`
    /// when the backend cannot or some request needs its logits on the host. `first_logits[i]` is
    /// the first logit row of `work[i]`.
    pub(crate) fn sample_step_on_device(
        &mut self,
        work: &[Scheduled],
        first_logits: &[usize],
        logits: &B::Buf,
    ) -> Option<Vec<u32>> {
        if !self.model.backend.samples_on_device() {
            return None;
        }
        let vocab = self.model.config.vocab_size;
        let scheduler = &self.scheduler;
        if work.iter().any(|w| {
            let seq = scheduler.seq(w.index);
            let unmaskable =
                w.samples && seq.constrained && (w.drafts > 0 || !device_can_mask(seq, vocab));
            unmaskable || needs_host_logits(&seq.request.sampling, w.drafts > 0)
        }) {
            return None;
        }
        // Each sampled row's uniform number, drawn before any mask is borrowed.
        let uniforms: Vec<f64> = work
            .iter()
            .map(|w| {
                let seq = self.scheduler.seq_mut(w.index);
                match w.drafts == 0 && w.samples && seq.request.sampling.temperature > 0.0 {
                    true => seq.rng.next_f64(),
                    false => 0.0,
                }
            })
            .collect();
        let mut rows = Vec::new();
        for ((w, &first), &uniform) in work.iter().zip(first_logits).zip(&uniforms) {
            let seq = self.scheduler.seq(w.index);
            if w.drafts > 0 {
                // Greedy verification needs only each row's argmax.
                rows.extend((first..first + w.len).map(|r| RowSampling::greedy(r as u32)));
            } else if w.samples {
                // device_can_mask passed above: the mask is usable, no need to scan it again.
                let allowed = match &seq.mask_ahead {
                    Some(Ok(Some(mask))) if seq.constrained => Some(mask.words.as_slice()),
                    _ => None,
                };
                rows.push(row_sampling(
                    first as u32,
                    &seq.request.sampling,
                    uniform,
                    allowed,
                ));
            }
        }
        self.model.backend.sample_rows(logits, vocab, &rows)
    }

    /// The argmax of each drafter's row of MTP logits, picked on the device, when every drafter
    /// drafts greedily (a one-hot draft distribution needs no logits on the host).
    pub(crate) fn greedy_drafts_on_device(
        &self,
        drafters: &[usize],
        logits: &B::Buf,
    ) -> Option<Vec<u32>> {
        let backend = &self.model.backend;
        // A constrained drafter checks its draft against its grammar, which may need the whole row.
        let greedy = drafters.iter().all(|&index| {
            let seq = self.scheduler.seq(index);
            let p = &seq.request.sampling;
            p.temperature == 0.0 && !needs_host_logits(p, true) && !seq.constrained
        });
        if !backend.samples_on_device() || !greedy {
            return None;
        }
        let rows: Vec<RowSampling> = (0..drafters.len() as u32)
            .map(RowSampling::greedy)
            .collect();
        let config = &self.model.config;
        let columns = backend.sample_rows(logits, config.draft_vocab_size(), &rows)?;
        Some(columns.into_iter().map(|c| config.draft_token(c)).collect())
    }
}
