//! The backend's `Buf`: a device buffer of f32 activations or parameters with its logical length.
//! Owns allocation only; ops live in the op modules.

use cudarc::driver::CudaSlice;

/// `len` f32 values on the device. The allocation holds at least one element, because CUDA refuses
/// zero-byte allocations and the model asks for empty buffers (e.g. a pool lent out and back).
pub struct CudaBuf {
    pub(crate) data: CudaSlice<f32>,
    pub(crate) len: usize,
}

impl CudaBuf {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}
