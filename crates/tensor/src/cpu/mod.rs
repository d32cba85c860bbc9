//! The fast CPU backend: f32 activations, bf16 weights kept as bf16 and widened in registers,
//! AVX-512 or AVX2 + FMA kernels chosen at run time (portable fallback otherwise), work split over its own rayon
//! pool. Every op means exactly what `reference` computes; tests in `tests` hold it to that.

mod activation;
mod attention;
mod conv;
mod gdn;
mod gemm;
mod gemv;
mod isa;
mod mat;
mod math;
mod norm;
mod pack;
mod par;
mod rope;
mod simd;
mod tile;
#[cfg(target_arch = "x86_64")]
mod vector;

#[cfg(test)]
mod tests;

pub use gemm::MatmulPrecision;
pub use isa::{Isa, IsaLevel, CPU_LEVEL_ENV};
pub use mat::CpuMat;

use crate::backend::{AttnShape, Backend, GdnShape, RouteChoice};
use crate::batch::BatchLayout;
use crate::cache::{KvLayerPool, StateLayerPool};
use crate::host::{HostTensor, TensorError};
use crate::reference;

/// Token counts up to this use the GEMV kernels (which stream the weights once per 4 tokens and need
/// no packing; measured faster than the blocked GEMM up to about 32 tokens on a 2-core Zen 4), larger
/// ones the blocked GEMM. Both compute every output in the same order, so the choice never changes
/// a bit.
const GEMV_MAX_TOKENS: usize = 16;
/// As `GEMV_MAX_TOKENS` for the AVX2 kernels, which stream the weights once per 2 tokens: the
/// GEMM overtook them between 4 and 8 tokens (`gemv_bench`, 2 threads, AVX2 forced on a Xeon).
const AVX2_GEMV_MAX_TOKENS: usize = 6;

/// Why a `CpuBackend` could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CpuBackendError {
    #[error("cpu backend: could not start a pool of {threads} worker threads (0 = one per core): {source}")]
    ThreadPool {
        threads: usize,
        #[source]
        source: rayon::ThreadPoolBuildError,
    },
}

/// How a `CpuBackend` is built.
#[derive(Clone, Copy, Debug)]
pub struct CpuOptions {
    /// Worker threads; 0 = one per core.
    pub threads: usize,
    /// The best kernels allowed (the CPU may support less). The default is `DELTASERVE_CPU_LEVEL`
    /// when it names a level, else AVX-512.
    pub max_isa: IsaLevel,
    /// How products with bf16 weights are computed.
    pub matmul_precision: MatmulPrecision,
}

impl Default for CpuOptions {
    fn default() -> Self {
        Self {
            threads: 0,
            // An unreadable value is ignored here (`Default` cannot fail); the CLI checks
            // `IsaLevel::from_env` first and refuses it.
            max_isa: IsaLevel::from_env()
                .ok()
                .flatten()
                .unwrap_or(IsaLevel::Avx512),
            matmul_precision: MatmulPrecision::default(),
        }
    }
}

/// The fast CPU backend. Owns its worker threads; `&self` ops may be called from any thread.
pub struct CpuBackend {
    pool: rayon::ThreadPool,
    isa: Isa,
    matmul_precision: MatmulPrecision,
}

impl CpuBackend {
    /// A backend with `threads` workers (0 = one per core) and the best kernels this CPU supports.
    ///
    /// # Panics
    /// When the operating system refuses to start the worker threads; use `try_new` to handle that.
    pub fn new(threads: usize) -> Self {
        match Self::try_new(threads) {
            Ok(backend) => backend,
            Err(e) => panic!("{e}"),
        }
    }

    pub fn try_new(threads: usize) -> Result<Self, CpuBackendError> {
        Self::with_options(CpuOptions {
            threads,
            ..CpuOptions::default()
        })
    }

    /// As `try_new`, with kernels no better than `cap` (tests and `doctor` force the portable path).
    pub fn with_isa(threads: usize, cap: IsaLevel) -> Result<Self, CpuBackendError> {
        Self::with_options(CpuOptions {
            threads,
            max_isa: cap,
            ..CpuOptions::default()
        })
    }

