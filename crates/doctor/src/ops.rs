//! Every op of a backend against `reference`, one at a time, on the real weights and shapes of a
//! model: the first linear-attention (GDN) layer, the first full-attention layer, MoE blocks, the
//! MTP head and the output head. Inputs are deterministic pseudo-random activations. Every op runs
//! through the op harness the backends' tests use (`deltaserve_tensor::op_check`), which gives both
//! sides the same host inputs: a row measures that op's own error, not the ones before it.

use crate::inputs::{token_ids, uniform};
use crate::report::{CheckRow, Comparison};
use deltaserve_model::weights::{Layer, Mixer, Mlp};
use deltaserve_model::Model;
use deltaserve_tensor::op_check::{self, AttentionPools, Operands, StatePools};
use deltaserve_tensor::reference::ReferenceBackend;
use deltaserve_tensor::{Backend, BatchLayout, MoeRouting};

/// Rows of a prefill op check: more than one GDN chunk (64) and not a multiple of it.
const PREFILL: usize = 70;
/// A second, short sequence batched with the first.
const SHORT: usize = 5;
const BLOCK: usize = 16;

struct Checker<'a, B: Backend> {
    r: &'a Model<ReferenceBackend>,
    t: &'a Model<B>,
    tolerance: f32,
    rows: Vec<CheckRow>,
}

