//! The model's weights on a backend, built from any `TensorSource` (checkpoint or dummy). This is
//! where checkpoint layouts are unified: Qwen3-Next's fused projections are reordered into the
//! Qwen3.5 split layout, the per-head interleaved query/gate rows are separated, and packed or
//! per-expert MoE tensors become one list of experts. Every tensor is shape-checked on the way.

use crate::config::{LayerKind, ModelConfig};
use crate::draft_fp8::DRAFT_HEAD;
use crate::error::LoadError;
use crate::source::TensorSource;
use crate::tp::Shard;
use deltaserve_tensor::{
    Backend, ExpertShape, ExpertTensors, ExpertWeights, Experts, GeneratedMatrix, HostTensor,
};

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
    /// The draft model's own output head (`--speculative-draft-model-quantization fp8`: the
    /// trunk's head in block FP8, split like it); `None`: drafting uses the trunk's head.
    pub draft_head: Option<B::Mat>,
}

pub struct Weights<B: Backend> {
    /// `[vocab, hidden]`; split over tensor-parallel ranks: this rank's `vocab / N` rows and a
    /// row of zeros.
    pub embed: B::Mat,
    pub layers: Vec<Layer<B>>,
    pub norm: B::Buf,
    /// `[vocab, hidden]` (this rank's `vocab / N` rows when split); `None` when tied to `embed`
    /// and unsplit.
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

/// `share`, `shard`'s part of `whole`, when it keeps the block-FP8 codes and scales that
/// `whole` has (its ends on scale-block boundaries); a share that would cut a block stops the
/// load naming the tensor, rather than running that matrix dequantized. `part` describes the
/// share for the message.
fn fp8_share(
    shard: Shard,
    whole: &HostTensor,
    share: HostTensor,
    part: impl FnOnce() -> String,
) -> Result<HostTensor, LoadError> {
    match whole.block_fp8() {
        Some(fp8) if share.block_fp8().is_none() && !shard.is_whole() => {
            Err(LoadError::Fp8BlockSplit {
                tp_size: shard.size,
                rank: shard.rank,
                tensor: whole.name.clone(),
                shape: whole.shape.clone(),
                part: part(),
                block: fp8.block,
            })
        }
        _ => Ok(share),
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
    /// The part of each tensor to keep (tensor parallelism); `Shard::WHOLE` keeps everything.
    shard: Shard,
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

    /// A column-parallel shard: the rows `ranges` of matrix `name` (the whole matrix when unsplit).
    fn mat_rows(
        &mut self,
        name: &str,
        shape: [usize; 2],
        ranges: &[(usize, usize)],
    ) -> Result<B::Mat, LoadError> {
        if self.shard.is_whole() {
            return self.mat(name, shape);
        }
        let t = self.host(name, &shape)?;
        let share = fp8_share(self.shard, &t, t.gather_rows(ranges), || {
            format!("rows {ranges:?}")
        })?;
        self.mat_from(&share)
    }

    /// A row-parallel shard: columns `[from, to)` of matrix `name` (the whole matrix when unsplit).
    fn mat_cols(
        &mut self,
        name: &str,
        shape: [usize; 2],
        (from, to): (usize, usize),
    ) -> Result<B::Mat, LoadError> {
        if self.shard.is_whole() {
            return self.mat(name, shape);
        }
        let t = self.host(name, &shape)?;
        let share = fp8_share(self.shard, &t, t.cols(from, to), || {
            format!("columns [{from}, {to})")
        })?;
        self.mat_from(&share)
    }

    /// The entries `ranges` (along dimension 0) of parameter `name`.
    fn vec_rows(
        &mut self,
        name: &str,
        shape: &[usize],
        ranges: &[(usize, usize)],
    ) -> Result<B::Buf, LoadError> {
        let t = self.host(name, shape)?;
        if self.shard.is_whole() {
            return self.vec_from(&t);
        }
        self.vec_from(&t.gather_rows(ranges))
    }

    /// gate and up column-parallel, down row-parallel, over the intermediate width.
    fn dense(&mut self, prefix: &str, intermediate: usize) -> Result<DenseMlp<B>, LoadError> {
        let h = self.config.hidden_size;
        let mine = self.shard.range(intermediate);
        Ok(DenseMlp {
            gate: self.mat_rows(
                &format!("{prefix}.gate_proj.weight"),
                [intermediate, h],
                &[mine],
            )?,
            up: self.mat_rows(
                &format!("{prefix}.up_proj.weight"),
                [intermediate, h],
                &[mine],
            )?,
            down: self.mat_cols(
                &format!("{prefix}.down_proj.weight"),
                [h, intermediate],
                mine,
            )?,
        })
    }

    fn attention(&mut self, prefix: &str) -> Result<AttentionWeights<B>, LoadError> {
        let c = self.config;
        let (h, d) = (c.hidden_size, c.head_dim);
        let (nq, nkv) = (c.num_attention_heads, c.num_key_value_heads);
        // Column-parallel by heads: this rank's query heads (with their gates) and KV heads (a
        // copy of the one they read when there are fewer KV heads than ranks); o_proj
        // row-parallel over the same query heads.
        let (q_from, q_to) = self.shard.range(nq);
        let (kv_from, kv_to) = self.shard.kv_range(nkv);
        let kv_rows = [(kv_from * d, kv_to * d)];
        // q_proj rows are interleaved per head: [q_h0 | gate_h0 | q_h1 | gate_h1 | ...].
        let q_and_gate = self.host(&format!("{prefix}.q_proj.weight"), &[nq * d * 2, h])?;
        let q_rows: Vec<_> = (q_from..q_to).map(|i| (2 * i * d, 2 * i * d + d)).collect();
        let gate_rows: Vec<_> = (q_from..q_to)
            .map(|i| (2 * i * d + d, 2 * (i + 1) * d))
            .collect();
        Ok(AttentionWeights {
            q: self.mat_from(&q_and_gate.gather_rows(&q_rows))?,
            gate: self.mat_from(&q_and_gate.gather_rows(&gate_rows))?,
            k: self.mat_rows(&format!("{prefix}.k_proj.weight"), [nkv * d, h], &kv_rows)?,
            v: self.mat_rows(&format!("{prefix}.v_proj.weight"), [nkv * d, h], &kv_rows)?,
            o: self.mat_cols(
                &format!("{prefix}.o_proj.weight"),
                [h, nq * d],
                (q_from * d, q_to * d),
            )?,
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
        // Each rank owns whole key-head groups (key heads [g_from, g_to)) and their value heads
        // [v_from, v_to) (value head h reads key head h / r, so they are contiguous too). The
        // q | k | v channels (projection rows and conv filters) are split per segment.
        let (g_from, g_to) = self.shard.range(hk);
        let (v_from, v_to) = self.shard.range(hv);
        let qkv_mine = [
            (g_from * dk, g_to * dk),
            (key_len + g_from * dk, key_len + g_to * dk),
            (2 * key_len + v_from * dv, 2 * key_len + v_to * dv),
        ];
        let value_heads_mine = [(v_from, v_to)];
        let fused = format!("{prefix}.in_proj_qkvz.weight");
        let (qkv, z, b, a) = if self.source.contains(&fused) {
            // Qwen3-Next: rows grouped per key head g as [q_g | k_g | v_g (r heads) | z_g (r heads)],
            // and in_proj_ba as [b_g (r) | a_g (r)], with r = HV / HK. Regroup into q | k | v and z.
            let r = hv / hk;
            let group = 2 * dk + 2 * r * dv;
            let qkvz = self.host(&fused, &[2 * key_len + 2 * value_len, h])?;
            let part = |offset: usize, len: usize| -> Vec<(usize, usize)> {
                (g_from..g_to)
                    .map(|g| (g * group + offset, g * group + offset + len))
                    .collect()
            };
            let qkv_rows: Vec<_> = [part(0, dk), part(dk, dk), part(2 * dk, r * dv)].concat();
            let ba = self.host(&format!("{prefix}.in_proj_ba.weight"), &[2 * hv, h])?;
            let ba_part = |offset: usize| -> Vec<(usize, usize)> {
                (g_from..g_to)
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
                self.mat_rows(
                    &format!("{prefix}.in_proj_qkv.weight"),
                    [conv_dim, h],
                    &qkv_mine,
                )?,
                self.mat_rows(
                    &format!("{prefix}.in_proj_z.weight"),
                    [value_len, h],
                    &[(v_from * dv, v_to * dv)],
                )?,
                self.mat_rows(
                    &format!("{prefix}.in_proj_b.weight"),
                    [hv, h],
                    &value_heads_mine,
                )?,
                self.mat_rows(
                    &format!("{prefix}.in_proj_a.weight"),
                    [hv, h],
                    &value_heads_mine,
                )?,
            )
        };
        Ok(GdnWeights {
            qkv,
            z,
            b,
            a,
            conv: self.vec_rows(
                &format!("{prefix}.conv1d.weight"),
                &[conv_dim, 1, kernel],
                &qkv_mine,
            )?,
            dt_bias: self.vec_rows(&format!("{prefix}.dt_bias"), &[hv], &value_heads_mine)?,
            a_log: self.vec_rows(&format!("{prefix}.A_log"), &[hv], &value_heads_mine)?,
            // The gated norm is per value head over dv: every rank holds it whole.
            norm: self.vec(&format!("{prefix}.norm.weight"), &[dv])?,
            out: self.mat_cols(
                &format!("{prefix}.out_proj.weight"),
                [h, value_len],
                (v_from * dv, v_to * dv),
            )?,
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
        // Tensor parallelism: each expert keeps its share [i_from, i_to) of the intermediate width
        // (gate and up rows, down columns), like a dense MLP.
        let (shard, whole) = (self.shard, self.shard.is_whole());
        let (i_from, i_to) = shard.range(im);
        let local = ExpertShape {
            intermediate: i_to - i_from,
            ..shape
        };
        let down_share = |down: HostTensor| {
            if whole {
                Ok(down)
            } else {
                let share = down.cols(i_from, i_to);
                fp8_share(shard, &down, share, || {
                    format!("columns [{i_from}, {i_to})")
                })
            }
        };
        let gate_up_share = |matrix: HostTensor, from: usize, to: usize| {
            let share = matrix.rows(from, to);
            fp8_share(shard, &matrix, share, || format!("rows [{from}, {to})"))
        };
        let packed = format!("{prefix}.experts.gate_up_proj");
        let packed_down = format!("{prefix}.experts.down_proj");
        if self.source.contains(&packed) {
            let generated = self
                .source
                .generated_matrix(&packed, [e * 2 * im, h])
                .zip(self.source.generated_matrix(&packed_down, [e * h, im]))
                .filter(|(gate_up, down)| {
                    whole
                        && stack_tiles_stay_in_one_matrix(gate_up, 2 * im)
                        && stack_tiles_stay_in_one_matrix(down, h)
                });
            if let Some((gate_up, down)) = generated {
                if let Some(experts) = self.backend.generate_experts(&gate_up, &down, shape) {
                    self.done += 2;
                    (self.progress)(self.done, self.total);
                    return Ok(experts?);
                }
            }
            let gate_up = self.host(&packed, &[e, 2 * im, h])?;
            let down = self.host(&packed_down, &[e, h, im])?;
            let tensors = (0..e)
                .map(|i| {
                    let gu = gate_up.rows(i, i + 1).reshaped(vec![2 * im, h]);
                    Ok(ExpertTensors {
                        gate: gate_up_share(gu.clone(), i_from, i_to)?,
                        up: gate_up_share(gu, im + i_from, im + i_to)?,
                        down: down_share(down.rows(i, i + 1).reshaped(vec![h, im]))?,
                    })
                })
                .collect::<Result<Vec<_>, LoadError>>()?;
            return Ok(self.backend.load_experts(&tensors, local)?);
        }
        let mut tensors = Vec::with_capacity(e);
        for i in 0..e {
            let p = format!("{prefix}.experts.{i}");
            let gate = self.host(&format!("{p}.gate_proj.weight"), &[im, h])?;
            let up = self.host(&format!("{p}.up_proj.weight"), &[im, h])?;
            let down = self.host(&format!("{p}.down_proj.weight"), &[h, im])?;
            tensors.push(ExpertTensors {
                gate: gate_up_share(gate, i_from, i_to)?,
                up: gate_up_share(up, i_from, i_to)?,
                down: down_share(down)?,
            });
        }
        Ok(self.backend.load_experts(&tensors, local)?)
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
        // Every expert is split inside like a dense MLP (its intermediate width, in `experts`);
        // the router and the shared expert's scalar gate are replicated.
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
        Self::load_shard(backend, config, source, load_mtp, Shard::WHOLE, progress)
    }

    /// Loads one tensor-parallel rank's share of every tensor (`config` is the whole model's;
    /// `crate::tp::rank_config` must have accepted the split). The vocabulary-split embedding gets
    /// one extra row of zeros, which every token outside the rank's range is looked up as.
    pub fn load_shard(
        backend: &B,
        config: &ModelConfig,
        source: &dyn TensorSource,
        load_mtp: bool,
        shard: Shard,
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
            shard,
        };
        let (embed, tied_head) = if shard.is_whole() {
            (b.mat("embed_tokens.weight", [v, h])?, None)
        } else {
            let (from, to) = shard.range(v);
            let mine = b.host("embed_tokens.weight", &[v, h])?.rows(from, to);
            let embed = b.mat_from(&mine.with_zero_rows(1))?;
            // A tied head reads the same rows without the zero row.
            let head = if config.tie_word_embeddings {
                Some(b.mat_from(&mine)?)
            } else {
                None
            };
            (embed, head)
        };
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
            tied_head
        } else {
            Some(b.mat_rows("lm_head.weight", [v, h], &[shard.range(v)])?)
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
                draft_head: if source.contains(DRAFT_HEAD) {
                    let rows = config.draft_vocab_size();
                    Some(b.mat_rows(DRAFT_HEAD, [rows, h], &[shard.range(rows)])?)
                } else {
                    None
                },
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

/// Whether a stack of matrices of `rows_each` rows, generated as one matrix, may be quantized as
/// one: its block-FP8 tiles (when asked for) then each lie inside one matrix, so the codes and
/// scales are those of quantizing each matrix alone.
fn stack_tiles_stay_in_one_matrix(spec: &GeneratedMatrix, rows_each: usize) -> bool {
    spec.block_fp8
        .is_none_or(|[block_rows, _]| rows_each.is_multiple_of(block_rows))
}
