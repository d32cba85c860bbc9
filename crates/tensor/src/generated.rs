//! A weight matrix that a source generates instead of reading (`--load-format dummy`), described
//! so that a backend can produce the very same values on its own device instead of uploading them.

use crate::dtype::DType;

/// `rows x cols` values in `dtype`, element `i` drawn as the dummy source draws it: chunk
/// `i / chunk_elems` is a SplitMix64 stream seeded with `chunk_seeds[chunk]`; each 64-bit draw
/// gives two 24-bit uniforms (bits 40.. then bits 16..40), mapped to `lo + u * ((hi - lo) / 2^24)`.
#[derive(Clone, Debug, PartialEq)]
pub struct GeneratedMatrix {
    pub name: String,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub lo: f32,
    pub hi: f32,
    pub chunk_elems: usize,
    pub chunk_seeds: Vec<u64>,
    /// Quantize the values to block FP8 with these block sizes (`--quantization fp8`), as the host
    /// quantizer would; a backend that cannot keep FP8 weights declines the spec and the host
    /// generates and quantizes instead.
    pub block_fp8: Option<[usize; 2]>,
}
