//! The model's weights on a backend, built from any `TensorSource` (checkpoint or dummy). This is
//! where checkpoint layouts are unified: Qwen3-Next's fused projections are reordered into the
//! Qwen3.5 split layout, the per-head interleaved query/gate rows are separated, and packed or
//! per-expert MoE tensors become one list of experts. Every tensor is shape-checked on the way.

use crate::config::{LayerKind, ModelConfig};
use crate::error::LoadError;
use crate::source::TensorSource;
use deltaserve_tensor::{Backend, ExpertShape, ExpertTensors, ExpertWeights, Experts, HostTensor};

/// Weights of a gated full-attention block (`self_attn.*`).
pub struct AttentionWeights<B: Backend> {
    /// `[q_heads*head_dim, hidden]`: the query half of `q_proj`.
    pub q: B::Mat,
    /// `[q_heads*head_dim, hidden]`: the output-gate half of `q_proj`.
    pub gate: B::Mat,
    pub k: B::Mat,
    pub v: B::Mat,
    pub o: B::Mat,
    pub q_norm: B::Buf,
    pub k_norm: B::Buf,
}

/// Weights of a Gated DeltaNet block (`linear_attn.*`) in the Qwen3.5 split layout.
pub struct GdnWeights<B: Backend> {
    /// `[conv_dim, hidden]`: q | k | v channels.
    pub qkv: B::Mat,
    /// `[value_heads*value_dim, hidden]`
    pub z: B::Mat,
    /// `[value_heads, hidden]`
    pub b: B::Mat,
    /// `[value_heads, hidden]`
    pub a: B::Mat,
    /// `[conv_dim, kernel]`
    pub conv: B::Buf,
    pub dt_bias: B::Buf,
    pub a_log: B::Buf,
    /// `[value_dim]`, plain (not 1+w) gated norm weight.
    pub norm: B::Buf,
    /// `[hidden, value_heads*value_dim]`
    pub out: B::Mat,
}

pub enum Mixer<B: Backend> {
    Attention(AttentionWeights<B>),
    Gdn(GdnWeights<B>),
}

/// SwiGLU MLP: `down(silu(gate x) * up x)`.
pub struct DenseMlp<B: Backend> {
    pub gate: B::Mat,
    pub up: B::Mat,
    pub down: B::Mat,
}

pub struct MoeMlp<B: Backend> {
    /// `[experts, hidden]`
    pub router: B::Mat,
    pub experts: Experts<B::Mat>,
    /// The shared expert and its scalar sigmoid gate `[1, hidden]`.
    pub shared: Option<(DenseMlp<B>, B::Mat)>,
    pub top_k: usize,
    pub renormalize: bool,
}

pub enum Mlp<B: Backend> {
    Dense(DenseMlp<B>),
    Moe(MoeMlp<B>),
}

pub struct Layer<B: Backend> {
    pub input_norm: B::Buf,
    pub post_norm: B::Buf,
    pub mixer: Mixer<B>,
    pub mlp: Mlp<B>,
}

/// The MTP head (`mtp.*`): predicts token t+2 from the trunk's post-norm hidden of t and token t+1.
pub struct MtpWeights<B: Backend> {
    /// `[hidden, 2*hidden]`, applied to `concat(norm(embed), norm(hidden))`.
    pub fc: B::Mat,
    pub pre_fc_norm_embedding: B::Buf,
    pub pre_fc_norm_hidden: B::Buf,
    /// One full-attention decoder layer.
    pub layer: Layer<B>,
    pub norm: B::Buf,
}

pub struct Weights<B: Backend> {
    /// `[vocab, hidden]`
    pub embed: B::Mat,
    pub layers: Vec<Layer<B>>,
    pub norm: B::Buf,
    /// `[vocab, hidden]`; `None` when tied to `embed`.
    pub lm_head: Option<B::Mat>,
    pub mtp: Option<MtpWeights<B>>,
}

impl<B: Backend> Weights<B> {
    /// Whether every MoE block (trunk and MTP) runs its routed experts without the host: their
    /// weights are stacked for a backend's fused kernels. The generic path routes on the host,
    /// which a recorded step cannot do.
    pub fn moe_stays_on_device(&self) -> bool {
        let trunk = self.layers.iter();
        let mtp = self.mtp.iter().map(|m| &m.layer);
        trunk.chain(mtp).all(|layer| match &layer.mlp {
            Mlp::Dense(_) => true,
            Mlp::Moe(moe) => matches!(moe.experts.weights, ExpertWeights::Stacked { .. }),
        })
    }
}

