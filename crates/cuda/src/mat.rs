//! The backend's `Mat`: a weight matrix `[rows, cols]` on the device, row-major as in the checkpoint,
//! stored as bf16 bits or f32 according to `GemmPrecision`, or as block-FP8 codes and scales when
//! the host tensor carries them and the precision is bf16 (fp8.rs). Owns loading only; `gemm`
//! multiplies.

use crate::options::GemmPrecision;
use cudarc::driver::{CudaSlice, CudaStream};
use deltaserve_tensor::dtype::{f32_to_bf16, DType};
use deltaserve_tensor::{HostTensor, TensorError};
use std::sync::Arc;

pub(crate) enum MatData {
    /// Raw bf16 bit patterns.
    Bf16(CudaSlice<u16>),
    F32(CudaSlice<f32>),
    /// e4m3fn codes `[rows, cols]` and f32 scales `[ceil(rows / 128), ceil(cols / 128)]`.
    Fp8 {
        codes: CudaSlice<u8>,
        scales: CudaSlice<f32>,
    },
}

/// The only block shape the FP8 kernels read (that of every released checkpoint); other block
/// shapes, and rows that are not whole 16-code vectors, load as bf16.
pub(crate) const FP8_BLOCK: [usize; 2] = [128, 128];

/// A weight matrix on the device.
pub struct CudaMat {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) data: MatData,
}

impl CudaMat {
    /// Bytes of device memory the matrix holds (codes and scales for FP8).
    pub(crate) fn stored_bytes(&self) -> usize {
        match &self.data {
            MatData::Bf16(data) => data.len() * 2,
            MatData::F32(data) => data.len() * 4,
            MatData::Fp8 { codes, scales } => codes.len() + scales.len() * 4,
        }
    }

    /// Uploads a 2-D host tensor: bf16 checkpoints keep their bits under `Bf16`; every other case
    /// goes through f32 (rounded to bf16 nearest-even under `Bf16`, kept under `F32`). With
    /// `keep_fp8` (bf16 precision only) a tensor that carries its block-FP8 form is stored in it.
    pub(crate) fn upload(
        stream: &Arc<CudaStream>,
        t: &HostTensor,
        precision: GemmPrecision,
        keep_fp8: bool,
    ) -> Result<Self, TensorError> {
        let (rows, cols) = match t.shape.as_slice() {
            [rows, cols] => (*rows, *cols),
            other => {
                return Err(TensorError::Invalid {
                    name: t.name.clone(),
                    message: format!("expected a 2-D matrix, found shape {other:?}"),
                })
            }
        };
        let device_error = |e: cudarc::driver::DriverError| TensorError::Invalid {
            name: t.name.clone(),
            message: format!(
                "could not copy the {rows}x{cols} {} matrix to the GPU: {e:?}",
                t.dtype
            ),
        };
        // One element at least: CUDA refuses zero-byte allocations.
        if let (GemmPrecision::Bf16, true, Some(fp8)) = (precision, keep_fp8, t.block_fp8()) {
            // Rows of whole 16-code vectors, as the FP8 kernels read them.
            if fp8.block == FP8_BLOCK && fp8.codes.len() == rows * cols && cols.is_multiple_of(16) {
                let mut codes = fp8.codes.clone();
                codes.resize(codes.len().max(1), 0);
                let mut scales = fp8.scales.clone();
                scales.resize(scales.len().max(1), 1.0);
                let data = MatData::Fp8 {
                    codes: stream.clone_htod(&codes).map_err(device_error)?,
                    scales: stream.clone_htod(&scales).map_err(device_error)?,
                };
                return Ok(Self { rows, cols, data });
            }
        }
        let data = match (precision, t.dtype) {
            (GemmPrecision::Bf16, DType::BF16) => {
                let mut bits: Vec<u16> = t
                    .bytes()
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect();
                bits.resize(bits.len().max(1), 0);
                MatData::Bf16(stream.clone_htod(&bits).map_err(device_error)?)
            }
            (GemmPrecision::Bf16, _) => {
                let mut bits: Vec<u16> = t.to_f32_vec().into_iter().map(f32_to_bf16).collect();
                bits.resize(bits.len().max(1), 0);
                MatData::Bf16(stream.clone_htod(&bits).map_err(device_error)?)
            }
            (GemmPrecision::F32, _) => {
                let mut values = t.to_f32_vec();
                values.resize(values.len().max(1), 0.0);
                MatData::F32(stream.clone_htod(&values).map_err(device_error)?)
            }
        };
        Ok(Self { rows, cols, data })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }
}
