//! `CudaBackend`: start-up (libraries, device, NVRTC kernels, cuBLAS) and the `Backend` impl, which
//! forwards each op to its module (`dense`, `gemm`, `attention`, `gdn`). Everything runs in order
//! on one stream; host-side metadata is uploaded per call.

use crate::buffer::CudaBuf;
use crate::compile;
use crate::detect::{open_device, OpenDevice};
use crate::error::CudaError;
use crate::launcher;
use crate::libraries;
use crate::mat::{CudaMat, MatData, FP8_BLOCK};
use crate::options::{CudaOptions, GdnPrefill, GemmPrecision};
use crate::profile::OpProfiler;
use crate::upload_cache::UploadCache;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, ValidAsZeroBits,
};
use deltaserve_tensor::{
    AttnShape, Backend, BatchLayout, Device, ExpertShape, ExpertTensors, Experts, GdnGateInputs,
    GdnShape, GeneratedMatrix, HostTensor, KvDtype, KvLayerPool, MoeRouting, OpTiming, RouteChoice,
    RowSampling, SharedExpert, StateLayerPool, StepGraph, StepInputs, TensorError,
};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// RoPE inverse frequencies on the device per `(rotary_dim, theta bits)`.
pub(crate) type RopeTables = HashMap<(usize, u32), Arc<CudaSlice<f32>>>;

/// Threads per block of the elementwise kernels.
pub(crate) const ELEMENTWISE_THREADS: u32 = 256;

/// The CUDA backend: one GPU, one stream, kernels compiled for that GPU at start-up. Clones are
/// cheap and share the stream, the kernels and the cuBLAS handle (ops stay in one order).
#[derive(Clone)]
pub struct CudaBackend {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    /// cuBLAS handles are not meant to be driven from several threads at once.
    pub(crate) blas: Arc<Mutex<CudaBlas>>,
    kernels: Arc<HashMap<&'static str, Kernel>>,
    /// Whether kernels that wait for their predecessor themselves are launched early (PDL).
    pub(crate) dependent_launch: bool,
    pub(crate) gemv_lane_shape: crate::gemv::LaneShape,
    pub(crate) moe_slot_shape: crate::moe::SlotShape,
    /// Output rows a block of the grouped MoE kernels (moe.rs `grouped_rows_per_block`).
    pub(crate) moe_grouped_rows: usize,
    /// Whether decode attention takes a kv head's query heads in one block (attention.rs).
    pub(crate) grouped_attention: bool,
    /// Whether the gated RMSNorm of rows up to 256 values takes a warp a row (dense.rs;
    /// `GATED_NORM_WARP=0`: a block a row, to measure).
    pub(crate) gated_norm_by_warp: bool,
    /// Whether a prefill's dense MLP hands its activation to the down GEMM as bf16 written once
    /// (gemm.rs `dense_mlp_op`; `MLP_BF16_ACT=0`: silu_mul in f32, then the GEMM's cast).
    pub(crate) bf16_act_mlp: bool,
    /// Whether the norms write a bf16 twin of outputs that go on to bf16 GEMMs (buffer.rs;
    /// `BF16_TWIN=0` turns it off, to measure).
    pub(crate) bf16_twins: bool,
    /// Whether the twins are written for GEMV steps of 2-8 rows too, whose kernels read bf16
    /// activations: the twin replaces the cast launch before each matrix group (`GEMV_TWIN=0`
    /// turns it off; on an H100, session 24, MTP k=3 verifies 0.6-1.4 % faster with it on the
    /// 35B-A3B, 27B and 9B shapes).
    pub(crate) gemv_twins: bool,
    /// Whether the layer norms write an FP8 twin of outputs that go on to FP8 GEMMs and GEMVs
    /// (buffer.rs; opt-in, `FP8_TWIN=1`: no faster on an H100, session 34; `ROW_QUADS=0` keeps it
    /// off: the twin is written from the norm's quads).
    pub(crate) fp8_twins: bool,
    /// Whether a prefill's gate and up GEMMs run as one batched cuBLAS GEMM (gemm.rs
    /// `silu_gate_of_bf16_products`; `GEMM_PAIRS=0` turns it off, to measure).
    pub(crate) gemm_pairs: bool,
    /// Whether a prefill's gate and up GEMMs write bf16 products for the activation (gemm.rs
    /// `dense_mlp_op`; it rounds the products once more than the f32 path; `MLP_BF16_GATE_UP=0`
    /// keeps them f32).
    pub(crate) bf16_gate_up: bool,
    /// Whether the chunked delta rule's scan loads the next chunk while it computes one
    /// (gdn_chunked.cu `GDN_SCAN_PIPELINE`; on by default since session 21, `=0` turns it off).
    pub(crate) gdn_scan_pipeline: bool,
    /// Whether the flash kernel's tiles launch heaviest first (flash.rs `heaviest_first`;
    /// `FLASH_HEAVY_FIRST`; on by default since session 21, `=0` turns it off).
    pub(crate) flash_heavy_first: bool,
    /// Whether the flash kernel double-buffers a bf16 pool's K/V tiles (flash_attention.cu
    /// `FLASH_KV_PIPELINE`; on by default since session 21, `=0` turns it off).
    pub(crate) flash_kv_pipeline: bool,
    /// Set once a weight is kept in block FP8: its GEMMs quantize their input themselves, and a
    /// bf16 twin would be written for nothing.
    pub(crate) fp8_weights_loaded: Arc<AtomicBool>,
    pub(crate) gemm_precision: GemmPrecision,
    /// `CudaOptions::keep_fp8_weights` under bf16 precision.
    pub(crate) keep_fp8_weights: bool,
    /// The FP8 tensor-core GEMM for kept FP8 weights (fp8_gemm.rs), where the GPU has one.
    pub(crate) fp8_gemm: crate::fp8_gemm::SharedFp8Gemm,
    /// The element type of the KV pools this backend makes (its attention reads both).
    pub(crate) kv_dtype: KvDtype,
    pub(crate) gdn_prefill: GdnPrefill,
    /// RoPE inverse frequencies per `(rotary_dim, theta bits)`, computed on the host as the
    /// reference does and kept on the device.
    pub(crate) rope_tables: Arc<Mutex<RopeTables>>,
    /// Per-op device timing, off unless `bench --profile` turns it on.
    pub(crate) profiler: Arc<OpProfiler>,
    /// The step's metadata tables on the device, uploaded once per step instead of once per layer.
    pub(crate) upload_cache: Arc<Mutex<UploadCache>>,
    device_name: String,
    compute_capability: (i32, i32),
    /// `OpenDevice::max_shared_per_block`: the kernels that need more than this (flash attention,
    /// the chunked delta rule) give way to the paged and recurrent ones.
    pub(crate) max_shared_per_block: usize,
    ptx_from_cache: usize,
}

