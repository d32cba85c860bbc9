//! Block-FP8 weights on the FP8 tensor cores (cuBLASLt, Hopper and later): the GEMMs the FP8 GEMV
//! kernels do not take (prefill, large decode batches). The activations are quantized as the
//! format intends (`quantize_activations_fp8`: e4m3 codes with one f32 scale per token and 128
//! columns, the 1 x 128 block), the weights keep their 128 x 128 block scales, and cuBLASLt applies
//! both scales per 128-wide slice of the sum in f32 (`VEC128_32F` x `BLK128x128_32F`), writing f32
//! straight into the op's output where the batch needs no padding, otherwise bf16 that is widened
//! to f32 for the next op (`FP8_GEMM_F32_OUT=0`: always the latter). This is W8A8 numerics, as
//! SGLang's FP8 path computes;
//! the widened-to-bf16 path (`FP8_GEMM=0` in `DELTASERVE_CUDA_DEFINES`, and wherever cuBLASLt has
//! no algorithm) keeps the activations' bf16 values. Plans (descriptors and the chosen algorithm)
//! are made once per shape.

use crate::backend::{launch, launch_elementwise, CudaBackend};
use crate::buffer::CudaBuf;
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// Columns per activation scale and rows/columns per weight scale.
const BLOCK: usize = 128;
/// cuBLASLt's workspace; its documentation recommends 32 MiB on Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;
/// Plans kept before the cache starts over (one per `[n, rows, k]` and output type; prefill
/// chunks vary in length, so the set of shapes is open).
const MAX_PLANS: usize = 4096;
/// Warps per block of `quantize_activations_fp8` (one warp per token and 128 columns).
const QUANTIZE_WARPS: usize = 8;
/// The GEMM's token count is padded to a multiple of this (zero rows): cuBLASLt's block-scaled
/// kernels declined 33 and 40 rows on the H200 (CUBLAS_STATUS_NOT_SUPPORTED) and took 16-2048.
const TOKEN_ALIGN: usize = 16;

/// A token batch's activations as e4m3 codes `[rows, k]` and their scales `[k / 128, rows]`, the
/// tokens padded with zero rows to `rows` (a multiple of `TOKEN_ALIGN`).
pub(crate) struct Fp8Activations {
    pub(crate) codes: CudaSlice<u8>,
    pub(crate) scales: CudaSlice<f32>,
    pub(crate) rows: usize,
}

/// The cuBLASLt handle, its workspace and the plans made so far.
pub(crate) struct Fp8Gemm {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    /// Per `[n, rows, k, f32 output]`; `None`: cuBLASLt has no algorithm for it (the caller widens
    /// to bf16 instead, or takes the bf16 output).
    plans: HashMap<[usize; 4], Option<Plan>>,
    /// Whether the GEMM writes f32 straight into the op's output where the batch needs no padding
    /// (default; `FP8_GEMM_F32_OUT=0`: bf16, then `cast_bf16_to_f32`). 27B prefill of 2048 tokens
    /// on the H200 (session 14): 12,425 tok/s against 11,834 with the bf16 output and the cast.
    f32_out: bool,
}

// SAFETY: the handle and the plans' descriptors are used only through `&mut Fp8Gemm`, which the
// backend keeps behind a mutex, so one thread at a time calls cuBLASLt with them (cuBLASLt allows
// a handle on any thread, not on two at once).
unsafe impl Send for Fp8Gemm {}

/// The descriptors and algorithm of one GEMM shape.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    weights: sys::cublasLtMatrixLayout_t,
    activations: sys::cublasLtMatrixLayout_t,
    out: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `Plan::new` and is destroyed once, here.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.out);
            let _ = lt::destroy_matrix_layout(self.activations);
            let _ = lt::destroy_matrix_layout(self.weights);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

