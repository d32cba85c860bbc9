//! `Fp8Quantization`: the block-FP8 scheme of Qwen's FP8 releases, as config.json's
//! `quantization_config` states it (`quant_method: "fp8"`, `fmt: "e4m3"`, `activation_scheme:
//! "dynamic"`, `weight_block_size: [128, 128]`, `modules_to_not_convert`), or as `--quantization
//! fp8` applies it to a bf16 checkpoint. Parsing and validation live in config.rs with the other
//! fields; the block arithmetic in block_fp8.rs.

use crate::source::checkpoint_names;

/// The one block shape deltaserve accepts: Qwen's (and DeepSeek-V3's) `[128, 128]`. The later GPU
/// kernels read whole 128-column scale blocks, so another shape is refused at start-up rather than
/// loaded through a path nothing else supports.
pub const FP8_BLOCK: [usize; 2] = [128, 128];

/// What Qwen's FP8 configs list in `modules_to_not_convert` (module names, matched as whole dotted
/// components): the embedding and `lm_head`, the MoE router `mlp.gate` and `shared_expert_gate`, the
/// GDN `conv1d` and `in_proj_a`/`in_proj_b` (Qwen3-Next: `in_proj_ba`), `mtp.fc`, and the vision
/// tower. Used by `--quantization fp8`, where the checkpoint has no list of its own.
pub const QWEN_MODULES_NOT_CONVERTED: &[&str] = &[
    "lm_head",
    "embed_tokens",
    "mlp.gate",
    "shared_expert_gate",
    "linear_attn.conv1d",
    "linear_attn.in_proj_a",
    "linear_attn.in_proj_b",
    "linear_attn.in_proj_ba",
    "mtp.fc",
    "visual",
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fp8Quantization {
    /// `weight_block_size` as `[rows, cols]` of `[out, in]` weights: always `FP8_BLOCK` once parsed.
    pub block: [usize; 2],
    /// Module names (or dotted suffixes / prefixes of them) that stay unquantized.
    pub modules_to_not_convert: Vec<String>,
}

impl Fp8Quantization {
    /// The scheme `--quantization fp8` applies to a bf16 checkpoint: 128 x 128 blocks, Qwen's list
    /// of unconverted modules.
    pub fn qwen_default() -> Self {
        Self {
            block: FP8_BLOCK,
            modules_to_not_convert: QWEN_MODULES_NOT_CONVERTED
                .iter()
                .map(|s| s.to_string())
                .collect(),
        }
    }

    /// Whether the weight `tensor` (a checkpoint or canonical name, e.g.
    /// `model.language_model.layers.0.mlp.gate.weight` or `layers.0.mlp.gate.weight`) belongs to a
    /// module listed in `modules_to_not_convert`. An entry matches a run of whole dotted
    /// components of the module name: `mlp.gate` matches `layers.0.mlp.gate` but not
    /// `layers.0.mlp.gate_proj`, and `model.visual` matches every vision-tower module.
    ///
    /// Released configs list checkpoint names (`model.language_model.layers.0.linear_attn.in_proj_a`)
    /// while sources are asked for canonical ones (`layers.0.linear_attn.in_proj_a.weight`), so a
    /// name is matched as each checkpoint name it may be stored as (the name itself among them).
    pub fn keeps_unconverted(&self, tensor: &str) -> bool {
        let module = tensor.strip_suffix(".weight").unwrap_or(tensor);
        let padded: Vec<String> = checkpoint_names(module)
            .into_iter()
            .map(|name| format!(".{name}."))
            .collect();
        self.modules_to_not_convert
            .iter()
            .filter(|entry| !entry.is_empty())
            .map(|entry| format!(".{entry}."))
            .any(|entry| padded.iter().any(|name| name.contains(&entry)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_match_whole_components() {
        let q = Fp8Quantization::qwen_default();
        for kept in [
            "lm_head.weight",
            "model.language_model.embed_tokens.weight",
            "layers.0.mlp.gate.weight",
            "model.layers.3.mlp.shared_expert_gate.weight",
            "layers.1.linear_attn.in_proj_a.weight",
            "layers.1.linear_attn.in_proj_b.weight",
            "model.layers.1.linear_attn.in_proj_ba.weight",
            "layers.1.linear_attn.conv1d.weight",
            "mtp.fc.weight",
            "model.visual.blocks.0.attn.qkv.weight",
        ] {
            assert!(q.keeps_unconverted(kept), "{kept}");
        }
        for converted in [
            "layers.0.mlp.gate_proj.weight",
            "layers.0.mlp.shared_expert.gate_proj.weight",
            "layers.1.linear_attn.in_proj_qkv.weight",
            "layers.1.linear_attn.in_proj_z.weight",
            "model.layers.1.linear_attn.in_proj_qkvz.weight",
            "mtp.layers.0.self_attn.q_proj.weight",
            "layers.0.mlp.experts.gate_up_proj",
            "layers.0.mlp.experts.3.down_proj.weight",
        ] {
            assert!(!q.keeps_unconverted(converted), "{converted}");
        }
        // Released configs list fully qualified module names.
        let listed = Fp8Quantization {
            block: FP8_BLOCK,
            modules_to_not_convert: vec![
                "model.language_model.layers.0.linear_attn.in_proj_a".into()
            ],
        };
        assert!(
            listed.keeps_unconverted("model.language_model.layers.0.linear_attn.in_proj_a.weight")
        );
        assert!(!listed
            .keeps_unconverted("model.language_model.layers.10.linear_attn.in_proj_a.weight"));
        // ... and match the canonical names sources are asked for.
        assert!(listed.keeps_unconverted("layers.0.linear_attn.in_proj_a.weight"));
        assert!(!listed.keeps_unconverted("layers.10.linear_attn.in_proj_a.weight"));
        let embed = Fp8Quantization {
            block: FP8_BLOCK,
            modules_to_not_convert: vec!["model.language_model.embed_tokens".into()],
        };
        assert!(embed.keeps_unconverted("embed_tokens.weight"));
        assert!(!embed.keeps_unconverted("layers.0.mlp.gate_proj.weight"));
    }
}
