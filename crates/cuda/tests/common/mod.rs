//! Helpers shared by the GPU tests: one backend per (GEMM precision, KV dtype) for the whole test
//! binary (or a printed reason to skip); deterministic random inputs and the error measure come
//! from the op harness (`deltaserve_tensor::op_check`).
#![allow(dead_code, unused_imports)]

use deltaserve_cuda::{CudaBackend, CudaOptions, GdnPrefill, GemmPrecision};
use deltaserve_tensor::{Backend, HostTensor, KvDtype};
use std::sync::OnceLock;

static F32_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static F32_BF16_KV_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static BF16_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static BF16_F32_KV_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static CHUNKED_GDN_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static SEQUENTIAL_SCAN_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static FLASH_PLAIN_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static FP8_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static FP8_TILES_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static FP8_W8A16_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static FP8_W8A8_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static FP8_GEMM_BF16_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static FP8_TWINS_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static FP8_DEEP_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static FP8_UNMIXED_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static FP8_DIAG_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static BF16_DIAG_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static BF16_DIAG_WIDE_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static BF16_SETS_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static BF16_SETS_WIDE_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static BF16_CORES_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static BF16_CORES_WIDE_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static FP8_DIAG_DEEP_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static LANES_BOUNDED_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static BF16_WIDE_LANES_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static BF16_NO_GEMV_TWINS_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static MLP_F32_ACT_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
static PREFILL_WITHOUT_SHORTCUTS_BACKEND: OnceLock<Result<CudaBackend, String>> = OnceLock::new();

/// The bf16 backend that keeps block-FP8 weights as FP8, or `None` after printing why not.
pub fn cuda_fp8(test: &str) -> Option<&'static CudaBackend> {
    let options = CudaOptions {
        keep_fp8_weights: Some(true),
        ..CudaOptions::default()
    };
    shared_backend(&FP8_BACKEND, options, test)
}

/// `cuda_fp8` with W8A16 kernels only (`GEMV_FP8_W8A8_FROM=17`: 2-8 rows on the tensor-core kernel
/// that widens the codes to bf16, as on GPUs before compute capability 8.9) and one row always on
/// the plain lane kernel (`GEMV_FP8_DEEP_BELOW=0`), or `None` after printing why not.
pub fn cuda_fp8_w8a16(test: &str) -> Option<&'static CudaBackend> {
    fp8_backend(&FP8_W8A16_BACKEND, &W8A16_DEFINES, test)
}

/// The defines of `cuda_fp8_w8a16`, which the backends described as its variants extend.
const W8A16_DEFINES: [(&str, &str); 2] =
    [("GEMV_FP8_W8A8_FROM", "17"), ("GEMV_FP8_DEEP_BELOW", "0")];

/// `cuda_fp8_w8a16` with one launch per format for a group mixing FP8 and bf16 matrices
/// (`GEMV_MIXED=0`; one launch for one token by default), or `None` after printing why not.
pub fn cuda_fp8_unmixed(test: &str) -> Option<&'static CudaBackend> {
    let defines = [W8A16_DEFINES[0], W8A16_DEFINES[1], ("GEMV_MIXED", "0")];
    fp8_backend(&FP8_UNMIXED_BACKEND, &defines, test)
}

/// `cuda_fp8_w8a16` with every iteration of the lane kernels bounded (`GEMV_LANE_UNCHECKED=0`;
/// the whole ones run unbounded by default), or `None` after printing why not.
pub fn cuda_lanes_bounded(test: &str) -> Option<&'static CudaBackend> {
    let defines = [
        W8A16_DEFINES[0],
        W8A16_DEFINES[1],
        ("GEMV_LANE_UNCHECKED", "0"),
    ];
    fp8_backend(&LANES_BOUNDED_BACKEND, &defines, test)
}

/// `cuda_fp8_w8a16` with all four tiles of the widening tensor-core kernel (2-32 rows;
/// `GEMV_FP8_MMA_TILES=4`, one tile by default), or `None` after printing why not.
pub fn cuda_fp8_tiles(test: &str) -> Option<&'static CudaBackend> {
    let defines = [("GEMV_FP8_W8A8_FROM", "17"), ("GEMV_FP8_MMA_TILES", "4")];
    fp8_backend(&FP8_TILES_BACKEND, &defines, test)
}

/// `cuda_fp8` with the W8A8 GEMV for 1-16 rows (`GEMV_FP8_W8A8_FROM=1`, `GEMV_FP8_W8A8_TO=16`;
/// 2-16 by default), or `None` after printing why not.
pub fn cuda_fp8_w8a8(test: &str) -> Option<&'static CudaBackend> {
    let defines = [("GEMV_FP8_W8A8_FROM", "1"), ("GEMV_FP8_W8A8_TO", "16")];
    fp8_backend(&FP8_W8A8_BACKEND, &defines, test)
}

