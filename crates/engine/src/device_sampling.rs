//! Sampling on the backend's device when it has a sampler (the cuda backend): a step's logits stay
//! on the GPU and only token ids come back. Used only when no request in the step needs the logits
//! themselves (logprobs, penalties, a sampled speculative verify, which compares distributions, or a
//! grammar, whose token mask is applied to host logits); otherwise the logits come to the host and the host sampler runs, exactly as on the CPU backends.

use crate::api::SamplingParams;
use crate::engine::Worker;
use crate::sampler::has_penalties;
use crate::scheduler::Scheduled;
use deltaserve_tensor::{Backend, RowSampling};

/// Whether a row of this request must be sampled from host logits: logprobs and penalties need the
/// whole row, and a sampled (not greedy) verify or draft needs distributions, not one token.
pub(crate) fn needs_host_logits(p: &SamplingParams, speculative: bool) -> bool {
    p.logprobs.is_some() || has_penalties(p) || (speculative && p.temperature != 0.0)
}

fn row_sampling(row: u32, p: &SamplingParams, uniform: f64) -> RowSampling {
    RowSampling {
        row,
        temperature: p.temperature,
        top_k: p.top_k.min(u32::MAX as usize) as u32,
        top_p: p.top_p,
        min_p: p.min_p,
        uniform,
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
        let scheduler = &self.scheduler;
        if work.iter().any(|w| {
            let seq = scheduler.seq(w.index);
            // A constrained request's row is masked by its grammar on the host (no device mask yet).
            (w.samples && seq.constrained) || needs_host_logits(&seq.request.sampling, w.drafts > 0)
        }) {
            return None;
        }
        let mut rows = Vec::new();
        for (w, &first) in work.iter().zip(first_logits) {
            let seq = self.scheduler.seq_mut(w.index);
            if w.drafts > 0 {
                // Greedy verification needs only each row's argmax.
                rows.extend((first..first + w.len).map(|r| RowSampling::greedy(r as u32)));
            } else if w.samples {
                let p = &seq.request.sampling;
                let uniform = if p.temperature > 0.0 {
                    seq.rng.next_f64()
                } else {
                    0.0
                };
                rows.push(row_sampling(first as u32, p, uniform));
            }
        }
        let vocab = self.model.config.vocab_size;
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
        backend.sample_rows(logits, self.model.config.vocab_size, &rows)
    }
}
