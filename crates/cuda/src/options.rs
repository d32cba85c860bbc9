//! How a `CudaBackend` is built: GEMM precision and where to find CUDA's libraries, headers and the
//! PTX cache. The defaults read the usual environment variables once, here, at the edge.

use deltaserve_tensor::KvDtype;
use std::path::PathBuf;

/// Precision of `matmul`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GemmPrecision {
    /// Weights stored as bf16 on the device (f32 and f16 checkpoints are rounded to bf16 at load);
    /// activations rounded to bf16 (nearest even) before each GEMM; bf16 tensor cores with f32
    /// accumulation and f32 output. The serving default: half the weight memory, full tensor-core
    /// rate. Each product carries the bf16 rounding of its activation (relative error <= 2^-9).
    #[default]
    Bf16,
    /// Weights stored as f32 (bf16 widened exactly), f32 activations, cuBLAS in pedantic f32 (no
    /// TF32). Twice the weight memory and far slower; for checking the model against the reference.
    F32,
}

impl GemmPrecision {
    /// The KV dtype that goes with these GEMMs when none is asked for.
    pub fn default_kv_dtype(self) -> KvDtype {
        match self {
            Self::Bf16 => KvDtype::Bf16,
            Self::F32 => KvDtype::F32,
        }
    }
}

/// How the delta rule runs over long new sequences (prefill; verify steps always use the recurrence).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GdnPrefill {
    /// The chunked form on the tensor cores (gdn_chunked.cu, TF32) under bf16 precision, the exact
    /// recurrence under f32 precision. The default.
    #[default]
    Auto,
    /// The recurrence with the state in registers, token by token (gdn.cu).
    Recurrent,
    /// The chunked form wherever the shape allows it, also under f32 precision (for tests).
    Chunked,
}
// `DELTASERVE_GDN_PREFILL=recurrent|chunked` picks one for the defaults (to measure the two).

/// Environment variables that pick kernel variants in `CudaOptions::default()` (for measuring them;
/// `bench` records the ones set): early starts off (`0`), extra kernel macro definitions, the
/// delta-rule prefill form.
pub const PDL_ENV: &str = "DELTASERVE_CUDA_PDL";
pub const DEFINES_ENV: &str = "DELTASERVE_CUDA_DEFINES";
pub const GDN_PREFILL_ENV: &str = "DELTASERVE_GDN_PREFILL";
pub const FP8_WEIGHTS_ENV: &str = "DELTASERVE_CUDA_FP8_WEIGHTS";
pub const KERNEL_VARIANT_ENV: [&str; 4] = [PDL_ENV, DEFINES_ENV, GDN_PREFILL_ENV, FP8_WEIGHTS_ENV];

/// Everything `CudaBackend::with_options` needs.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    pub gemm_precision: GemmPrecision,
    /// The element type of the KV pools (`Backend::kv_dtype`); `None`: that of the GEMMs (bf16
    /// with `GemmPrecision::Bf16`, f32 with `F32`, which keeps the f32 mode exact).
    pub kv_dtype: Option<KvDtype>,
    pub gdn_prefill: GdnPrefill,
    /// Folders searched for libcuda, libnvrtc and libcublas when the system library path lacks them.
    pub library_dirs: Vec<PathBuf>,
    /// Passed to NVRTC as include paths when they exist (the kernels themselves need no header).
    pub include_dirs: Vec<PathBuf>,
    /// Where compiled PTX is kept between runs; `None` compiles at every start.
    pub ptx_cache_dir: Option<PathBuf>,
    /// Launch kernels that wait for their predecessor themselves before it has finished
    /// (programmatic dependent launch, Hopper and newer; launcher.rs). Default on;
    /// `DELTASERVE_CUDA_PDL=0` turns it off, to measure what it brings.
    pub dependent_launch: bool,
    /// Extra `NAME=VALUE` macro definitions for every kernel file, overriding the tuning
    /// constants the kernels declare with `#ifndef` (`DELTASERVE_CUDA_DEFINES`, space separated):
    /// for measuring kernel variants without rebuilding. Launchers whose grids depend on such a
    /// constant read it back with `CudaOptions::define`.
    pub defines: Vec<(String, String)>,
    /// Keep block-FP8 weights as FP8 on the device (the W8A16 GEMV for up to 8 rows, the W8A8
    /// tensor-core GEMM past that on Hopper, widened to bf16 per product elsewhere) instead of
    /// widening them to bf16 at load. `None`: kept where the GPU has the FP8 tensor-core GEMM
    /// (compute capability 9.0 on), where every measured FP8 figure beats bf16 (docs/fp8.md);
    /// `DELTASERVE_CUDA_FP8_WEIGHTS=1` keeps them on any GPU, `=0` widens them.
    pub keep_fp8_weights: Option<bool>,
}

