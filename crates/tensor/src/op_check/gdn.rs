//! The Gated DeltaNet state ops in the op harness: the state pools of one GDN layer (conv windows
//! and recurrent states) on a backend and on the reference, carried from step to step through the
//! causal conv, the gated delta rule and the slot copies and resets.

use super::{poisoned, Outputs};
use crate::backend::{Backend, GdnShape};
use crate::batch::BatchLayout;
use crate::cache::StateLayerPool;
use crate::reference::ReferenceBackend;

/// The state pools of one GDN layer on both backends.
pub struct StatePools<B: Backend> {
    pub ours: StateLayerPool<B>,
    pub reference: StateLayerPool<ReferenceBackend>,
}

impl<B: Backend> StatePools<B> {
    /// Zeroed pools of `slots` slots: conv windows of `conv_kernel - 1` rows of `conv_dim`,
    /// recurrent states `[value_heads, key_dim, value_dim]`.
    pub fn new(
        be: &B,
        slots: usize,
        conv_dim: usize,
        conv_kernel: usize,
        value_heads: usize,
        key_dim: usize,
        value_dim: usize,
    ) -> Self {
        Self {
            ours: StateLayerPool::new(
                be,
                slots,
                conv_dim,
                conv_kernel,
                value_heads,
                key_dim,
                value_dim,
            ),
            reference: StateLayerPool::new(
                &ReferenceBackend,
                slots,
                conv_dim,
                conv_kernel,
                value_heads,
                key_dim,
                value_dim,
            ),
        }
    }

    /// Sets every conv window to `conv` and every recurrent state to `ssm` (whole pools), on both.
    pub fn hold(&mut self, be: &B, conv: &[f32], ssm: &[f32]) {
        self.ours.conv = be.upload(conv);
        self.ours.ssm = be.upload(ssm);
        self.reference.conv = conv.to_vec();
        self.reference.ssm = ssm.to_vec();
    }

    /// Puts the reference's windows and states into ours, so that the next step measures only its
    /// own error (doctor, after a step whose differences it has recorded).
    pub fn align_to_reference(&mut self, be: &B) {
        let (conv, ssm) = (self.reference.conv.clone(), self.reference.ssm.clone());
        self.ours.conv = be.upload(&conv);
        self.ours.ssm = be.upload(&ssm);
    }

    /// The depthwise causal conv + SiLU of `x [T, conv_dim]` with weights `w [conv_dim, K]`,
    /// updating (and snapshotting) the windows.
    pub fn causal_conv1d(
        &mut self,
        be: &B,
        x: &[f32],
        w: &B::Buf,
        w_ref: &[f32],
        batch: &BatchLayout,
    ) -> Outputs {
        let mut want = vec![0.0; x.len()];
        ReferenceBackend.causal_conv1d(
            &x.to_vec(),
            &w_ref.to_vec(),
            &mut self.reference,
            batch,
            &mut want,
        );
        let mut out = poisoned(be, x.len());
        be.causal_conv1d(&be.upload(x), w, &mut self.ours, batch, &mut out);
        (be.to_host(&out), want)
    }

    /// The gated delta rule over `mixed [T, conv_dim]` with gates `g`, `beta` `[T, value_heads]`,
    /// reading and writing (and snapshotting) the states; out `[T, value_heads, value_dim]`.
    pub fn gated_delta_rule(
        &mut self,
        be: &B,
        mixed: &[f32],
        g: &[f32],
        beta: &[f32],
        batch: &BatchLayout,
        shape: GdnShape,
    ) -> Outputs {
        let out_len = batch.total_tokens() * shape.value_heads * shape.value_dim;
        let mut want = vec![0.0; out_len];
        ReferenceBackend.gated_delta_rule(
            &mixed.to_vec(),
            &g.to_vec(),
            &beta.to_vec(),
            &mut self.reference,
            batch,
            shape,
            &mut want,
        );
        let mut out = poisoned(be, out_len);
        be.gated_delta_rule(
            &be.upload(mixed),
            &be.upload(g),
            &be.upload(beta),
            &mut self.ours,
            batch,
            shape,
            &mut out,
        );
        (be.to_host(&out), want)
    }

    /// Copies slot `src` into `dst` on both.
    pub fn copy_slot(&mut self, be: &B, src: usize, dst: usize) {
        ReferenceBackend.copy_state_slot(&mut self.reference, src, dst);
        be.copy_state_slot(&mut self.ours, src, dst);
    }

    /// Zeroes `slot` on both.
    pub fn reset_slot(&mut self, be: &B, slot: usize) {
        ReferenceBackend.reset_state_slot(&mut self.reference, slot);
        be.reset_state_slot(&mut self.ours, slot);
    }

    /// The pools' contents: `(conv windows, recurrent states)`, each `(ours, reference)`.
    pub fn contents(&self, be: &B) -> (Outputs, Outputs) {
        (
            (be.to_host(&self.ours.conv), self.reference.conv.clone()),
            (be.to_host(&self.ours.ssm), self.reference.ssm.clone()),
        )
    }
}