/// `cuda_fp8` with the W8A8 GEMM writing bf16 that a cast widens (`FP8_GEMM_F32_OUT=0`; f32
/// straight into the output where the batch needs no padding by default), or `None` after printing
/// why not.
pub fn cuda_fp8_gemm_bf16_out(test: &str) -> Option<&'static CudaBackend> {
    fp8_backend(&FP8_GEMM_BF16_BACKEND, &[("FP8_GEMM_F32_OUT", "0")], test)
}

/// `cuda_fp8` with the layer norms writing FP8 twins of their outputs (`FP8_TWIN=1`, opt-in until
/// it has run on a GPU), or `None` after printing why not.
pub fn cuda_fp8_twins(test: &str) -> Option<&'static CudaBackend> {
    fp8_backend(&FP8_TWINS_BACKEND, &[("FP8_TWIN", "1")], test)
}

/// `cuda_fp8` with every one-token FP8 launch on the deeper-buffered lane kernel
/// (`GEMV_FP8_DEEP_BELOW` past any launch's warps), or `None` after printing why not.
pub fn cuda_fp8_deep(test: &str) -> Option<&'static CudaBackend> {
    fp8_backend(
        &FP8_DEEP_BACKEND,
        &[("GEMV_FP8_DEEP_BELOW", "1000000")],
        test,
    )
}

/// `cuda_fp8_w8a16` with the one-token FP8 lane kernels on the tensor cores (`GEMV_FP8_DIAG=1`),
/// or `None` after printing why not.
pub fn cuda_fp8_diag(test: &str) -> Option<&'static CudaBackend> {
    let defines = [W8A16_DEFINES[0], W8A16_DEFINES[1], ("GEMV_FP8_DIAG", "1")];
    fp8_backend(&FP8_DIAG_BACKEND, &defines, test)
}

/// `cuda_fp8_diag` with every one-token FP8 launch on the deeper-buffered kernel.
pub fn cuda_fp8_diag_deep(test: &str) -> Option<&'static CudaBackend> {
    let defines = [
        W8A16_DEFINES[0],
        ("GEMV_FP8_DIAG", "1"),
        ("GEMV_FP8_DEEP_BELOW", "1000000"),
    ];
    fp8_backend(&FP8_DIAG_DEEP_BACKEND, &defines, test)
}

/// The default backend with a prefill's dense MLP activation kept in f32 until the down GEMM's
/// cast (`MLP_BF16_ACT=0`), or `None` after printing why not.
pub fn cuda_mlp_f32_act(test: &str) -> Option<&'static CudaBackend> {
    fp8_backend(&MLP_F32_ACT_BACKEND, &[("MLP_BF16_ACT", "0")], test)
}

/// The default backend without the prefill's bf16 shortcuts (`BF16_TWIN=0`: the GEMMs cast their
/// inputs themselves; `GEMM_PAIRS=0`: the MLP's gate and up GEMMs as two calls;
/// `MLP_BF16_GATE_UP=0`: a prefill's gate and up GEMMs write f32), so the tests reach both paths,
/// or `None` after printing why not.
pub fn cuda_prefill_without_shortcuts(test: &str) -> Option<&'static CudaBackend> {
    fp8_backend(
        &PREFILL_WITHOUT_SHORTCUTS_BACKEND,
        &[
            ("BF16_TWIN", "0"),
            ("GEMM_PAIRS", "0"),
            ("MLP_BF16_GATE_UP", "0"),
        ],
        test,
    )
}

fn fp8_backend(
    cell: &'static OnceLock<Result<CudaBackend, String>>,
    defines: &[(&str, &str)],
    test: &str,
) -> Option<&'static CudaBackend> {
    backend_with_defines(cell, true, defines, test)
}

/// The default backend (bf16 GEMMs), FP8 weights kept or widened, with `defines`.
fn backend_with_defines(
    cell: &'static OnceLock<Result<CudaBackend, String>>,
    keep_fp8_weights: bool,
    defines: &[(&str, &str)],
    test: &str,
) -> Option<&'static CudaBackend> {
    let options = CudaOptions {
        keep_fp8_weights: Some(keep_fp8_weights),
        defines: defines
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect(),
        ..CudaOptions::default()
    };
    shared_backend(cell, options, test)
}

/// The f32 backend with the chunked delta rule for prefill, or `None` after printing why not.
pub fn cuda_chunked_gdn(test: &str) -> Option<&'static CudaBackend> {
    let options = CudaOptions {
        gemm_precision: GemmPrecision::F32,
        gdn_prefill: GdnPrefill::Chunked,
        ..CudaOptions::default()
    };
    shared_backend(&CHUNKED_GDN_BACKEND, options, test)
}