impl Drop for Fp8Gemm {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: created by `Fp8Gemm::new`, destroyed once, after every plan that used it.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

/// Whether a `[n, k]` block-FP8 matrix fits the FP8 GEMM: whole 128 x 128 blocks (one activation
/// scale per 128 columns; cuBLASLt declined 64- and 300-row matrices on the H200), and a weight
/// scale row cuBLASLt reads without padding (its 128 x 128 scales are laid out in rows of a
/// multiple of 4 blocks).
pub(crate) fn fp8_gemm_fits(n: usize, k: usize) -> bool {
    k > 0
        && k.is_multiple_of(BLOCK)
        && (k / BLOCK).is_multiple_of(4)
        && n > 0
        && n.is_multiple_of(BLOCK)
        && [n, k].iter().all(|&d| d <= i32::MAX as usize)
}

impl Fp8Gemm {
    /// The handle and workspace, or why cuBLASLt cannot start here.
    pub(crate) fn new(backend: &CudaBackend, f32_out: bool) -> Result<Self, String> {
        let handle = lt::create_handle().map_err(|e| format!("cublasLtCreate: {e}"))?;
        let workspace = backend.alloc_for_overwrite("cuBLASLt workspace", WORKSPACE_BYTES);
        Ok(Self {
            handle,
            workspace,
            plans: HashMap::new(),
            f32_out,
        })
    }
}

/// The plan for `[n, rows, k]` with an f32 or a bf16 output from `plans`, made on first use
/// (`None` and a log line when cuBLASLt declines it).
fn plan_for(
    plans: &mut HashMap<[usize; 4], Option<Plan>>,
    handle: sys::cublasLtHandle_t,
    [n, rows, k]: [usize; 3],
    f32_out: bool,
    scales: [u64; 2],
) -> Option<&Plan> {
    let instead = if f32_out {
        "f32 output declined; bf16 instead"
    } else {
        "widening the weights to bf16 for this shape"
    };
    plans
        .entry([n, rows, k, usize::from(f32_out)])
        .or_insert_with(|| {
            Plan::new(handle, [n, rows, k], f32_out, scales)
                .map_err(|why| eprintln!("cuda: FP8 GEMM {rows}x{k} @ {n}x{k}^T: {why}; {instead}"))
                .ok()
        })
        .as_ref()
}

impl Plan {
    /// The plan for `out [tokens, n] bf16 (or f32) = x_q [tokens, k] (VEC128 scales) @ w [n, k]^T
    /// (BLK128x128 scales)`, or why there is none. bf16 is the output cuBLASLt's documentation
    /// lists for block-scaled FP8 on Hopper (an f32 one was tried only before the scale pointers
    /// below were set, and failed as bf16 then did). cuBLASLt is column-major: `out^T [n, tokens]
    /// = op(A) B` with A the row-major weights transposed (`k x n`, ld k) and B the activations
    /// (`k x tokens`, ld k).
    ///
    /// `scale_pointers` (weights', activations') are set before the algorithm is chosen: cuBLASLt
    /// answers a block-scaled heuristic query without them with CUBLAS_STATUS_INVALID_VALUE.
    fn new(
        handle: sys::cublasLtHandle_t,
        [n, tokens, k]: [usize; 3],
        f32_out: bool,
        scale_pointers: [u64; 2],
    ) -> Result<Self, String> {
        let fail = |what: &str, e: lt::CublasError| format!("{what}: {e}");
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(|e| fail("cublasLtMatmulDescCreate", e))?;
        let e4m3 = sys::cudaDataType::CUDA_R_8F_E4M3;
        let layouts = [
            (e4m3, k, n, k),
            (e4m3, k, tokens, k),
            if f32_out {
                (sys::cudaDataType::CUDA_R_32F, n, tokens, n)
            } else {
                (sys::cudaDataType::CUDA_R_16BF, n, tokens, n)
            },
        ];
        let mut made = Vec::with_capacity(3);
        for (dtype, rows, cols, ld) in layouts {
            match lt::create_matrix_layout(dtype, rows as u64, cols as u64, ld as i64) {
                Ok(layout) => made.push(layout),
                Err(e) => {
                    // SAFETY: each was created just above and is not used again.
                    unsafe {
                        for layout in made {
                            let _ = lt::destroy_matrix_layout(layout);
                        }
                        let _ = lt::destroy_matmul_desc(desc);
                    }
                    return Err(fail("cublasLtMatrixLayoutCreate", e));
                }
            }
        }
        let mut plan = Self {
            desc,
            weights: made[0],
            activations: made[1],
            out: made[2],
            // Replaced by the heuristic's choice below.
            algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
        };
        plan.describe()
            .and_then(|()| plan.point_at_scales(scale_pointers))
            .map_err(|e| fail("cublasLtMatmulDescSetAttribute", e))?;
        plan.algo = plan.choose_algo(handle)?;
        Ok(plan)
    }

