//! A backend that fails on purpose, for the tests of a failed step under tensor parallelism: it
//! forwards every op to an inner backend and panics on a chosen matmul call, as a device error
//! surfaces (a panic inside an op). Included by path from crates/engine/tests as well. The shape of
//! the forwarding follows crates/tensor/src/diagnostic.rs.
#![allow(dead_code)]

use deltaserve_tensor::device::Device;
use deltaserve_tensor::generated::GeneratedMatrix;
use deltaserve_tensor::{
    AttnShape, Backend, BatchLayout, Communicator, ExpertShape, ExpertTensors, Experts, GdnShape,
    HostTensor, InProcessGroup, KvLayerPool, MoeRouting, RouteChoice, RowSampling, SharedExpert,
    StateLayerPool, TensorError,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The message of the injected panic.
pub const INJECTED: &str = "injected device failure";

/// When a `Faulty` backend fails; shared with the test, which arms it.
#[derive(Clone, Default)]
pub struct Fault {
    /// 0: disarmed; `n`: the `n`-th matmul from now panics (once, then disarmed).
    countdown: Arc<AtomicUsize>,
    /// Matmuls run so far (to pick a call inside a given step).
    calls: Arc<AtomicUsize>,
}

impl Fault {
    /// The `nth` (1-based) matmul from now panics.
    pub fn arm(&self, nth: usize) {
        assert!(nth > 0);
        self.countdown.store(nth, Ordering::SeqCst);
    }

    /// Whether an armed fault has not fired yet.
    pub fn armed(&self) -> bool {
        self.countdown.load(Ordering::SeqCst) > 0
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn tick(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let fire = self
            .countdown
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok_and(|before| before == 1);
        if fire {
            panic!("{INJECTED}");
        }
    }
}

/// `inner`, failing where `fault` says.
pub struct Faulty<B> {
    pub inner: B,
    pub fault: Fault,
}

/// Two ranks of `inner()`, each behind a `Faulty` wrapper, over one in-process group: the faults
/// the test arms, the backends and the communicators, as `load_tensor_parallel` takes them.
pub type FaultyPair<B> = (
    [Fault; 2],
    Vec<Faulty<B>>,
    Vec<Box<dyn Communicator<Faulty<B>>>>,
);

pub fn faulty_pair<B: Backend + 'static>(inner: impl Fn() -> B) -> FaultyPair<B>
where
    InProcessGroup: Communicator<Faulty<B>>,
{
    let faults = [Fault::default(), Fault::default()];
    let backends = faults
        .iter()
        .map(|fault| Faulty {
            inner: inner(),
            fault: fault.clone(),
        })
        .collect();
    let comms = InProcessGroup::new(2)
        .into_iter()
        .map(|g| Box::new(g) as Box<dyn Communicator<Faulty<B>>>)
        .collect();
    (faults, backends, comms)
}

impl<B: Backend> Backend for Faulty<B> {
    type Buf = B::Buf;
    type Mat = B::Mat;

    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn zeros(&self, len: usize) -> Self::Buf {
        self.inner.zeros(len)
    }
    fn kv_dtype(&self) -> deltaserve_tensor::KvDtype {
        self.inner.kv_dtype()
    }
    fn scratch(&self, len: usize) -> Self::Buf {
        self.inner.scratch(len)
    }
    fn upload(&self, data: &[f32]) -> Self::Buf {
        self.inner.upload(data)
    }
    fn to_host(&self, buf: &Self::Buf) -> Vec<f32> {
        self.inner.to_host(buf)
    }
    fn buf_len(&self, buf: &Self::Buf) -> usize {
        self.inner.buf_len(buf)
    }
    fn load_mat(&self, t: &HostTensor) -> Result<Self::Mat, TensorError> {
        self.inner.load_mat(t)
    }
    fn load_vec(&self, t: &HostTensor) -> Result<Self::Buf, TensorError> {
        self.inner.load_vec(t)
    }
    fn mat_shape(&self, m: &Self::Mat) -> (usize, usize) {
        self.inner.mat_shape(m)
    }
    fn mat_bytes(&self, m: &Self::Mat) -> usize {
        self.inner.mat_bytes(m)
    }
    fn embedding(&self, table: &Self::Mat, ids: &[u32], out: &mut Self::Buf) {
        self.inner.embedding(table, ids, out)
    }
    fn matmul(&self, x: &Self::Buf, w: &Self::Mat, out: &mut Self::Buf, tokens: usize) {
        self.fault.tick();
        self.inner.matmul(x, w, out, tokens)
    }
    fn matmul_group(
        &self,
        x: &Self::Buf,
        ws: &[&Self::Mat],
        outs: &mut [&mut Self::Buf],
        tokens: usize,
    ) {
        self.fault.tick();
        self.inner.matmul_group(x, ws, outs, tokens)
    }
    fn add_rms_norm(
        &self,
        acc: &mut Self::Buf,
        x: &Self::Buf,
        w: &Self::Buf,
        eps: f32,
        dim: usize,
        out: &mut Self::Buf,
    ) {
        self.inner.add_rms_norm(acc, x, w, eps, dim, out)
    }
    fn rms_norm(&self, x: &Self::Buf, w: &Self::Buf, eps: f32, dim: usize, out: &mut Self::Buf) {
        self.inner.rms_norm(x, w, eps, dim, out)
    }
    fn gated_rms_norm(
        &self,
        x: &Self::Buf,
        z: &Self::Buf,
        w: &Self::Buf,
        eps: f32,
        dim: usize,
        out: &mut Self::Buf,
    ) {
        self.inner.gated_rms_norm(x, z, w, eps, dim, out)
    }
    fn add_inplace(&self, acc: &mut Self::Buf, x: &Self::Buf) {
        self.inner.add_inplace(acc, x)
    }
    fn silu_mul(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf) {
        self.inner.silu_mul(gate, up, out)
    }
    fn sigmoid_mul_inplace(&self, x: &mut Self::Buf, gate: &Self::Buf) {
        self.inner.sigmoid_mul_inplace(x, gate)
    }
    fn rope(
        &self,
        x: &mut Self::Buf,
        positions: &[u32],
        heads: usize,
        head_dim: usize,
        rotary_dim: usize,
        theta: f32,
    ) {
        self.inner
            .rope(x, positions, heads, head_dim, rotary_dim, theta)
    }
    fn concat_cols(
        &self,
        a: &Self::Buf,
        b: &Self::Buf,
        a_dim: usize,
        b_dim: usize,
        out: &mut Self::Buf,
    ) {
        self.inner.concat_cols(a, b, a_dim, b_dim, out)
    }
    fn gather_rows(&self, src: &Self::Buf, dim: usize, rows: &[u32]) -> Self::Buf {
        self.inner.gather_rows(src, dim, rows)
    }
    fn scatter_add_rows(
        &self,
        acc: &mut Self::Buf,
        src: &Self::Buf,
        dim: usize,
        rows: &[u32],
        weights: &[f32],
    ) {
        self.inner.scatter_add_rows(acc, src, dim, rows, weights)
    }
    fn sigmoid_scale_rows(&self, x: &mut Self::Buf, gate: &Self::Buf, dim: usize) {
        self.inner.sigmoid_scale_rows(x, gate, dim)
    }

    fn attention(
        &self,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        pool: &mut KvLayerPool<Self>,
        batch: &BatchLayout,
        shape: AttnShape,
        out: &mut Self::Buf,
    ) {
        let mut lent = KvLayerPool::<B> {
            k: std::mem::replace(&mut pool.k, self.inner.zeros(0)),
            v: std::mem::replace(&mut pool.v, self.inner.zeros(0)),
            num_blocks: pool.num_blocks,
            block_size: pool.block_size,
            kv_heads: pool.kv_heads,
            head_dim: pool.head_dim,
            dtype: pool.dtype,
        };
        self.inner.attention(q, k, v, &mut lent, batch, shape, out);
        pool.k = lent.k;
        pool.v = lent.v;
    }

    fn causal_conv1d(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        pool: &mut StateLayerPool<Self>,
        batch: &BatchLayout,
        out: &mut Self::Buf,
    ) {
        with_inner_state(&self.inner, pool, |p| {
            self.inner.causal_conv1d(x, w, p, batch, out)
        })
    }
    fn gdn_gates(
        &self,
        a: &Self::Buf,
        b: &Self::Buf,
        a_log: &Self::Buf,
        dt_bias: &Self::Buf,
        g: &mut Self::Buf,
        beta: &mut Self::Buf,
    ) {
        self.inner.gdn_gates(a, b, a_log, dt_bias, g, beta)
    }
    fn gated_delta_rule(
        &self,
        mixed: &Self::Buf,
        g: &Self::Buf,
        beta: &Self::Buf,
        pool: &mut StateLayerPool<Self>,
        batch: &BatchLayout,
        shape: GdnShape,
        out: &mut Self::Buf,
    ) {
        with_inner_state(&self.inner, pool, |p| {
            self.inner
                .gated_delta_rule(mixed, g, beta, p, batch, shape, out)
        })
    }
    fn reset_state_slot(&self, pool: &mut StateLayerPool<Self>, slot: usize) {
        with_inner_state(&self.inner, pool, |p| self.inner.reset_state_slot(p, slot))
    }
    fn copy_state_slot(&self, pool: &mut StateLayerPool<Self>, src: usize, dst: usize) {
        with_inner_state(&self.inner, pool, |p| {
            self.inner.copy_state_slot(p, src, dst)
        })
    }
    fn route_top_k(
        &self,
        logits: &Self::Buf,
        experts: usize,
        top_k: usize,
        renormalize: bool,
    ) -> Vec<RouteChoice> {
        self.inner.route_top_k(logits, experts, top_k, renormalize)
    }
    fn load_experts(
        &self,
        experts: &[ExpertTensors],
        shape: ExpertShape,
    ) -> Result<Experts<Self::Mat>, TensorError> {
        self.inner.load_experts(experts, shape)
    }
    fn generate_experts(
        &self,
        gate_up: &GeneratedMatrix,
        down: &GeneratedMatrix,
        shape: ExpertShape,
    ) -> Option<Result<Experts<Self::Mat>, TensorError>> {
        self.inner.generate_experts(gate_up, down, shape)
    }
    fn moe_experts(
        &self,
        x: &Self::Buf,
        router_logits: &Self::Buf,
        experts: &Experts<Self::Mat>,
        routing: MoeRouting,
        tokens: usize,
        shared: Option<SharedExpert<'_, Self::Mat, Self::Buf>>,
    ) -> Self::Buf {
        self.inner
            .moe_experts(x, router_logits, experts, routing, tokens, shared)
    }
    fn generate_mat(&self, spec: &GeneratedMatrix) -> Option<Result<Self::Mat, TensorError>> {
        self.inner.generate_mat(spec)
    }
    fn samples_on_device(&self) -> bool {
        self.inner.samples_on_device()
    }
    fn sample_rows(
        &self,
        logits: &Self::Buf,
        vocab: usize,
        rows: &[RowSampling],
    ) -> Option<Vec<u32>> {
        self.inner.sample_rows(logits, vocab, rows)
    }
    fn device(&self) -> Option<&dyn Device> {
        self.inner.device()
    }
    fn run_step<R: Send>(&self, step: impl FnOnce() -> R + Send) -> R {
        self.inner.run_step(step)
    }
    fn recover_after_failure(&self) {
        self.inner.recover_after_failure()
    }
    fn copy_buf(&self, src: &Self::Buf) -> Self::Buf {
        self.inner.copy_buf(src)
    }
}

/// Lends a state pool typed for the wrapper to the inner backend (the same buffers and geometry,
/// moved out and back).
fn with_inner_state<B: Backend, R>(
    inner: &B,
    pool: &mut StateLayerPool<Faulty<B>>,
    f: impl FnOnce(&mut StateLayerPool<B>) -> R,
) -> R {
    let mut lent = StateLayerPool::<B> {
        conv: std::mem::replace(&mut pool.conv, inner.zeros(0)),
        ssm: std::mem::replace(&mut pool.ssm, inner.zeros(0)),
        slots: pool.slots,
        conv_dim: pool.conv_dim,
        conv_history: pool.conv_history,
        value_heads: pool.value_heads,
        key_dim: pool.key_dim,
        value_dim: pool.value_dim,
    };
    let result = f(&mut lent);
    pool.conv = lent.conv;
    pool.ssm = lent.ssm;
    result
}
