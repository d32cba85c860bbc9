//! `matmul` (`out [T, N] = x [T, K] @ w[N, K]^T`): a few rows of bf16 or block-FP8 weights go to the
//! GEMV kernel (`gemv`), everything else through cuBLAS `gemmEx`: bf16 weights (block-FP8 ones
//! widened to bf16 first) with activations cast to bf16 (tensor cores, f32 accumulation and
//! output), or f32 weights in pedantic f32. Row-major `out^T = w x^T` is cuBLAS's column-major `C [N, T] = op(A) B` with A = w transposed.

use crate::backend::{device_failure, launch, CudaBackend};
use crate::buffer::CudaBuf;
use crate::fp8_gemm::{fp8_gemm_fits, Fp8Activations};
use crate::mat::{CudaMat, MatData};
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use deltaserve_tensor::Backend;
use std::ffi::c_void;
use std::sync::MutexGuard;

impl CudaBackend {
    pub(crate) fn matmul_op(&self, x: &CudaBuf, w: &CudaMat, out: &mut CudaBuf, tokens: usize) {
        self.matmul_group_op(x, &[w], &mut [out], tokens);
    }

    /// `outs[i] = x @ ws[i]^T` for matrices that share the input: the GEMV kernel for a few rows
    /// of bf16 weights (one launch for the group), else one cast of x and a cuBLAS GEMM each.
    pub(crate) fn matmul_group_op(
        &self,
        x: &CudaBuf,
        ws: &[&CudaMat],
        outs: &mut [&mut CudaBuf],
        tokens: usize,
    ) {
        assert_eq!(
            ws.len(),
            outs.len(),
            "matmul_group: {} matrices but {} outputs",
            ws.len(),
            outs.len()
        );
        for (w, out) in ws.iter().zip(outs.iter()) {
            let (n, k) = (w.rows, w.cols);
            assert_eq!(
                k, ws[0].cols,
                "matmul_group: matrices sharing an input must have as many columns"
            );
            assert!(
                x.len >= tokens * k,
                "matmul: x holds {} values, {tokens} tokens x {k} need more",
                x.len
            );
            assert!(
                out.len >= tokens * n,
                "matmul: out holds {} values, {tokens} tokens x {n} need more",
                out.len
            );
        }
        if tokens == 0 || ws.is_empty() {
            return;
        }
        let is_fp8 = |w: &CudaMat| matches!(w.data, MatData::Fp8 { .. });
        let fp8_members = ws.iter().filter(|w| is_fp8(w)).count();
        if fp8_members > 0 && fp8_members < ws.len() {
            // A checkpoint keeps some matrices of a group unquantized (GDN in_proj_a/b beside
            // in_proj_qkv/z): one launch over both formats where the lane kernels can, else each
            // format is a group of its own, so both can take the GEMV.
            if self.mixed_gemv_applies(ws, tokens) {
                self.gemv_mixed_op(x, ws, outs);
                return;
            }
            for fp8 in [true, false] {
                let (sub_ws, mut sub_outs): (Vec<&CudaMat>, Vec<&mut CudaBuf>) = ws
                    .iter()
                    .zip(outs.iter_mut())
                    .filter(|(w, _)| is_fp8(w) == fp8)
                    .map(|(w, out)| (*w, &mut **out))
                    .unzip();
                self.matmul_group_op(x, &sub_ws, &mut sub_outs, tokens);
            }
            return;
        }
        if self.gemv_applies(ws, tokens) {
            self.gemv_op(x, ws, outs, tokens);
            return;
        }
        let mut inputs = GemmInputs::default();
        let mut i = 0;
        while i < ws.len() {
            if i + 1 < ws.len() && self.gemm_pairs {
                let (first, rest) = outs[i..].split_at_mut(1);
                if self.gemm_pair_op(
                    x,
                    &mut inputs,
                    [ws[i], ws[i + 1]],
                    [&mut *first[0], &mut *rest[0]],
                    tokens,
                ) {
                    i += 2;
                    continue;
                }
            }
            self.gemm_op(x, &mut inputs, ws[i], outs[i], tokens);
            i += 1;
        }
    }

