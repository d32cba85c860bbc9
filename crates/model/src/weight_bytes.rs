//! The bytes of weights one decode step reads, summed over the matrices as the backend stores them
//! (bf16, f32, or FP8 codes and their block scales): the numerator of `bench`'s bandwidth and
//! roofline figures. Every matrix of every layer and the output head count whole; the embedding
//! table one row; a MoE block's routed experts `top_k / experts` of their bytes (a token reads
//! its `top_k` experts). Norm, conv and gate vectors are left out (a few MB on the 27B shape).

use crate::forward::Model;
use crate::weights::{DenseMlp, Layer, Mixer, Mlp};
use deltaserve_tensor::moe::ExpertWeights;
use deltaserve_tensor::Backend;

impl<B: Backend> Model<B> {
    /// Bytes of weights a one-token step of the trunk reads on this backend (this rank's shard
    /// under tensor parallelism).
    pub fn decode_weight_bytes(&self) -> usize {
        let w = &self.weights;
        let layers: usize = w.layers.iter().map(|l| self.layer_bytes(l)).sum();
        layers + self.head_bytes(self.trunk_head())
    }

    /// Bytes one single-token forward of the MTP head reads: `fc`, its decoder layer and its output
    /// head (its own draft head, or the trunk's) with one embedding row; `None` without an MTP
    /// head.
    pub fn mtp_forward_weight_bytes(&self) -> Option<usize> {
        let mtp = self.weights.mtp.as_ref()?;
        let head = mtp.draft_head.as_ref().unwrap_or_else(|| self.trunk_head());
        let fc_and_layer = self.backend.mat_bytes(&mtp.fc) + self.layer_bytes(&mtp.layer);
        Some(fc_and_layer + self.head_bytes(head))
    }

    /// The output head `head` and one embedding row.
    fn head_bytes(&self, head: &B::Mat) -> usize {
        let (be, w) = (&self.backend, &self.weights);
        let embed_rows = be.mat_shape(&w.embed).0.max(1);
        be.mat_bytes(head) + be.mat_bytes(&w.embed) / embed_rows
    }

    fn layer_bytes(&self, layer: &Layer<B>) -> usize {
        let be = &self.backend;
        let mixer = match &layer.mixer {
            Mixer::Attention(a) => [&a.q, &a.gate, &a.k, &a.v, &a.o]
                .iter()
                .map(|m| be.mat_bytes(m))
                .sum::<usize>(),
            Mixer::Gdn(g) => [&g.qkv, &g.z, &g.b, &g.a, &g.out]
                .iter()
                .map(|m| be.mat_bytes(m))
                .sum(),
        };
        let mlp = match &layer.mlp {
            Mlp::Dense(d) => self.dense_bytes(d),
            Mlp::Moe(m) => {
                let experts = m.experts.shape.experts.max(1);
                let all_experts: usize = match &m.experts.weights {
                    ExpertWeights::PerExpert { gate, up, down } => gate
                        .iter()
                        .chain(up)
                        .chain(down)
                        .map(|x| be.mat_bytes(x))
                        .sum(),
                    ExpertWeights::Stacked { gate_up, down } => {
                        be.mat_bytes(gate_up) + be.mat_bytes(down)
                    }
                };
                let shared = m
                    .shared
                    .as_ref()
                    .map_or(0, |(d, gate)| self.dense_bytes(d) + be.mat_bytes(gate));
                be.mat_bytes(&m.router) + all_experts * m.top_k / experts + shared
            }
        };
        mixer + mlp
    }

    fn dense_bytes(&self, d: &DenseMlp<B>) -> usize {
        let be = &self.backend;
        be.mat_bytes(&d.gate) + be.mat_bytes(&d.up) + be.mat_bytes(&d.down)
    }
}
