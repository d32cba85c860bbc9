//! `--speculative-draft-model-quantization fp8` (SGLang's flag): the draft model, the MTP head, in
//! block FP8 whatever the trunk's format. Its decoder layer's linear weights are quantized as
//! `--quantization fp8` quantizes them (the scheme's `modules_to_not_convert` still kept), and it
//! gets an output head of its own, `DRAFT_HEAD`: the trunk's `lm_head` (or tied embedding)
//! quantized the same way. Drafting reads that head instead of the trunk's, half the bytes of a
//! bf16 one, which on the 27B shape is most of a draft step's reads (2.5 GB of bf16 against ~0.4 GB
//! for the MTP layer in FP8). The verify step and every committed token still come from the trunk
//! and its exact head, so the text is what plain decoding gives; only how often a draft is
//! accepted can change (docs/fp8.md). A MoE draft layer's packed experts stay as stored.

use crate::error::LoadError;
use crate::online_fp8::quantized_to_block_fp8;
use crate::quantization::Fp8Quantization;
use crate::source::TensorSource;
use deltaserve_tensor::{GeneratedMatrix, HostTensor};

/// The canonical name the draft head is asked for by (no checkpoint holds it: this source makes
/// it from the trunk's head).
pub const DRAFT_HEAD: &str = "mtp.draft_head.weight";

/// Where the draft model's weights live in the canonical names.
const DRAFT_LAYERS: &str = "mtp.layers.";

/// The trunk's output head: `lm_head.weight`, or `embed_tokens.weight` when the embeddings are
/// tied.
pub(crate) fn trunk_head_name(tied_embeddings: bool) -> &'static str {
    if tied_embeddings {
        "embed_tokens.weight"
    } else {
        "lm_head.weight"
    }
}

pub struct DraftFp8Source {
    inner: Box<dyn TensorSource>,
    scheme: Fp8Quantization,
    /// The trunk head the draft head is quantized from: `lm_head.weight`, or
    /// `embed_tokens.weight` when the embeddings are tied.
    trunk_head: &'static str,
}

impl DraftFp8Source {
    pub fn new(
        inner: Box<dyn TensorSource>,
        scheme: Fp8Quantization,
        tied_embeddings: bool,
    ) -> Self {
        Self {
            inner,
            scheme,
            trunk_head: trunk_head_name(tied_embeddings),
        }
    }

    /// The MTP decoder layer's linear weights (`[out, in]`, `*.weight`) outside the scheme's
    /// unconverted modules.
    fn converts(&self, name: &str, shape: &[usize]) -> bool {
        name.starts_with(DRAFT_LAYERS)
            && shape.len() == 2
            && name.ends_with(".weight")
            && !self.scheme.keeps_unconverted(name)
    }

    /// `name` as the inner source knows it: the draft head is the trunk head's values, unless the
    /// inner source has a draft head of its own (`--speculative-token-map`'s listed rows).
    fn source_name<'a>(&self, name: &'a str) -> &'a str {
        if name == DRAFT_HEAD && !self.inner.contains(DRAFT_HEAD) {
            self.trunk_head
        } else {
            name
        }
    }

    fn quantized(&self, tensor: HostTensor) -> HostTensor {
        if tensor.block_fp8().is_some() {
            return tensor; // an FP8 checkpoint, or --quantization fp8 already did it
        }
        quantized_to_block_fp8(tensor, self.scheme.block)
    }
}