/// A loaded kernel and whether it may start before the previous kernel has finished (launcher.rs).
pub(crate) struct Kernel {
    pub(crate) function: CudaFunction,
    pub(crate) waits_for_previous_grid: bool,
}

/// Panics on a device failure inside an op: the `Backend` trait has no error channel, and a
/// failed launch or copy leaves the GPU's results undefined, so carrying on would be worse.
#[track_caller]
pub(crate) fn device_failure(op: &str, err: impl std::fmt::Debug) -> ! {
    panic!("cuda backend: {op} failed on the device: {err:?}")
}

/// Launches kernel `$name` with `$cfg` and the given arguments, which must all be references to
/// named values (the launch reads them through pointers). Callers state the safety contract.
macro_rules! launch {
    // An argument list built at run time (a slice of `&dyn KernelArg`), after a semicolon.
    ($be:expr, $name:expr, $cfg:expr; $args:expr) => {{
        let args: &[&dyn $crate::launcher::KernelArg] = $args;
        // SAFETY: the caller checked the argument types against the kernel's signature and every
        // length the kernel indexes with (see the comment at the call).
        if let Err(e) = unsafe { $be.launch_kernel($name, $cfg, args) } {
            $crate::backend::device_failure($name, e);
        }
    }};
    ($be:expr, $name:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {
        $crate::backend::launch!($be, $name, $cfg; &[$( $arg ),+])
    };
}
pub(crate) use launch;

/// Launches the elementwise kernel `$name` over `$n` elements, `$per_thread` a thread (1 unless
/// given): `elementwise_config(n.div_ceil(per_thread))`. The kernel's `i64` element count is bound
/// to `$count`, for the argument list to name where the kernel declares it. Launches nothing for no
/// elements, so it stands at an op's end in place of `if n == 0 { return; }` and the launch. As
/// `launch!`, callers state the contract.
macro_rules! launch_elementwise {
    ($be:expr, $name:expr, $count:ident = $n:expr, $per_thread:literal per thread, $($arg:expr),+ $(,)?) => {{
        let n: usize = $n;
        if n > 0 {
            let $count = n as i64;
            $crate::backend::launch!(
                $be,
                $name,
                $crate::backend::CudaBackend::elementwise_config(n.div_ceil($per_thread)),
                $($arg),+
            );
        }
    }};
    ($be:expr, $name:expr, $count:ident = $n:expr, $($arg:expr),+ $(,)?) => {
        $crate::backend::launch_elementwise!($be, $name, $count = $n, 1 per thread, $($arg),+)
    };
}
pub(crate) use launch_elementwise;

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".to_string())
}

