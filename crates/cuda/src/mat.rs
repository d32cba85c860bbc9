//! The backend's `Mat`: a weight matrix `[rows, cols]` on the device, row-major as in the checkpoint,
//! stored as bf16 bits or f32 according to `GemmPrecision`. Owns loading only; `gemm` multiplies.

use crate::options::GemmPrecision;
use cudarc::driver::{CudaSlice, CudaStream};
use deltaserve_tensor::dtype::{f32_to_bf16, DType};
use deltaserve_tensor::{HostTensor, TensorError};
use std::sync::Arc;

pub(crate) enum MatData {
    /// Raw bf16 bit patterns.
    Bf16(CudaSlice<u16>),
    F32(CudaSlice<f32>),
}

/// A weight matrix on the device.
pub struct CudaMat {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) data: MatData,
}

impl CudaMat {
    /// Uploads a 2-D host tensor: bf16 checkpoints keep their bits under `Bf16`; every other case
    /// goes through f32 (rounded to bf16 nearest-even under `Bf16`, kept under `F32`).
    pub(crate) fn upload(
        stream: &Arc<CudaStream>,
        t: &HostTensor,
        precision: GemmPrecision,
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
