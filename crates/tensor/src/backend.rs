//! The `Backend` trait: every op the Qwen3.5 / Qwen3-Next forward pass needs, on a ragged batch.
//! The forward pass is written once against this trait; `reference` defines what each op means and
//! every other backend is tested against it op by op (`op_check`). What a backend's device is apart
//! from the ops (its memory, bandwidth and op timings) is a `Device`, reached through `device()`.
//!
//! Conventions: activations are `Buf`s of f32 laid out row-major as `[tokens, ...]`; matrices are
//! `Mat`s stored `[out, in]` as in the checkpoint; `matmul` computes `x @ w^T`.

use crate::batch::BatchLayout;
use crate::cache::{KvLayerPool, StateLayerPool};
use crate::device::Device;
use crate::device_sampling::RowSampling;
use crate::generated::GeneratedMatrix;
use crate::host::{HostTensor, TensorError};
use crate::kv_dtype::KvDtype;
use crate::moe::{self, ExpertShape, ExpertTensors, Experts, MoeRouting, SharedExpert};
use crate::step_graph::{StepGraph, StepInputs};

/// Geometry of a gated full-attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Geometry of a Gated DeltaNet layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnShape {
    /// HK: query/key heads.
    pub key_heads: usize,
    /// HV: value heads; a multiple of `key_heads` (value head h reads key head h / (HV/HK)).
    pub value_heads: usize,
    /// dk
    pub key_dim: usize,
    /// dv
    pub value_dim: usize,
}

impl GdnShape {
    /// Channels of the conv input: q | k | v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }
}

/// One routed (token, expert) pair of an MoE layer with its combine weight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouteChoice {
    pub token: u32,
    pub expert: u32,
    pub weight: f32,
}

/// What a GDN layer's gates are made of: the `a` and `b` projections `[T, value_heads]` and the
/// layer's `A_log` and `dt_bias` `[value_heads]` (`Backend::gdn_gates`).
pub struct GdnGateInputs<'a, Buf> {
    pub a: &'a Buf,
    pub b: &'a Buf,
    pub a_log: &'a Buf,
    pub dt_bias: &'a Buf,
}

// Four shared references: copyable whatever `Buf` is (a derive would ask `Buf: Copy`).
impl<Buf> Clone for GdnGateInputs<'_, Buf> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<Buf> Copy for GdnGateInputs<'_, Buf> {}

/// The ops of the model. `&self` everywhere: a backend is shared by the engine thread and `doctor`.
pub trait Backend: Send + Sync {
    /// f32 activations and small parameter vectors (norm weights, gates, caches).
    type Buf: Send + Sync;
    /// A weight matrix `[out, in]` in the backend's storage dtype.
    type Mat: Send + Sync;

    fn name(&self) -> &'static str;

    // ---- memory -------------------------------------------------------------------------------
    fn zeros(&self, len: usize) -> Self::Buf;
    /// The dtype of the KV pools `KvLayerPool::new` makes for this backend. The host backends store
    /// and read f32 pools only.
    fn kv_dtype(&self) -> KvDtype {
        KvDtype::F32
    }
    /// A buffer of `len` values that the caller overwrites completely before reading any: a
    /// backend may leave it uninitialised (saves a memset per intermediate on a GPU).
    fn scratch(&self, len: usize) -> Self::Buf {
        self.zeros(len)
    }
    fn upload(&self, data: &[f32]) -> Self::Buf;
    fn to_host(&self, buf: &Self::Buf) -> Vec<f32>;
    fn buf_len(&self, buf: &Self::Buf) -> usize;
    /// A 2-D `[out, in]` tensor (an embedding table is one too: `[vocab, hidden]`).
    fn load_mat(&self, t: &HostTensor) -> Result<Self::Mat, TensorError>;
    /// Any tensor, as f32 (norm weights, conv weights, A_log, dt_bias).
    fn load_vec(&self, t: &HostTensor) -> Result<Self::Buf, TensorError> {
        Ok(self.upload(&t.to_f32_vec()))
    }
    /// `(rows, cols)` of a matrix.
    fn mat_shape(&self, m: &Self::Mat) -> (usize, usize);
    /// Bytes the matrix occupies as this backend stores it (what one pass over it reads: bf16,
    /// f32, or FP8 codes plus their block scales; a backend's padding included).
    fn mat_bytes(&self, m: &Self::Mat) -> usize;

