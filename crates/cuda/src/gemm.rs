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
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            self.gemm_op(x, &mut inputs, w, out, tokens);
        }
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
            let mut act = self.scratch(tokens * rows);
            self.matmul_silu_gate_op(x, gate, up, &mut act, tokens);
            self.matmul_group_op(&act, &[down], &mut [out], tokens);
            return;
        };
        if let (true, MatData::Bf16(g), MatData::Bf16(u)) =
            (self.bf16_gate_up, &gate.data, &up.data)
        {
            let act_bf16 = self.silu_gate_of_bf16_products(x, [g, u], tokens, rows, gate.cols);
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
            return;
        }
        let (mut act, mut up_out) = (self.scratch(tokens * rows), self.scratch(tokens * rows));
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

    /// `silu(x @ gate^T) * (x @ up^T)` as bf16 for the down GEMM, from gate and up products the
    /// GEMMs write in bf16 (`MLP_BF16_GATE_UP`); one batched GEMM for both (`GEMM_PAIRS`).
    /// The caller checked the shapes: both matrices `rows x k`, x `tokens x k`.
    fn silu_gate_of_bf16_products(
        &self,
        x: &CudaBuf,
        [gate, up]: [&CudaSlice<u16>; 2],
        tokens: usize,
        rows: usize,
        k: usize,
    ) -> CudaSlice<u16> {
        let mut inputs = GemmInputs::default();
        let x_bf16 = self.bf16_input(x, &mut inputs, tokens * k);
        let n = tokens * rows;
        // Both products in one allocation, the one of the lower-addressed weights first, so that a
        // paired GEMM's batch strides are positive (`in_address_order`); the second starts on a
        // 256-byte boundary for cuBLAS and the kernel's 8-byte accesses.
        let half = n.next_multiple_of(PRODUCT_ALIGN_ELEMENTS);
        // Overwritten whole (the padding is never read): the products by cuBLAS, the activation by
        // the kernel.
        let mut products: CudaSlice<u16> =
            self.alloc_for_overwrite("bf16 gate/up products", 2 * half);
        let mut act: CudaSlice<u16> = self.alloc_for_overwrite("bf16 MLP activations", n);
        let (gate_out, up_out);
        {
            let (gate_ptr, _gate_guard) = gate.device_ptr(&self.stream);
            let (up_ptr, _up_guard) = up.device_ptr(&self.stream);
            let (x_ptr, _x_guard) = x_bf16.device_ptr(&self.stream);
            let (products_ptr, _products_guard) = products.device_ptr_mut(&self.stream);
            let second = products_ptr + 2 * half as u64;
            (gate_out, up_out) = if gate_ptr < up_ptr {
                (products_ptr, second)
            } else {
                (second, products_ptr)
            };
            let product = |weights: [u64; 2], outputs: [u64; 2], products: usize| RawGemm {
                weights,
                input: x_ptr,
                outputs,
                products,
                input_type: cudaDataType_t::CUDA_R_16BF,
                output_type: cudaDataType_t::CUDA_R_16BF,
                compute: cublasComputeType_t::CUBLAS_COMPUTE_32F,
                n: rows,
                tokens,
                k,
            };
            // SAFETY: gate and up hold rows * k bf16, x_bf16 tokens * k, each product tokens * rows
            // bf16 (two halves of `products`, apart); the guards outlive the calls.
            unsafe {
                if self.gemm_pairs {
                    self.raw_gemm(product([gate_ptr, up_ptr], [gate_out, up_out], 2));
                } else {
                    self.raw_gemm(product([gate_ptr, gate_ptr], [gate_out, gate_out], 1));
                    self.raw_gemm(product([up_ptr, up_ptr], [up_out, up_out], 1));
                }
            }
        }
        let n64 = n as i64;
        // Contract: gate_out and up_out point at n bf16 each inside `products` (alive to the end of
        // this function, after the launch is queued), 256-byte aligned as the kernel's 8-byte
        // accesses need; act holds n.
        launch!(
            self,
            "silu_mul_bf16_of_bf16",
            Self::elementwise_config(n.div_ceil(4)),
            &gate_out,
            &up_out,
            &mut act,
            &n64
        );
        act
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
                    let x_fp8 = match x.fp8_twin(tokens, k) {
                        Some(twin) => twin,
                        None => inputs
                            .fp8
                            .get_or_insert_with(|| self.quantize_activations_fp8(x, tokens, k)),
                    };
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

    /// One cuBLAS product `out [tokens, n] = x [tokens, k] @ w [n, k]^T` in row-major terms (cuBLAS's
    /// column-major `C [n, tokens] = W^T X`), or two sharing the input as one strided-batched call
    /// whose batch strides are the distances between the two weight and the two output allocations
    /// (the input's is 0). The Hopper kernels address a batch through TMA descriptors, whose
    /// strides must be positive and below 2^40 bytes (a negative weight distance was an illegal
    /// address on an H100, session 20): the pair goes in address order when both distances share a
    /// sign, and as two calls when they do not or are too far.
    ///
    /// # Safety
    /// The pointers are device allocations of the stream's context, valid for the call: each
    /// weight `n * k` and the input `tokens * k` elements of `input_type`, each output `tokens * n`
    /// of `output_type`; with two products, the two weights and the two outputs are different
    /// allocations (256-byte aligned, so their distances are whole elements).
    pub(crate) unsafe fn raw_gemm(&self, g: RawGemm) {
        if g.products == 2 {
            match in_address_order(g) {
                Some((ordered, strides)) => {
                    // SAFETY: the caller's contract, the pair reordered.
                    unsafe { self.raw_gemm_batched(ordered, strides) };
                }
                None => {
                    for p in 0..2 {
                        let one = RawGemm {
                            weights: [g.weights[p]; 2],
                            outputs: [g.outputs[p]; 2],
                            products: 1,
                            ..g
                        };
                        // SAFETY: the caller's contract, for one of its products.
                        unsafe { self.raw_gemm(one) };
                    }
                }
            }
            return;
        }
        let blas = self.cublas_for([g.n, g.tokens, g.k]);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (n, tokens, k) = (g.n as i32, g.tokens as i32, g.k as i32);
        // SAFETY: the caller's contract; the leading dimensions are the row lengths of these
        // row-major buffers; alpha and beta are host f32 as the default pointer mode expects, and
        // the handle runs on our stream.
        let status = unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                n,
                tokens,
                k,
                (&alpha as *const f32).cast::<c_void>(),
                g.weights[0] as *const c_void,
                g.input_type,
                k,
                g.input as *const c_void,
                g.input_type,
                k,
                (&beta as *const f32).cast::<c_void>(),
                g.outputs[0] as *mut c_void,
                g.output_type,
                n,
                g.compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if let Err(e) = status {
            device_failure("matmul (cuBLAS)", e);
        }
    }

    /// `raw_gemm`'s two products as one strided-batched call, `strides` from `in_address_order`.
    ///
    /// # Safety
    /// As `raw_gemm`, with `g` the pair in address order.
    unsafe fn raw_gemm_batched(&self, g: RawGemm, (stride_w, stride_out): (i64, i64)) {
        let blas = self.cublas_for([g.n, g.tokens, g.k]);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (n, tokens, k) = (g.n as i32, g.tokens as i32, g.k as i32);
        // SAFETY: as in `raw_gemm`; the strides are the distances from the first weight and output
        // to the second.
        let status = unsafe {
            cudarc::cublas::result::gemm_strided_batched_ex(
                *blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                n,
                tokens,
                k,
                (&alpha as *const f32).cast::<c_void>(),
                g.weights[0] as *const c_void,
                g.input_type,
                k,
                stride_w,
                g.input as *const c_void,
                g.input_type,
                k,
                0,
                (&beta as *const f32).cast::<c_void>(),
                g.outputs[0] as *mut c_void,
                g.output_type,
                n,
                stride_out,
                2,
                g.compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if let Err(e) = status {
            device_failure("matmul (cuBLAS, batched)", e);
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
        let (w_ptr, _w_guard) = w.device_ptr(&self.stream);
        let (x_ptr, _x_guard) = x.device_ptr(&self.stream);
        let (out_ptr, _out_guard) = out.data_mut().device_ptr_mut(&self.stream);
        // SAFETY: w holds n * k and x tokens * k elements of `input_type` (the callers checked x;
        // a CudaMat holds rows * cols), out holds tokens * n f32 (checked by `matmul_op`); the
        // guards outlive the call.
        unsafe {
            self.raw_gemm(RawGemm {
                weights: [w_ptr, w_ptr],
                input: x_ptr,
                outputs: [out_ptr, out_ptr],
                products: 1,
                input_type,
                output_type: cudaDataType_t::CUDA_R_32F,
                compute,
                n,
                tokens,
                k,
            })
        };
    }
}

/// The operands of `CudaBackend::raw_gemm`: device pointers (the second weight and output are
/// read only when `products` is 2) and the element types.
#[derive(Clone, Copy)]
pub(crate) struct RawGemm {
    pub(crate) weights: [u64; 2],
    pub(crate) input: u64,
    pub(crate) outputs: [u64; 2],
    pub(crate) products: usize,
    pub(crate) input_type: cudaDataType_t,
    pub(crate) output_type: cudaDataType_t,
    pub(crate) compute: cublasComputeType_t,
    pub(crate) n: usize,
    pub(crate) tokens: usize,
    pub(crate) k: usize,
}

/// Elements of bf16 in 256 bytes: where the second of two products in one allocation starts.
const PRODUCT_ALIGN_ELEMENTS: usize = 128;

/// A pair of products in address order (both weight and output distances positive) with those
/// distances as batch strides in elements; None when the two distances differ in sign or reach
/// 2^40 bytes, the limits of the TMA descriptors cuBLAS's Hopper kernels build (see `raw_gemm`).
fn in_address_order(g: RawGemm) -> Option<(RawGemm, (i64, i64))> {
    const TMA_STRIDE_LIMIT: i64 = 1 << 40;
    let distance_w = g.weights[1] as i64 - g.weights[0] as i64;
    let distance_out = g.outputs[1] as i64 - g.outputs[0] as i64;
    if distance_w == 0
        || distance_out == 0
        || (distance_w > 0) != (distance_out > 0)
        || distance_w.abs() >= TMA_STRIDE_LIMIT
        || distance_out.abs() >= TMA_STRIDE_LIMIT
    {
        return None;
    }
    let ordered = if distance_w > 0 {
        g
    } else {
        RawGemm {
            weights: [g.weights[1], g.weights[0]],
            outputs: [g.outputs[1], g.outputs[0]],
            ..g
        }
    };
    let strides = (
        distance_w.abs() / element_bytes(g.input_type),
        distance_out.abs() / element_bytes(g.output_type),
    );
    Some((ordered, strides))
}

fn element_bytes(t: cudaDataType_t) -> i64 {
    match t {
        cudaDataType_t::CUDA_R_16BF | cudaDataType_t::CUDA_R_16F => 2,
        cudaDataType_t::CUDA_R_8F_E4M3 | cudaDataType_t::CUDA_R_8F_E5M2 => 1,
        _ => 4,
    }
}

/// The input of a group's GEMMs in each form a member needs, converted once for the group.
#[derive(Default)]
struct GemmInputs {
    bf16: Option<CudaSlice<u16>>,
    fp8: Option<Fp8Activations>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(weights: [u64; 2], outputs: [u64; 2]) -> RawGemm {
        RawGemm {
            weights,
            input: 0x1000,
            outputs,
            products: 2,
            input_type: cudaDataType_t::CUDA_R_16BF,
            output_type: cudaDataType_t::CUDA_R_32F,
            compute: cublasComputeType_t::CUBLAS_COMPUTE_32F,
            n: 4,
            tokens: 16,
            k: 8,
        }
    }

    /// A pair reaches cuBLAS with positive batch strides in elements: kept when both distances are
    /// positive, swapped (weights and outputs together) when both are negative, refused when they
    /// differ in sign or reach the TMA descriptors' 2^40 bytes.
    #[test]
    fn a_pair_goes_in_address_order_or_not_batched() {
        let (ordered, strides) =
            in_address_order(pair([0x10000, 0x20000], [0x90000, 0x98000])).unwrap();
        assert_eq!(
            (ordered.weights, ordered.outputs),
            ([0x10000, 0x20000], [0x90000, 0x98000])
        );
        assert_eq!(strides, (0x10000 / 2, 0x8000 / 4));
        let (ordered, strides) =
            in_address_order(pair([0x20000, 0x10000], [0x98000, 0x90000])).unwrap();
        assert_eq!(
            (ordered.weights, ordered.outputs),
            ([0x10000, 0x20000], [0x90000, 0x98000])
        );
        assert_eq!(strides, (0x10000 / 2, 0x8000 / 4));
        assert!(in_address_order(pair([0x10000, 0x20000], [0x98000, 0x90000])).is_none());
        assert!(in_address_order(pair([0x10000, 0x10000], [0x90000, 0x98000])).is_none());
        let far = 0x10000 + (1u64 << 40);
        assert!(in_address_order(pair([0x10000, far], [0x90000, 0x98000])).is_none());
    }
}
