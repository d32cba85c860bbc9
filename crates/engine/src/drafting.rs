//! The MTP side of speculative decoding, run after every engine step: "extend" the MTP head's KV
//! cache with the pairs (target hidden of t, token t+1) of the positions just computed, then draft k
//! tokens autoregressively for the next verify step (docs/model.md, "MTP head"). All speculating
//! sequences are batched into one MTP forward per draft step. A request under a grammar drafts only
//! tokens the grammar allows after its earlier drafts.

use crate::api::{SamplingParams, TokenConstraint};
use crate::engine::{Extend, Worker};
use crate::rng::Rng;
use crate::sampler::{apply_mask, draw, processed_distribution, PenaltyHistory};
use crate::speculative::DraftFault;
use deltaserve_model::MtpInput;
use deltaserve_tensor::{Backend, BatchLayout, SeqLayout};

/// The MTP logits of the drafters' rows: on the host, or already reduced to each row's argmax on
/// the device (every drafter greedy).
enum DraftLogits {
    Host(Vec<f32>),
    Argmaxes(Vec<u32>),
}

/// One sequence taking part in this round's MTP work.
struct Participant {
    /// The running sequence's index (`Scheduler::seq`).
    index: usize,
    /// Whether it drafts for the next step (else it only refreshes the MTP cache).
    drafting: bool,
}

impl<B: Backend> Worker<B> {
    pub(crate) fn draft(&mut self, extends: Vec<Extend>) {
        let Some(spec) = self.speculative.clone() else {
            return;
        };
        if extends.is_empty() {
            return;
        }
        let k = spec.num_steps;
        let allow = spec
            .disable_batch_size
            .is_none_or(|n| self.scheduler.running_count() <= n);
        let mut participants = Vec::with_capacity(extends.len());
        for extend in &extends {
            let Some(index) = self.scheduler.index_of(extend.id) else {
                continue;
            };
            let seq = self.scheduler.seq(index);
            // Drafts are verified at positions computed..=computed+k: reserve their blocks now, since
            // the MTP cache writes up to computed+k-2 while drafting.
            let decoding = seq.pending() == 1 && seq.computed >= seq.prompt_len;
            let upto = seq.computed + k + 1;
            let drafting = allow
                && decoding
                && upto <= self.context_length
                && self.scheduler.try_reserve(index, upto);
            participants.push(Participant { index, drafting });
        }

        // Extend: one MTP forward over every participant's new pairs.
        let hidden_size = self.model.config.hidden_size;
        let mut hidden = Vec::new();
        let mut next_tokens = Vec::new();
        let mut seqs = Vec::new();
        let mut last_rows = Vec::new();
        for (p, extend) in participants.iter().zip(&extends) {
            let seq = self.scheduler.seq(p.index);
            let start = next_tokens.len();
            hidden.extend_from_slice(&extend.hidden);
            next_tokens.extend_from_slice(&extend.next_tokens);
            seqs.push(self.mtp_layout(p.index, start, extend.next_tokens.len(), extend.pos));
            if p.drafting {
                last_rows.push((start + extend.next_tokens.len() - 1) as u32);
            }
            debug_assert_eq!(seq.computed, extend.pos + extend.next_tokens.len());
        }
        debug_assert_eq!(hidden.len(), next_tokens.len() * hidden_size);
        let drafters: Vec<usize> = participants
            .iter()
            .filter(|p| p.drafting)
            .map(|p| p.index)
            .collect();
        let mut step_hidden =
            match self.mtp_step(&hidden, &next_tokens, seqs, &last_rows, &drafters) {
                Some((logits, h)) => {
                    self.take_drafts(&drafters, &logits);
                    h
                }
                None => return,
            };

        // Draft steps 2..=k: each drafter feeds its own last draft and MTP hidden state.
        for step in 2..=k {
            if drafters.is_empty() {
                break;
            }
            let mut tokens = Vec::with_capacity(drafters.len());
            let mut seqs = Vec::with_capacity(drafters.len());
            for (row, &index) in drafters.iter().enumerate() {
                let seq = self.scheduler.seq(index);
                let spec_state = seq.spec.as_ref().expect("drafters speculate");
                tokens.push(
                    *spec_state
                        .drafts
                        .last()
                        .expect("a draft from the previous step"),
                );
                seqs.push(self.mtp_layout(index, row, 1, seq.computed - 1 + (step - 1)));
            }
            let rows: Vec<u32> = (0..drafters.len() as u32).collect();
            match self.mtp_step(&step_hidden, &tokens, seqs, &rows, &drafters) {
                Some((logits, h)) => {
                    self.take_drafts(&drafters, &logits);
                    step_hidden = h;
                }
                None => return,
            }
        }
    }

