//! A weight matrix as a block-FP8 checkpoint stores it: e4m3fn codes and one f32 scale per block.
//! A host tensor read from such a checkpoint (or quantized at load) carries these parts beside its
//! exactly dequantized f32 values, so that a backend with kernels that read FP8 weights keeps the
//! codes (half the bytes of bf16) and every other backend uses the f32 values.

/// `codes` `[matrices, rows, cols]` row-major; `scales` `[matrices, ceil(rows / block[0]),
/// ceil(cols / block[1])]`; weight `[r][c]` = `e4m3(codes[r][c]) * scales[r / block[0]][c / block[1]]`.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockFp8Matrix {
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub block: [usize; 2],
}

/// The scale grid of one `rows x cols` matrix: `[ceil(rows / block[0]), ceil(cols / block[1])]`.
pub fn scale_grid(rows: usize, cols: usize, block: [usize; 2]) -> [usize; 2] {
    [rows.div_ceil(block[0]), cols.div_ceil(block[1])]
}