impl CudaOptions {
    /// The value of `-D name=...` in `defines`, if any, parsed.
    pub fn define<T: std::str::FromStr>(&self, name: &str) -> Option<T> {
        self.defines
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.parse().ok())
    }
}

/// `NAME=VALUE` pairs separated by spaces; a bare `NAME` defines it as 1.
fn parse_defines(text: &str) -> Vec<(String, String)> {
    text.split_whitespace()
        .map(|item| match item.split_once('=') {
            Some((name, value)) => (name.to_string(), value.to_string()),
            None => (item.to_string(), "1".to_string()),
        })
        .collect()
}

impl Default for CudaOptions {
    /// `$CUDA_HOME`, `$CUDA_PATH` and `/usr/local/cuda` (lib64, targets/x86_64-linux/lib, include),
    /// the driver folders of NVIDIA containers, and `$XDG_CACHE_HOME/deltaserve/ptx` (else
    /// `~/.cache/deltaserve/ptx`).
    fn default() -> Self {
        let env_dir = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let mut roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
            .iter()
            .filter_map(|v| env_dir(v))
            .collect();
        roots.push(PathBuf::from("/usr/local/cuda"));
        let mut library_dirs = Vec::new();
        for root in &roots {
            library_dirs.push(root.join("lib64"));
            library_dirs.push(root.join("targets/x86_64-linux/lib"));
            library_dirs.push(root.join("lib"));
        }
        library_dirs.extend(
            [
                "/usr/local/nvidia/lib64",
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib64",
            ]
            .map(PathBuf::from),
        );
        let include_dirs = roots.iter().map(|r| r.join("include")).collect();
        let ptx_cache_dir = env_dir("XDG_CACHE_HOME")
            .or_else(|| env_dir("HOME").map(|h| h.join(".cache")))
            .map(|c| c.join("deltaserve").join("ptx"));
        Self {
            gemm_precision: GemmPrecision::default(),
            kv_dtype: None,
            gdn_prefill: match std::env::var(GDN_PREFILL_ENV).as_deref() {
                Ok("recurrent") => GdnPrefill::Recurrent,
                Ok("chunked") => GdnPrefill::Chunked,
                _ => GdnPrefill::default(),
            },
            library_dirs,
            include_dirs,
            ptx_cache_dir,
            dependent_launch: std::env::var(PDL_ENV).map_or(true, |v| v != "0"),
            defines: std::env::var(DEFINES_ENV)
                .map(|v| parse_defines(&v))
                .unwrap_or_default(),
            keep_fp8_weights: match std::env::var(FP8_WEIGHTS_ENV).as_deref() {
                Ok("1") => Some(true),
                Ok("0") => Some(false),
                _ => None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_defines;

    #[test]
    fn defines_parse_as_pairs_and_bare_names() {
        assert_eq!(
            parse_defines(" GEMV_LANE_ROWS=4  FAST "),
            vec![
                ("GEMV_LANE_ROWS".to_string(), "4".to_string()),
                ("FAST".to_string(), "1".to_string())
            ]
        );
        assert!(parse_defines("").is_empty());
    }
}
