//! The trunk forward pass, written once against `Backend`, over a ragged batch (spec §3). Every
//! sequence in the batch reads and writes only its own blocks and slot, so a sequence's numbers do
//! not depend on what else is batched with it.

use crate::cache::HybridCache;
use crate::config::ModelConfig;
use crate::weights::{AttentionWeights, DenseMlp, GdnWeights, Layer, Mixer, Mlp, MoeMlp, Weights};
use deltaserve_tensor::{Backend, BatchLayout};

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

/// Sees the residual stream after each layer; used by `doctor` to find the first diverging layer.
pub trait LayerObserver<B: Backend> {
    fn after_layer(&mut self, layer: usize, hidden: &B::Buf);
}

impl<B: Backend> LayerObserver<B> for () {
    fn after_layer(&mut self, _: usize, _: &B::Buf) {}
}

/// A loaded model: its config, its backend and its weights on that backend.
pub struct Model<B: Backend> {
    pub config: ModelConfig,
    pub backend: B,
    pub weights: Weights<B>,
    /// For each layer, its index among the layers of its kind (KV pool or state pool index).
    pool_index: Vec<usize>,
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
        }
    }

    pub fn forward(
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
        let be = &self.backend;
        let c = &self.config;
        let t = input.tokens.len();
        debug_assert_eq!(t, input.batch.total_tokens());
        let positions = input.batch.positions();
        let mut h = be.zeros(t * c.hidden_size);
        be.embedding(&self.weights.embed, input.tokens, &mut h);
        for (i, layer) in self.weights.layers.iter().enumerate() {
            let pool = self.pool_index[i];
            self.decoder_layer(layer, &mut h, t, &positions, input.batch, cache, Some(pool));
            observer.after_layer(i, &h);
        }
        self.head(&h, &self.weights.norm, input.logit_rows, input.hidden_rows)
    }

    /// Final norm `norm` of the chosen rows of the residual stream `h`, and lm_head (or the tied
    /// embedding) over the normed `logit_rows`.
    pub(crate) fn head(
        &self,
        h: &B::Buf,
        norm: &B::Buf,
        logit_rows: &[u32],
        hidden_rows: &[u32],
    ) -> ForwardOutput<B> {
        let (be, c) = (&self.backend, &self.config);
        let normed = self.norm(&be.gather_rows(h, c.hidden_size, logit_rows), norm);
        let head = self.weights.lm_head.as_ref().unwrap_or(&self.weights.embed);
        let mut logits = be.zeros(logit_rows.len() * c.vocab_size);
        be.matmul(&normed, head, &mut logits, logit_rows.len());
        let hidden = if hidden_rows == logit_rows {
            normed
        } else {
            self.norm(&be.gather_rows(h, c.hidden_size, hidden_rows), norm)
        };
        ForwardOutput { logits, hidden }
    }

    pub(crate) fn norm(&self, x: &B::Buf, w: &B::Buf) -> B::Buf {
        let be = &self.backend;
        let mut out = be.zeros(be.buf_len(x));
        be.rms_norm(
            x,
            w,
            self.config.rms_norm_eps,
            self.config.hidden_size,
            &mut out,
        );
        out
    }

    fn linear(&self, x: &B::Buf, w: &B::Mat, tokens: usize) -> B::Buf {
        let be = &self.backend;
        let mut out = be.zeros(tokens * be.mat_shape(w).0);
        be.matmul(x, w, &mut out, tokens);
        out
    }

    /// One decoder layer in place on the residual stream `h`. `pool` is the layer's index among the
    /// layers of its kind; `None` selects the MTP KV pool.
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
        let be = &self.backend;
        let x = self.norm(h, &layer.input_norm);
        let mixed = match &layer.mixer {
            Mixer::Attention(w) => {
                let kv = match pool {
                    Some(i) => &mut cache.kv[i],
                    // Invariant: the MTP layer only runs when the cache was built with an MTP pool
                    // (checked by `Model::mtp_forward` before it gets here).
                    None => cache.mtp_kv.as_mut().expect("MTP KV pool present"),
                };
                self.attention(w, &x, t, positions, batch, kv)
            }
            Mixer::Gdn(w) => {
                let i = pool.expect("GDN layers are never the MTP layer");
                self.gdn(w, &x, t, batch, &mut cache.state[i])
            }
        };
        be.add_inplace(h, &mixed);
        let x = self.norm(h, &layer.post_norm);
        let mlp_out = match &layer.mlp {
            Mlp::Dense(w) => self.dense_mlp(w, &x, t),
            Mlp::Moe(w) => self.moe(w, &x, t),
        };
        be.add_inplace(h, &mlp_out);
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
        let d = shape.head_dim;
        let eps = c.rms_norm_eps;
        let q_raw = self.linear(x, &w.q, t);
        let gate = self.linear(x, &w.gate, t);
        let k_raw = self.linear(x, &w.k, t);
        let v = self.linear(x, &w.v, t);
        let mut q = be.zeros(be.buf_len(&q_raw));
        be.rms_norm(&q_raw, &w.q_norm, eps, d, &mut q);
        let mut k = be.zeros(be.buf_len(&k_raw));
        be.rms_norm(&k_raw, &w.k_norm, eps, d, &mut k);
        let theta = c.rope_theta as f32;
        be.rope(&mut q, positions, shape.q_heads, d, c.rotary_dim, theta);
        be.rope(&mut k, positions, shape.kv_heads, d, c.rotary_dim, theta);
        let mut attn = be.zeros(be.buf_len(&q));
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
        let mixed = self.linear(x, &w.qkv, t);
        let z = self.linear(x, &w.z, t);
        let b = self.linear(x, &w.b, t);
        let a = self.linear(x, &w.a, t);
        let mut conv_out = be.zeros(be.buf_len(&mixed));
        be.causal_conv1d(&mixed, &w.conv, state, batch, &mut conv_out);
        let mut g = be.zeros(be.buf_len(&a));
        let mut beta = be.zeros(be.buf_len(&b));
        be.gdn_gates(&a, &b, &w.a_log, &w.dt_bias, &mut g, &mut beta);
        let mut core = be.zeros(t * shape.value_heads * shape.value_dim);
        be.gated_delta_rule(&conv_out, &g, &beta, state, batch, shape, &mut core);
        let mut normed = be.zeros(be.buf_len(&core));
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
        let gate = self.linear(x, &w.gate, t);
        let up = self.linear(x, &w.up, t);
        let mut act = be.zeros(be.buf_len(&gate));
        be.silu_mul(&gate, &up, &mut act);
        self.linear(&act, &w.down, t)
    }

    fn moe(&self, w: &MoeMlp<B>, x: &B::Buf, t: usize) -> B::Buf {
        let be = &self.backend;
        let hidden = self.config.hidden_size;
        let router_logits = self.linear(x, &w.router, t);
        let routes = be.route_top_k(&router_logits, w.experts.len(), w.top_k, w.renormalize);
        let mut out = be.zeros(t * hidden);
        for (e, expert) in w.experts.iter().enumerate() {
            let (rows, weights): (Vec<u32>, Vec<f32>) = routes
                .iter()
                .filter(|r| r.expert as usize == e)
                .map(|r| (r.token, r.weight))
                .unzip();
            if rows.is_empty() {
                continue;
            }
            let xe = be.gather_rows(x, hidden, &rows);
            let ye = self.dense_mlp(expert, &xe, rows.len());
            be.scatter_add_rows(&mut out, &ye, hidden, &rows, &weights);
        }
        if let Some((shared, gate)) = &w.shared {
            let mut s = self.dense_mlp(shared, x, t);
            let g = self.linear(x, gate, t);
            be.sigmoid_scale_rows(&mut s, &g, hidden);
            be.add_inplace(&mut out, &s);
        }
        out
    }
}
