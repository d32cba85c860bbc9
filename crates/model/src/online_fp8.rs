//! `--quantization fp8` on an unquantized checkpoint (and dummy weights for an FP8 checkpoint's
//! config, with its scheme): every linear weight outside the scheme's
//! `modules_to_not_convert` is quantized to block FP8 as it is read (the 128 x 128 recipe of
//! block_fp8.rs) and handed on dequantized with the codes and scales attached, so the model computes
//! with exactly the weights an FP8 checkpoint made with that recipe would hold; backends that keep
//! FP8 weights store the codes (docs/fp8.md).

use crate::block_fp8;
use crate::error::LoadError;
use crate::quantization::Fp8Quantization;
use crate::source::TensorSource;
use deltaserve_tensor::{BlockFp8Matrix, GeneratedMatrix, HostTensor};

pub struct Fp8QuantizingSource {
    inner: Box<dyn TensorSource>,
    scheme: Fp8Quantization,
}

impl Fp8QuantizingSource {
    pub fn new(inner: Box<dyn TensorSource>, scheme: Fp8Quantization) -> Self {
        Self { inner, scheme }
    }

    /// Linear weights: `[out, in]` matrices named `*.weight`, and packed experts `[E, out, in]`.
    fn converts(&self, name: &str, shape: &[usize]) -> bool {
        let linear = match shape.len() {
            2 => name.ends_with(".weight"),
            3 => is_packed_experts(name),
            _ => false,
        };
        linear && !self.scheme.keeps_unconverted(name)
    }
}

/// `tensor` (`[.., rows, cols]`: one matrix or a stack of them) quantized to block FP8 with the
/// recipe of block_fp8.rs and handed on as its dequantized values with the codes and scales
/// attached, as an FP8 checkpoint's tensor is read.
pub fn quantized_to_block_fp8(tensor: HostTensor, block: [usize; 2]) -> HostTensor {
    let shape = tensor.shape.clone();
    let [.., rows, cols] = shape[..] else {
        unreachable!("only matrices and stacks of them are quantized")
    };
    let matrices = shape[..shape.len() - 2].iter().product();
    let (codes, scales) = block_fp8::quantize(&tensor.to_f32_vec(), matrices, [rows, cols], block);
    let values = block_fp8::dequantize(&codes, &scales, matrices, [rows, cols], block);
    let stored = BlockFp8Matrix {
        codes,
        scales,
        block,
    };
    HostTensor::from_f32(tensor.name, shape, &values).with_block_fp8(stored)
}

fn is_packed_experts(name: &str) -> bool {
    name.ends_with(".experts.gate_up_proj") || name.ends_with(".experts.down_proj")
}

impl TensorSource for Fp8QuantizingSource {
    fn get(&self, name: &str, shape: &[usize]) -> Result<HostTensor, LoadError> {
        let tensor = self.inner.get(name, shape)?;
        if !self.converts(name, shape) {
            return Ok(tensor);
        }
        Ok(quantized_to_block_fp8(tensor, self.scheme.block))
    }

    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }

    /// A converted matrix is offered for generation with the quantizer's block shape, so that a
    /// backend that keeps FP8 weights quantizes it on its device as `get` would on the host (one
    /// that cannot declines, and `get` runs). Packed experts are offered as one `[E * out, in]`
    /// matrix: its tiles are each expert's own only when `out` is whole blocks, which the caller
    /// checks (weights.rs reads the experts otherwise).
    fn generated_matrix(&self, name: &str, shape: [usize; 2]) -> Option<GeneratedMatrix> {
        let spec = self.inner.generated_matrix(name, shape)?;
        let converts = (name.ends_with(".weight") || is_packed_experts(name))
            && !self.scheme.keeps_unconverted(name);
        Some(GeneratedMatrix {
            block_fp8: converts.then_some(self.scheme.block),
            ..spec
        })
    }

    fn describe(&self) -> String {
        format!("{}, quantized to block FP8 at load", self.inner.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dummy::DummySource;
    use deltaserve_tensor::DType;

    #[test]
    fn linear_weights_are_quantized_and_the_rest_is_untouched() {
        let source = Fp8QuantizingSource::new(
            Box::new(DummySource::new(DType::BF16, 5)),
            Fp8Quantization::qwen_default(),
        );
        let plain = DummySource::new(DType::BF16, 5);
        for (name, shape, quantized) in [
            ("layers.0.mlp.up_proj.weight", vec![300, 200], true),
            ("layers.0.mlp.experts.gate_up_proj", vec![4, 64, 160], true),
            ("layers.0.linear_attn.in_proj_a.weight", vec![6, 64], false),
            ("layers.0.mlp.gate.weight", vec![8, 64], false),
            ("embed_tokens.weight", vec![256, 64], false),
            ("lm_head.weight", vec![256, 64], false),
            ("mtp.fc.weight", vec![64, 128], false),
            ("layers.0.linear_attn.conv1d.weight", vec![160, 1, 4], false),
            ("norm.weight", vec![64], false),
        ] {
            let ours = source.get(name, &shape).unwrap();
            let theirs = plain.get(name, &shape).unwrap();
            if !quantized {
                assert_eq!(ours.dtype, theirs.dtype, "{name}");
                assert_eq!(ours.bytes(), theirs.bytes(), "{name} must stay as stored");
                continue;
            }
            // A converted matrix is offered for generation only with the quantizer's blocks
            // (packed experts as their stack of rows).
            let rows: usize = shape[..shape.len() - 1].iter().product();
            let offered = source
                .generated_matrix(name, [rows, shape[shape.len() - 1]])
                .map(|spec| spec.block_fp8);
            assert_eq!(offered, Some(Some([128, 128])), "{name}");
            let (w, q) = (theirs.to_f32_vec(), ours.to_f32_vec());
            // Each value moves by at most half an e4m3 step: 2^-4 of itself, or 2^-10 of its
            // tile's scale (at most the tensor's amax / 448) below the normal range.
            let amax = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let mut moved = 0;
            for (a, b) in w.iter().zip(&q) {
                let bound = (a.abs() * 2f32.powi(-4)).max(amax / 448.0 * 2f32.powi(-10));
                assert!((a - b).abs() <= bound * (1.0 + 1e-6), "{name}: {a} -> {b}");
                moved += usize::from(a != b);
            }
            assert!(moved > w.len() / 2, "{name}: only {moved} values quantized");
        }
    }
}
