//! Finding the CUDA shared libraries at run time. cudarc loads the driver, NVRTC and cuBLAS by bare
//! file name (so only from the system library path) and panics when one is missing; this module
//! checks for each first and, when the system path lacks it, pre-loads it from the CUDA folders in
//! `CudaOptions::library_dirs`, so that cudarc's own lookup then finds the already-loaded library.

use crate::error::CudaError;
use std::path::{Path, PathBuf};

/// One CUDA library cudarc will load.
pub(crate) struct CudaLibrary {
    /// What it is, for messages.
    pub what: &'static str,
    /// File names to look for in `library_dirs`, preferred first.
    pub file_names: &'static [&'static str],
    /// cudarc's own check that it can load the library by name.
    present: fn() -> bool,
    hint: &'static str,
}

fn driver_present() -> bool {
    // SAFETY: only tries to open and close the library; no symbol is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

fn nvrtc_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn cublas_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

fn cublas_lt_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::cublaslt::sys::is_culib_present() }
}

pub(crate) const DRIVER: CudaLibrary = CudaLibrary {
    what: "CUDA driver",
    file_names: &["libcuda.so.1", "libcuda.so"],
    present: driver_present,
    hint: "Is an NVIDIA driver installed (nvidia-smi works)? Inside a container, the driver's libraries must be mounted.",
};

pub(crate) const NVRTC: CudaLibrary = CudaLibrary {
    what: "NVRTC runtime compiler",
    file_names: &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
    present: nvrtc_present,
    hint: "Install the CUDA toolkit or the `nvidia-cuda-nvrtc` wheel, and add its lib folder to LD_LIBRARY_PATH.",
};

pub(crate) const CUBLAS_LT: CudaLibrary = CudaLibrary {
    what: "cuBLASLt",
    file_names: &["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"],
    present: cublas_lt_present,
    hint: "Install the CUDA toolkit or the `nvidia-cublas` wheel, and add its lib folder to LD_LIBRARY_PATH.",
};

pub(crate) const CUBLAS: CudaLibrary = CudaLibrary {
    what: "cuBLAS",
    file_names: &["libcublas.so.13", "libcublas.so.12", "libcublas.so"],
    present: cublas_present,
    hint: "Install the CUDA toolkit or the `nvidia-cublas` wheel, and add its lib folder to LD_LIBRARY_PATH.",
};

fn nccl_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

pub(crate) const NCCL: CudaLibrary = CudaLibrary {
    what: "NCCL",
    file_names: &["libnccl.so.2", "libnccl.so"],
    present: nccl_present,
    hint: "--tp-size above 1 on cuda needs NCCL: install the `nvidia-nccl-cu13` wheel (or the libnccl2 package) and add its lib folder to LD_LIBRARY_PATH.",
};

/// Makes `lib` loadable by cudarc, pre-loading it from `dirs` when the system path lacks it.
pub(crate) fn ensure(lib: &CudaLibrary, dirs: &[PathBuf]) -> Result<(), CudaError> {
    if (lib.present)() {
        return Ok(());
    }
    let candidates = dirs
        .iter()
        .flat_map(|dir| lib.file_names.iter().map(move |name| dir.join(name)));
    for path in candidates {
        if path.is_file() && preload(&path) && (lib.present)() {
            preload_companions(&path);
            return Ok(());
        }
    }
    Err(CudaError::LibraryMissing {
        what: lib.what,
        library: lib.file_names[0],
        searched: dirs.iter().map(|d| d.display().to_string()).collect(),
        hint: lib.hint,
    })
}

/// Some libraries open helpers by bare name when first used (NVRTC 13.0 opens
/// `libnvrtc-builtins.so.13.0`), which a folder outside the system path would not satisfy: pre-load
/// the helpers found beside the library.
fn preload_companions(library: &Path) {
    let (Some(dir), Some(name)) = (library.parent(), library.file_name()) else {
        return;
    };
    let Some(stem) = name.to_str().and_then(|n| n.split(".so").next()) else {
        return;
    };
    let prefix = format!("{stem}-builtins.so");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let companion = entry.file_name();
        if companion.to_str().is_some_and(|c| c.starts_with(&prefix)) {
            preload(&entry.path());
        }
    }
}

/// Loads the library at `path` and keeps it loaded for the life of the process: the dynamic loader
/// then resolves cudarc's later load by file name (the library's soname) to this copy.
fn preload(path: &Path) -> bool {
    // SAFETY: opening a CUDA library runs only its initialisers, which have no preconditions.
    match unsafe { libloading::Library::new(path) } {
        Ok(lib) => {
            // cudarc keeps function pointers into the library for the life of the process, so it
            // must never be unloaded.
            std::mem::forget(lib);
            true
        }
        Err(_) => false,
    }
}