    fn describe(&self) -> Result<(), lt::CublasError> {
        let transposed = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T;
        let plain = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N;
        let weight_scales =
            sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        let activation_scales =
            sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        use sys::cublasLtMatmulDescAttributes_t as Attr;
        // SAFETY: each value is a live local of the type the attribute takes, passed with its size.
        unsafe {
            set_desc(self.desc, Attr::CUBLASLT_MATMUL_DESC_TRANSA, &transposed)?;
            set_desc(self.desc, Attr::CUBLASLT_MATMUL_DESC_TRANSB, &plain)?;
            set_desc(
                self.desc,
                Attr::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                &weight_scales,
            )?;
            set_desc(
                self.desc,
                Attr::CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                &activation_scales,
            )?;
        }
        Ok(())
    }

    /// Points the descriptor at this call's weight and activation scales (device addresses).
    fn point_at_scales(&self, [weights, activations]: [u64; 2]) -> Result<(), lt::CublasError> {
        use sys::cublasLtMatmulDescAttributes_t as Attr;
        // SAFETY: the attributes take a device pointer, passed as a live local of pointer size.
        unsafe {
            set_desc(
                self.desc,
                Attr::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                &weights,
            )?;
            set_desc(
                self.desc,
                Attr::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                &activations,
            )
        }
    }

    fn choose_algo(
        &self,
        handle: sys::cublasLtHandle_t,
    ) -> Result<sys::cublasLtMatmulAlgo_t, String> {
        let pref =
            lt::create_matmul_pref().map_err(|e| format!("cublasLtMatmulPreferenceCreate: {e}"))?;
        let workspace = WORKSPACE_BYTES;
        // SAFETY: pref was created above; the attribute takes a size_t, passed with its size; the
        // heuristic reads descriptors this plan owns; pref is destroyed once, after its last use.
        unsafe {
            let chosen = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&workspace as *const usize).cast::<c_void>(),
                std::mem::size_of::<usize>(),
            )
            .and_then(|()| {
                lt::get_matmul_algo_heuristic(
                    handle,
                    self.desc,
                    self.weights,
                    self.activations,
                    self.out,
                    self.out,
                    pref,
                )
            });
            let _ = lt::destroy_matmul_pref(pref);
            chosen
                .map(|heuristic| heuristic.algo)
                .map_err(|e| format!("no cuBLASLt algorithm: {e}"))
        }
    }
}

/// # Safety
/// `desc` is a live descriptor and `T` the type attribute `attr` takes.
unsafe fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<(), lt::CublasError> {
    lt::set_matmul_desc_attribute(
        desc,
        attr,
        (value as *const T).cast::<c_void>(),
        std::mem::size_of::<T>(),
    )
}

/// The rows of a batch of `tokens` quantized activations: padded to the GEMM's multiple.
pub(crate) fn fp8_activation_rows(tokens: usize) -> usize {
    tokens.next_multiple_of(TOKEN_ALIGN)
}

impl CudaBackend {
    /// Room for `codes` e4m3 activation codes and `scales` scales, to be written whole (`rows`
    /// left for the writer to set).
    pub(crate) fn alloc_fp8_activations(&self, codes: usize, scales: usize) -> Fp8Activations {
        Fp8Activations {
            codes: self.alloc_for_overwrite("fp8 activations", codes),
            scales: self.alloc_for_overwrite("fp8 activation scales", scales),
            rows: 0,
        }
    }