    /// Two bf16 matrices of one shape that share the input (gate and up, q and gate, k and v, the
    /// GDN's a and b) as one strided-batched cuBLAS GEMM: one launch with twice the output tiles,
    /// so fewer partial waves (`GEMM_PAIRS=1`; off until measured on a GPU). The batch strides are the
    /// distances between the two allocations (any distance is a stride to cuBLAS; the input's is
    /// 0), so neither the weights nor the outputs need to be laid out together. False, with nothing
    /// done, for other pairs.
    fn gemm_pair_op(
        &self,
        x: &CudaBuf,
        inputs: &mut GemmInputs,
        [w0, w1]: [&CudaMat; 2],
        [out0, out1]: [&mut CudaBuf; 2],
        tokens: usize,
    ) -> bool {
        let (MatData::Bf16(a0), MatData::Bf16(a1)) = (&w0.data, &w1.data) else {
            return false;
        };
        let (n, k) = (w0.rows, w0.cols);
        if (w1.rows, w1.cols) != (n, k) || n == 0 || k == 0 {
            return false;
        }
        let x_bf16 = self.bf16_input(x, inputs, tokens * k);
        let blas = self.cublas_for([n, tokens, k]);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (w0_ptr, _w0_guard) = a0.device_ptr(&self.stream);
        let (w1_ptr, _w1_guard) = a1.device_ptr(&self.stream);
        let (x_ptr, _x_guard) = x_bf16.device_ptr(&self.stream);
        let (out0_ptr, _out0_guard) = out0.data_mut().device_ptr_mut(&self.stream);
        let (out1_ptr, _out1_guard) = out1.data_mut().device_ptr_mut(&self.stream);
        // Allocations are 256-byte aligned, so both distances are whole elements.
        let stride_w = (w1_ptr as i64 - w0_ptr as i64) / 2;
        let stride_out = (out1_ptr as i64 - out0_ptr as i64) / 4;
        // SAFETY: as gemm_ex's, for each of the two products: w0 + stride_w (in bf16 elements) is
        // w1 and out0 + stride_out (in f32 elements) is out1, each holding n * k weights and
        // tokens * n outputs (checked by `matmul_group_op`); the input, tokens * k bf16, is read by
        // both (stride 0).
        let status = unsafe {
            cudarc::cublas::result::gemm_strided_batched_ex(
                *blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                tokens as i32,
                k as i32,
                (&alpha as *const f32).cast::<c_void>(),
                w0_ptr as *const c_void,
                cudaDataType_t::CUDA_R_16BF,
                k as i32,
                stride_w,
                x_ptr as *const c_void,
                cudaDataType_t::CUDA_R_16BF,
                k as i32,
                0,
                (&beta as *const f32).cast::<c_void>(),
                out0_ptr as *mut c_void,
                cudaDataType_t::CUDA_R_32F,
                n as i32,
                stride_out,
                2,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if let Err(e) = status {
            device_failure("matmul (cublasGemmStridedBatchedEx)", e);
        }
        true
    }

    /// `out = silu(x @ gate^T) * (x @ up^T)`: the paired GEMV kernel for a few rows, else
    /// `matmul_group_op` and `silu_mul_op`.
    pub(crate) fn matmul_silu_gate_op(
        &self,
        x: &CudaBuf,
        gate: &CudaMat,
        up: &CudaMat,
        out: &mut CudaBuf,
        tokens: usize,
    ) {
        let rows = gate.rows;
        assert!(
            out.len >= tokens * rows,
            "matmul_silu_gate: out holds {} values, {tokens} tokens x {rows} need more",
            out.len
        );
        if tokens > 0
            && x.len >= tokens * gate.cols
            && self.silu_gate_gemv_applies(gate, up, tokens)
        {
            self.gemv_silu_gate_op(x, gate, up, out, tokens);
            return;
        }
        let mut g = self.scratch(tokens * rows);
        let mut u = self.scratch(tokens * up.rows);
        self.matmul_group_op(x, &[gate, up], &mut [&mut g, &mut u], tokens);
        self.silu_mul_op(&g, &u, out);
    }

    /// `Backend::dense_mlp`. With bf16 weights past the GEMV kernels (a prefill, a large batch) the
    /// activation goes to the down projection as the bf16 its GEMM reads, written once by
    /// `silu_mul_bf16` (bit for bit `silu_mul` and the cast `gemm_op` would make of it; 27B
    /// prefill of 2048 tokens: 143 MB written as f32 and read back, then 214 MB of cast, a layer);
    /// otherwise `matmul_silu_gate_op`, then `matmul_group_op` over `[down]`.
    pub(crate) fn dense_mlp_op(
        &self,
        x: &CudaBuf,
        [gate, up, down]: [&CudaMat; 3],
        out: &mut CudaBuf,
        tokens: usize,
    ) {
        let rows = gate.rows;
        let mut act = self.scratch(tokens * rows);
        let bf16_gemms = tokens > 0
            && self.bf16_act_mlp
            && (up.rows, up.cols) == (rows, gate.cols)
            && down.cols == rows
            && rows > 0
            && x.len >= tokens * gate.cols
            && out.len >= tokens * down.rows
            && !self.silu_gate_gemv_applies(gate, up, tokens)
            && !self.gemv_applies(&[down], tokens);
        let (true, MatData::Bf16(down_weights)) = (bf16_gemms, &down.data) else {
            self.matmul_silu_gate_op(x, gate, up, &mut act, tokens);
            self.matmul_group_op(&act, &[down], &mut [out], tokens);
            return;
        };
        let mut up_out = self.scratch(tokens * rows);
        self.matmul_group_op(x, &[gate, up], &mut [&mut act, &mut up_out], tokens);
        let n = tokens * rows;
        // Overwritten whole by silu_mul_bf16.
        let mut act_bf16: CudaSlice<u16> = self.alloc_for_overwrite("bf16 MLP activations", n);
        let n64 = n as i64;
        // Contract: act and up_out hold n f32 (allocated so), act_bf16 n bf16; whole (aligned)
        // allocations, as the kernel's 16- and 8-byte accesses need.
        launch!(
            self,
            "silu_mul_bf16",
            Self::elementwise_config(n.div_ceil(4)),
            act.data(),
            up_out.data(),
            &mut act_bf16,
            &n64
        );
        self.gemm_ex(
            down_weights,
            &act_bf16,
            cudaDataType_t::CUDA_R_16BF,
            out,
            down.rows,
            tokens,
            rows,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
        );
    }

    /// One cuBLAS GEMM; `inputs` caches the conversions of `x` across the matrices of a group.
    fn gemm_op(
        &self,
        x: &CudaBuf,
        inputs: &mut GemmInputs,
        w: &CudaMat,
        out: &mut CudaBuf,
        tokens: usize,
    ) {
        let (n, k) = (w.rows, w.cols);
        if n == 0 {
            return;
        }
        if k == 0 {
            // An empty sum: cuBLAS would not touch C.
            let mut view = out.data_mut().slice_mut(0..tokens * n);
            if let Err(e) = self.stream.memset_zeros(&mut view) {
                device_failure("matmul (k = 0)", e);
            }
            return;
        }
        match &w.data {
            MatData::Bf16(weights) => {
                let x_bf16 = self.bf16_input(x, inputs, tokens * k);
                self.gemm_ex(
                    weights,
                    x_bf16,
                    cudaDataType_t::CUDA_R_16BF,
                    out,
                    n,
                    tokens,
                    k,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                );
            }
            MatData::Fp8 { codes, scales } => {
                // Prefill and batches past the FP8 GEMV: the FP8 tensor cores where this GPU and
                // shape have them (fp8_gemm.rs), else widened to bf16 for cuBLAS, matrix by matrix
                // (a scratch of one matrix; the widening reads 1 and writes 2 bytes a weight, small
                // against the product at these token counts).
                if self.fp8_gemm.is_some() && fp8_gemm_fits(n, k) {
                    let x_fp8 = inputs
                        .fp8
                        .get_or_insert_with(|| self.quantize_activations_fp8(x, tokens, k));
                    if self.fp8_gemm_op(x_fp8, codes, scales, out, n, tokens, k) {
                        return;
                    }
                }
                let weights = self.dequantize_block_fp8(codes, scales, n, k);
                let x_bf16 = inputs
                    .bf16
                    .get_or_insert_with(|| self.cast_to_bf16(x, tokens * k));
                self.gemm_ex(
                    &weights,
                    x_bf16,
                    cudaDataType_t::CUDA_R_16BF,
                    out,
                    n,
                    tokens,
                    k,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                );
            }
            MatData::F32(weights) => {
                self.gemm_ex(
                    weights,
                    x.data(),
                    cudaDataType_t::CUDA_R_32F,
                    out,
                    n,
                    tokens,
                    k,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC,
                );
            }
        }
    }

    /// The cuBLAS handle, bound to this thread's context, for a product of these dimensions
    /// (each within cuBLAS's 32-bit sizes).
    fn cublas_for(&self, dims: [usize; 3]) -> MutexGuard<'_, CudaBlas> {
        if dims.iter().any(|&d| d > i32::MAX as usize) {
            panic!("matmul: dimensions {dims:?} exceed cuBLAS's 32-bit sizes");
        }
        let blas = self
            .blas
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Err(e) = self.ctx.bind_to_thread() {
            device_failure("matmul (binding the context)", e);
        }
        blas
    }

    /// The first `len` values of `x` as a bf16 product reads them: the twin the op that wrote `x`
    /// left, else the group's cast, made once.
    fn bf16_input<'a>(
        &self,
        x: &'a CudaBuf,
        inputs: &'a mut GemmInputs,
        len: usize,
    ) -> &'a CudaSlice<u16> {
        match x.bf16_twin(len) {
            Some(twin) => twin,
            None => inputs.bf16.get_or_insert_with(|| self.cast_to_bf16(x, len)),
        }
    }

    /// The first `len` values of `x` rounded to bf16 (nearest even), as every bf16 product takes
    /// its activations; the caller checked that `x` holds `len` values.
    pub(crate) fn cast_to_bf16(&self, x: &CudaBuf, len: usize) -> CudaSlice<u16> {
        // Overwritten whole by the cast below.
        let mut cast: CudaSlice<u16> = self.alloc_for_overwrite("bf16 activations", len);
        let len64 = len as i64;
        // Contract: x holds len values (checked by the caller), cast was allocated that long; both
        // are whole (aligned) allocations, as the kernel's 16- and 8-byte accesses need.
        launch!(
            self,
            "cast_f32_to_bf16",
            Self::elementwise_config(len.div_ceil(4)),
            x.data(),
            &mut cast,
            &len64
        );
        cast
    }

    /// `out [tokens, n] = x [tokens, k] @ w [n, k]^T` with both inputs of `input_type`.
    #[allow(clippy::too_many_arguments)]
    fn gemm_ex<T>(
        &self,
        w: &CudaSlice<T>,
        x: &CudaSlice<T>,
        input_type: cudaDataType_t,
        out: &mut CudaBuf,
        n: usize,
        tokens: usize,
        k: usize,
        compute: cublasComputeType_t,
    ) {
        let blas = self.cublas_for([n, tokens, k]);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (w_ptr, _w_guard) = w.device_ptr(&self.stream);
        let (x_ptr, _x_guard) = x.device_ptr(&self.stream);
        let (out_ptr, _out_guard) = out.data_mut().device_ptr_mut(&self.stream);
        // SAFETY: w holds n * k and x tokens * k elements of `input_type` (the callers checked x;
        // a CudaMat holds rows * cols), out holds tokens * n f32 (checked by `matmul_op`); the
        // leading dimensions are the row lengths of these row-major buffers; alpha and beta are
        // host f32 as the default pointer mode expects, and the handle runs on our stream.
        let status = unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                tokens as i32,
                k as i32,
                (&alpha as *const f32).cast::<c_void>(),
                w_ptr as *const c_void,
                input_type,
                k as i32,
                x_ptr as *const c_void,
                input_type,
                k as i32,
                (&beta as *const f32).cast::<c_void>(),
                out_ptr as *mut c_void,
                cudaDataType_t::CUDA_R_32F,
                n as i32,
                compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if let Err(e) = status {
            device_failure("matmul (cublasGemmEx)", e);
        }
    }
}

/// The input of a group's GEMMs in each form a member needs, converted once for the group.
#[derive(Default)]
struct GemmInputs {
    bf16: Option<CudaSlice<u16>>,
    fp8: Option<Fp8Activations>,
}