impl CudaBackend {
    /// The backend on GPU `device_ordinal` with the default options (bf16 GEMMs; libraries from the
    /// system path or the usual CUDA folders; PTX cached under `~/.cache/deltaserve/ptx`).
    pub fn new(device_ordinal: usize) -> Result<Self, CudaError> {
        Self::with_options(device_ordinal, CudaOptions::default())
    }

    /// Never panics: a missing driver or library, a missing or too old GPU, a kernel that does not
    /// compile, and a panic inside the CUDA bindings are all returned as errors.
    pub fn with_options(device_ordinal: usize, options: CudaOptions) -> Result<Self, CudaError> {
        catch_unwind(AssertUnwindSafe(|| Self::start(device_ordinal, &options))).unwrap_or_else(
            |payload| {
                Err(CudaError::Panicked {
                    during: "starting the backend",
                    message: panic_message(payload),
                })
            },
        )
    }

    fn start(ordinal: usize, options: &CudaOptions) -> Result<Self, CudaError> {
        let OpenDevice {
            ctx,
            name,
            compute_capability: (major, minor),
            sm_count,
            max_shared_per_block,
        } = open_device(ordinal, &options.library_dirs)?;
        // SAFETY: everything runs on the one stream below, in order, so cudarc's cross-stream
        // event tracking is not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(|e| CudaError::driver("creating a stream", e))?;

        let options = &with_device_defaults(options, max_shared_per_block);
        let arch = format!("compute_{major}{minor}");
        let compiled = compile::compile_all(&arch, options)?;
        let ptx_from_cache = compiled.iter().filter(|c| c.cached).count();
        let mut kernels = HashMap::new();
        for unit in compiled {
            let waiting: Vec<bool> = unit
                .file
                .functions
                .iter()
                .map(|f| launcher::waits_for_previous_grid(&unit.ptx, f))
                .collect();
            let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(unit.ptx)).map_err(|e| {
                CudaError::driver(
                    format!("loading the PTX of kernels/{} for {arch} (an NVRTC newer than the driver makes PTX it cannot load)", unit.file.name),
                    e,
                )
            })?;
            for (&function, waits_for_previous_grid) in unit.file.functions.iter().zip(waiting) {
                let f = module
                    .load_function(function)
                    .map_err(|e| CudaError::MissingKernel {
                        file: unit.file.name,
                        function,
                        message: format!("{e:?}"),
                    })?;
                kernels.insert(
                    function,
                    Kernel {
                        function: f,
                        waits_for_previous_grid,
                    },
                );
            }
        }

