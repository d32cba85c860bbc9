//! The trunk forward pass, written once against `Backend`, over a ragged batch (docs/model.md,
//! "Trunk"). Every sequence in the batch reads and writes only its own blocks and slot, so a
//! sequence's numbers do not depend on what else is batched with it.

use crate::cache::HybridCache;
use crate::config::ModelConfig;
use crate::step_graphs::StepGraphs;
use crate::tp::{RankCommand, TpRank};
use crate::weights::{AttentionWeights, DenseMlp, GdnWeights, Layer, Mixer, Mlp, MoeMlp, Weights};
use deltaserve_tensor::{
    Backend, BatchLayout, Communicator, GdnGateInputs, MoeRouting, SharedExpert,
};

/// What one forward step computes.
pub struct ForwardInput<'a> {
    /// Token ids, one per batch row.
    pub tokens: &'a [u32],
    pub batch: &'a BatchLayout,
    /// Rows whose logits are wanted, e.g. the last row of each sequence.
    pub logit_rows: &'a [u32],
    /// Rows whose post-norm hidden states are wanted (the MTP head's input); often empty.
    pub hidden_rows: &'a [u32],
}

pub struct ForwardOutput<B: Backend> {
    /// `[logit_rows, vocab]`
    pub logits: B::Buf,
    /// `[hidden_rows, hidden]`: the post-final-norm hidden state (the input of `lm_head` and of the
    /// MTP head).
    pub hidden: B::Buf,
}

/// Sees the residual stream before and after each layer, and may replace what the next layer
/// starts from; used by `doctor` to check every layer on the same input in both backends.
/// `Send`: the step, observer included, may run on one of the backend's worker threads.
pub trait LayerObserver<B: Backend>: Send {
    fn before_layer(&mut self, _layer: usize, _hidden: &B::Buf) {}
    fn after_layer(&mut self, layer: usize, hidden: &B::Buf);
    /// The residual stream the rest of the model continues from instead of the layer's own
    /// output; `None` keeps it.
    fn replace_after_layer(&mut self, _layer: usize) -> Option<Vec<f32>> {
        None
    }
}

impl<B: Backend> LayerObserver<B> for () {
    fn after_layer(&mut self, _: usize, _: &B::Buf) {}
}

/// Where one decoder layer runs in the step: its rows, positions, batch and cache pool.
struct LayerStep<'a> {
    t: usize,
    positions: &'a [u32],
    batch: &'a BatchLayout,
    /// The layer's index among the layers of its kind; `None` selects the MTP KV pool.
    pool: Option<usize>,
}

/// A loaded model: its config, its backend and its weights on that backend.
pub struct Model<B: Backend> {
    pub config: ModelConfig,
    pub backend: B,
    pub weights: Weights<B>,
    /// For each layer, its index among the layers of its kind (KV pool or state pool index).
    pool_index: Vec<usize>,
    /// Recorded decode steps (off unless enabled).
    pub(crate) step_graphs: StepGraphs<B>,
    /// This rank's place in a tensor-parallel group (`None`: the whole model on one backend).
    pub(crate) tp: Option<TpRank<B>>,
}

impl<B: Backend> Model<B> {
    pub fn new(config: ModelConfig, backend: B, weights: Weights<B>) -> Self {
        let mut counts = [0usize; 2];
        let pool_index = (0..config.num_hidden_layers)
            .map(|i| {
                let kind = usize::from(config.is_full_attention(i));
                counts[kind] += 1;
                counts[kind] - 1
            })
            .collect();
        Self {
            config,
            backend,
            weights,
            pool_index,
            step_graphs: StepGraphs::default(),
            tp: None,
        }
    }

    /// One rank of a tensor-parallel group: `config` is the rank-local config
    /// (`crate::tp::rank_config`), `weights` this rank's shard (`Weights::load_shard`).
    pub fn with_rank(
        config: ModelConfig,
        backend: B,
        weights: Weights<B>,
        comm: Box<dyn Communicator<B>>,
    ) -> Self {
        let mut model = Self::new(config, backend, weights);
        model.tp = Some(TpRank::new(comm));
        model
    }

    /// Tensor-parallel ranks (1 when the model is whole).
    pub fn tp_size(&self) -> usize {
        self.shard().size
    }

    pub fn forward(
        &self,
        input: &ForwardInput<'_>,
        cache: &mut HybridCache<B>,
    ) -> ForwardOutput<B> {
        // Recorded steps read the token ids from the step's device tables, which the split
        // embedding's id remapping does not go through: tensor-parallel steps run plainly.
        if self.tp.is_none() {
            if let Some(out) = self.forward_recorded(input, cache) {
                return out;
            }
        }
        self.forward_plain(input, cache)
    }

