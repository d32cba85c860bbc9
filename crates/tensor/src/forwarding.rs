//! Backends that wrap another one (a fault injector, a host stand-in for a device sampler) change
//! one or two ops and pass the rest through. `forward_ops!` writes the passing-through methods, so
//! a wrapper states only what it changes and which ops it forwards; the pools typed for the wrapper
//! are lent to the inner backend for the ops that take them (`KvLayerPool::lend`,
//! `StateLayerPool::lend`).

use crate::backend::Backend;
use crate::cache::{KvLayerPool, StateLayerPool};

impl<W: Backend> KvLayerPool<W> {
    /// This pool as a pool of `inner`, a backend with the same buffers (the wrapped one): the
    /// buffers moved out for `f` and back, the geometry copied.
    pub fn lend<B: Backend<Buf = W::Buf>, R>(
        &mut self,
        inner: &B,
        f: impl FnOnce(&mut KvLayerPool<B>) -> R,
    ) -> R {
        let mut lent = KvLayerPool::<B> {
            k: std::mem::replace(&mut self.k, inner.zeros(0)),
            v: std::mem::replace(&mut self.v, inner.zeros(0)),
            num_blocks: self.num_blocks,
            block_size: self.block_size,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            dtype: self.dtype,
        };
        let result = f(&mut lent);
        self.k = lent.k;
        self.v = lent.v;
        result
    }
}

impl<W: Backend> StateLayerPool<W> {
    /// This pool as a pool of `inner`, a backend with the same buffers (the wrapped one): the
    /// buffers moved out for `f` and back, the geometry copied.
    pub fn lend<B: Backend<Buf = W::Buf>, R>(
        &mut self,
        inner: &B,
        f: impl FnOnce(&mut StateLayerPool<B>) -> R,
    ) -> R {
        let mut lent = StateLayerPool::<B> {
            conv: std::mem::replace(&mut self.conv, inner.zeros(0)),
            ssm: std::mem::replace(&mut self.ssm, inner.zeros(0)),
            slots: self.slots,
            conv_dim: self.conv_dim,
            conv_history: self.conv_history,
            value_heads: self.value_heads,
            key_dim: self.key_dim,
            value_dim: self.value_dim,
        };
        let result = f(&mut lent);
        self.conv = lent.conv;
        self.ssm = lent.ssm;
        result
    }
}