        libraries::ensure(&libraries::CUBLAS_LT, &options.library_dirs)?;
        libraries::ensure(&libraries::CUBLAS, &options.library_dirs)?;
        let blas = CudaBlas::new(stream.clone()).map_err(|e| CudaError::Cublas {
            what: "creating a handle",
            message: format!("{e:?}"),
        })?;
        let mut backend = Self {
            ctx,
            stream,
            blas: Arc::new(Mutex::new(blas)),
            kernels: Arc::new(kernels),
            dependent_launch: options.dependent_launch,
            gemv_lane_shape: crate::gemv::LaneShape::from_options(options, sm_count),
            moe_slot_shape: crate::moe::SlotShape::from_options(options),
            moe_grouped_rows: crate::moe::grouped_rows_per_block(options),
            grouped_attention: options.define::<u32>("ATTENTION_GQA").unwrap_or(1) != 0,
            gated_norm_by_warp: options.define::<u32>("GATED_NORM_WARP").unwrap_or(1) != 0,
            bf16_act_mlp: options.define::<u32>("MLP_BF16_ACT").unwrap_or(1) != 0,
            bf16_twins: options.define::<u32>("BF16_TWIN").unwrap_or(1) != 0,
            gemv_twins: options.define::<u32>("GEMV_TWIN").unwrap_or(1) != 0,
            fp8_twins: options.define::<u32>("FP8_TWIN").unwrap_or(0) != 0
                && options.define::<u32>("ROW_QUADS").unwrap_or(1) != 0,
            gemm_pairs: options.define::<u32>("GEMM_PAIRS").unwrap_or(1) != 0,
            bf16_gate_up: options.define::<u32>("MLP_BF16_GATE_UP").unwrap_or(1) != 0,
            gdn_scan_pipeline: options.define::<u32>("GDN_SCAN_PIPELINE").unwrap_or(1) != 0,
            flash_heavy_first: options.define::<u32>("FLASH_HEAVY_FIRST").unwrap_or(1) != 0,
            flash_kv_pipeline: options.define::<u32>("FLASH_KV_PIPELINE").unwrap_or(1) != 0,
            fp8_weights_loaded: Arc::new(AtomicBool::new(false)),
            gemm_precision: options.gemm_precision,
            keep_fp8_weights: options.keep_fp8_weights.unwrap_or(major >= 9)
                && options.gemm_precision == GemmPrecision::Bf16,
            fp8_gemm: None,
            kv_dtype: options
                .kv_dtype
                .unwrap_or(options.gemm_precision.default_kv_dtype()),
            gdn_prefill: options.gdn_prefill,
            rope_tables: Arc::new(Mutex::new(HashMap::new())),
            profiler: Arc::new(OpProfiler::default()),
            upload_cache: Arc::new(Mutex::new(UploadCache::default())),
            device_name: name,
            compute_capability: (major, minor),
            max_shared_per_block,
            ptx_from_cache,
        };
        // Block-scaled FP8 GEMMs need Hopper's cuBLASLt; `FP8_GEMM=0` measures without.
        if backend.keep_fp8_weights
            && major >= 9
            && options.define::<u32>("FP8_GEMM").unwrap_or(1) != 0
        {
            let f32_out = options.define::<u32>("FP8_GEMM_F32_OUT").unwrap_or(1) != 0;
            match crate::fp8_gemm::Fp8Gemm::new(&backend, f32_out) {
                Ok(gemm) => backend.fp8_gemm = Some(Arc::new(Mutex::new(gemm))),
                Err(why) => eprintln!(
                    "cuda: no FP8 tensor-core GEMM ({why}); FP8 weights are widened to bf16 for prefill"
                ),
            }
        }
        Ok(backend)
    }

    /// The GPU's name as the driver reports it.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    pub fn gemm_precision(&self) -> GemmPrecision {
        self.gemm_precision
    }

    /// Whether kept block-FP8 weights multiply prefill and large batches on the FP8 tensor cores
    /// (W8A8, fp8_gemm.rs) rather than widened to bf16.
    pub fn has_fp8_gemm(&self) -> bool {
        self.fp8_gemm.is_some()
    }

    /// How many kernel files were loaded from the PTX cache instead of being compiled.
    pub fn ptx_files_from_cache(&self) -> usize {
        self.ptx_from_cache
    }

    /// Waits until every queued op has finished (for timing).
    pub fn synchronize(&self) {
        if let Err(e) = self.stream.synchronize() {
            device_failure("synchronize", e);
        }
    }

    /// `(free, total)` bytes of device memory.
    fn device_memory(&self) -> (usize, usize) {
        if let Err(e) = self.ctx.bind_to_thread() {
            device_failure("reading free memory (binding the context)", e);
        }
        cudarc::driver::result::mem_get_info()
            .unwrap_or_else(|e| device_failure("reading free memory", e))
    }

    pub(crate) fn function(&self, name: &'static str) -> &CudaFunction {
        &self.kernel(name).function
    }

    pub(crate) fn kernel(&self, name: &'static str) -> &Kernel {
        // Invariant: `start` loaded every function named in `kernels::FILES` or failed, and the
        // op modules launch only those names.
        self.kernels
            .get(name)
            .unwrap_or_else(|| panic!("cuda backend: kernel `{name}` was never loaded"))
    }

    /// Copies small host metadata to the device (one element at least: CUDA refuses zero bytes).
    pub(crate) fn upload<T: DeviceRepr + Default + Clone>(
        &self,
        what: &str,
        data: &[T],
    ) -> CudaSlice<T> {
        let result = if data.is_empty() {
            self.stream.clone_htod(&[T::default()])
        } else {
            self.stream.clone_htod(data)
        };
        result.unwrap_or_else(|e| device_failure(what, e))
    }

    /// A zeroed device allocation of `len` elements (one at least).
    pub(crate) fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        what: &str,
        len: usize,
    ) -> CudaSlice<T> {
        self.stream
            .alloc_zeros::<T>(len.max(1))
            .unwrap_or_else(|e| device_failure(what, e))
    }

    /// A device allocation of `len` elements (one at least) left uninitialised: only for buffers a
    /// kernel overwrites completely before anything reads them (saves the memset of `alloc_zeros`).
    pub(crate) fn alloc_for_overwrite<T: DeviceRepr>(
        &self,
        what: &str,
        len: usize,
    ) -> CudaSlice<T> {
        // SAFETY: callers write every element before reading any (see each call).
        unsafe { self.stream.alloc::<T>(len.max(1)) }.unwrap_or_else(|e| device_failure(what, e))
    }

    fn noting_fp8(&self, m: CudaMat) -> CudaMat {
        if matches!(m.data, MatData::Fp8 { .. }) {
            self.fp8_weights_loaded.store(true, Ordering::Relaxed);
        }
        m
    }

    /// Whether an op whose output of `tokens` rows of `k` goes on to GEMMs writes an FP8 twin:
    /// with block-FP8 weights kept, where those GEMMs quantize their activations (the W8A8 GEMV
    /// kernel's rows, and the FP8 GEMM's past them; one token's kernel reads f32).
    pub(crate) fn wants_fp8_twin(&self, tokens: usize, k: usize) -> bool {
        let w8a8 = self.gemv_lane_shape.w8a8_tokens();
        self.fp8_twins
            && self.fp8_weights_loaded.load(Ordering::Relaxed)
            && self.compute_capability() >= (8, 9)
            && k.is_multiple_of(128)
            && tokens >= *w8a8.start()
            && (tokens <= *w8a8.end() || self.fp8_gemm.is_some())
    }

    /// Whether an op whose output goes on to GEMMs of `tokens` rows writes a bf16 twin: where those
    /// are cuBLAS bf16 GEMMs, past the GEMV kernels' rows, and with `gemv_twins` where they are
    /// GEMV kernels that read rounded activations (2 rows on; the one-token kernel rounds them
    /// itself, so a one-token decode never writes one).
    pub(crate) fn wants_bf16_twin(&self, tokens: usize) -> bool {
        let first_rows = if self.gemv_twins {
            2
        } else {
            self.gemv_lane_shape.max_tokens(false) + 1
        };
        self.bf16_twins
            && self.gemm_precision == GemmPrecision::Bf16
            && tokens >= first_rows
            && !self.fp8_weights_loaded.load(Ordering::Relaxed)
    }

    /// A launch config of `ELEMENTWISE_THREADS`-thread blocks covering `n` elements (the kernels
    /// loop over the grid, so the block count is capped).
    pub(crate) fn elementwise_config(n: usize) -> LaunchConfig {
        let blocks = n.div_ceil(ELEMENTWISE_THREADS as usize).clamp(1, 1 << 16) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (ELEMENTWISE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

impl Backend for CudaBackend {
    type Buf = CudaBuf;
    type Mat = CudaMat;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn zeros(&self, len: usize) -> CudaBuf {
        CudaBuf::new(self.alloc_zeros("zeros", len), len)
    }

    fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    fn scratch(&self, len: usize) -> CudaBuf {
        // Every op writes its whole output; `scratch` is only asked for such outputs.
        CudaBuf::new(self.alloc_for_overwrite("scratch", len), len)
    }

    fn upload(&self, data: &[f32]) -> CudaBuf {
        CudaBuf::new(self.upload("upload", data), data.len())
    }

    fn to_host(&self, buf: &CudaBuf) -> Vec<f32> {
        if buf.len == 0 {
            return Vec::new();
        }
        self.timed("to_host", || {
            let host = self
                .stream
                .clone_dtoh(&buf.data().slice(0..buf.len))
                .unwrap_or_else(|e| device_failure("to_host", e));
            self.synchronize();
            host
        })
    }

    fn buf_len(&self, buf: &CudaBuf) -> usize {
        buf.len
    }

    fn load_mat(&self, t: &HostTensor) -> Result<CudaMat, TensorError> {
        CudaMat::upload(&self.stream, t, self.gemm_precision, self.keep_fp8_weights)
            .map(|m| self.noting_fp8(m))
    }

    fn mat_shape(&self, m: &CudaMat) -> (usize, usize) {
        (m.rows, m.cols)
    }

    fn mat_bytes(&self, m: &CudaMat) -> usize {
        m.stored_bytes()
    }

    fn embedding(&self, table: &CudaMat, ids: &[u32], out: &mut CudaBuf) {
        self.timed("embedding", || self.embedding_op(table, ids, out))
    }

    fn matmul(&self, x: &CudaBuf, w: &CudaMat, out: &mut CudaBuf, tokens: usize) {
        self.timed(
            || format!("matmul {}x{}", w.rows, w.cols),
            || self.matmul_op(x, w, out, tokens),
        )
    }

    fn matmul_group(&self, x: &CudaBuf, ws: &[&CudaMat], outs: &mut [&mut CudaBuf], tokens: usize) {
        self.timed(
            || {
                let shapes: Vec<String> = ws
                    .iter()
                    .map(|w| format!("{}x{}", w.rows, w.cols))
                    .collect();
                format!("matmul {}", shapes.join("+"))
            },
            || self.matmul_group_op(x, ws, outs, tokens),
        )
    }

    fn rms_norm(&self, x: &CudaBuf, w: &CudaBuf, eps: f32, dim: usize, out: &mut CudaBuf) {
        self.timed("rms_norm", || self.rms_norm_op(x, w, eps, dim, out))
    }

    fn add_rms_norm(
        &self,
        acc: &mut CudaBuf,
        x: &CudaBuf,
        w: &CudaBuf,
        eps: f32,
        dim: usize,
        out: &mut CudaBuf,
    ) {
        self.timed("add_rms_norm", || {
            self.add_rms_norm_op(acc, x, w, eps, dim, out)
        })
    }

    fn gated_rms_norm(
        &self,
        x: &CudaBuf,
        z: &CudaBuf,
        w: &CudaBuf,
        eps: f32,
        dim: usize,
        out: &mut CudaBuf,
    ) {
        self.timed("gated_rms_norm", || {
            self.gated_rms_norm_op(x, z, w, eps, dim, out)
        })
    }

    fn add_inplace(&self, acc: &mut CudaBuf, x: &CudaBuf) {
        self.timed("add_inplace", || self.add_inplace_op(acc, x))
    }

    fn silu_mul(&self, gate: &CudaBuf, up: &CudaBuf, out: &mut CudaBuf) {
        self.timed("silu_mul", || self.silu_mul_op(gate, up, out))
    }

    fn dense_mlp(&self, x: &CudaBuf, mats: [&CudaMat; 3], out: &mut CudaBuf, tokens: usize) {
        let [gate, up, down] = mats;
        self.timed(
            || {
                format!(
                    "dense_mlp {}x{}+{}x{}+{}x{}",
                    gate.rows, gate.cols, up.rows, up.cols, down.rows, down.cols
                )
            },
            || self.dense_mlp_op(x, mats, out, tokens),
        )
    }

    fn matmul_silu_gate(
        &self,
        x: &CudaBuf,
        gate: &CudaMat,
        up: &CudaMat,
        out: &mut CudaBuf,
        tokens: usize,
    ) {
        self.timed(
            || {
                format!(
                    "matmul_silu_gate {}x{}+{}x{}",
                    gate.rows, gate.cols, up.rows, up.cols
                )
            },
            || self.matmul_silu_gate_op(x, gate, up, out, tokens),
        )
    }

    fn qk_norm_rope(
        &self,
        q_raw: &CudaBuf,
        k_raw: &CudaBuf,
        norms: [&CudaBuf; 2],
        eps: f32,
        positions: &[u32],
        shape: AttnShape,
        rope: (usize, f32),
        q: &mut CudaBuf,
        k: &mut CudaBuf,
    ) {
        self.timed("qk_norm_rope", || {
            self.qk_norm_rope_op(q_raw, k_raw, norms, eps, positions, shape, rope, q, k)
        })
    }

    fn sigmoid_mul_inplace(&self, x: &mut CudaBuf, gate: &CudaBuf) {
        self.timed("sigmoid_mul", || self.sigmoid_mul_op(x, gate))
    }

    fn rope(
        &self,
        x: &mut CudaBuf,
        positions: &[u32],
        heads: usize,
        head_dim: usize,
        rotary_dim: usize,
        theta: f32,
    ) {
        self.timed("rope", || {
            self.rope_op(x, positions, heads, head_dim, rotary_dim, theta)
        })
    }

    fn concat_cols(&self, a: &CudaBuf, b: &CudaBuf, a_dim: usize, b_dim: usize, out: &mut CudaBuf) {
        self.timed("concat_cols", || {
            self.concat_cols_op(a, b, a_dim, b_dim, out)
        })
    }

    fn gather_rows(&self, src: &CudaBuf, dim: usize, rows: &[u32]) -> CudaBuf {
        self.timed("gather_rows", || self.gather_rows_op(src, dim, rows))
    }

    fn scatter_add_rows(
        &self,
        acc: &mut CudaBuf,
        src: &CudaBuf,
        dim: usize,
        rows: &[u32],
        weights: &[f32],
    ) {
        self.timed("scatter_add_rows", || {
            self.scatter_add_rows_op(acc, src, dim, rows, weights)
        })
    }

    fn sigmoid_scale_rows(&self, x: &mut CudaBuf, gate: &CudaBuf, dim: usize) {
        self.timed("sigmoid_scale_rows", || {
            self.sigmoid_scale_rows_op(x, gate, dim)
        })
    }

    fn attention(
        &self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        pool: &mut KvLayerPool<Self>,
        batch: &BatchLayout,
        shape: AttnShape,
        out: &mut CudaBuf,
    ) {
        self.timed("attention", || {
            self.attention_op(q, k, v, pool, batch, shape, out)
        })
    }

    fn causal_conv1d(
        &self,
        x: &CudaBuf,
        w: &CudaBuf,
        pool: &mut StateLayerPool<Self>,
        batch: &BatchLayout,
        out: &mut CudaBuf,
    ) {
        self.timed("causal_conv1d", || {
            self.causal_conv1d_op(x, w, pool, batch, out)
        })
    }

    fn gdn_gates(
        &self,
        a: &CudaBuf,
        b: &CudaBuf,
        a_log: &CudaBuf,
        dt_bias: &CudaBuf,
        g: &mut CudaBuf,
        beta: &mut CudaBuf,
    ) {
        self.timed("gdn_gates", || {
            self.gdn_gates_op(a, b, a_log, dt_bias, g, beta)
        })
    }

    fn gated_delta_rule(
        &self,
        mixed: &CudaBuf,
        g: &CudaBuf,
        beta: &CudaBuf,
        pool: &mut StateLayerPool<Self>,
        batch: &BatchLayout,
        shape: GdnShape,
        out: &mut CudaBuf,
    ) {
        self.timed("gated_delta_rule", || {
            let gates = crate::gdn::GateSource::Computed { g, beta };
            self.gated_delta_rule_op(mixed, gates, pool, batch, shape, out)
        })
    }

    fn gdn_gates_and_delta_rule(
        &self,
        mixed: &CudaBuf,
        gates: GdnGateInputs<'_, CudaBuf>,
        pool: &mut StateLayerPool<Self>,
        batch: &BatchLayout,
        shape: GdnShape,
        out: &mut CudaBuf,
    ) {
        self.timed("gdn_gates_and_delta_rule", || {
            let gates = crate::gdn::GateSource::Raw(gates);
            self.gated_delta_rule_op(mixed, gates, pool, batch, shape, out)
        })
    }

    fn reset_state_slot(&self, pool: &mut StateLayerPool<Self>, slot: usize) {
        self.timed("reset_state_slot", || self.reset_state_slot_op(pool, slot))
    }

    fn copy_state_slot(&self, pool: &mut StateLayerPool<Self>, src: usize, dst: usize) {
        self.timed("copy_state_slot", || {
            self.copy_state_slot_op(pool, src, dst)
        })
    }

    fn route_top_k(
        &self,
        logits: &CudaBuf,
        experts: usize,
        top_k: usize,
        renormalize: bool,
    ) -> Vec<RouteChoice> {
        // The router logits are tiny ([tokens, experts]); routing on the host reuses the reference
        // exactly, ties and all.
        deltaserve_tensor::reference::route_top_k(
            &self.to_host(logits),
            experts,
            top_k,
            renormalize,
        )
    }

    fn load_experts(
        &self,
        experts: &[ExpertTensors],
        shape: ExpertShape,
    ) -> Result<Experts<CudaMat>, TensorError> {
        self.load_experts_op(experts, shape)
    }

    fn generate_experts(
        &self,
        gate_up: &GeneratedMatrix,
        down: &GeneratedMatrix,
        shape: ExpertShape,
    ) -> Option<Result<Experts<CudaMat>, TensorError>> {
        self.timed("generate_experts", || {
            self.generate_experts_op(gate_up, down, shape)
        })
    }

    fn moe_experts(
        &self,
        x: &CudaBuf,
        router_logits: &CudaBuf,
        experts: &Experts<CudaMat>,
        routing: MoeRouting,
        tokens: usize,
        shared: Option<SharedExpert<'_, CudaMat, CudaBuf>>,
    ) -> CudaBuf {
        self.timed("moe_experts", || {
            self.moe_experts_op(x, router_logits, experts, routing, tokens, shared)
        })
    }

    fn generate_mat(&self, spec: &GeneratedMatrix) -> Option<Result<CudaMat, TensorError>> {
        // Block-FP8 weights are quantized here under bf16 precision only (f32 keeps the exact
        // dequantized values, which the host computes), in the block shape and rows the kernels
        // read (as `load_mat`); they stay FP8 or are widened to bf16 (generate.rs).
        let quantized_here = self.gemm_precision == GemmPrecision::Bf16
            && spec.block_fp8 == Some(FP8_BLOCK)
            && spec.cols.is_multiple_of(16);
        if spec.block_fp8.is_some() && !quantized_here {
            return None;
        }
        Some(self.timed("generate_mat", || {
            self.generate_mat_op(spec).map(|m| self.noting_fp8(m))
        }))
    }

    fn samples_on_device(&self) -> bool {
        true
    }

    fn sample_rows(
        &self,
        logits: &CudaBuf,
        vocab: usize,
        rows: &[RowSampling],
    ) -> Option<Vec<u32>> {
        Some(self.timed("sample_rows", || self.sample_rows_op(logits, vocab, rows)))
    }

    fn prepare_step(&self, inputs: &StepInputs<'_>) -> Option<u64> {
        Some(self.prepare_step_op(inputs))
    }

    fn step_hidden(&self, data: &[f32]) -> CudaBuf {
        self.step_hidden_op(data)
    }

    fn begin_capture(&self) -> bool {
        self.begin_capture_op()
    }

    fn end_capture(&self) -> Option<StepGraph> {
        self.end_capture_op()
    }

    fn replay(&self, graph: &StepGraph) -> bool {
        self.replay_op(graph)
    }

    fn recover_after_failure(&self) -> Result<(), String> {
        self.recover_after_failure_op()
    }

    fn copy_buf(&self, src: &CudaBuf) -> CudaBuf {
        self.copy_buf_op(src)
    }

    fn device(&self) -> Option<&dyn Device> {
        Some(self)
    }
}

impl Device for CudaBackend {
    fn memory(&self) -> (usize, usize) {
        self.device_memory()
    }

    fn measure_read_bandwidth(&self) -> f64 {
        self.measure_read_bandwidth_op()
    }

    fn set_op_profiling(&self, on: bool) {
        self.set_op_profiling_op(on);
    }

    fn take_op_profile(&self) -> Vec<OpTiming> {
        self.take_op_profile_op()
    }
}

/// `options` with the pipelined kernels' switches turned off where the device cannot give a
/// block their larger shared memory (unless the user set them): with the pipelines compiled in,
/// the flash kernel and the chunked delta rule would not run there at all, while without them
/// they still fit (e.g. flash attention on an A100).
fn with_device_defaults(options: &CudaOptions, max_shared: usize) -> CudaOptions {
    let mut options = options.clone();
    for (name, fits) in [
        (
            "FLASH_KV_PIPELINE",
            crate::flash::kv_pipeline_fits(max_shared),
        ),
        (
            "GDN_SCAN_PIPELINE",
            crate::gdn_chunked::scan_pipeline_fits(max_shared),
        ),
    ] {
        if !fits && options.define::<u32>(name).is_none() {
            options.defines.push((name.to_string(), "0".to_string()));
        }
    }
    options
}

#[cfg(test)]
mod tests {
    use super::*;

    fn switches(options: &CudaOptions) -> (Option<u32>, Option<u32>) {
        (
            options.define("FLASH_KV_PIPELINE"),
            options.define("GDN_SCAN_PIPELINE"),
        )
    }

    #[test]
    fn pipelines_stay_on_where_they_fit_and_user_choices_win() {
        let plain = CudaOptions::default();
        let hopper = 227 * 1024;
        let a100 = 163 * 1024;
        assert_eq!(
            switches(&with_device_defaults(&plain, hopper)),
            (None, None)
        );
        assert_eq!(
            switches(&with_device_defaults(&plain, a100)),
            (Some(0), Some(0))
        );
        let chosen = CudaOptions {
            defines: vec![("FLASH_KV_PIPELINE".to_string(), "1".to_string())],
            ..CudaOptions::default()
        };
        assert_eq!(
            switches(&with_device_defaults(&chosen, a100)),
            (Some(1), Some(0))
        );
    }
}