impl TensorSource for DraftFp8Source {
    fn get(&self, name: &str, shape: &[usize]) -> Result<HostTensor, LoadError> {
        let tensor = self.inner.get(self.source_name(name), shape)?;
        if name == DRAFT_HEAD || self.converts(name, shape) {
            Ok(self.quantized(tensor))
        } else {
            Ok(tensor)
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.inner.contains(self.source_name(name))
    }

    /// The draft head and the converted layer weights are offered for generation with the
    /// quantizer's blocks (the draft head with the trunk head's values), so that a backend that
    /// keeps FP8 weights quantizes them on its device as `get` would on the host.
    fn generated_matrix(&self, name: &str, shape: [usize; 2]) -> Option<GeneratedMatrix> {
        let spec = self.inner.generated_matrix(self.source_name(name), shape)?;
        let quantize = name == DRAFT_HEAD || self.converts(name, &shape);
        Some(GeneratedMatrix {
            block_fp8: spec.block_fp8.or(quantize.then_some(self.scheme.block)),
            ..spec
        })
    }

    fn describe(&self) -> String {
        format!(
            "{}, the draft model (MTP head) in block FP8 (--speculative-draft-model-quantization fp8)",
            self.inner.describe()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dummy::DummySource;
    use crate::online_fp8::Fp8QuantizingSource;
    use deltaserve_tensor::DType;

    fn draft(tied: bool) -> DraftFp8Source {
        DraftFp8Source::new(
            Box::new(DummySource::new(DType::BF16, 7).with_tied_embeddings(tied)),
            Fp8Quantization::qwen_default(),
            tied,
        )
    }

    #[test]
    fn the_mtp_layer_is_quantized_and_the_trunk_is_not() {
        let source = draft(false);
        let plain = DummySource::new(DType::BF16, 7);
        for (name, quantized) in [
            ("mtp.layers.0.mlp.up_proj.weight", true),
            ("mtp.layers.0.self_attn.q_proj.weight", true),
            ("mtp.fc.weight", false),
            ("mtp.layers.0.input_layernorm.weight", false),
            ("layers.0.mlp.up_proj.weight", false),
            ("lm_head.weight", false),
        ] {
            let shape: &[usize] = if name.ends_with("layernorm.weight") {
                &[256]
            } else {
                &[256, 128]
            };
            let ours = source.get(name, shape).unwrap();
            let theirs = plain.get(name, shape).unwrap();
            assert_eq!(ours.block_fp8().is_some(), quantized, "{name}");
            if !quantized {
                assert_eq!(ours.bytes(), theirs.bytes(), "{name} must stay as stored");
            }
            if shape.len() == 2 {
                let offered = source.generated_matrix(name, [shape[0], shape[1]]);
                let blocks = offered.map(|spec| spec.block_fp8.is_some());
                assert_eq!(blocks, Some(quantized), "{name}: generation offer");
            }
        }
    }

    #[test]
    fn the_draft_head_is_the_trunk_head_quantized() {
        for tied in [false, true] {
            let source = draft(tied);
            let trunk = if tied {
                "embed_tokens.weight"
            } else {
                "lm_head.weight"
            };
            assert!(source.contains(DRAFT_HEAD), "tied: {tied}");
            let head = source.get(DRAFT_HEAD, &[256, 128]).unwrap();
            let stored = head.block_fp8().expect("the draft head is FP8");
            let want = Fp8QuantizingSource::new(
                Box::new(DummySource::new(DType::BF16, 7).with_tied_embeddings(tied)),
                Fp8Quantization {
                    modules_to_not_convert: vec![],
                    ..Fp8Quantization::qwen_default()
                },
            )
            .get(trunk, &[256, 128])
            .unwrap();
            let want_stored = want.block_fp8().unwrap();
            assert_eq!(stored.codes, want_stored.codes, "tied: {tied}");
            assert_eq!(stored.scales, want_stored.scales, "tied: {tied}");
            assert_eq!(head.bytes(), want.bytes(), "tied: {tied}");
            let spec = source.generated_matrix(DRAFT_HEAD, [256, 128]).unwrap();
            let trunk_spec = DummySource::new(DType::BF16, 7)
                .with_tied_embeddings(tied)
                .generated_matrix(trunk, [256, 128])
                .unwrap();
            assert_eq!(spec.block_fp8, Some([128, 128]));
            assert_eq!(
                GeneratedMatrix {
                    block_fp8: None,
                    ..spec
                },
                trunk_spec,
                "the draft head is generated from the trunk head's values"
            );
        }
    }

    #[test]
    fn weights_that_are_fp8_already_pass_through() {
        let source = DraftFp8Source::new(
            Box::new(Fp8QuantizingSource::new(
                Box::new(DummySource::new(DType::BF16, 7)),
                Fp8Quantization::qwen_default(),
            )),
            Fp8Quantization::qwen_default(),
            false,
        );
        let once = Fp8QuantizingSource::new(
            Box::new(DummySource::new(DType::BF16, 7)),
            Fp8Quantization::qwen_default(),
        );
        let name = "mtp.layers.0.mlp.down_proj.weight";
        let ours = source.get(name, &[128, 256]).unwrap();
        let theirs = once.get(name, &[128, 256]).unwrap();
        assert_eq!(ours.bytes(), theirs.bytes());
        assert_eq!(
            ours.block_fp8().unwrap().codes,
            theirs.block_fp8().unwrap().codes
        );
    }
}
