//! Why a `CudaBackend` could not be made. Every failure on the way to a working device (driver,
//! libraries, GPU, kernel compilation, cuBLAS) is one variant with a message a user can act on.

/// What went wrong while starting the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error(
        "cuda backend: the {what} library ({library}) could not be loaded; looked in the system library path \
         (LD_LIBRARY_PATH, ldconfig) and in {searched:?}. {hint}"
    )]
    LibraryMissing {
        what: &'static str,
        library: &'static str,
        searched: Vec<String>,
        hint: &'static str,
    },
    #[error("cuda backend: the driver reports {count} GPU(s), so device ordinal {ordinal} does not exist")]
    NoDevice { ordinal: usize, count: usize },
    #[error("cuda backend: {what}: {message}")]
    Driver { what: String, message: String },
    #[error(
        "cuda backend: GPU {ordinal} ({name}) has compute capability {major}.{minor}; at least 8.0 is needed \
         (bf16 tensor-core GEMMs)"
    )]
    UnsupportedDevice {
        ordinal: usize,
        name: String,
        major: i32,
        minor: i32,
    },
    #[error(
        "cuda backend: NVRTC could not compile kernels/{file} with options {options:?}:\n{log}"
    )]
    Compile {
        file: &'static str,
        options: Vec<String>,
        log: String,
    },
    #[error(
        "cuda backend: kernel `{function}` is missing from the compiled kernels/{file}: {message}"
    )]
    MissingKernel {
        file: &'static str,
        function: &'static str,
        message: String,
    },
    #[error("cuda backend: cuBLAS {what} failed: {message}")]
    Cublas { what: &'static str, message: String },
    #[error("cuda backend: the CUDA bindings panicked while {during}: {message}")]
    Panicked {
        during: &'static str,
        message: String,
    },
}

impl CudaError {
    pub(crate) fn driver(what: impl Into<String>, err: impl std::fmt::Debug) -> Self {
        CudaError::Driver {
            what: what.into(),
            message: format!("{err:?}"),
        }
    }
}
