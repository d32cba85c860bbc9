//! The CUDA backend of deltaserve: `CudaBackend` implements `deltaserve_tensor::Backend` on one
//! NVIDIA GPU with CUDA C kernels (kernels/*.cu) compiled by NVRTC at start-up and cuBLAS GEMMs.
//! CUDA's libraries are loaded at run time, so this crate builds (and its tests skip) without CUDA.

mod attention;
mod backend;
mod bandwidth;
mod buffer;
pub mod compile;
mod dense;
mod detect;
mod error;
mod flash;
mod fp8;
mod fp8_gemm;
mod gdn;
mod gdn_chunked;
mod gemm;
mod gemv;
mod generate;
mod graphs;
pub mod kernels;
mod launcher;
mod layout;
mod libraries;
mod mat;
mod moe;
mod nccl;
mod options;
mod profile;
mod sampling;
mod upload_cache;

pub use backend::CudaBackend;
pub use buffer::CudaBuf;
pub use detect::{gpu_count, usable_gpu};
pub use error::CudaError;
pub use flash::FLASH_MIN_TOKENS;
pub use launcher::waits_for_previous_grid;
pub use mat::CudaMat;
pub use nccl::NcclCommunicator;
pub use options::{CudaOptions, GdnPrefill, GemmPrecision, KERNEL_VARIANT_ENV};
