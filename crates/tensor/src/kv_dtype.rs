//! The element type of a paged KV pool, and how a pool's buffer holds its elements. A backend's
//! `Buf` is a buffer of 4-byte words: an f32 pool keeps one value per word; a bf16 pool two values
//! per word (element 2i in the low half of word i, 2i + 1 in the high half, i.e. the bf16 values
//! in element order in little-endian memory), so half the memory holds the same tokens.

use crate::dtype::{bf16_to_f32, f32_to_bf16};

/// How K and V are stored in a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// The values as computed (exact).
    #[default]
    F32,
    /// Each value rounded to bf16 (nearest even) when written: relative error <= 2^-9 per value.
    Bf16,
}

impl KvDtype {
    /// Bytes of one stored element.
    pub fn bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 => 2,
        }
    }

    /// The flag spelling (`--kv-cache-dtype`).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "fp32",
            Self::Bf16 => "bf16",
        }
    }

    /// Words of a buffer that holds `elements` values.
    pub fn storage_words(self, elements: usize) -> usize {
        match self {
            Self::F32 => elements,
            Self::Bf16 => elements.div_ceil(2),
        }
    }

    /// The words a pool buffer holds for `values` (bf16: rounded to nearest even, packed in pairs).
    pub fn encode(self, values: &[f32]) -> Vec<f32> {
        match self {
            Self::F32 => values.to_vec(),
            Self::Bf16 => values
                .chunks(2)
                .map(|pair| {
                    let lo = f32_to_bf16(pair[0]) as u32;
                    let hi = pair.get(1).map_or(0, |&v| f32_to_bf16(v) as u32);
                    f32::from_bits(lo | (hi << 16))
                })
                .collect(),
        }
    }

    /// The first `elements` values held in `words` (what `encode` made, or a backend's pool read
    /// back with `Backend::to_host`).
    pub fn decode(self, words: &[f32], elements: usize) -> Vec<f32> {
        assert!(
            words.len() >= self.storage_words(elements),
            "{} words hold fewer than {elements} {} values",
            words.len(),
            self.name()
        );
        match self {
            Self::F32 => words[..elements].to_vec(),
            Self::Bf16 => (0..elements)
                .map(|i| {
                    let word = words[i / 2].to_bits();
                    bf16_to_f32((word >> (16 * (i % 2))) as u16)
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_words_pack_pairs_in_element_order_rounded_to_nearest_even() {
        // 1 + 2^-8 lies halfway between the bf16 values 1 and 1 + 2^-7: the tie goes to the even
        // one, 1. 3 + 3 * 2^-8 is no bf16 value (their spacing is 2^-6 there): it rounds to 3 + 2^-6.
        let values = [1.0 + 2f32.powi(-8), -2.5, 3.0 + 3.0 * 2f32.powi(-8)];
        let words = KvDtype::Bf16.encode(&values);
        assert_eq!(words.len(), KvDtype::Bf16.storage_words(values.len()));
        assert_eq!(words.len(), 2);
        let bits: Vec<u32> = words.iter().map(|w| w.to_bits()).collect();
        assert_eq!(bits[0] & 0xffff, f32_to_bf16(values[0]) as u32);
        assert_eq!(bits[0] >> 16, f32_to_bf16(values[1]) as u32);
        assert_eq!(bits[1], f32_to_bf16(values[2]) as u32);
        let decoded = KvDtype::Bf16.decode(&words, values.len());
        assert_eq!(decoded, [1.0, -2.5, 3.0 + 2f32.powi(-6)]);
    }

    #[test]
    fn f32_words_are_the_values() {
        let values = [0.1f32, -7.25, f32::MAX];
        assert_eq!(
            KvDtype::F32.decode(&KvDtype::F32.encode(&values), 3),
            values
        );
        assert_eq!(KvDtype::F32.storage_words(3), 3);
        assert_eq!((KvDtype::F32.bytes(), KvDtype::Bf16.bytes()), (4, 2));
    }
}