/// Loads tensors from a source through a backend, counting progress.
struct Builder<'a, B: Backend> {
    backend: &'a B,
    source: &'a dyn TensorSource,
    config: &'a ModelConfig,
    progress: &'a mut dyn FnMut(usize, usize),
    done: usize,
    total: usize,
}

impl<B: Backend> Builder<'_, B> {
    fn host(&mut self, name: &str, shape: &[usize]) -> Result<HostTensor, LoadError> {
        let t = self.source.get(name, shape)?;
        self.done += 1;
        (self.progress)(self.done, self.total);
        Ok(t)
    }

    fn mat_from(&self, t: &HostTensor) -> Result<B::Mat, LoadError> {
        Ok(self.backend.load_mat(t)?)
    }

    fn vec_from(&self, t: &HostTensor) -> Result<B::Buf, LoadError> {
        Ok(self.backend.load_vec(t)?)
    }

    fn mat(&mut self, name: &str, shape: [usize; 2]) -> Result<B::Mat, LoadError> {
        if let Some(spec) = self.source.generated_matrix(name, shape) {
            if let Some(generated) = self.backend.generate_mat(&spec) {
                self.done += 1;
                (self.progress)(self.done, self.total);
                return Ok(generated?);
            }
        }
        let t = self.host(name, &shape)?;
        self.mat_from(&t)
    }

    fn vec(&mut self, name: &str, shape: &[usize]) -> Result<B::Buf, LoadError> {
        let t = self.host(name, shape)?;
        self.vec_from(&t)
    }

    fn dense(&mut self, prefix: &str, intermediate: usize) -> Result<DenseMlp<B>, LoadError> {
        let h = self.config.hidden_size;
        Ok(DenseMlp {
            gate: self.mat(&format!("{prefix}.gate_proj.weight"), [intermediate, h])?,
            up: self.mat(&format!("{prefix}.up_proj.weight"), [intermediate, h])?,
            down: self.mat(&format!("{prefix}.down_proj.weight"), [h, intermediate])?,
        })
    }

    fn attention(&mut self, prefix: &str) -> Result<AttentionWeights<B>, LoadError> {
        let c = self.config;
        let (h, d) = (c.hidden_size, c.head_dim);
        let (nq, nkv) = (c.num_attention_heads, c.num_key_value_heads);
        // q_proj rows are interleaved per head: [q_h0 | gate_h0 | q_h1 | gate_h1 | ...].
        let q_and_gate = self.host(&format!("{prefix}.q_proj.weight"), &[nq * d * 2, h])?;
        let q_rows: Vec<_> = (0..nq).map(|i| (2 * i * d, 2 * i * d + d)).collect();
        let gate_rows: Vec<_> = (0..nq).map(|i| (2 * i * d + d, 2 * (i + 1) * d)).collect();
        Ok(AttentionWeights {
            q: self.mat_from(&q_and_gate.gather_rows(&q_rows))?,
            gate: self.mat_from(&q_and_gate.gather_rows(&gate_rows))?,
            k: self.mat(&format!("{prefix}.k_proj.weight"), [nkv * d, h])?,
            v: self.mat(&format!("{prefix}.v_proj.weight"), [nkv * d, h])?,
            o: self.mat(&format!("{prefix}.o_proj.weight"), [h, nq * d])?,
            q_norm: self.vec(&format!("{prefix}.q_norm.weight"), &[d])?,
            k_norm: self.vec(&format!("{prefix}.k_norm.weight"), &[d])?,
        })
    }

    fn gdn(&mut self, prefix: &str) -> Result<GdnWeights<B>, LoadError> {
        let c = self.config;
        let h = c.hidden_size;
        let shape = c.gdn_shape();
        let (hk, hv, dk, dv) = (
            shape.key_heads,
            shape.value_heads,
            shape.key_dim,
            shape.value_dim,
        );
        let (key_len, value_len, conv_dim) = (hk * dk, hv * dv, shape.conv_dim());
        let kernel = c.linear_conv_kernel_dim;
        let fused = format!("{prefix}.in_proj_qkvz.weight");
        let (qkv, z, b, a) = if self.source.contains(&fused) {
            // Qwen3-Next: rows grouped per key head g as [q_g | k_g | v_g (r heads) | z_g (r heads)],
            // and in_proj_ba as [b_g (r) | a_g (r)], with r = HV / HK. Regroup into q | k | v and z.
            let r = hv / hk;
            let group = 2 * dk + 2 * r * dv;
            let qkvz = self.host(&fused, &[2 * key_len + 2 * value_len, h])?;
            let part = |offset: usize, len: usize| -> Vec<(usize, usize)> {
                (0..hk)
                    .map(|g| (g * group + offset, g * group + offset + len))
                    .collect()
            };
            let qkv_rows: Vec<_> = [part(0, dk), part(dk, dk), part(2 * dk, r * dv)].concat();
            let ba = self.host(&format!("{prefix}.in_proj_ba.weight"), &[2 * hv, h])?;
            let ba_part = |offset: usize| -> Vec<(usize, usize)> {
                (0..hk)
                    .map(|g| (g * 2 * r + offset, g * 2 * r + offset + r))
                    .collect()
            };
            (
                self.mat_from(&qkvz.gather_rows(&qkv_rows))?,
                self.mat_from(&qkvz.gather_rows(&part(2 * dk + r * dv, r * dv)))?,
                self.mat_from(&ba.gather_rows(&ba_part(0)))?,
                self.mat_from(&ba.gather_rows(&ba_part(r)))?,
            )
        } else {
            (
                self.mat(&format!("{prefix}.in_proj_qkv.weight"), [conv_dim, h])?,
                self.mat(&format!("{prefix}.in_proj_z.weight"), [value_len, h])?,
                self.mat(&format!("{prefix}.in_proj_b.weight"), [hv, h])?,
                self.mat(&format!("{prefix}.in_proj_a.weight"), [hv, h])?,
            )
        };
        Ok(GdnWeights {
            qkv,
            z,
            b,
            a,
            conv: self.vec(&format!("{prefix}.conv1d.weight"), &[conv_dim, 1, kernel])?,
            dt_bias: self.vec(&format!("{prefix}.dt_bias"), &[hv])?,
            a_log: self.vec(&format!("{prefix}.A_log"), &[hv])?,
            norm: self.vec(&format!("{prefix}.norm.weight"), &[dv])?,
            out: self.mat(&format!("{prefix}.out_proj.weight"), [h, value_len])?,
        })
    }

    /// The routed experts, from packed `experts.gate_up_proj [E, 2 * im, h]` / `experts.down_proj
    /// [E, h, im]` or from per-expert `experts.{i}.{gate,up,down}_proj.weight`; generated on the
    /// device when the source and the backend can.
    fn experts(&mut self, prefix: &str, shape: ExpertShape) -> Result<Experts<B::Mat>, LoadError> {
        let ExpertShape {
            experts: e,
            intermediate: im,
            hidden: h,
        } = shape;
        let packed = format!("{prefix}.experts.gate_up_proj");
        let packed_down = format!("{prefix}.experts.down_proj");
        if self.source.contains(&packed) {
            let generated = self
                .source
                .generated_matrix(&packed, [e * 2 * im, h])
                .zip(self.source.generated_matrix(&packed_down, [e * h, im]));
            if let Some((gate_up, down)) = generated {
                if let Some(experts) = self.backend.generate_experts(&gate_up, &down, shape) {
                    self.done += 2;
                    (self.progress)(self.done, self.total);
                    return Ok(experts?);
                }
            }
            let gate_up = self.host(&packed, &[e, 2 * im, h])?;
            let down = self.host(&packed_down, &[e, h, im])?;
            let tensors: Vec<ExpertTensors> = (0..e)
                .map(|i| {
                    let gu = gate_up.rows(i, i + 1).reshaped(vec![2 * im, h]);
                    ExpertTensors {
                        gate: gu.rows(0, im),
                        up: gu.rows(im, 2 * im),
                        down: down.rows(i, i + 1).reshaped(vec![h, im]),
                    }
                })
                .collect();
            return Ok(self.backend.load_experts(&tensors, shape)?);
        }
        let mut tensors = Vec::with_capacity(e);
        for i in 0..e {
            let p = format!("{prefix}.experts.{i}");
            tensors.push(ExpertTensors {
                gate: self.host(&format!("{p}.gate_proj.weight"), &[im, h])?,
                up: self.host(&format!("{p}.up_proj.weight"), &[im, h])?,
                down: self.host(&format!("{p}.down_proj.weight"), &[h, im])?,
            });
        }
        Ok(self.backend.load_experts(&tensors, shape)?)
    }

    fn moe(&mut self, prefix: &str) -> Result<MoeMlp<B>, LoadError> {
        let c = self.config;
        let h = c.hidden_size;
        let moe = c.moe.as_ref().ok_or_else(|| LoadError::Config {
            file: self.source.describe().into(),
            field: "num_experts".into(),
            message: "layer is MoE but the config has no MoE fields".into(),
        })?;
        let (e, im) = (moe.num_experts, moe.moe_intermediate_size);
        let experts = self.experts(
            prefix,
            ExpertShape {
                experts: e,
                intermediate: im,
                hidden: h,
            },
        )?;
        let shared = if moe.shared_expert_intermediate_size > 0 {
            let mlp = self.dense(
                &format!("{prefix}.shared_expert"),
                moe.shared_expert_intermediate_size,
            )?;
            let gate = self.mat(&format!("{prefix}.shared_expert_gate.weight"), [1, h])?;
            Some((mlp, gate))
        } else {
            None
        };
        Ok(MoeMlp {
            router: self.mat(&format!("{prefix}.gate.weight"), [e, h])?,
            experts,
            shared,
            top_k: moe.top_k,
            renormalize: moe.renormalize,
        })
    }

    fn layer(&mut self, prefix: &str, kind: LayerKind, moe: bool) -> Result<Layer<B>, LoadError> {
        let h = self.config.hidden_size;
        let mixer = match kind {
            LayerKind::FullAttention => {
                Mixer::Attention(self.attention(&format!("{prefix}.self_attn"))?)
            }
            LayerKind::LinearAttention => Mixer::Gdn(self.gdn(&format!("{prefix}.linear_attn"))?),
        };
        let mlp = if moe {
            Mlp::Moe(self.moe(&format!("{prefix}.mlp"))?)
        } else {
            Mlp::Dense(self.dense(&format!("{prefix}.mlp"), self.config.intermediate_size)?)
        };
        Ok(Layer {
            input_norm: self.vec(&format!("{prefix}.input_layernorm.weight"), &[h])?,
            post_norm: self.vec(&format!("{prefix}.post_attention_layernorm.weight"), &[h])?,
            mixer,
            mlp,
        })
    }
}