    fn mtp_layout(&self, index: usize, start: usize, len: usize, pos: usize) -> SeqLayout {
        let seq = self.scheduler.seq(index);
        SeqLayout {
            start,
            len,
            pos,
            blocks: seq.blocks.clone(),
            slot: seq.slot.expect("running sequences hold a slot") as usize,
            snapshot_slots: Vec::new(),
        }
    }

    /// One MTP forward; the drafters' logits (or their argmaxes, picked on the device) and the host
    /// hidden states of `rows`.
    fn mtp_step(
        &mut self,
        hidden: &[f32],
        next_tokens: &[u32],
        seqs: Vec<SeqLayout>,
        rows: &[u32],
        drafters: &[usize],
    ) -> Option<(DraftLogits, Vec<f32>)> {
        let batch = BatchLayout {
            seqs,
            block_size: self.scheduler.block_size(),
        };
        let input = MtpInput {
            hidden,
            next_tokens,
            batch: &batch,
            logit_rows: rows,
            hidden_rows: rows,
        };
        self.clock.device_begins(&self.metrics);
        let out = self.model.mtp_forward(&input, &mut self.cache).ok()?;
        let logits = match self.greedy_drafts_on_device(drafters, &out.logits) {
            Some(argmaxes) => DraftLogits::Argmaxes(argmaxes),
            None => DraftLogits::Host(self.model.backend.to_host(&out.logits)),
        };
        let hidden = self.model.backend.to_host(&out.hidden);
        self.clock.device_ends(&self.metrics);
        Some((logits, hidden))
    }

    /// Draws one draft per drafter from its row of MTP logits, with the request's own sampling
    /// settings (penalties see the drafts before it).
    fn take_drafts(&mut self, drafters: &[usize], logits: &DraftLogits) {
        let vocab = self.model.config.vocab_size;
        let draft_vocab = self.model.config.draft_vocab_size();
        let draft_ids = self.model.config.draft_vocab.as_deref();
        let fault = self
            .speculative
            .as_ref()
            .map_or(DraftFault::None, |s| s.fault.clone());
        for (row, &index) in drafters.iter().enumerate() {
            let seq = self.scheduler.seq_mut(index);
            let spec = seq.spec.as_mut().expect("drafters speculate");
            let mut history = seq.history.clone();
            for &d in &spec.drafts {
                history.record(d);
            }
            let (mut token, mut dist) = match logits {
                DraftLogits::Argmaxes(ids) => (ids[row], vec![(ids[row], 1.0)]),
                DraftLogits::Host(logits) => {
                    let columns = &logits[row * draft_vocab..(row + 1) * draft_vocab];
                    let whole_row = draft_row_over_vocabulary(columns, draft_ids, vocab);
                    let row = &whole_row[..];
                    let sampling = &seq.request.sampling;
                    match seq.constraint.as_deref_mut() {
                        Some(constraint) => constrained_draft(
                            row,
                            constraint,
                            &spec.drafts,
                            sampling,
                            &history,
                            &mut seq.rng,
                        ),
                        None => {
                            let dist = processed_distribution(row, sampling, &history);
                            (draw(&dist, &mut seq.rng), dist)
                        }
                    }
                }
            };
            match &fault {
                DraftFault::None => {}
                DraftFault::WrongTokens => {
                    token = (token + 1) % vocab as u32;
                    dist = vec![(token, 1.0)];
                }
                DraftFault::Scripted(script) => {
                    let so_far: Vec<u32> = seq.tokens.iter().chain(&spec.drafts).copied().collect();
                    token = (script.0)(&so_far);
                    dist = vec![(token, 1.0)];
                }
            }
            spec.drafts.push(token);
            spec.draft_dists.push(dist);
        }
    }
}