    /// The step with every op launched one by one (never a recording).
    pub(crate) fn forward_plain(
        &self,
        input: &ForwardInput<'_>,
        cache: &mut HybridCache<B>,
    ) -> ForwardOutput<B> {
        self.forward_observed(input, cache, &mut ())
    }

    pub fn forward_observed(
        &self,
        input: &ForwardInput<'_>,
        cache: &mut HybridCache<B>,
        observer: &mut dyn LayerObserver<B>,
    ) -> ForwardOutput<B> {
        self.on_all_ranks(
            cache,
            |link| RankCommand::Forward {
                cache: link,
                tokens: input.tokens.to_vec(),
                batch: input.batch.clone(),
                logit_rows: input.logit_rows.to_vec(),
                hidden_rows: input.hidden_rows.to_vec(),
            },
            |cache| self.forward_rank(input, cache, observer),
        )
    }

    /// This rank's part of the step (the whole step without tensor parallelism), run where its
    /// backend issues ops fastest (`Backend::run_step`).
    fn forward_rank(
        &self,
        input: &ForwardInput<'_>,
        cache: &mut HybridCache<B>,
        observer: &mut dyn LayerObserver<B>,
    ) -> ForwardOutput<B> {
        self.backend
            .run_step(|| self.forward_layers(input, cache, observer))
    }

    fn forward_layers(
        &self,
        input: &ForwardInput<'_>,
        cache: &mut HybridCache<B>,
        observer: &mut dyn LayerObserver<B>,
    ) -> ForwardOutput<B> {
        let be = &self.backend;
        let t = input.tokens.len();
        debug_assert_eq!(t, input.batch.total_tokens());
        let positions = input.batch.positions();
        let mut h = self.embed(input.tokens);
        let layers = &self.weights.layers;
        let mut x = match layers.first() {
            Some(first) => self.norm(&h, &first.input_norm),
            None => be.scratch(0),
        };
        for (i, layer) in layers.iter().enumerate() {
            let step = LayerStep {
                t,
                positions: &positions,
                batch: input.batch,
                pool: Some(self.pool_index[i]),
            };
            observer.before_layer(i, &h);
            // The next layer's input norm is fused into this layer's last residual add.
            let next_norm = layers.get(i + 1).map(|next| &next.input_norm);
            if let Some(next) = self.layer_from_normed(layer, &x, &mut h, &step, cache, next_norm) {
                x = next;
            }
            observer.after_layer(i, &h);
            if let Some(replacement) = observer.replace_after_layer(i) {
                h = be.upload(&replacement);
                if let Some(norm) = next_norm {
                    x = self.norm(&h, norm);
                }
            }
        }
        self.head(&h, &self.weights.norm, input.logit_rows, input.hidden_rows)
    }

    /// `embed[ids]`, `[T, hidden]`. Split over the vocabulary: each rank looks up the ids it
    /// holds (the others read its zero row) and the sum over ranks is the whole lookup. (A
    /// one-rank group runs the same collectives, which then change nothing: it checks the
    /// communicator's plumbing on one device.)
    pub(crate) fn embed(&self, ids: &[u32]) -> B::Buf {
        let be = &self.backend;
        let mut h = be.scratch(ids.len() * self.config.hidden_size);
        match &self.tp {
            Some(tp) => {
                let (from, to) = tp.shard.range(self.config.vocab_size);
                let zero_row = (to - from) as u32;
                let local: Vec<u32> = ids
                    .iter()
                    .map(|&id| {
                        let id = id as usize;
                        if (from..to).contains(&id) {
                            (id - from) as u32
                        } else {
                            zero_row
                        }
                    })
                    .collect();
                be.embedding(&self.weights.embed, &local, &mut h);
                tp.comm.all_reduce_sum(be, &mut h);
            }
            None => be.embedding(&self.weights.embed, ids, &mut h),
        }
        h
    }

    /// The sum over tensor-parallel ranks of a row-parallel layer's partial output (nothing to do
    /// when the model is whole).
    fn all_reduce(&self, x: &mut B::Buf) {
        if let Some(tp) = &self.tp {
            tp.comm.all_reduce_sum(&self.backend, x);
        }
    }

    /// Final norm `norm` of the chosen rows of the residual stream `h`, and lm_head (or the tied
    /// embedding) over the normed `logit_rows`; split over the vocabulary, each rank's logits are
    /// gathered so that every rank holds the whole `[rows, vocab]`.
    pub(crate) fn head(
        &self,
        h: &B::Buf,
        norm: &B::Buf,
        logit_rows: &[u32],
        hidden_rows: &[u32],
    ) -> ForwardOutput<B> {
        self.head_with(self.trunk_head(), h, norm, logit_rows, hidden_rows)
    }