    pub fn with_options(options: CpuOptions) -> Result<Self, CpuBackendError> {
        let threads = options.threads;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("deltaserve-cpu-{i}"))
            .build()
            .map_err(|source| CpuBackendError::ThreadPool { threads, source })?;
        Ok(Self {
            pool,
            isa: Isa::at_most(options.max_isa),
            matmul_precision: options.matmul_precision,
        })
    }

    pub fn matmul_precision(&self) -> MatmulPrecision {
        self.matmul_precision
    }

    /// Whether bf16 matrices are stored as bf16 pairs for `vdpbf16ps` (see `MatmulPrecision::Bf16`).
    fn bf16_pairs(&self) -> bool {
        self.matmul_precision == MatmulPrecision::Bf16 && self.isa.bf16_dot()
    }

    /// A bf16 matrix `[rows, cols]` from row-major raw bf16 bits, laid out for this backend
    /// (benchmarks and tests; checkpoints go through `load_mat`).
    pub fn mat_from_bf16_bits(&self, rows: usize, cols: usize, bits: &[u16]) -> CpuMat {
        self.pool
            .install(|| CpuMat::from_bf16_bits(rows, cols, bits, self.bf16_pairs()))
    }

    /// The kernels in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Token counts up to which products run on the GEMV kernels at this backend's level.
    fn gemv_max_tokens(&self) -> usize {
        if self.isa.avx2() {
            AVX2_GEMV_MAX_TOKENS
        } else {
            GEMV_MAX_TOKENS
        }
    }

    /// `x [tokens, cols] @ w^T` with the GEMV kernels regardless of `tokens` (benchmarks, tests).
    pub fn matmul_gemv(&self, x: &[f32], w: &CpuMat, out: &mut [f32], tokens: usize) {
        gemv::gemv(self.isa, &self.pool, w, x, tokens, out);
    }

    /// `x [tokens, cols] @ w^T` with the blocked GEMM regardless of `tokens` (benchmarks, tests).
    pub fn matmul_gemm(&self, x: &[f32], w: &CpuMat, out: &mut [f32], tokens: usize) {
        gemm::gemm(self.isa, &self.pool, w, x, tokens, out);
    }
}

impl Backend for CpuBackend {
    type Buf = Vec<f32>;
    type Mat = CpuMat;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn zeros(&self, len: usize) -> Vec<f32> {
        vec![0.0; len]
    }

    fn upload(&self, data: &[f32]) -> Vec<f32> {
        data.to_vec()
    }

    fn to_host(&self, buf: &Vec<f32>) -> Vec<f32> {
        buf.clone()
    }

    fn buf_len(&self, buf: &Vec<f32>) -> usize {
        buf.len()
    }

    fn load_mat(&self, t: &HostTensor) -> Result<CpuMat, TensorError> {
        self.pool.install(|| CpuMat::upload(t, self.bf16_pairs()))
    }

    fn mat_shape(&self, m: &CpuMat) -> (usize, usize) {
        (m.rows(), m.cols())
    }

    fn mat_bytes(&self, m: &CpuMat) -> usize {
        m.bytes()
    }

    fn run_step<R: Send>(&self, step: impl FnOnce() -> R + Send) -> R {
        // Inside, every op's `pool.install` runs inline on this worker and its parallel pieces
        // go to the other workers, which spin for a while after each op before they sleep.
        self.pool.install(step)
    }

    fn embedding(&self, table: &CpuMat, ids: &[u32], out: &mut Vec<f32>) {
        let h = table.cols();
        for (row, &id) in out.chunks_mut(h).zip(ids) {
            table.row_into(id as usize, row);
        }
    }

    fn matmul(&self, x: &Vec<f32>, w: &CpuMat, out: &mut Vec<f32>, tokens: usize) {
        if tokens <= self.gemv_max_tokens() {
            self.matmul_gemv(x, w, out, tokens);
        } else {
            self.matmul_gemm(x, w, out, tokens);
        }
    }

    fn matmul_group(
        &self,
        x: &Vec<f32>,
        ws: &[&CpuMat],
        outs: &mut [&mut Vec<f32>],
        tokens: usize,
    ) {
        if tokens > self.gemv_max_tokens() {
            assert_eq!(ws.len(), outs.len(), "matmul_group: one output per matrix");
            for (w, out) in ws.iter().zip(outs.iter_mut()) {
                self.matmul_gemm(x, w, out, tokens);
            }
            return;
        }
        let mut outs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
        gemv::gemv_group(self.isa, &self.pool, ws, x, tokens, &mut outs);
    }

    fn rms_norm(&self, x: &Vec<f32>, w: &Vec<f32>, eps: f32, dim: usize, out: &mut Vec<f32>) {
        norm::rms_norm(self.isa, &self.pool, x, w, eps, dim, out);
    }

    fn gated_rms_norm(
        &self,
        x: &Vec<f32>,
        z: &Vec<f32>,
        w: &Vec<f32>,
        eps: f32,
        dim: usize,
        out: &mut Vec<f32>,
    ) {
        norm::gated_rms_norm(self.isa, &self.pool, x, z, w, eps, dim, out);
    }

