//! Whether this machine has a GPU the backend can use, without starting the backend (no kernels
//! compiled): for choosing `--backend` automatically.

use crate::error::CudaError;
use crate::libraries;
use cudarc::driver::CudaContext;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The name of GPU 0 when the driver loads, a GPU is visible and it is new enough (compute
/// capability 8.0 or later); otherwise why not. Never panics.
pub fn usable_gpu() -> Result<String, CudaError> {
    catch_unwind(AssertUnwindSafe(probe)).unwrap_or_else(|_| {
        Err(CudaError::Panicked {
            during: "looking for a GPU",
            message: "the CUDA bindings panicked".to_string(),
        })
    })
}

fn probe() -> Result<String, CudaError> {
    libraries::ensure(&libraries::DRIVER, &[])?;
    cudarc::driver::result::init()
        .map_err(|e| CudaError::driver("cuInit (is a GPU visible to this process?)", e))?;
    let count = CudaContext::device_count().map_err(|e| CudaError::driver("counting GPUs", e))?;
    if count < 1 {
        return Err(CudaError::NoDevice {
            ordinal: 0,
            count: 0,
        });
    }
    let ctx =
        CudaContext::new(0).map_err(|e| CudaError::driver("creating a context on GPU 0", e))?;
    let name = ctx
        .name()
        .map_err(|e| CudaError::driver("reading the GPU's name", e))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| CudaError::driver("reading the compute capability", e))?;
    if major < 8 {
        return Err(CudaError::UnsupportedDevice {
            ordinal: 0,
            name,
            major,
            minor,
        });
    }
    Ok(name)
}