    /// The trunk's output head: `lm_head`, or the tied embedding when there is none.
    pub(crate) fn trunk_head(&self) -> &B::Mat {
        self.weights.lm_head.as_ref().unwrap_or(&self.weights.embed)
    }

    /// `head` through the output matrix `head` (the MTP draft model's own head, when it has one).
    pub(crate) fn head_with(
        &self,
        head: &B::Mat,
        h: &B::Buf,
        norm: &B::Buf,
        logit_rows: &[u32],
        hidden_rows: &[u32],
    ) -> ForwardOutput<B> {
        let (be, c) = (&self.backend, &self.config);
        let normed = self.norm(&be.gather_rows(h, c.hidden_size, logit_rows), norm);
        let rows = logit_rows.len();
        let local_vocab = be.mat_shape(head).0;
        let mut logits = be.scratch(rows * local_vocab);
        be.matmul(&normed, head, &mut logits, rows);
        if let Some(tp) = &self.tp {
            logits = tp.comm.all_gather_cols(be, &logits, rows, local_vocab);
        }
        let hidden = if hidden_rows == logit_rows {
            normed
        } else {
            self.norm(&be.gather_rows(h, c.hidden_size, hidden_rows), norm)
        };
        ForwardOutput { logits, hidden }
    }

    pub(crate) fn norm(&self, x: &B::Buf, w: &B::Buf) -> B::Buf {
        let be = &self.backend;
        let mut out = be.scratch(be.buf_len(x));
        be.rms_norm(
            x,
            w,
            self.config.rms_norm_eps,
            self.config.hidden_size,
            &mut out,
        );
        out
    }

    /// `x @ w^T` for each matrix of `ws` (they share the input): one backend op.
    fn linears<const N: usize>(&self, x: &B::Buf, ws: [&B::Mat; N], tokens: usize) -> [B::Buf; N] {
        let be = &self.backend;
        let mut outs = ws.map(|w| be.scratch(tokens * be.mat_shape(w).0));
        let mut out_refs: Vec<&mut B::Buf> = outs.iter_mut().collect();
        be.matmul_group(x, &ws, &mut out_refs, tokens);
        outs
    }

    fn linear(&self, x: &B::Buf, w: &B::Mat, tokens: usize) -> B::Buf {
        let [out] = self.linears(x, [w], tokens);
        out
    }