    // ---- dense ops ----------------------------------------------------------------------------
    /// `out[t] = table[ids[t]]`; out `[T, hidden]`.
    fn embedding(&self, table: &Self::Mat, ids: &[u32], out: &mut Self::Buf);
    /// `out [T, out] = x [T, in] @ w^T`.
    fn matmul(&self, x: &Self::Buf, w: &Self::Mat, out: &mut Self::Buf, tokens: usize);
    /// `outs[i] [T, rows_i] = x [T, in] @ ws[i]^T` for matrices that share their input (q/k/v,
    /// gate/up): one op, so a backend can read `x` once and launch once. Same result as `matmul`
    /// on each.
    fn matmul_group(
        &self,
        x: &Self::Buf,
        ws: &[&Self::Mat],
        outs: &mut [&mut Self::Buf],
        tokens: usize,
    ) {
        assert_eq!(ws.len(), outs.len(), "matmul_group: one output per matrix");
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            self.matmul(x, w, out, tokens);
        }
    }
    /// Zero-centred RMSNorm over rows of `dim`: `x * rsqrt(mean(x^2) + eps) * (1 + w)`.
    fn rms_norm(&self, x: &Self::Buf, w: &Self::Buf, eps: f32, dim: usize, out: &mut Self::Buf);
    /// The residual add and the next norm in one op: `acc += x`, then `out = rms_norm(acc)`.
    #[allow(clippy::too_many_arguments)]
    fn add_rms_norm(
        &self,
        acc: &mut Self::Buf,
        x: &Self::Buf,
        w: &Self::Buf,
        eps: f32,
        dim: usize,
        out: &mut Self::Buf,
    ) {
        self.add_inplace(acc, x);
        self.rms_norm(acc, w, eps, dim, out);
    }
    /// Plain gated RMSNorm over rows of `dim`: `w * x * rsqrt(mean(x^2) + eps) * silu(z)`.
    fn gated_rms_norm(
        &self,
        x: &Self::Buf,
        z: &Self::Buf,
        w: &Self::Buf,
        eps: f32,
        dim: usize,
        out: &mut Self::Buf,
    );
    /// `acc += x`.
    fn add_inplace(&self, acc: &mut Self::Buf, x: &Self::Buf);
    /// `out = silu(gate) * up`.
    fn silu_mul(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf);
    /// `out [T, rows] = silu(x @ gate^T) * (x @ up^T)`, the gated MLP's first half, in one op so
    /// that a backend can apply the activation where it sums the products. Same result as
    /// `matmul_group` over `[gate, up]` then `silu_mul`.
    fn matmul_silu_gate(
        &self,
        x: &Self::Buf,
        gate: &Self::Mat,
        up: &Self::Mat,
        out: &mut Self::Buf,
        tokens: usize,
    ) {
        let rows = self.mat_shape(gate).0;
        let mut g = self.scratch(tokens * rows);
        let mut u = self.scratch(tokens * rows);
        self.matmul_group(x, &[gate, up], &mut [&mut g, &mut u], tokens);
        self.silu_mul(&g, &u, out);
    }
    /// The gated MLP whole: `out [T, h] = (silu(x @ gate^T) * (x @ up^T)) @ down^T`, so that a
    /// backend can hand the activation to the down projection in the form that product reads.
    /// Same result as `matmul_silu_gate` then `matmul_group` over `[down]` (the default).
    fn dense_mlp(
        &self,
        x: &Self::Buf,
        [gate, up, down]: [&Self::Mat; 3],
        out: &mut Self::Buf,
        tokens: usize,
    ) {
        let mut act = self.scratch(tokens * self.mat_shape(gate).0);
        self.matmul_silu_gate(x, gate, up, &mut act, tokens);
        self.matmul_group(&act, &[down], &mut [out], tokens);
    }
    /// `x *= sigmoid(gate)`, elementwise.
    fn sigmoid_mul_inplace(&self, x: &mut Self::Buf, gate: &Self::Buf);
    /// Rotate-half (NeoX) RoPE on the first `rotary_dim` dims of every head; x `[T, heads, head_dim]`.
    fn rope(
        &self,
        x: &mut Self::Buf,
        positions: &[u32],
        heads: usize,
        head_dim: usize,
        rotary_dim: usize,
        theta: f32,
    );
    /// The gated attention's per-head norms and RoPE in one op: `q = rope(rms_norm(q_raw, q_norm))`
    /// over `[T, q_heads, head_dim]` and `k` likewise over the kv heads, the norms over `head_dim`
    /// and the rotation on its first `rotary_dim` dims at `positions`. Same result as the four ops.
    #[allow(clippy::too_many_arguments)]
    fn qk_norm_rope(
        &self,
        q_raw: &Self::Buf,
        k_raw: &Self::Buf,
        [q_norm, k_norm]: [&Self::Buf; 2],
        eps: f32,
        positions: &[u32],
        shape: AttnShape,
        (rotary_dim, theta): (usize, f32),
        q: &mut Self::Buf,
        k: &mut Self::Buf,
    ) {
        let d = shape.head_dim;
        self.rms_norm(q_raw, q_norm, eps, d, q);
        self.rms_norm(k_raw, k_norm, eps, d, k);
        self.rope(q, positions, shape.q_heads, d, rotary_dim, theta);
        self.rope(k, positions, shape.kv_heads, d, rotary_dim, theta);
    }
    /// `out [T, a_dim + b_dim] = concat(a [T, a_dim], b [T, b_dim])` along columns.
    fn concat_cols(
        &self,
        a: &Self::Buf,
        b: &Self::Buf,
        a_dim: usize,
        b_dim: usize,
        out: &mut Self::Buf,
    );
    /// `out [rows.len(), dim] = src[rows]`.
    fn gather_rows(&self, src: &Self::Buf, dim: usize, rows: &[u32]) -> Self::Buf;
    /// `acc[rows[i]] += weights[i] * src[i]`, rows of `dim`.
    fn scatter_add_rows(
        &self,
        acc: &mut Self::Buf,
        src: &Self::Buf,
        dim: usize,
        rows: &[u32],
        weights: &[f32],
    );
    /// `x[t] *= sigmoid(gate[t])` for rows of `dim` (a scalar gate per row).
    fn sigmoid_scale_rows(&self, x: &mut Self::Buf, gate: &Self::Buf, dim: usize);

    // ---- attention ----------------------------------------------------------------------------
    /// Writes the new `k`, `v` (`[T, kv_heads, head_dim]`) into `pool` at each sequence's positions,
    /// then computes causal softmax attention of `q` (`[T, q_heads, head_dim]`) over each sequence's
    /// cached keys, scale `head_dim^-0.5`, GQA with consecutive grouping. `out` `[T, q_heads, head_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        pool: &mut KvLayerPool<Self>,
        batch: &BatchLayout,
        shape: AttnShape,
        out: &mut Self::Buf,
    );

    // ---- Gated DeltaNet -----------------------------------------------------------------------
    /// Depthwise causal conv (kernel K = conv history + 1) then SiLU over `x [T, conv_dim]`, with
    /// `w [conv_dim, K]` (`w[c, K-1]` multiplies the current token) and each sequence's conv window
    /// in `pool` as history; the window is updated (and snapshotted where the layout asks).
    fn causal_conv1d(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        pool: &mut StateLayerPool<Self>,
        batch: &BatchLayout,
        out: &mut Self::Buf,
    );
    /// `g = -exp(a_log) * softplus(a + dt_bias)`, `beta = sigmoid(b)`; all `[T, value_heads]`.
    fn gdn_gates(
        &self,
        a: &Self::Buf,
        b: &Self::Buf,
        a_log: &Self::Buf,
        dt_bias: &Self::Buf,
        g: &mut Self::Buf,
        beta: &mut Self::Buf,
    );
    /// The gated delta rule over `mixed [T, conv_dim]` (the conv output: q | k | v), including the
    /// l2-norm of q and k, the `key_dim^-0.5` query scale and GVA. Sequences with `len > 1` and no
    /// snapshot slots use the chunked form (chunk 64); others the recurrent form token by token.
    /// Reads and writes each sequence's recurrent state in `pool`. `out [T, value_heads, value_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn gated_delta_rule(
        &self,
        mixed: &Self::Buf,
        g: &Self::Buf,
        beta: &Self::Buf,
        pool: &mut StateLayerPool<Self>,
        batch: &BatchLayout,
        shape: GdnShape,
        out: &mut Self::Buf,
    );
    /// `gdn_gates` then `gated_delta_rule` in one op, so that a backend can compute each token's
    /// gates where the rule reads them. Same result as the two ops.
    fn gdn_gates_and_delta_rule(
        &self,
        mixed: &Self::Buf,
        gates: GdnGateInputs<'_, Self::Buf>,
        pool: &mut StateLayerPool<Self>,
        batch: &BatchLayout,
        shape: GdnShape,
        out: &mut Self::Buf,
    ) {
        let n = self.buf_len(gates.a);
        let (mut g, mut beta) = (self.scratch(n), self.scratch(n));
        self.gdn_gates(
            gates.a,
            gates.b,
            gates.a_log,
            gates.dt_bias,
            &mut g,
            &mut beta,
        );
        self.gated_delta_rule(mixed, &g, &beta, pool, batch, shape, out);
    }
    /// Zeroes a state slot (a new sequence starts from an empty state).
    fn reset_state_slot(&self, pool: &mut StateLayerPool<Self>, slot: usize);
    /// Copies the conv window and recurrent state of slot `src` into `dst`.
    fn copy_state_slot(&self, pool: &mut StateLayerPool<Self>, src: usize, dst: usize);

    // ---- MoE ----------------------------------------------------------------------------------
    /// Softmax (f32) over `logits [T, experts]`, top-`k` per token (ties: lower expert index first),
    /// weights renormalised to sum 1 when `renormalize`. Returned grouped by token, in rank order.
    fn route_top_k(
        &self,
        logits: &Self::Buf,
        experts: usize,
        top_k: usize,
        renormalize: bool,
    ) -> Vec<RouteChoice>;

    /// Uploads the routed experts of one MoE block (default: one matrix per projection).
    fn load_experts(
        &self,
        experts: &[ExpertTensors],
        shape: ExpertShape,
    ) -> Result<Experts<Self::Mat>, TensorError> {
        moe::load_per_expert(self, experts, shape)
    }

    /// Generates the stacked experts (`gate_up [E * 2 * im, h]`, `down [E * h, im]`) on the device,
    /// bit for bit what the source would upload; `None`: this backend cannot (the caller loads the
    /// tensors from the source).
    fn generate_experts(
        &self,
        _gate_up: &GeneratedMatrix,
        _down: &GeneratedMatrix,
        _shape: ExpertShape,
    ) -> Option<Result<Experts<Self::Mat>, TensorError>> {
        None
    }

    /// The routed experts' output `[T, h]` for `x [T, h]` given the router's logits `[T, E]`, plus
    /// the gated shared expert when given. Default: `moe::moe_per_expert`.
    #[allow(clippy::too_many_arguments)]
    fn moe_experts(
        &self,
        x: &Self::Buf,
        router_logits: &Self::Buf,
        experts: &Experts<Self::Mat>,
        routing: MoeRouting,
        tokens: usize,
        shared: Option<SharedExpert<'_, Self::Mat, Self::Buf>>,
    ) -> Self::Buf {
        moe::moe_per_expert(self, x, router_logits, experts, routing, tokens, shared)
    }

    // ---- running a step -------------------------------------------------------------------------
    /// Runs one model step's ops (`step` calls the ops on this backend). The default runs it on
    /// the calling thread; the cpu backend runs it on one of its own worker threads, so that each
    /// op hands its parallel work to a sibling worker instead of waking the pool from outside and
    /// putting the caller to sleep until the op ends (docs/backends.md, "Running a step").
    fn run_step<R: Send>(&self, step: impl FnOnce() -> R + Send) -> R {
        step()
    }

    // ---- device extras (defaults: the backend has none) ----------------------------------------
    /// The backend's own device (its memory, bandwidth and op timings); `None` for backends that
    /// run from host memory.
    fn device(&self) -> Option<&dyn Device> {
        None
    }

    /// Generates a matrix on the device, bit for bit the values the source would have uploaded;
    /// `None`: this backend cannot (the caller generates on the host and uploads).
    fn generate_mat(&self, _spec: &GeneratedMatrix) -> Option<Result<Self::Mat, TensorError>> {
        None
    }

    /// Whether `sample_rows` samples on the device (asked before drawing the uniform numbers, so
    /// a backend without it leaves every request's random stream as the host sampler uses it).
    fn samples_on_device(&self) -> bool {
        false
    }

    /// Picks one token for each of `rows` of `logits [rows, vocab]` without copying the logits off
    /// the device, drawing from the distribution the engine's host sampler defines. `None`: this
    /// backend has no device sampler and the caller samples on the host.
    fn sample_rows(
        &self,
        _logits: &Self::Buf,
        _vocab: usize,
        _rows: &[RowSampling],
    ) -> Option<Vec<u32>> {
        None
    }

    /// Puts the device tables of a step (token ids, positions, sequence and attention tables,
    /// logit rows) in place at addresses that stay fixed while their sizes do, so that recorded
    /// ops read the new step's values on replay. Returns a key of the step's shape as the
    /// backend's ops see it (launch grids, table addresses): a recording is valid for steps with
    /// the same key. `None`: this backend cannot record steps.
    fn prepare_step(&self, _inputs: &StepInputs<'_>) -> Option<u64> {
        None
    }

    /// A step's input hidden states `[T, hidden]` on the device. Backends that record steps read
    /// them from the table `prepare_step` filled (`StepInputs::hidden`), so that a replay starts
    /// from the new step's rows; the default uploads them.
    fn step_hidden(&self, data: &[f32]) -> Self::Buf {
        self.upload(data)
    }

    /// Starts recording ops instead of running them; false when this backend cannot.
    fn begin_capture(&self) -> bool {
        false
    }

    /// Ends the recording. `None` when it failed; the recorded ops never ran either way.
    fn end_capture(&self) -> Option<StepGraph> {
        None
    }

    /// Runs a recording again, on the tables `prepare_step` put in place.
    fn replay(&self, _graph: &StepGraph) -> bool {
        false
    }

    /// Puts the backend back in a usable state after an op panicked mid-step (the caller ends the
    /// requests of that step): e.g. ends a recording left open. `Err(cause)` when the device is
    /// lost for good (a GPU context that can run nothing more after an illegal address, a launch
    /// failure, an uncorrectable ECC error or a fallen-off bus): every later step would fail too.
    fn recover_after_failure(&self) -> Result<(), String> {
        Ok(())
    }

    /// A copy of `src` in a new buffer.
    fn copy_buf(&self, src: &Self::Buf) -> Self::Buf {
        self.upload(&self.to_host(src))
    }
}
