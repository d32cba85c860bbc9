//! Element types that appear in checkpoints, and their conversion to f32.

use std::fmt;

/// Element type of a stored tensor (the safetensors header's `dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    BF16,
    F16,
    F32,
}

impl DType {
    pub fn size_bytes(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 => 4,
        }
    }

    /// Parses the spelling used by safetensors headers and by `config.json` (`torch_dtype`/`dtype`).
    pub fn parse(name: &str) -> Option<DType> {
        match name {
            "BF16" | "bfloat16" | "bf16" => Some(DType::BF16),
            "F16" | "float16" | "f16" | "half" => Some(DType::F16),
            "F32" | "float32" | "f32" | "float" => Some(DType::F32),
            _ => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
        })
    }
}

#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Round-to-nearest-even, as torch does when casting f32 to bf16.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// Decodes little-endian elements of `dtype` from `bytes` into f32.
pub fn decode_to_f32(dtype: DType, bytes: &[u8], out: &mut Vec<f32>) {
    out.clear();
    match dtype {
        DType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        DType::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]]))),
        ),
        DType::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]]))),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_round_trip_and_rounding() {
        assert_eq!(bf16_to_f32(f32_to_bf16(1.5)), 1.5);
        // 1 + 2^-8 is exactly half-way between two bf16 values: ties go to even (1.0).
        assert_eq!(bf16_to_f32(f32_to_bf16(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(DType::parse("BF16"), Some(DType::BF16));
        assert_eq!(DType::parse("I64"), None);
    }
}