    /// One decoder layer in place on the residual stream `h` (its input norm included). `pool` is
    /// the layer's index among the layers of its kind; `None` selects the MTP KV pool.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn decoder_layer(
        &self,
        layer: &Layer<B>,
        h: &mut B::Buf,
        t: usize,
        positions: &[u32],
        batch: &BatchLayout,
        cache: &mut HybridCache<B>,
        pool: Option<usize>,
    ) {
        let x = self.norm(h, &layer.input_norm);
        let step = LayerStep {
            t,
            positions,
            batch,
            pool,
        };
        self.layer_from_normed(layer, &x, h, &step, cache, None);
    }

    /// One decoder layer on the residual stream `h` whose input norm `x` is already computed.
    /// With `next_norm`, returns that norm of the updated `h` (the next layer's input, computed in
    /// the same op as the last residual add); otherwise only adds.
    fn layer_from_normed(
        &self,
        layer: &Layer<B>,
        x: &B::Buf,
        h: &mut B::Buf,
        step: &LayerStep<'_>,
        cache: &mut HybridCache<B>,
        next_norm: Option<&B::Buf>,
    ) -> Option<B::Buf> {
        let (be, c) = (&self.backend, &self.config);
        let (t, hidden, eps) = (step.t, c.hidden_size, c.rms_norm_eps);
        let mut mixed = match &layer.mixer {
            Mixer::Attention(w) => {
                let kv = match step.pool {
                    Some(i) => &mut cache.kv[i],
                    // Invariant: the MTP layer only runs when the cache was built with an MTP pool
                    // (checked by `Model::mtp_forward` before it gets here).
                    None => cache.mtp_kv.as_mut().expect("MTP KV pool present"),
                };
                self.attention(w, x, t, step.positions, step.batch, kv)
            }
            Mixer::Gdn(w) => {
                let i = step.pool.expect("GDN layers are never the MTP layer");
                self.gdn(w, x, t, step.batch, &mut cache.state[i])
            }
        };
        // o_proj / out_proj are row-parallel: sum the ranks' partial outputs.
        self.all_reduce(&mut mixed);
        let mut x = be.scratch(t * hidden);
        be.add_rms_norm(h, &mixed, &layer.post_norm, eps, hidden, &mut x);
        let mut mlp_out = match &layer.mlp {
            Mlp::Dense(w) => self.dense_mlp(w, &x, t),
            Mlp::Moe(w) => self.moe(w, &x, t),
        };
        // down_proj (of the dense MLP, every expert and the shared expert) is row-parallel; the
        // routed experts' weights and the shared gate scale each rank's part alike, so one sum
        // over ranks after the whole MLP suffices.
        self.all_reduce(&mut mlp_out);
        match next_norm {
            Some(norm) => {
                be.add_rms_norm(h, &mlp_out, norm, eps, hidden, &mut x);
                Some(x)
            }
            None => {
                be.add_inplace(h, &mlp_out);
                None
            }
        }
    }

    fn attention(
        &self,
        w: &AttentionWeights<B>,
        x: &B::Buf,
        t: usize,
        positions: &[u32],
        batch: &BatchLayout,
        kv: &mut deltaserve_tensor::KvLayerPool<B>,
    ) -> B::Buf {
        let (be, c) = (&self.backend, &self.config);
        let shape = c.attn_shape();
        let eps = c.rms_norm_eps;
        let [q_raw, gate, k_raw, v] = self.linears(x, [&w.q, &w.gate, &w.k, &w.v], t);
        let mut q = be.scratch(be.buf_len(&q_raw));
        let mut k = be.scratch(be.buf_len(&k_raw));
        be.qk_norm_rope(
            &q_raw,
            &k_raw,
            [&w.q_norm, &w.k_norm],
            eps,
            positions,
            shape,
            (c.rotary_dim, c.rope_theta as f32),
            &mut q,
            &mut k,
        );
        let mut attn = be.scratch(be.buf_len(&q));
        be.attention(&q, &k, &v, kv, batch, shape, &mut attn);
        be.sigmoid_mul_inplace(&mut attn, &gate);
        self.linear(&attn, &w.o, t)
    }

    fn gdn(
        &self,
        w: &GdnWeights<B>,
        x: &B::Buf,
        t: usize,
        batch: &BatchLayout,
        state: &mut deltaserve_tensor::StateLayerPool<B>,
    ) -> B::Buf {
        let (be, c) = (&self.backend, &self.config);
        let shape = c.gdn_shape();
        let [mixed, z, b, a] = self.linears(x, [&w.qkv, &w.z, &w.b, &w.a], t);
        let mut conv_out = be.scratch(be.buf_len(&mixed));
        be.causal_conv1d(&mixed, &w.conv, state, batch, &mut conv_out);
        let gates = GdnGateInputs {
            a: &a,
            b: &b,
            a_log: &w.a_log,
            dt_bias: &w.dt_bias,
        };
        let mut core = be.scratch(t * shape.value_heads * shape.value_dim);
        be.gdn_gates_and_delta_rule(&conv_out, gates, state, batch, shape, &mut core);
        let mut normed = be.scratch(be.buf_len(&core));
        be.gated_rms_norm(
            &core,
            &z,
            &w.norm,
            c.rms_norm_eps,
            shape.value_dim,
            &mut normed,
        );
        self.linear(&normed, &w.out, t)
    }

    fn dense_mlp(&self, w: &DenseMlp<B>, x: &B::Buf, t: usize) -> B::Buf {
        let be = &self.backend;
        let mut out = be.scratch(t * be.mat_shape(&w.down).0);
        be.dense_mlp(x, [&w.gate, &w.up, &w.down], &mut out, t);
        out
    }

    fn moe(&self, w: &MoeMlp<B>, x: &B::Buf, t: usize) -> B::Buf {
        let be = &self.backend;
        let routing = MoeRouting {
            top_k: w.top_k,
            renormalize: w.renormalize,
        };
        match &w.shared {
            Some((shared, gate)) => {
                // One launch for the router and the shared expert's gate (both read x).
                let [router_logits, gate_logits] = self.linears(x, [&w.router, gate], t);
                let shared = SharedExpert {
                    gate: &shared.gate,
                    up: &shared.up,
                    down: &shared.down,
                    gate_logits: &gate_logits,
                };
                be.moe_experts(x, &router_logits, &w.experts, routing, t, Some(shared))
            }
            None => {
                let router_logits = self.linear(x, &w.router, t);
                be.moe_experts(x, &router_logits, &w.experts, routing, t, None)
            }
        }
    }
}
