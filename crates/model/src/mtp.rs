//! The MTP head forward (docs/model.md, "MTP head"): from the trunk's post-norm hidden state of
//! token t and the id of token t+1, predict token t+2. One full-attention layer with its own KV
//! pool (`HybridCache::mtp_kv`), sharing the trunk's embedding and lm_head (or with a head of its
//! own in block FP8: crate::draft_fp8). Positions are those of the hidden states' tokens.

use crate::cache::HybridCache;
use crate::forward::{ForwardOutput, Model};
use crate::tp::RankCommand;
use crate::weights::MtpWeights;
use deltaserve_tensor::{Backend, BatchLayout};

/// Why the MTP head cannot run.
#[derive(Debug, thiserror::Error)]
pub enum MtpError {
    #[error(
        "this model has no MTP head (mtp_num_hidden_layers is 0 or its weights were not loaded)"
    )]
    NoHead,
    #[error("the cache was built without an MTP KV pool")]
    NoCache,
}

/// One MTP step over a ragged batch.
pub struct MtpInput<'a> {
    /// `[T, hidden]`: post-norm hidden state of token t for every row (trunk output, or the MTP's
    /// own output for draft steps after the first).
    pub hidden: &'a [f32],
    /// Token t+1 for every row.
    pub next_tokens: &'a [u32],
    /// Positions are those of token t; block tables index the MTP KV pool.
    pub batch: &'a BatchLayout,
    pub logit_rows: &'a [u32],
    pub hidden_rows: &'a [u32],
}

/// Where an MTP step's ops find its input hidden states on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HiddenInput {
    /// Uploaded for this step alone (a step that is not recorded: an extend after a prefill
    /// chunk may bring thousands of rows, which a step table would keep allocated).
    Uploaded,
    /// From the step table `Backend::prepare_step` filled, so that a recording reads the rows of
    /// each replayed step.
    StepTable,
}

impl<B: Backend> Model<B> {
    pub fn has_mtp(&self) -> bool {
        self.weights.mtp.is_some()
    }

    /// Runs the MTP head; returns logits for token t+2 for `logit_rows` and the MTP's post-`mtp.norm`
    /// hidden state (the hidden input of the next draft step) for `hidden_rows`.
    pub fn mtp_forward(
        &self,
        input: &MtpInput<'_>,
        cache: &mut HybridCache<B>,
    ) -> Result<ForwardOutput<B>, MtpError> {
        let mtp = self.weights.mtp.as_ref().ok_or(MtpError::NoHead)?;
        if cache.mtp_kv.is_none() {
            return Err(MtpError::NoCache);
        }
        // As for the trunk's steps: the split embedding's id remapping would bypass the recorded
        // token table, so tensor-parallel MTP steps run plainly.
        if self.tp.is_none() {
            if let Some(out) = self.mtp_recorded(mtp, input, cache) {
                return Ok(out);
            }
        }
        Ok(self.on_all_ranks(
            cache,
            |link| RankCommand::Mtp {
                cache: link,
                hidden: input.hidden.to_vec(),
                next_tokens: input.next_tokens.to_vec(),
                batch: input.batch.clone(),
                logit_rows: input.logit_rows.to_vec(),
                hidden_rows: input.hidden_rows.to_vec(),
            },
            |cache| {
                self.backend
                    .run_step(|| self.mtp_rank(mtp, input, cache, HiddenInput::Uploaded))
            },
        ))
    }

    /// This rank's part of an MTP step (`fc` is replicated; the decoder layer and the head are
    /// split like the trunk's).
    pub(crate) fn mtp_rank(
        &self,
        mtp: &MtpWeights<B>,
        input: &MtpInput<'_>,
        cache: &mut HybridCache<B>,
        hidden_input: HiddenInput,
    ) -> ForwardOutput<B> {
        let (be, c) = (&self.backend, &self.config);
        let hsz = c.hidden_size;
        let t = input.next_tokens.len();
        let embedded = self.embed(input.next_tokens);
        let e = self.norm(&embedded, &mtp.pre_fc_norm_embedding);
        let hidden = match hidden_input {
            HiddenInput::Uploaded => be.upload(input.hidden),
            HiddenInput::StepTable => be.step_hidden(input.hidden),
        };
        let h = self.norm(&hidden, &mtp.pre_fc_norm_hidden);
        let mut both = be.zeros(t * 2 * hsz);
        be.concat_cols(&e, &h, hsz, hsz, &mut both);
        let mut u = be.zeros(t * hsz);
        be.matmul(&both, &mtp.fc, &mut u, t);
        let positions = input.batch.positions();
        self.decoder_layer(&mtp.layer, &mut u, t, &positions, input.batch, cache, None);
        let head = mtp.draft_head.as_ref().unwrap_or_else(|| self.trunk_head());
        self.head_with(head, &u, &mtp.norm, input.logit_rows, input.hidden_rows)
    }
}
