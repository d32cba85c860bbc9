//! `--load-format dummy` weights generated on the GPU (`dummy_fill`, kernels/dummy.cu), bit for bit
//! what the host generator would have uploaded, without the host work or the copy.

use crate::backend::{launch, CudaBackend};
use crate::launcher::KernelArg;
use crate::mat::{CudaMat, MatData};
use crate::options::GemmPrecision;
use cudarc::driver::CudaSlice;
use deltaserve_tensor::{DType, GeneratedMatrix, TensorError};

impl CudaBackend {
    pub(crate) fn generate_mat_op(&self, spec: &GeneratedMatrix) -> Result<CudaMat, TensorError> {
        let n = spec.rows * spec.cols;
        let chunks = n.div_ceil(spec.chunk_elems.max(1));
        if spec.chunk_seeds.len() < chunks
            || spec.chunk_elems == 0
            || spec.chunk_elems > i32::MAX as usize
        {
            return Err(TensorError::Invalid {
                name: spec.name.clone(),
                message: format!(
                    "generated matrix of {n} values needs {chunks} chunk seeds of {} elements, has {}",
                    spec.chunk_elems,
                    spec.chunk_seeds.len()
                ),
            });
        }
        if !matches!(spec.dtype, DType::BF16 | DType::F32) {
            return Err(TensorError::Invalid {
                name: spec.name.clone(),
                message: format!("cannot generate {} weights on the GPU", spec.dtype),
            });
        }
        let seeds = self.upload("dummy seeds", &spec.chunk_seeds);
        let (n64, chunk32) = (n as i64, spec.chunk_elems as i32);
        let bf16_values = i32::from(spec.dtype == DType::BF16);
        // Contract: `seeds` holds one per chunk of n (checked above); each call below says which
        // output the kernel writes and that it holds n values.
        let fill = |out_bf16: &dyn KernelArg, out_f32: &dyn KernelArg| {
            launch!(
                self,
                "dummy_fill",
                Self::elementwise_config(n),
                out_bf16,
                out_f32,
                &n64,
                &seeds,
                &chunk32,
                &spec.lo,
                &spec.hi,
                &bf16_values
            )
        };
        let data = match self.gemm_precision {
            GemmPrecision::Bf16 => {
                let mut bits: CudaSlice<u16> = self.alloc_zeros("dummy matrix", n);
                let mut unused: CudaSlice<f32> = self.alloc_zeros("dummy matrix (unused f32)", 1);
                // Contract: `bits` holds n values; the f32 output is not written when the bf16
                // one is given.
                fill(&mut bits, &mut unused);
                MatData::Bf16(bits)
            }
            GemmPrecision::F32 => {
                let mut values: CudaSlice<f32> = self.alloc_zeros("dummy matrix", n);
                let null_bf16: u64 = 0;
                // Contract: `values` holds n values; a null bf16 pointer selects the f32 output.
                fill(&null_bf16, &mut values);
                MatData::F32(values)
            }
        };
        // `generate_mat` offers block-FP8 specs only under bf16 precision with 128 x 128 blocks:
        // quantized as the host would, then kept, or widened back to the bf16 bits the host path
        // uploads.
        let data = match (spec.block_fp8, data) {
            (Some(_), MatData::Bf16(values)) => {
                let fp8 = self.quantize_block_fp8(&values, spec.rows, spec.cols);
                match fp8 {
                    MatData::Fp8 { codes, scales } if !self.keep_fp8_weights => MatData::Bf16(
                        self.dequantize_block_fp8(&codes, &scales, spec.rows, spec.cols),
                    ),
                    kept => kept,
                }
            }
            (_, data) => data,
        };
        Ok(CudaMat {
            rows: spec.rows,
            cols: spec.cols,
            data,
        })
    }
}
