//! NVRTC compilation of the kernel files to PTX for one GPU architecture, cached on disk under a
//! name keyed by a hash of the NVRTC version, the options and the source. Knows nothing about the
//! device; `backend` loads the PTX it returns.

use crate::error::CudaError;
use crate::kernels::{full_source, KernelFile, FILES};
use crate::libraries;
use crate::options::CudaOptions;
use std::path::{Path, PathBuf};

/// PTX of one kernel file.
pub struct CompiledFile {
    pub file: &'static KernelFile,
    pub ptx: String,
    /// Whether it came from the on-disk cache.
    pub cached: bool,
}

/// NVRTC's `(major, minor)` version.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both pointers are valid for one write each.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    status
        .result()
        .map_err(|e| CudaError::driver("nvrtcVersion", e))?;
    Ok((major, minor))
}

/// The NVRTC options for `arch` (e.g. `compute_90`): the architecture and the include folders that
/// exist.
pub fn nvrtc_options(
    arch: &str,
    include_dirs: &[PathBuf],
    defines: &[(String, String)],
) -> Vec<String> {
    let mut options = vec![format!("--gpu-architecture={arch}")];
    options.extend(defines.iter().map(|(n, v)| format!("-D{n}={v}")));
    options.extend(
        include_dirs
            .iter()
            .filter(|d| d.is_dir())
            .map(|d| format!("--include-path={}", d.display())),
    );
    options
}

/// Compiles every kernel file for `arch` (loading NVRTC first, from `options.library_dirs` when the
/// system path lacks it). Used at start-up and by the compile check that needs no GPU.
pub fn compile_all(arch: &str, options: &CudaOptions) -> Result<Vec<CompiledFile>, CudaError> {
    libraries::ensure(&libraries::NVRTC, &options.library_dirs)?;
    let version = nvrtc_version()?;
    let nvrtc_options = nvrtc_options(arch, &options.include_dirs, &options.defines);
    FILES
        .iter()
        .map(|file| {
            compile_file(
                file,
                version,
                &nvrtc_options,
                options.ptx_cache_dir.as_deref(),
            )
        })
        .collect()
}

fn compile_file(
    file: &'static KernelFile,
    version: (i32, i32),
    options: &[String],
    cache_dir: Option<&Path>,
) -> Result<CompiledFile, CudaError> {
    let source = full_source(file);
    let key = cache_key(version, options, &source);
    let stem = file.name.trim_end_matches(".cu");
    let cache_path = cache_dir.map(|d| d.join(format!("{stem}-{key:016x}.ptx")));
    if let Some(ptx) = cache_path
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
    {
        return Ok(CompiledFile {
            file,
            ptx,
            cached: true,
        });
    }
    let compile_options = cudarc::nvrtc::CompileOptions {
        options: options.to_vec(),
        name: Some(file.name.to_string()),
        ..Default::default()
    };
    let ptx =
        cudarc::nvrtc::compile_ptx_with_opts(&source, compile_options).map_err(|e| match e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => CudaError::Compile {
                file: file.name,
                options: options.to_vec(),
                log: log.to_string_lossy().into_owned(),
            },
            other => CudaError::Compile {
                file: file.name,
                options: options.to_vec(),
                log: format!("{other:?}"),
            },
        })?;
    let ptx = ptx.to_src();
    if let Some(path) = &cache_path {
        // A cache that cannot be written only costs a compile at the next start.
        let _ = write_atomically(path, &ptx);
    }
    Ok(CompiledFile {
        file,
        ptx,
        cached: false,
    })
}

/// Writes through a temporary file and a rename, so a concurrent reader never sees half a file.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// FNV-1a (64-bit) of everything that changes the PTX: stable across Rust versions, unlike std's
/// hasher.
fn cache_key(version: (i32, i32), options: &[String], source: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        hash ^= 0xff;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    };
    feed(format!("nvrtc {}.{}", version.0, version.1).as_bytes());
    for option in options {
        feed(option.as_bytes());
    }
    feed(source.as_bytes());
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_key_changes_with_every_input() {
        let opts = vec!["--gpu-architecture=compute_90".to_string()];
        let base = cache_key((13, 0), &opts, "src");
        assert_eq!(base, cache_key((13, 0), &opts, "src"));
        assert_ne!(base, cache_key((13, 1), &opts, "src"));
        assert_ne!(
            base,
            cache_key(
                (13, 0),
                &["--gpu-architecture=compute_80".to_string()],
                "src"
            )
        );
        assert_ne!(base, cache_key((13, 0), &opts, "src "));
    }

    #[test]
    fn options_name_the_architecture_and_only_existing_include_dirs() {
        let dir = std::env::temp_dir();
        let opts = nvrtc_options(
            "compute_90",
            &[dir.clone(), PathBuf::from("/no/such/cuda/include")],
            &[("GEMV_LANE_ROWS".to_string(), "4".to_string())],
        );
        assert_eq!(
            opts,
            vec![
                "--gpu-architecture=compute_90".to_string(),
                "-DGEMV_LANE_ROWS=4".to_string(),
                format!("--include-path={}", dir.display())
            ]
        );
    }
}