impl<B: Backend> Checker<'_, B> {
    fn push(
        &mut self,
        what: impl Into<String>,
        layer: Option<usize>,
        layer_kind: &'static str,
        comparison: Comparison,
    ) {
        self.rows.push(CheckRow {
            what: what.into(),
            layer,
            layer_kind,
            comparison,
            tolerance: self.tolerance,
        });
    }

    // Each argument is one coordinate of the check (what, where, which weights, how many rows).
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &mut self,
        what: &str,
        layer: Option<usize>,
        kind: &'static str,
        wr: &deltaserve_tensor::reference::RefMat,
        wt: &B::Mat,
        tokens: usize,
        seed: u64,
    ) {
        let (rows, cols) = (wr.rows, wr.cols);
        let x = uniform(tokens * cols, seed, 1.0);
        let (ours, reference) =
            op_check::matmul(&self.t.backend, wt, wr, &x, tokens, Operands::Exact);
        let c = Comparison::of(&ours, &reference);
        self.push(
            format!("matmul {what} [{tokens} x {cols}] -> {rows}"),
            layer,
            kind,
            c,
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn rms_norm(
        &mut self,
        what: &str,
        layer: Option<usize>,
        kind: &'static str,
        wr: &[f32],
        wt: &B::Buf,
        rows: usize,
        seed: u64,
    ) {
        let x = uniform(rows * wr.len(), seed, 2.0);
        let eps = self.r.config.rms_norm_eps;
        let (ours, reference) = op_check::rms_norm(&self.t.backend, wt, wr, &x, eps);
        let c = Comparison::of(&ours, &reference);
        self.push(format!("rms_norm {what}"), layer, kind, c);
    }

    /// Two sequences prefilled together, then one decode step each.
    fn two_sequence_steps(&self) -> [BatchLayout; 2] {
        let blocks_a: Vec<u32> = (0..(PREFILL + 1).div_ceil(BLOCK) as u32).collect();
        let blocks_b: Vec<u32> = (blocks_a.len() as u32..blocks_a.len() as u32 + 1).collect();
        [
            BatchLayout::packed(
                BLOCK,
                [
                    (PREFILL, 0, blocks_a.clone(), 0),
                    (SHORT, 0, blocks_b.clone(), 1),
                ],
            ),
            BatchLayout::packed(BLOCK, [(1, PREFILL, blocks_a, 0), (1, SHORT, blocks_b, 1)]),
        ]
    }

    fn attention_layer(&mut self, layer: usize, rl: &Layer<ReferenceBackend>, tl: &Layer<B>) {
        let (Mixer::Attention(rw), Mixer::Attention(tw)) = (&rl.mixer, &tl.mixer) else {
            return;
        };
        let kind = "full_attention";
        let l = Some(layer);
        for (name, wr, wt) in [
            ("q_proj (query)", &rw.q, &tw.q),
            ("q_proj (gate)", &rw.gate, &tw.gate),
            ("k_proj", &rw.k, &tw.k),
            ("v_proj", &rw.v, &tw.v),
            ("o_proj", &rw.o, &tw.o),
        ] {
            self.matmul(name, l, kind, wr, wt, PREFILL, 11);
            self.matmul(name, l, kind, wr, wt, 1, 12);
        }
        let shape = self.r.config.attn_shape();
        let d = shape.head_dim;
        self.rms_norm(
            "q_norm",
            l,
            kind,
            &rw.q_norm,
            &tw.q_norm,
            PREFILL * shape.q_heads,
            13,
        );
        self.rms_norm(
            "k_norm",
            l,
            kind,
            &rw.k_norm,
            &tw.k_norm,
            PREFILL * shape.kv_heads,
            14,
        );

        let be = &self.t.backend;
        let positions: Vec<u32> = (0..PREFILL as u32).map(|p| p * 3 + 1).collect();
        let q = uniform(PREFILL * shape.q_heads * d, 15, 1.0);
        let (rot, theta) = (self.r.config.rotary_dim, self.r.config.rope_theta as f32);
        let (ours, reference) = op_check::rope(be, &q, &positions, shape.q_heads, d, rot, theta);
        self.push(
            "rope (partial, neox)",
            l,
            kind,
            Comparison::of(&ours, &reference),
        );

        let steps = self.two_sequence_steps();
        let blocks = (PREFILL + 1).div_ceil(BLOCK) + 1;
        let mut pools = AttentionPools::new(be, blocks, BLOCK, shape.kv_heads, d, be.kv_dtype());
        for (step, batch) in steps.iter().enumerate() {
            let n = batch.total_tokens();
            let q = uniform(n * shape.q_heads * d, 16 + step as u64, 2.0);
            let k = uniform(n * shape.kv_heads * d, 18 + step as u64, 2.0);
            let v = uniform(n * shape.kv_heads * d, 20 + step as u64, 1.0);
            let (ours, reference) = pools.attend(be, &q, &k, &v, batch, shape);
            let what = if step == 0 {
                "attention (prefill, 2 sequences)"
            } else {
                "attention (paged decode)"
            };
            self.push(what, l, kind, Comparison::of(&ours, &reference));
        }

        let gate = uniform(PREFILL * 64, 22, 3.0);
        let x = uniform(PREFILL * 64, 23, 1.0);
        let (ours, reference) = op_check::sigmoid_mul_inplace(&self.t.backend, &x, &gate);
        let c = Comparison::of(&ours, &reference);
        self.push("sigmoid gate", l, kind, c);
    }

    fn gdn_layer(&mut self, layer: usize, rl: &Layer<ReferenceBackend>, tl: &Layer<B>) {
        let (Mixer::Gdn(rw), Mixer::Gdn(tw)) = (&rl.mixer, &tl.mixer) else {
            return;
        };
        let kind = "linear_attention";
        let l = Some(layer);
        for (name, wr, wt) in [
            ("in_proj_qkv", &rw.qkv, &tw.qkv),
            ("in_proj_z", &rw.z, &tw.z),
            ("in_proj_b", &rw.b, &tw.b),
            ("in_proj_a", &rw.a, &tw.a),
            ("out_proj", &rw.out, &tw.out),
        ] {
            self.matmul(name, l, kind, wr, wt, PREFILL, 31);
            self.matmul(name, l, kind, wr, wt, 1, 32);
        }
        let c = &self.r.config;
        let shape = c.gdn_shape();
        let conv_dim = shape.conv_dim();
        let hv = shape.value_heads;
        let steps = self.two_sequence_steps();
        let be = &self.t.backend;
        let mut pools = StatePools::new(
            be,
            2,
            conv_dim,
            c.linear_conv_kernel_dim,
            hv,
            shape.key_dim,
            shape.value_dim,
        );
        for (step, batch) in steps.iter().enumerate() {
            let n = batch.total_tokens();
            let phase = if step == 0 {
                "prefill, chunked"
            } else {
                "decode, recurrent"
            };
            let x = uniform(n * conv_dim, 40 + step as u64, 2.0);
            let (conv, conv_ref) = pools.causal_conv1d(be, &x, &tw.conv, &rw.conv, batch);
            let ((windows, windows_ref), _) = pools.contents(be);
            let cmp =
                Comparison::of(&conv, &conv_ref).worst(Comparison::of(&windows, &windows_ref));
            self.push(format!("causal_conv1d + state ({phase})"), l, kind, cmp);

            let a = uniform(n * hv, 42 + step as u64, 3.0);
            let b = uniform(n * hv, 44 + step as u64, 3.0);
            let ((g, g_ref), (beta, beta_ref)) =
                op_check::gdn_gates(be, &a, &b, &tw.a_log, &rw.a_log, &tw.dt_bias, &rw.dt_bias);
            let cmp = Comparison::of(&g, &g_ref).worst(Comparison::of(&beta, &beta_ref));
            self.push(format!("gdn gates ({phase})"), l, kind, cmp);

            // The delta rule reads the reference's conv output and gates on both sides, so only its
            // own error shows.
            let (out, out_ref) =
                pools.gated_delta_rule(be, &conv_ref, &g_ref, &beta_ref, batch, shape);
            let (_, (states, states_ref)) = pools.contents(be);
            let cmp = Comparison::of(&out, &out_ref).worst(Comparison::of(&states, &states_ref));
            self.push(format!("gated delta rule + state ({phase})"), l, kind, cmp);
            pools.align_to_reference(be);
        }
        let dv = shape.value_dim;
        let x = uniform(PREFILL * hv * dv, 50, 1.0);
        let z = uniform(PREFILL * hv * dv, 51, 3.0);
        let (ours, reference) =
            op_check::gated_rms_norm(be, &tw.norm, &rw.norm, &x, &z, c.rms_norm_eps);
        self.push("gated rms_norm", l, kind, Comparison::of(&ours, &reference));
    }

    fn mlp(
        &mut self,
        layer: Option<usize>,
        kind: &'static str,
        rl: &Layer<ReferenceBackend>,
        tl: &Layer<B>,
    ) {
        self.rms_norm(
            "input_layernorm",
            layer,
            kind,
            &rl.input_norm,
            &tl.input_norm,
            PREFILL,
            60,
        );
        self.rms_norm(
            "post_attention_layernorm",
            layer,
            kind,
            &rl.post_norm,
            &tl.post_norm,
            PREFILL,
            61,
        );
        match (&rl.mlp, &tl.mlp) {
            (Mlp::Dense(r), Mlp::Dense(t)) => {
                for (name, wr, wt) in [
                    ("mlp.gate_proj", &r.gate, &t.gate),
                    ("mlp.up_proj", &r.up, &t.up),
                    ("mlp.down_proj", &r.down, &t.down),
                ] {
                    self.matmul(name, layer, kind, wr, wt, PREFILL, 62);
                    self.matmul(name, layer, kind, wr, wt, 1, 63);
                }
                // The GEMV path runs gate and up as one fused op (matmul_silu_gate) ...
                for (tokens, seed) in [(PREFILL, 65), (1, 66)] {
                    let x = uniform(tokens * r.gate.cols, seed, 1.0);
                    let (ours, reference) = op_check::matmul_silu_gate(
                        &self.t.backend,
                        &t.gate,
                        &t.up,
                        &r.gate,
                        &r.up,
                        &x,
                        tokens,
                        Operands::Exact,
                    );
                    let what = format!("mlp silu(gate) * up [{tokens} x {}]", r.gate.cols);
                    self.push(what, layer, kind, Comparison::of(&ours, &reference));
                }
                // ... inside the whole MLP as one op (dense_mlp), whose activation a backend may
                // hand to the down projection in its own form.
                for (tokens, seed) in [(PREFILL, 67), (1, 68)] {
                    let x = uniform(tokens * r.gate.cols, seed, 1.0);
                    let (ours, reference) = op_check::dense_mlp(
                        &self.t.backend,
                        [&t.gate, &t.up, &t.down],
                        [&r.gate, &r.up, &r.down],
                        &x,
                        tokens,
                        Operands::Exact,
                    );
                    let what = format!("mlp whole [{tokens} x {}]", r.gate.cols);
                    self.push(what, layer, kind, Comparison::of(&ours, &reference));
                }
            }
            (Mlp::Moe(r), Mlp::Moe(t)) => {
                self.matmul(
                    "mlp.gate (router)",
                    layer,
                    kind,
                    &r.router,
                    &t.router,
                    PREFILL,
                    64,
                );
                let experts = r.experts.shape.experts;
                let logits = uniform(PREFILL * experts, 65, 4.0);
                let (rt, rr) = op_check::route_top_k(
                    &self.t.backend,
                    &logits,
                    experts,
                    r.top_k,
                    r.renormalize,
                );
                let same_experts = rr.len() == rt.len()
                    && rr
                        .iter()
                        .zip(&rt)
                        .all(|(a, b)| a.token == b.token && a.expert == b.expert);
                let wr: Vec<f32> = rr.iter().map(|c| c.weight).collect();
                let wt: Vec<f32> = rt.iter().map(|c| c.weight).collect();
                let cmp = if same_experts {
                    Comparison::of(&wt, &wr)
                } else {
                    Comparison {
                        max_abs: f32::INFINITY,
                        relative: f32::INFINITY,
                    }
                };
                self.push("moe routing (softmax top-k)", layer, kind, cmp);
                // The whole routed-experts pass (routing, every chosen expert, the weighted
                // combine) on a prefill and a one-token decode.
                let hidden = r.experts.shape.hidden;
                let routing = MoeRouting {
                    top_k: r.top_k,
                    renormalize: r.renormalize,
                };
                for (tokens, phase) in [(PREFILL, "prefill"), (1, "decode")] {
                    let x = uniform(tokens * hidden, 66, 1.0);
                    let (ours, reference) = op_check::moe_experts(
                        &self.t.backend,
                        &t.experts,
                        &r.experts,
                        &x,
                        &logits[..tokens * experts],
                        routing,
                        Operands::Exact,
                    );
                    let c = Comparison::of(&ours, &reference);
                    self.push(format!("moe experts ({phase})"), layer, kind, c);
                }
                if let (Some((rs, _)), Some((ts, _))) = (&r.shared, &t.shared) {
                    self.matmul(
                        "shared_expert.up_proj",
                        layer,
                        kind,
                        &rs.up,
                        &ts.up,
                        PREFILL,
                        67,
                    );
                }
            }
            _ => {}
        }
    }

    fn elementwise(&mut self) {
        let kind = "model";
        let be = &self.t.backend;
        let n = PREFILL * 64;
        let gate = uniform(n, 70, 4.0);
        let up = uniform(n, 71, 2.0);
        let (ours, reference) = op_check::silu_mul(be, &gate, &up);
        self.push("silu_mul", None, kind, Comparison::of(&ours, &reference));
        let residual = uniform(n, 72, 2.0);
        let (ours, summed) = op_check::add_inplace(be, &residual, &up);
        self.push("residual add", None, kind, Comparison::of(&ours, &summed));
        let rows: Vec<u32> = vec![3, 0, 3, 69];
        let weights = [0.5f32, 1.0, -0.25, 2.0];
        let (ours, gathered) = op_check::gather_rows(be, &gate, 64, &rows);
        self.push("gather_rows", None, kind, Comparison::of(&ours, &gathered));
        let (ours, scattered) =
            op_check::scatter_add_rows(be, &summed, &gathered, 64, &rows, &weights);
        self.push(
            "scatter_add_rows",
            None,
            kind,
            Comparison::of(&ours, &scattered),
        );
        let row_gates = uniform(PREFILL, 73, 3.0);
        let (ours, reference) = op_check::sigmoid_scale_rows(be, &scattered, &row_gates, 64);
        self.push(
            "sigmoid_scale_rows",
            None,
            kind,
            Comparison::of(&ours, &reference),
        );
        let (ours, reference) = op_check::concat_cols(be, &gate, &up, 64, 64);
        self.push("concat_cols", None, kind, Comparison::of(&ours, &reference));
    }

    fn head(&mut self) {
        let c = &self.r.config;
        let ids = token_ids(PREFILL, c.vocab_size, 80);
        let (ours, reference) = op_check::embedding(
            &self.t.backend,
            &self.t.weights.embed,
            &self.r.weights.embed,
            &ids,
        );
        self.push(
            "embedding",
            None,
            "model",
            Comparison::of(&ours, &reference),
        );
        self.rms_norm(
            "final norm",
            None,
            "model",
            &self.r.weights.norm,
            &self.t.weights.norm,
            PREFILL,
            81,
        );
        let (hr, ht) = (
            self.r
                .weights
                .lm_head
                .as_ref()
                .unwrap_or(&self.r.weights.embed),
            self.t
                .weights
                .lm_head
                .as_ref()
                .unwrap_or(&self.t.weights.embed),
        );
        self.matmul("lm_head", None, "model", hr, ht, 3, 82);
        if let (Some(mr), Some(mt)) = (&self.r.weights.mtp, &self.t.weights.mtp) {
            self.matmul("mtp.fc", None, "mtp", &mr.fc, &mt.fc, 2, 83);
            self.attention_layer_mtp(mr, mt);
        }
    }

    fn attention_layer_mtp(
        &mut self,
        mr: &deltaserve_model::weights::MtpWeights<ReferenceBackend>,
        mt: &deltaserve_model::weights::MtpWeights<B>,
    ) {
        if let (Mixer::Attention(rw), Mixer::Attention(tw)) = (&mr.layer.mixer, &mt.layer.mixer) {
            self.matmul("mtp q_proj (query)", None, "mtp", &rw.q, &tw.q, 1, 84);
            self.matmul("mtp o_proj", None, "mtp", &rw.o, &tw.o, 1, 85);
        }
    }
}

/// Checks every op of `target`'s backend against `reference` on the same weights. Rows come in
/// model order: embedding and head, the first GDN layer, the first full-attention layer (and their
/// MLPs), generic element-wise ops.
pub fn check_ops<B: Backend>(
    reference: &Model<ReferenceBackend>,
    target: &Model<B>,
    tolerance: f32,
) -> Vec<CheckRow> {
    let mut checker = Checker {
        r: reference,
        t: target,
        tolerance,
        rows: Vec::new(),
    };
    checker.head();
    let c = &reference.config;
    let first_of = |full: bool| (0..c.num_hidden_layers).find(|&i| c.is_full_attention(i) == full);
    let mut chosen: Vec<usize> = [first_of(false), first_of(true)]
        .into_iter()
        .flatten()
        .collect();
    chosen.sort_unstable();
    for layer in chosen {
        let (rl, tl) = (
            &reference.weights.layers[layer],
            &target.weights.layers[layer],
        );
        let kind = if c.is_full_attention(layer) {
            "full_attention"
        } else {
            "linear_attention"
        };
        checker.gdn_layer(layer, rl, tl);
        checker.attention_layer(layer, rl, tl);
        checker.mlp(Some(layer), kind, rl, tl);
    }
    checker.elementwise();
    checker.rows
}
