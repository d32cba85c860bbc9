//! Compiles every kernel file with NVRTC for sm_90 (compute_90), without a GPU: the check that the
//! CUDA C builds at all. libnvrtc is found on the system library path (e.g. LD_LIBRARY_PATH), in the
//! repository's .venv NVRTC wheel or in `$DELTASERVE_NVRTC_VENV` (CI installs the CUDA 13.0 wheel
//! there and the test must run); otherwise it is skipped with a printed reason.

use deltaserve_cuda::compile::{compile_all, nvrtc_version};
use deltaserve_cuda::kernels::FILES;
use deltaserve_cuda::{waits_for_previous_grid, CudaError, CudaOptions};
use std::path::{Path, PathBuf};

/// Set by CI to a virtual environment holding the CUDA 13.0 NVRTC wheel
/// (scripts/requirements-nvrtc.txt): the check must then run, not skip.
const REQUIRED_VENV: &str = "DELTASERVE_NVRTC_VENV";

/// `lib` folders of NVIDIA wheels in the virtual environments: `$DELTASERVE_NVRTC_VENV` first, then
/// the repository's .venv, if there is one.
fn venv_nvidia_lib_dirs() -> Vec<PathBuf> {
    let mut venvs: Vec<PathBuf> = std::env::var_os(REQUIRED_VENV)
        .map(PathBuf::from)
        .into_iter()
        .collect();
    venvs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv"));
    venvs
        .iter()
        .filter_map(|venv| std::fs::read_dir(venv.join("lib")).ok())
        .flat_map(|pythons| pythons.flatten())
        .flat_map(|p| {
            ["cu13/lib", "cuda_nvrtc/lib"]
                .map(|sub| p.path().join("site-packages/nvidia").join(sub))
        })
        .filter(|d| d.is_dir())
        .collect()
}

/// Kernels (name prefixes) launched in plain stream order: start-up and test-only kernels. Every
/// other kernel waits for its predecessor itself and may start early (launcher.rs).
const IN_STREAM_ORDER: &[&str] = &["dummy_fill", "read_bandwidth"];

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
            assert!(
                std::env::var_os(REQUIRED_VENV).is_none(),
                "${REQUIRED_VENV} is set but NVRTC did not load from it: {e}"
            );
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
            let in_stream_order = IN_STREAM_ORDER.iter().any(|p| function.starts_with(p));
            assert_eq!(
                waits_for_previous_grid(&unit.ptx, function),
                !in_stream_order,
                "kernels/{}: `{function}` should {}wait for the previous kernel itself \
                 (AFTER_PREVIOUS_KERNEL in common.cuh; launcher.rs)",
                unit.file.name,
                if in_stream_order { "not " } else { "" }
            );
        }
        // The other direction: a kernel the file defines but `FILES` does not list is never
        // loaded, and launching it panics at run time.
        for entry in unit.ptx.split(".entry ").skip(1) {
            let name = entry.split('(').next().unwrap_or_default().trim();
            assert!(
                unit.file.functions.contains(&name),
                "kernels/{}: `{name}` is defined but not listed in kernels::FILES",
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