/// Inside `impl Backend for Wrapper` (with `type Buf = Inner::Buf; type Mat = Inner::Mat;`):
/// `forward_ops!(inner; zeros, upload, matmul, ...)` defines each named op as the same op of
/// `self.inner`. Every op of the trait that a wrapper may want to pass through has an arm; a name
/// without one is a compile error here, not a silent default.
#[macro_export]
macro_rules! forward_ops {
    ($inner:ident; $($op:ident),+ $(,)?) => {
        $( $crate::forward_ops!(@op $inner $op); )+
    };
    (@op $inner:ident name) => {
        fn name(&self) -> &'static str { self.$inner.name() }
    };
    (@op $inner:ident zeros) => {
        fn zeros(&self, len: usize) -> Self::Buf { self.$inner.zeros(len) }
    };
    (@op $inner:ident kv_dtype) => {
        fn kv_dtype(&self) -> $crate::KvDtype { self.$inner.kv_dtype() }
    };
    (@op $inner:ident scratch) => {
        fn scratch(&self, len: usize) -> Self::Buf { self.$inner.scratch(len) }
    };
    (@op $inner:ident upload) => {
        fn upload(&self, data: &[f32]) -> Self::Buf { self.$inner.upload(data) }
    };
    (@op $inner:ident to_host) => {
        fn to_host(&self, buf: &Self::Buf) -> Vec<f32> { self.$inner.to_host(buf) }
    };
    (@op $inner:ident buf_len) => {
        fn buf_len(&self, buf: &Self::Buf) -> usize { self.$inner.buf_len(buf) }
    };
    (@op $inner:ident copy_buf) => {
        fn copy_buf(&self, src: &Self::Buf) -> Self::Buf { self.$inner.copy_buf(src) }
    };
    (@op $inner:ident load_mat) => {
        fn load_mat(&self, t: &$crate::HostTensor) -> Result<Self::Mat, $crate::TensorError> {
            self.$inner.load_mat(t)
        }
    };
    (@op $inner:ident load_vec) => {
        fn load_vec(&self, t: &$crate::HostTensor) -> Result<Self::Buf, $crate::TensorError> {
            self.$inner.load_vec(t)
        }
    };
    (@op $inner:ident mat_shape) => {
        fn mat_shape(&self, m: &Self::Mat) -> (usize, usize) { self.$inner.mat_shape(m) }
    };
    (@op $inner:ident mat_bytes) => {
        fn mat_bytes(&self, m: &Self::Mat) -> usize { self.$inner.mat_bytes(m) }
    };
    (@op $inner:ident generate_mat) => {
        fn generate_mat(
            &self,
            spec: &$crate::GeneratedMatrix,
        ) -> Option<Result<Self::Mat, $crate::TensorError>> {
            self.$inner.generate_mat(spec)
        }
    };
    (@op $inner:ident embedding) => {
        fn embedding(&self, table: &Self::Mat, ids: &[u32], out: &mut Self::Buf) {
            self.$inner.embedding(table, ids, out)
        }
    };
    (@op $inner:ident matmul) => {
        fn matmul(&self, x: &Self::Buf, w: &Self::Mat, out: &mut Self::Buf, tokens: usize) {
            self.$inner.matmul(x, w, out, tokens)
        }
    };
    (@op $inner:ident matmul_group) => {
        fn matmul_group(
            &self,
            x: &Self::Buf,
            ws: &[&Self::Mat],
            outs: &mut [&mut Self::Buf],
            tokens: usize,
        ) {
            self.$inner.matmul_group(x, ws, outs, tokens)
        }
    };
    (@op $inner:ident add_rms_norm) => {
        fn add_rms_norm(
            &self,
            acc: &mut Self::Buf,
            x: &Self::Buf,
            w: &Self::Buf,
            eps: f32,
            dim: usize,
            out: &mut Self::Buf,
        ) {
            self.$inner.add_rms_norm(acc, x, w, eps, dim, out)
        }
    };
    (@op $inner:ident rms_norm) => {
        fn rms_norm(&self, x: &Self::Buf, w: &Self::Buf, eps: f32, dim: usize, out: &mut Self::Buf) {
            self.$inner.rms_norm(x, w, eps, dim, out)
        }
    };
    (@op $inner:ident gated_rms_norm) => {
        fn gated_rms_norm(
            &self,
            x: &Self::Buf,
            z: &Self::Buf,
            w: &Self::Buf,
            eps: f32,
            dim: usize,
            out: &mut Self::Buf,
        ) {
            self.$inner.gated_rms_norm(x, z, w, eps, dim, out)
        }
    };
    (@op $inner:ident add_inplace) => {
        fn add_inplace(&self, acc: &mut Self::Buf, x: &Self::Buf) { self.$inner.add_inplace(acc, x) }
    };
    (@op $inner:ident silu_mul) => {
        fn silu_mul(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf) {
            self.$inner.silu_mul(gate, up, out)
        }
    };
    (@op $inner:ident sigmoid_mul_inplace) => {
        fn sigmoid_mul_inplace(&self, x: &mut Self::Buf, gate: &Self::Buf) {
            self.$inner.sigmoid_mul_inplace(x, gate)
        }
    };
    (@op $inner:ident rope) => {
        fn rope(
            &self,
            x: &mut Self::Buf,
            positions: &[u32],
            heads: usize,
            head_dim: usize,
            rotary_dim: usize,
            theta: f32,
        ) {
            self.$inner.rope(x, positions, heads, head_dim, rotary_dim, theta)
        }
    };
    (@op $inner:ident concat_cols) => {
        fn concat_cols(
            &self,
            a: &Self::Buf,
            b: &Self::Buf,
            a_dim: usize,
            b_dim: usize,
            out: &mut Self::Buf,
        ) {
            self.$inner.concat_cols(a, b, a_dim, b_dim, out)
        }
    };
    (@op $inner:ident gather_rows) => {
        fn gather_rows(&self, src: &Self::Buf, dim: usize, rows: &[u32]) -> Self::Buf {
            self.$inner.gather_rows(src, dim, rows)
        }
    };
    (@op $inner:ident scatter_add_rows) => {
        fn scatter_add_rows(
            &self,
            acc: &mut Self::Buf,
            src: &Self::Buf,
            dim: usize,
            rows: &[u32],
            weights: &[f32],
        ) {
            self.$inner.scatter_add_rows(acc, src, dim, rows, weights)
        }
    };
    (@op $inner:ident sigmoid_scale_rows) => {
        fn sigmoid_scale_rows(&self, x: &mut Self::Buf, gate: &Self::Buf, dim: usize) {
            self.$inner.sigmoid_scale_rows(x, gate, dim)
        }
    };
    (@op $inner:ident attention) => {
        fn attention(
            &self,
            q: &Self::Buf,
            k: &Self::Buf,
            v: &Self::Buf,
            pool: &mut $crate::KvLayerPool<Self>,
            batch: &$crate::BatchLayout,
            shape: $crate::AttnShape,
            out: &mut Self::Buf,
        ) {
            pool.lend(&self.$inner, |p| self.$inner.attention(q, k, v, p, batch, shape, out))
        }
    };
    (@op $inner:ident causal_conv1d) => {
        fn causal_conv1d(
            &self,
            x: &Self::Buf,
            w: &Self::Buf,
            pool: &mut $crate::StateLayerPool<Self>,
            batch: &$crate::BatchLayout,
            out: &mut Self::Buf,
        ) {
            pool.lend(&self.$inner, |p| self.$inner.causal_conv1d(x, w, p, batch, out))
        }
    };
    (@op $inner:ident gdn_gates) => {
        fn gdn_gates(
            &self,
            a: &Self::Buf,
            b: &Self::Buf,
            a_log: &Self::Buf,
            dt_bias: &Self::Buf,
            g: &mut Self::Buf,
            beta: &mut Self::Buf,
        ) {
            self.$inner.gdn_gates(a, b, a_log, dt_bias, g, beta)
        }
    };
    (@op $inner:ident gated_delta_rule) => {
        fn gated_delta_rule(
            &self,
            mixed: &Self::Buf,
            g: &Self::Buf,
            beta: &Self::Buf,
            pool: &mut $crate::StateLayerPool<Self>,
            batch: &$crate::BatchLayout,
            shape: $crate::GdnShape,
            out: &mut Self::Buf,
        ) {
            pool.lend(&self.$inner, |p| {
                self.$inner.gated_delta_rule(mixed, g, beta, p, batch, shape, out)
            })
        }
    };
    (@op $inner:ident reset_state_slot) => {
        fn reset_state_slot(&self, pool: &mut $crate::StateLayerPool<Self>, slot: usize) {
            pool.lend(&self.$inner, |p| self.$inner.reset_state_slot(p, slot))
        }
    };
    (@op $inner:ident copy_state_slot) => {
        fn copy_state_slot(&self, pool: &mut $crate::StateLayerPool<Self>, src: usize, dst: usize) {
            pool.lend(&self.$inner, |p| self.$inner.copy_state_slot(p, src, dst))
        }
    };
    (@op $inner:ident route_top_k) => {
        fn route_top_k(
            &self,
            logits: &Self::Buf,
            experts: usize,
            top_k: usize,
            renormalize: bool,
        ) -> Vec<$crate::RouteChoice> {
            self.$inner.route_top_k(logits, experts, top_k, renormalize)
        }
    };
    (@op $inner:ident load_experts) => {
        fn load_experts(
            &self,
            experts: &[$crate::ExpertTensors],
            shape: $crate::ExpertShape,
        ) -> Result<$crate::Experts<Self::Mat>, $crate::TensorError> {
            self.$inner.load_experts(experts, shape)
        }
    };
    (@op $inner:ident generate_experts) => {
        fn generate_experts(
            &self,
            gate_up: &$crate::GeneratedMatrix,
            down: &$crate::GeneratedMatrix,
            shape: $crate::ExpertShape,
        ) -> Option<Result<$crate::Experts<Self::Mat>, $crate::TensorError>> {
            self.$inner.generate_experts(gate_up, down, shape)
        }
    };
    (@op $inner:ident dense_mlp) => {
        fn dense_mlp(
            &self,
            x: &Self::Buf,
            mats: [&Self::Mat; 3],
            out: &mut Self::Buf,
            tokens: usize,
        ) {
            self.$inner.dense_mlp(x, mats, out, tokens)
        }
    };
    (@op $inner:ident moe_experts) => {
        fn moe_experts(
            &self,
            x: &Self::Buf,
            router_logits: &Self::Buf,
            experts: &$crate::Experts<Self::Mat>,
            routing: $crate::MoeRouting,
            tokens: usize,
            shared: Option<$crate::SharedExpert<'_, Self::Mat, Self::Buf>>,
        ) -> Self::Buf {
            self.$inner.moe_experts(x, router_logits, experts, routing, tokens, shared)
        }
    };
    (@op $inner:ident samples_on_device) => {
        fn samples_on_device(&self) -> bool { self.$inner.samples_on_device() }
    };
    (@op $inner:ident sample_rows) => {
        fn sample_rows(
            &self,
            logits: &Self::Buf,
            vocab: usize,
            rows: &[$crate::RowSampling],
        ) -> Option<Vec<u32>> {
            self.$inner.sample_rows(logits, vocab, rows)
        }
    };
    (@op $inner:ident device) => {
        fn device(&self) -> Option<&dyn $crate::Device> { self.$inner.device() }
    };
    (@op $inner:ident run_step) => {
        fn run_step<R: Send>(&self, step: impl FnOnce() -> R + Send) -> R { self.$inner.run_step(step) }
    };
    (@op $inner:ident recover_after_failure) => {
        fn recover_after_failure(&self) -> Result<(), String> { self.$inner.recover_after_failure() }
    };
}