/// The default backend without the flash kernel's two defaults (`FLASH_HEAVY_FIRST=0`: tiles
/// launched in plan order; `FLASH_KV_PIPELINE=0`: a bf16 pool's K/V tiles single-buffered), or
/// `None` after printing why not.
pub fn cuda_flash_plain(test: &str) -> Option<&'static CudaBackend> {
    backend_with_defines(
        &FLASH_PLAIN_BACKEND,
        true,
        &[("FLASH_HEAVY_FIRST", "0"), ("FLASH_KV_PIPELINE", "0")],
        test,
    )
}

/// `cuda_chunked_gdn` with the scan computing one chunk after loading it (`GDN_SCAN_PIPELINE=0`;
/// the default loads the next chunk meanwhile), or `None` after printing why not.
pub fn cuda_chunked_gdn_sequential(test: &str) -> Option<&'static CudaBackend> {
    let options = CudaOptions {
        gemm_precision: GemmPrecision::F32,
        gdn_prefill: GdnPrefill::Chunked,
        defines: vec![("GDN_SCAN_PIPELINE".to_string(), "0".to_string())],
        ..CudaOptions::default()
    };
    shared_backend(&SEQUENTIAL_SCAN_BACKEND, options, test)
}

/// The backend on GPU 0 with `precision` and the KV dtype that goes with it (bf16 pools with bf16
/// GEMMs, as `serve` runs by default; f32 pools with f32 GEMMs, the exact mode), or `None` after
/// printing why the test is skipped.
pub fn cuda(precision: GemmPrecision, test: &str) -> Option<&'static CudaBackend> {
    cuda_kv(precision, precision.default_kv_dtype(), test)
}

/// The backend on GPU 0 with `precision` whose KV pools hold `kv_dtype`, or `None` after printing
/// why the test is skipped.
pub fn cuda_kv(
    precision: GemmPrecision,
    kv_dtype: KvDtype,
    test: &str,
) -> Option<&'static CudaBackend> {
    let cell = match (precision, kv_dtype) {
        (GemmPrecision::F32, KvDtype::F32) => &F32_BACKEND,
        (GemmPrecision::F32, KvDtype::Bf16) => &F32_BF16_KV_BACKEND,
        (GemmPrecision::Bf16, KvDtype::Bf16) => &BF16_BACKEND,
        (GemmPrecision::Bf16, KvDtype::F32) => &BF16_F32_KV_BACKEND,
    };
    let options = CudaOptions {
        gemm_precision: precision,
        kv_dtype: Some(kv_dtype),
        // Block-FP8 checkpoints widened to bf16 at load, as the tests of these backends expect
        // (`cuda_fp8` keeps them).
        keep_fp8_weights: Some(false),
        ..CudaOptions::default()
    };
    shared_backend(cell, options, test)
}

/// The bf16 backend whose small launches keep the lane kernels' usual rows a warp
/// (`GEMV_LANE_NARROW=0`; one row a warp below a block per SM by default), or `None` after
/// printing why not.
pub fn cuda_wide_lanes(test: &str) -> Option<&'static CudaBackend> {
    let defines = [("GEMV_LANE_NARROW", "0")];
    backend_with_defines(&BF16_WIDE_LANES_BACKEND, false, &defines, test)
}

/// The bf16 backend with the lane kernels on the tensor cores (`GEMV_BF16_DIAG=1`), and the same
/// with small launches kept on the usual rows a warp (`GEMV_LANE_NARROW=0`), or `None` after
/// printing why not.
pub fn cuda_bf16_diag(test: &str) -> Option<&'static CudaBackend> {
    let defines = [("GEMV_BF16_DIAG", "1")];
    backend_with_defines(&BF16_DIAG_BACKEND, false, &defines, test)
}

pub fn cuda_bf16_diag_wide(test: &str) -> Option<&'static CudaBackend> {
    let defines = [("GEMV_BF16_DIAG", "1"), ("GEMV_LANE_NARROW", "0")];
    backend_with_defines(&BF16_DIAG_WIDE_BACKEND, false, &defines, test)
}

/// The bf16 backend with the lane kernels on the tensor cores, four tokens an mma
/// (`GEMV_BF16_SETS=1`, the default, named so the test holds whatever `DELTASERVE_CUDA_DEFINES`
/// says), and the same without the narrow kernels, or `None` after printing why not.
pub fn cuda_bf16_sets(test: &str) -> Option<&'static CudaBackend> {
    let defines = [("GEMV_BF16_SETS", "1")];
    backend_with_defines(&BF16_SETS_BACKEND, false, &defines, test)
}

