//! Compiles every kernel file with NVRTC for sm_90 (compute_90), without a GPU: the check that the
//! CUDA C builds at all. Skipped (with a printed reason) when libnvrtc cannot be loaded; found on
//! the system library path (e.g. LD_LIBRARY_PATH) or in the repository's .venv NVRTC wheel.

use deltaserve_cuda::compile::{compile_all, nvrtc_version};
use deltaserve_cuda::kernels::FILES;
use deltaserve_cuda::{CudaError, CudaOptions};
use std::path::{Path, PathBuf};

/// `lib` folders of NVIDIA wheels in the repository's virtual environment, if there is one.
fn venv_nvidia_lib_dirs() -> Vec<PathBuf> {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/lib");
    let Ok(pythons) = std::fs::read_dir(&lib) else {
        return Vec::new();
    };
    pythons
        .flatten()
        .flat_map(|p| {
            ["cu13/lib", "cuda_nvrtc/lib"]
                .map(|sub| p.path().join("site-packages/nvidia").join(sub))
        })
        .filter(|d| d.is_dir())
        .collect()
}

#[test]
fn every_kernel_compiles_for_sm90() {
    let mut options = CudaOptions {
        ptx_cache_dir: None,
        ..CudaOptions::default()
    };
    options.library_dirs.extend(venv_nvidia_lib_dirs());
    let compiled = match std::panic::catch_unwind(|| compile_all("compute_90", &options)) {
        Ok(Ok(compiled)) => compiled,
        Ok(Err(e @ CudaError::LibraryMissing { .. })) => {
            println!("SKIP every_kernel_compiles_for_sm90: {e}");
            return;
        }
        Ok(Err(e)) => panic!("{e}"),
        Err(_) => panic!("the NVRTC bindings panicked"),
    };
    let (major, minor) = nvrtc_version().unwrap();
    // Test-only: DELTASERVE_PTX_DUMP=folder keeps the PTX for inspection.
    let dump = std::env::var_os("DELTASERVE_PTX_DUMP").map(PathBuf::from);
    assert_eq!(compiled.len(), FILES.len());
    for unit in &compiled {
        assert!(
            unit.ptx.contains(".target sm_90"),
            "kernels/{}: PTX is not for sm_90",
            unit.file.name
        );
        for function in unit.file.functions {
            assert!(
                unit.ptx.contains(&format!(".entry {function}(")),
                "kernels/{}: no entry point `{function}` in the PTX",
                unit.file.name
            );
        }
        if let Some(dir) = &dump {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join(unit.file.name.replace(".cu", ".ptx")), &unit.ptx).unwrap();
        }
        println!(
            "kernels/{}: {} bytes of PTX (NVRTC {major}.{minor})",
            unit.file.name,
            unit.ptx.len()
        );
    }
}
