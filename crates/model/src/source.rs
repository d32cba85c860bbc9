//! `TensorSource`: where the weight builder gets named host tensors from (a safetensors checkpoint,
//! or generated dummy weights), plus the canonical-name to checkpoint-name mapping. It does not know
//! model shapes; callers pass the shape they expect and get a checked tensor or a `LoadError`.

use crate::error::LoadError;
use deltaserve_tensor::GeneratedMatrix;
use deltaserve_tensor::HostTensor;

pub trait TensorSource: Send + Sync {
    /// `name` is canonical: relative to the text model, e.g. "embed_tokens.weight", "norm.weight",
    /// "layers.3.self_attn.q_proj.weight", "lm_head.weight", "mtp.fc.weight",
    /// "mtp.layers.0.mlp.gate_proj.weight".
    /// Returns the tensor checked against `shape` (error names tensor, file, expected and found shape).
    fn get(&self, name: &str, shape: &[usize]) -> Result<HostTensor, LoadError>;
    fn contains(&self, name: &str) -> bool;
    /// How to generate matrix `name` on a device, for sources that generate rather than read
    /// (`None`: read it with `get`).
    fn generated_matrix(&self, _name: &str, _shape: [usize; 2]) -> Option<GeneratedMatrix> {
        None
    }
    /// What this source reads from (e.g. the checkpoint directory), for messages.
    fn describe(&self) -> String;
}

/// The names a canonical tensor name may be stored under in a checkpoint, in lookup order:
/// Qwen3.5/3.6 keep the trunk under `model.language_model.`, Qwen3-Next under `model.`, and
/// text-only re-exports may drop the prefix; `lm_head.weight` and `mtp.*` sit at the top level
/// (some exports put the MTP under `model.mtp.`).
pub fn checkpoint_names(canonical: &str) -> Vec<String> {
    if canonical == "lm_head.weight" {
        vec![canonical.to_string()]
    } else if canonical.starts_with("mtp.") {
        vec![canonical.to_string(), format!("model.{canonical}")]
    } else {
        vec![
            format!("model.language_model.{canonical}"),
            format!("model.{canonical}"),
            canonical.to_string(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_mapping_order() {
        assert_eq!(
            checkpoint_names("layers.3.self_attn.q_proj.weight"),
            [
                "model.language_model.layers.3.self_attn.q_proj.weight",
                "model.layers.3.self_attn.q_proj.weight",
                "layers.3.self_attn.q_proj.weight"
            ]
        );
        assert_eq!(checkpoint_names("lm_head.weight"), ["lm_head.weight"]);
        assert_eq!(
            checkpoint_names("mtp.fc.weight"),
            ["mtp.fc.weight", "model.mtp.fc.weight"]
        );
    }
}