pub fn cuda_bf16_sets_wide(test: &str) -> Option<&'static CudaBackend> {
    let defines = [("GEMV_BF16_SETS", "1"), ("GEMV_LANE_NARROW", "0")];
    backend_with_defines(&BF16_SETS_WIDE_BACKEND, false, &defines, test)
}

/// The bf16 backend with the lane kernels on the CUDA cores (`GEMV_BF16_SETS=0`), and the same
/// without the narrow kernels, or `None` after printing why not.
pub fn cuda_bf16_cores(test: &str) -> Option<&'static CudaBackend> {
    let defines = [("GEMV_BF16_SETS", "0")];
    backend_with_defines(&BF16_CORES_BACKEND, false, &defines, test)
}

pub fn cuda_bf16_cores_wide(test: &str) -> Option<&'static CudaBackend> {
    let defines = [("GEMV_BF16_SETS", "0"), ("GEMV_LANE_NARROW", "0")];
    backend_with_defines(&BF16_CORES_WIDE_BACKEND, false, &defines, test)
}

/// The bf16 backend whose norms write bf16 twins only for cuBLAS GEMMs, past the GEMV kernels'
/// rows (`GEMV_TWIN=0`; for GEMV steps of 2-8 rows too by default), or `None` after printing why
/// not.
pub fn cuda_without_gemv_twins(test: &str) -> Option<&'static CudaBackend> {
    backend_with_defines(
        &BF16_NO_GEMV_TWINS_BACKEND,
        false,
        &[("GEMV_TWIN", "0")],
        test,
    )
}

/// The backend `cell` holds for the whole test binary, made with `options` on first use.
fn shared_backend(
    cell: &'static OnceLock<Result<CudaBackend, String>>,
    options: CudaOptions,
    test: &str,
) -> Option<&'static CudaBackend> {
    match cell.get_or_init(|| CudaBackend::with_options(0, options).map_err(|e| e.to_string())) {
        Ok(b) => Some(b),
        Err(why) => {
            println!("SKIP {test}: no usable CUDA device: {why}");
            None
        }
    }
}

/// The op harness's inputs and error measure, shared with the cpu backend's tests and doctor.
pub use deltaserve_tensor::op_check::{check, Rng};

/// `matmul_group` over the matrices `host` (loaded on `be`) for `tokens` rows of `x`, each
/// matrix's output read back: the form the kernel-variant tests compare bit for bit.
pub fn group_products(
    be: &CudaBackend,
    host: &[HostTensor],
    x: &[f32],
    tokens: usize,
) -> Vec<Vec<f32>> {
    let ws: Vec<_> = host.iter().map(|t| be.load_mat(t).unwrap()).collect();
    let mut outs: Vec<_> = host.iter().map(|t| be.zeros(tokens * t.shape[0])).collect();
    let mut out_refs: Vec<_> = outs.iter_mut().collect();
    be.matmul_group(
        &be.upload(x),
        &ws.iter().collect::<Vec<_>>(),
        &mut out_refs,
        tokens,
    );
    outs.iter().map(|o| be.to_host(o)).collect()
}

/// `matmul_silu_gate` against `matmul_group` over `[gate, up]` then `silu_mul`, bit for bit, for
/// token counts on both sides of the paired kernels' limits (4 for the CUDA-core kernel, 32 for the
/// FP8 tensor-core one, whose tiles change at 8, 16 and 24; the two ops past them), into an output
/// poisoned with NaN so that an unwritten element fails.
pub fn assert_silu_gate_is_the_two_ops(
    be: &CudaBackend,
    gate: &deltaserve_cuda::CudaMat,
    up: &deltaserve_cuda::CudaMat,
    rng: &mut Rng,
    what: &str,
) {
    use deltaserve_tensor::Backend;
    let (rows, k) = be.mat_shape(gate);
    for tokens in (1..=10).chain([16, 17, 32, 33]) {
        let x = be.upload(&rng.vec(tokens * k, 1.0));
        let mut fused = be.upload(&vec![f32::NAN; tokens * rows]);
        be.matmul_silu_gate(&x, gate, up, &mut fused, tokens);
        let (mut g, mut u) = (be.zeros(tokens * rows), be.zeros(tokens * rows));
        be.matmul_group(&x, &[gate, up], &mut [&mut g, &mut u], tokens);
        let mut act = be.zeros(tokens * rows);
        be.silu_mul(&g, &u, &mut act);
        assert_eq!(
            be.to_host(&fused),
            be.to_host(&act),
            "{what} [{rows}x{k}], {tokens} tokens: the fused silu gate differs from its two ops"
        );
    }
}
