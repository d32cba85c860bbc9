//! Whether this machine has a GPU the backend can use, without starting the backend (no kernels
//! compiled): for choosing `--backend` automatically.

use crate::error::CudaError;
use crate::libraries;
use crate::options::CudaOptions;
use cudarc::driver::CudaContext;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;

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

/// How many GPUs the driver shows this process (for `--tp-size N`); an error without a driver.
pub fn gpu_count() -> Result<usize, CudaError> {
    catch_unwind(AssertUnwindSafe(|| {
        libraries::ensure(&libraries::DRIVER, &CudaOptions::default().library_dirs)?;
        cudarc::driver::result::init()
            .map_err(|e| CudaError::driver("cuInit (is a GPU visible to this process?)", e))?;
        let count =
            CudaContext::device_count().map_err(|e| CudaError::driver("counting GPUs", e))?;
        Ok(count.max(0) as usize)
    }))
    .unwrap_or_else(|_| {
        Err(CudaError::Panicked {
            during: "counting GPUs",
            message: "the CUDA bindings panicked".to_string(),
        })
    })
}

fn probe() -> Result<String, CudaError> {
    // The same folders the backend itself searches.
    open_device(0, &CudaOptions::default().library_dirs).map(|device| device.name)
}

/// A context on GPU `ordinal`, checked to be new enough.
pub(crate) struct OpenDevice {
    pub ctx: Arc<CudaContext>,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub sm_count: usize,
    /// The most dynamic shared memory a block may opt in to (bytes): 227 KB on Hopper, 163 KB on
    /// the A100, 99 KB on the A6000 and the RTX 30/40 cards.
    pub max_shared_per_block: usize,
}

/// Loads the driver (searching `library_dirs` too), initialises it and opens GPU `ordinal`; a
/// missing driver or GPU and a GPU older than compute capability 8.0 are errors.
pub(crate) fn open_device(
    ordinal: usize,
    library_dirs: &[PathBuf],
) -> Result<OpenDevice, CudaError> {
    libraries::ensure(&libraries::DRIVER, library_dirs)?;
    cudarc::driver::result::init()
        .map_err(|e| CudaError::driver("cuInit (is a GPU visible to this process?)", e))?;
    let count = CudaContext::device_count().map_err(|e| CudaError::driver("counting GPUs", e))?;
    if ordinal >= count.max(0) as usize {
        return Err(CudaError::NoDevice {
            ordinal,
            count: count.max(0) as usize,
        });
    }
    let ctx = CudaContext::new(ordinal)
        .map_err(|e| CudaError::driver(format!("creating a context on GPU {ordinal}"), e))?;
    let name = ctx
        .name()
        .map_err(|e| CudaError::driver("reading the GPU's name", e))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| CudaError::driver("reading the compute capability", e))?;
    if major < 8 {
        return Err(CudaError::UnsupportedDevice {
            ordinal,
            name,
            major,
            minor,
        });
    }
    let sm_count = ctx
        .attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
        .map_err(|e| CudaError::driver("reading the GPU's SM count", e))?;
    let max_shared_per_block = ctx
        .attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )
        .map_err(|e| CudaError::driver("reading the GPU's shared memory per block", e))?;
    Ok(OpenDevice {
        ctx,
        name,
        compute_capability: (major, minor),
        sm_count: sm_count.max(1) as usize,
        max_shared_per_block: max_shared_per_block.max(0) as usize,
    })
}