    fn add_inplace(&self, acc: &mut Vec<f32>, x: &Vec<f32>) {
        activation::add_inplace(self.isa, &self.pool, acc, x);
    }

    fn silu_mul(&self, gate: &Vec<f32>, up: &Vec<f32>, out: &mut Vec<f32>) {
        activation::silu_mul(self.isa, &self.pool, gate, up, out);
    }

    fn sigmoid_mul_inplace(&self, x: &mut Vec<f32>, gate: &Vec<f32>) {
        activation::sigmoid_mul(self.isa, &self.pool, x, gate);
    }

    fn rope(
        &self,
        x: &mut Vec<f32>,
        positions: &[u32],
        heads: usize,
        head_dim: usize,
        rotary_dim: usize,
        theta: f32,
    ) {
        rope::rope(&self.pool, x, positions, heads, head_dim, rotary_dim, theta);
    }

    fn concat_cols(
        &self,
        a: &Vec<f32>,
        b: &Vec<f32>,
        a_dim: usize,
        b_dim: usize,
        out: &mut Vec<f32>,
    ) {
        reference::ReferenceBackend.concat_cols(a, b, a_dim, b_dim, out);
    }

    fn gather_rows(&self, src: &Vec<f32>, dim: usize, rows: &[u32]) -> Vec<f32> {
        reference::ReferenceBackend.gather_rows(src, dim, rows)
    }

    fn scatter_add_rows(
        &self,
        acc: &mut Vec<f32>,
        src: &Vec<f32>,
        dim: usize,
        rows: &[u32],
        weights: &[f32],
    ) {
        for (i, (&r, &w)) in rows.iter().zip(weights).enumerate() {
            let dst = &mut acc[r as usize * dim..(r as usize + 1) * dim];
            for (d, &s) in dst.iter_mut().zip(&src[i * dim..(i + 1) * dim]) {
                *d += w * s;
            }
        }
    }

    fn sigmoid_scale_rows(&self, x: &mut Vec<f32>, gate: &Vec<f32>, dim: usize) {
        activation::sigmoid_scale_rows(self.isa, &self.pool, x, gate, dim);
    }

    fn attention(
        &self,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        pool: &mut KvLayerPool<Self>,
        batch: &BatchLayout,
        shape: AttnShape,
        out: &mut Vec<f32>,
    ) {
        attention::attention(self.isa, &self.pool, q, k, v, pool, batch, shape, out);
    }

    fn causal_conv1d(
        &self,
        x: &Vec<f32>,
        w: &Vec<f32>,
        pool: &mut StateLayerPool<Self>,
        batch: &BatchLayout,
        out: &mut Vec<f32>,
    ) {
        conv::causal_conv1d(
            self.isa,
            &self.pool,
            x,
            w,
            &mut pool.conv,
            pool.conv_dim,
            pool.conv_history,
            batch,
            out,
        );
    }

    fn gdn_gates(
        &self,
        a: &Vec<f32>,
        b: &Vec<f32>,
        a_log: &Vec<f32>,
        dt_bias: &Vec<f32>,
        g: &mut Vec<f32>,
        beta: &mut Vec<f32>,
    ) {
        reference::gdn_gates(a, b, a_log, dt_bias, g, beta);
    }

    fn gated_delta_rule(
        &self,
        mixed: &Vec<f32>,
        g: &Vec<f32>,
        beta: &Vec<f32>,
        pool: &mut StateLayerPool<Self>,
        batch: &BatchLayout,
        shape: GdnShape,
        out: &mut Vec<f32>,
    ) {
        gdn::gated_delta_rule(
            self.isa,
            &self.pool,
            mixed,
            g,
            beta,
            &mut pool.ssm,
            batch,
            shape,
            out,
        );
    }

    fn reset_state_slot(&self, pool: &mut StateLayerPool<Self>, slot: usize) {
        let (c, s) = (pool.conv_slot_len(), pool.ssm_slot_len());
        pool.conv[slot * c..(slot + 1) * c].fill(0.0);
        pool.ssm[slot * s..(slot + 1) * s].fill(0.0);
    }

    fn copy_state_slot(&self, pool: &mut StateLayerPool<Self>, src: usize, dst: usize) {
        let (c, s) = (pool.conv_slot_len(), pool.ssm_slot_len());
        pool.conv.copy_within(src * c..(src + 1) * c, dst * c);
        pool.ssm.copy_within(src * s..(src + 1) * s, dst * s);
    }

    fn route_top_k(
        &self,
        logits: &Vec<f32>,
        experts: usize,
        top_k: usize,
        renormalize: bool,
    ) -> Vec<RouteChoice> {
        reference::route_top_k(logits, experts, top_k, renormalize)
    }
}
