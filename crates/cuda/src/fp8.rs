//! Block-FP8 weights on the device (kernels/block_fp8.cu; the FP8 GEMV kernels are in gemv.cu):
//! quantizing generated weights as the host quantizer does, and widening a matrix to bf16 for the
//! paths that multiply bf16 (cuBLAS GEMMs, the embedding).

use crate::backend::{launch, CudaBackend};
use crate::mat::MatData;
use cudarc::driver::{CudaSlice, LaunchConfig};

/// Threads of a `quantize_block_fp8` block (one block per 128 x 128 tile).
const QUANTIZE_THREADS: u32 = 256;
/// Rows and columns of a scale block (`FP8_BLOCK` of block_fp8.cu).
const BLOCK: usize = 128;

impl CudaBackend {
    /// The block-FP8 form of a bf16 `[rows, cols]` matrix: per 128 x 128 tile `scale = amax / 448`,
    /// `code = e4m3(value / scale)`, bit for bit what `block_fp8::quantize` computes on the host.
    pub(crate) fn quantize_block_fp8(
        &self,
        values: &CudaSlice<u16>,
        rows: usize,
        cols: usize,
    ) -> MatData {
        let grid = [rows.div_ceil(BLOCK), cols.div_ceil(BLOCK)];
        // Overwritten whole below: one block writes each tile's codes and its scale.
        let mut codes: CudaSlice<u8> = self.alloc_for_overwrite("fp8 codes", rows * cols);
        let mut scales: CudaSlice<f32> = self.alloc_for_overwrite("fp8 scales", grid[0] * grid[1]);
        if rows * cols > 0 {
            let cfg = LaunchConfig {
                grid_dim: (grid[1] as u32, grid[0] as u32, 1),
                block_dim: (QUANTIZE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let (rows32, cols32) = (rows as i32, cols as i32);
            // Contract: values holds rows * cols bf16 values, codes as many bytes, scales one
            // value per tile of the grid above.
            launch!(
                self,
                "quantize_block_fp8",
                cfg,
                values,
                &mut codes,
                &mut scales,
                &rows32,
                &cols32
            );
        }
        MatData::Fp8 { codes, scales }
    }

    /// The bf16 weights `bf16(e4m3(code) * scale)` of a block-FP8 `[rows, cols]` matrix, the bits
    /// a host-dequantized FP8 weight gets on upload.
    pub(crate) fn dequantize_block_fp8(
        &self,
        codes: &CudaSlice<u8>,
        scales: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
    ) -> CudaSlice<u16> {
        let n = rows * cols;
        // Overwritten whole by the kernel.
        let mut out: CudaSlice<u16> = self.alloc_for_overwrite("fp8 widened to bf16", n);
        if n > 0 {
            let (rows32, cols32) = (rows as i32, cols as i32);
            // Contract: codes holds rows * cols bytes with cols % 16 == 0 (an `Fp8` matrix, see
            // mat.rs), scales the 128 x 128 grid, out n values; one thread per 8 codes.
            launch!(
                self,
                "dequantize_block_fp8_bf16",
                Self::elementwise_config(n / 8),
                codes,
                scales,
                &mut out,
                &rows32,
                &cols32
            );
        }
        out
    }
}