/// What an unlisted token's logit reads as when the draft head covers only the token map's ids:
/// finite, so that a row whose allowed tokens are all unlisted (a grammar's mask) still has a
/// distribution to draw from (even over them) instead of a division of infinities; any listed
/// token outweighs it completely.
const UNLISTED_LOGIT: f32 = -1.0e30;

/// An MTP logits row as a row over the whole vocabulary: as it is without a token map, else each
/// listed token's logit at its id and `UNLISTED_LOGIT` elsewhere.
fn draft_row_over_vocabulary<'a>(
    columns: &'a [f32],
    draft_ids: Option<&[u32]>,
    vocab: usize,
) -> std::borrow::Cow<'a, [f32]> {
    let Some(ids) = draft_ids else {
        return std::borrow::Cow::Borrowed(columns);
    };
    let mut row = vec![UNLISTED_LOGIT; vocab];
    for (&id, &logit) in ids.iter().zip(columns) {
        row[id as usize] = logit;
    }
    std::borrow::Cow::Owned(row)
}

/// A draft that the request's grammar allows after its earlier drafts, so verification does not
/// spend a position rejecting it. A greedy drafter checks its argmax alone (cheap) and computes the
/// grammar's mask only when the argmax is forbidden; a sampling drafter always draws from the masked
/// distribution, since verification divides by the probability the draft was drawn with. When the
/// constraint cannot answer, the draft goes unconstrained: verification holds the output to the
/// grammar either way and reports the constraint's errors itself.
fn constrained_draft(
    row: &[f32],
    constraint: &mut dyn TokenConstraint,
    drafts: &[u32],
    sampling: &SamplingParams,
    history: &PenaltyHistory,
    rng: &mut Rng,
) -> (u32, Vec<(u32, f32)>) {
    if sampling.temperature == 0.0 {
        let dist = processed_distribution(row, sampling, history);
        let token = dist[0].0;
        if constraint.allows_after(drafts, token).unwrap_or(true) {
            return (token, dist);
        }
    }
    let masked = match constraint.allowed_after(drafts) {
        Ok(mask) => apply_mask(row, mask).ok(),
        Err(_) => None,
    };
    let dist = processed_distribution(masked.as_deref().unwrap_or(row), sampling, history);
    (draw(&dist, rng), dist)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::PenaltyHistory;

    #[test]
    fn a_token_map_row_puts_each_logit_at_its_id_and_keeps_unlisted_ids_out() {
        let whole = draft_row_over_vocabulary(&[0.5, -1.0], None, 2);
        assert_eq!(whole[..], [0.5, -1.0]);
        let row = draft_row_over_vocabulary(&[0.5, 2.0, -3.0], Some(&[4, 0, 2]), 6);
        assert_eq!(
            row[..],
            [
                2.0,
                UNLISTED_LOGIT,
                -3.0,
                UNLISTED_LOGIT,
                0.5,
                UNLISTED_LOGIT
            ]
        );
        let sampling = SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        };
        let dist = processed_distribution(&row, &sampling, &PenaltyHistory::new(&[]));
        let unlisted: f32 = dist
            .iter()
            .filter(|(id, _)| ![0, 2, 4].contains(id))
            .map(|&(_, p)| p)
            .sum();
        assert_eq!(unlisted, 0.0, "{dist:?}");
        // A grammar that allows only unlisted ids still leaves a distribution to draw from.
        let only_unlisted: Vec<f32> = row
            .iter()
            .enumerate()
            .map(|(id, &l)| {
                if id == 3 || id == 5 {
                    l
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect();
        let dist = processed_distribution(&only_unlisted, &sampling, &PenaltyHistory::new(&[]));
        assert!(dist.iter().all(|&(_, p)| p.is_finite()), "{dist:?}");
        let total: f32 = dist.iter().map(|&(_, p)| p).sum();
        assert!((total - 1.0).abs() < 1e-6, "{dist:?}");
    }
}