fn layer_is_moe(config: &ModelConfig, layer: usize) -> bool {
    config
        .moe
        .as_ref()
        .is_some_and(|m| m.layer_is_moe.get(layer).copied().unwrap_or(false))
}

impl<B: Backend> Weights<B> {
    /// Loads every tensor the config calls for. `load_mtp` skips the MTP head when false (it is also
    /// skipped when the config declares none). `progress(done, total)` is called per tensor.
    pub fn load(
        backend: &B,
        config: &ModelConfig,
        source: &dyn TensorSource,
        load_mtp: bool,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self, LoadError> {
        let (v, h) = (config.vocab_size, config.hidden_size);
        let with_mtp = load_mtp && config.mtp_num_hidden_layers > 0;
        // A rough tensor count for the progress bar: ~14 per layer.
        let total = 3 + config.num_hidden_layers * 14 + if with_mtp { 16 } else { 0 };
        let mut b = Builder {
            backend,
            source,
            config,
            progress,
            done: 0,
            total,
        };
        let embed = b.mat("embed_tokens.weight", [v, h])?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                b.layer(
                    &format!("layers.{i}"),
                    config.layer_types[i],
                    layer_is_moe(config, i),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let norm = b.vec("norm.weight", &[h])?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            Some(b.mat("lm_head.weight", [v, h])?)
        };
        let mtp = if with_mtp {
            // The MTP layer's MLP has the same kind as the trunk's (MoE for MoE models).
            let moe = config.moe.is_some();
            Some(MtpWeights {
                fc: b.mat("mtp.fc.weight", [h, 2 * h])?,
                pre_fc_norm_embedding: b.vec("mtp.pre_fc_norm_embedding.weight", &[h])?,
                pre_fc_norm_hidden: b.vec("mtp.pre_fc_norm_hidden.weight", &[h])?,
                layer: b.layer("mtp.layers.0", LayerKind::FullAttention, moe)?,
                norm: b.vec("mtp.norm.weight", &[h])?,
            })
        } else {
            None
        };
        Ok(Weights {
            embed,
            layers,
            norm,
            lm_head,
            mtp,
        })
    }
}