    /// `x [tokens, k]` as e4m3 codes and per-128-column scales; `k % 128 == 0` (the caller
    /// checked `fp8_gemm_fits`) and x holds `tokens * k` values (checked by `matmul_group_op`).
    pub(crate) fn quantize_activations_fp8(
        &self,
        x: &CudaBuf,
        tokens: usize,
        k: usize,
    ) -> Fp8Activations {
        let rows = fp8_activation_rows(tokens);
        // Overwritten whole below: every (row, group) warp writes its 128 codes and its scale.
        let Fp8Activations {
            mut codes,
            mut scales,
            ..
        } = self.alloc_fp8_activations(rows * k, rows * k / BLOCK);
        let warps = rows * k / BLOCK;
        let cfg = LaunchConfig {
            grid_dim: (warps.div_ceil(QUANTIZE_WARPS) as u32, 1, 1),
            block_dim: (32 * QUANTIZE_WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (tokens32, rows32, k32) = (tokens as i32, rows as i32, k as i32);
        // Contract: x holds tokens * k f32 with k % 128 == 0 (whole float4 loads per lane, 16-byte
        // aligned rows; rows past tokens are not read); codes rows * k bytes, scales rows * k / 128
        // values.
        launch!(
            self,
            "quantize_activations_fp8",
            cfg,
            x.data(),
            &mut codes,
            &mut scales,
            &tokens32,
            &rows32,
            &k32
        );
        Fp8Activations {
            codes,
            scales,
            rows,
        }
    }

    /// `out [tokens, n] = x_q @ w^T` on the FP8 tensor cores, or `false` (nothing written) when
    /// this backend has no FP8 GEMM or cuBLASLt no algorithm for the shape.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fp8_gemm_op(
        &self,
        x: &Fp8Activations,
        codes: &CudaSlice<u8>,
        scales: &CudaSlice<f32>,
        out: &mut CudaBuf,
        n: usize,
        tokens: usize,
        k: usize,
    ) -> bool {
        let Some(gemm) = &self.fp8_gemm else {
            return false;
        };
        let mut gemm = gemm.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let gemm = &mut *gemm;
        if gemm.plans.len() >= MAX_PLANS {
            gemm.plans.clear();
        }
        let handle = gemm.handle;
        let (w_scale_ptr, _ws) = scales.device_ptr(&self.stream);
        let (x_scale_ptr, _xs) = x.scales.device_ptr(&self.stream);
        let scale_pointers = [w_scale_ptr, x_scale_ptr];
        let rows = x.rows;
        // An f32 output goes straight into `out`, which holds `tokens` rows: only unpadded batches.
        let shape = [n, rows, k];
        let f32_out = gemm.f32_out
            && rows == tokens
            && plan_for(&mut gemm.plans, handle, shape, true, scale_pointers).is_some();
        let (workspace_ptr, _wsp) = gemm.workspace.device_ptr_mut(&self.stream);
        let Some(plan) = plan_for(&mut gemm.plans, handle, shape, f32_out, scale_pointers) else {
            return false;
        };
        if let Err(e) = self.ctx.bind_to_thread() {
            crate::backend::device_failure("fp8 matmul (binding the context)", e);
        }
        let (w_ptr, _w) = codes.device_ptr(&self.stream);
        let (x_ptr, _x) = x.codes.device_ptr(&self.stream);
        // bf16 output: written whole by the GEMM, then widened into `out`.
        let mut product: Option<CudaSlice<u16>> =
            (!f32_out).then(|| self.alloc_for_overwrite("fp8 gemm output", rows * n));
        let (out_ptr, out_guard) = match &mut product {
            Some(product) => product.device_ptr_mut(&self.stream),
            None => out.data_mut().device_ptr_mut(&self.stream),
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the plan's layouts describe exactly these buffers: codes n * k bytes with the
        // 128 x 128 scale grid (n / 128 rows of k / 128), x's codes rows * k bytes with k / 128 x
        // rows scales, the output rows * n bf16 (allocated above) or, for an f32 plan, out's
        // tokens * n = rows * n f32 (checked by matmul_group_op; rows == tokens above); the scale
        // pointers are device addresses set before the call that reads them, under the mutex; the
        // workspace holds WORKSPACE_BYTES as the plan's preference said; alpha/beta are host f32.
        let status = plan.point_at_scales(scale_pointers).and_then(|()| unsafe {
            lt::matmul(
                handle,
                plan.desc,
                (&alpha as *const f32).cast::<c_void>(),
                (&beta as *const f32).cast::<c_void>(),
                w_ptr as *const c_void,
                plan.weights,
                x_ptr as *const c_void,
                plan.activations,
                out_ptr as *const c_void,
                plan.out,
                out_ptr as *mut c_void,
                plan.out,
                &plan.algo,
                workspace_ptr as *mut c_void,
                WORKSPACE_BYTES,
                self.stream.cu_stream() as sys::cudaStream_t,
            )
        });
        if let Err(e) = status {
            crate::backend::device_failure("fp8 matmul (cublasLtMatmul)", e);
        }
        // The widening below reads `product` and writes `out`, which the guard borrows.
        drop(out_guard);
        if let Some(product) = &product {
            // Contract: product holds rows >= tokens rows of n bf16 values (written above), the
            // first tokens of them are out's rows (out holds tokens * n f32, checked by
            // matmul_group_op); both are whole allocations (16-byte aligned).
            launch_elementwise!(
                self,
                "cast_bf16_to_f32",
                count = tokens * n,
                4 per thread,
                product,
                out.data_mut(),
                &count
            );
        }
        true
    }
}

/// The backend's FP8 GEMM, shared by its clones.
pub(crate) type SharedFp8Gemm = Option<Arc<Mutex<Fp8Gemm>>>;
