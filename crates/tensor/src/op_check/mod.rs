//! One op harness for every backend: each function runs one op on a backend and on `ReferenceBackend`
//! with the same host inputs and returns both outputs on the host, `(ours, reference)`. The cpu
//! backend's tests, the cuda backend's tests and `doctor` call it, so an op is exercised the same way
//! everywhere; they differ only in inputs (random shapes at the edges of the kernels, or a model's
//! real weights) and in tolerance. The weights come in both forms (the backend's, the reference's)
//! because doctor holds them loaded. Outputs start as NaN, so an element an op leaves unwritten
//! fails (the model hands ops `Backend::scratch` buffers, which they must overwrite completely).
//! The ops that read and write cache pools (attention, the conv window, the delta rule's state)
//! keep a pool pair from step to step: `AttentionPools`, `StatePools`. Also here: the deterministic
//! inputs and the error measure of the tests.

mod attention;
mod gdn;

pub use attention::AttentionPools;
pub use gdn::StatePools;

use crate::backend::{Backend, RouteChoice};
use crate::dtype::{bf16_to_f32, f32_to_bf16};
use crate::moe::{Experts, MoeRouting};
use crate::reference::{RefMat, ReferenceBackend};

/// `(ours, reference)`, both on the host.
pub type Outputs = (Vec<f32>, Vec<f32>);

/// What the reference sees of the activations a backend rounds before its products (a bf16 GEMM,
/// the flash attention kernel): the exact values, or the values rounded as the backend rounds them,
/// so that the comparison measures the op's arithmetic and not the rounding the backend chose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Operands {
    #[default]
    Exact,
    /// Rounded to bf16, nearest even.
    Bf16,
    /// Quantized in blocks of 128 consecutive values (a row's 128-column group when rows are whole
    /// groups) as an FP8 GEMM quantizes its activations: per block `scale = amax / 448` (1 for an
    /// all-zero block), each value `e4m3(v / scale) * scale`.
    E4m3Blocks,
}

impl Operands {
    /// `x` as the reference sees it.
    pub fn seen(self, x: &[f32]) -> Vec<f32> {
        match self {
            Self::Exact => x.to_vec(),
            Self::Bf16 => x.iter().map(|&v| bf16_to_f32(f32_to_bf16(v))).collect(),
            Self::E4m3Blocks => {
                assert!(
                    x.len().is_multiple_of(128),
                    "E4m3Blocks operands: {} values are not whole blocks of 128",
                    x.len()
                );
                x.chunks(128).flat_map(e4m3_block).collect()
            }
        }
    }
}

/// One block of activations as the FP8 GEMM sees it (`Operands::E4m3Blocks`).
fn e4m3_block(block: &[f32]) -> Vec<f32> {
    let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = crate::e4m3::block_scale(amax);
    block
        .iter()
        .map(|&v| crate::e4m3::e4m3_to_f32(crate::e4m3::f32_to_e4m3(v / scale)) * scale)
        .collect()
}

/// A backend buffer of `len` NaNs, for an op's output.
fn poisoned<B: Backend>(be: &B, len: usize) -> B::Buf {
    be.upload(&vec![f32::NAN; len])
}

/// `out = x @ w^T` for `tokens` rows of `x`; the reference multiplies `x` as `operands` says.
pub fn matmul<B: Backend>(
    be: &B,
    w: &B::Mat,
    w_ref: &RefMat,
    x: &[f32],
    tokens: usize,
    operands: Operands,
) -> Outputs {
    let mut want = vec![0.0; tokens * w_ref.rows];
    ReferenceBackend.matmul(&operands.seen(x), w_ref, &mut want, tokens);
    let mut out = poisoned(be, tokens * w_ref.rows);
    be.matmul(&be.upload(x), w, &mut out, tokens);
    (be.to_host(&out), want)
}

/// `matmul_group`: one `(ours, reference)` per matrix of the group, which shares the input `x`.
pub fn matmul_group<B: Backend>(
    be: &B,
    ws: &[&B::Mat],
    w_refs: &[&RefMat],
    x: &[f32],
    tokens: usize,
    operands: Operands,
) -> Vec<Outputs> {
    assert_eq!(
        ws.len(),
        w_refs.len(),
        "matmul_group: one reference per matrix"
    );
    let mut outs: Vec<B::Buf> = w_refs
        .iter()
        .map(|w| poisoned(be, tokens * w.rows))
        .collect();
    let mut out_list: Vec<&mut B::Buf> = outs.iter_mut().collect();
    be.matmul_group(&be.upload(x), ws, &mut out_list, tokens);
    let seen = operands.seen(x);
    outs.iter()
        .zip(w_refs)
        .map(|(out, w_ref)| {
            let mut want = vec![0.0; tokens * w_ref.rows];
            ReferenceBackend.matmul(&seen, w_ref, &mut want, tokens);
            (be.to_host(out), want)
        })
        .collect()
}

/// `out[t] = table[ids[t]]`.
pub fn embedding<B: Backend>(be: &B, table: &B::Mat, table_ref: &RefMat, ids: &[u32]) -> Outputs {
    let mut want = vec![0.0; ids.len() * table_ref.cols];
    ReferenceBackend.embedding(table_ref, ids, &mut want);
    let mut out = poisoned(be, want.len());
    be.embedding(table, ids, &mut out);
    (be.to_host(&out), want)
}

/// Zero-centred RMSNorm over rows of `dim`.
pub fn rms_norm<B: Backend>(be: &B, w: &B::Buf, w_ref: &[f32], x: &[f32], eps: f32) -> Outputs {
    let dim = w_ref.len();
    let mut want = vec![0.0; x.len()];
    ReferenceBackend.rms_norm(&x.to_vec(), &w_ref.to_vec(), eps, dim, &mut want);
    let mut out = poisoned(be, x.len());
    be.rms_norm(&be.upload(x), w, eps, dim, &mut out);
    (be.to_host(&out), want)
}

/// The fused residual add and norm: `acc + x`, then its RMSNorm; returns `(residual, normed)`.
pub fn add_rms_norm<B: Backend>(
    be: &B,
    w: &B::Buf,
    w_ref: &[f32],
    acc: &[f32],
    x: &[f32],
    eps: f32,
) -> (Outputs, Outputs) {
    let dim = w_ref.len();
    let mut acc_ref = acc.to_vec();
    let mut want = vec![0.0; acc.len()];
    ReferenceBackend.add_rms_norm(
        &mut acc_ref,
        &x.to_vec(),
        &w_ref.to_vec(),
        eps,
        dim,
        &mut want,
    );
    let mut acc_ours = be.upload(acc);
    let mut out = poisoned(be, acc.len());
    be.add_rms_norm(&mut acc_ours, &be.upload(x), w, eps, dim, &mut out);
    ((be.to_host(&acc_ours), acc_ref), (be.to_host(&out), want))
}

/// Gated RMSNorm over rows of `dim`, gate `z`.
pub fn gated_rms_norm<B: Backend>(
    be: &B,
    w: &B::Buf,
    w_ref: &[f32],
    x: &[f32],
    z: &[f32],
    eps: f32,
) -> Outputs {
    let dim = w_ref.len();
    let mut want = vec![0.0; x.len()];
    ReferenceBackend.gated_rms_norm(
        &x.to_vec(),
        &z.to_vec(),
        &w_ref.to_vec(),
        eps,
        dim,
        &mut want,
    );
    let mut out = poisoned(be, x.len());
    be.gated_rms_norm(&be.upload(x), &be.upload(z), w, eps, dim, &mut out);
    (be.to_host(&out), want)
}

/// `acc + x`.
pub fn add_inplace<B: Backend>(be: &B, acc: &[f32], x: &[f32]) -> Outputs {
    let mut want = acc.to_vec();
    ReferenceBackend.add_inplace(&mut want, &x.to_vec());
    let mut got = be.upload(acc);
    be.add_inplace(&mut got, &be.upload(x));
    (be.to_host(&got), want)
}

/// `silu(gate) * up`.
pub fn silu_mul<B: Backend>(be: &B, gate: &[f32], up: &[f32]) -> Outputs {
    let mut want = vec![0.0; gate.len()];
    ReferenceBackend.silu_mul(&gate.to_vec(), &up.to_vec(), &mut want);
    let mut out = poisoned(be, gate.len());
    be.silu_mul(&be.upload(gate), &be.upload(up), &mut out);
    (be.to_host(&out), want)
}

/// `silu(x @ gate^T) * (x @ up^T)`, the gated MLP's first half in one op.
#[allow(clippy::too_many_arguments)]
pub fn matmul_silu_gate<B: Backend>(
    be: &B,
    gate: &B::Mat,
    up: &B::Mat,
    gate_ref: &RefMat,
    up_ref: &RefMat,
    x: &[f32],
    tokens: usize,
    operands: Operands,
) -> Outputs {
    let mut want = vec![0.0; tokens * gate_ref.rows];
    ReferenceBackend.matmul_silu_gate(&operands.seen(x), gate_ref, up_ref, &mut want, tokens);
    let mut out = poisoned(be, tokens * gate_ref.rows);
    be.matmul_silu_gate(&be.upload(x), gate, up, &mut out, tokens);
    (be.to_host(&out), want)
}

/// The whole gated MLP, `(silu(x @ gate^T) * (x @ up^T)) @ down^T`; the reference multiplies `x`
/// as `operands` says.
pub fn dense_mlp<B: Backend>(
    be: &B,
    [gate, up, down]: [&B::Mat; 3],
    [gate_ref, up_ref, down_ref]: [&RefMat; 3],
    x: &[f32],
    tokens: usize,
    operands: Operands,
) -> Outputs {
    let mut want = vec![0.0; tokens * down_ref.rows];
    ReferenceBackend.dense_mlp(
        &operands.seen(x),
        [gate_ref, up_ref, down_ref],
        &mut want,
        tokens,
    );
    let mut out = poisoned(be, tokens * down_ref.rows);
    be.dense_mlp(&be.upload(x), [gate, up, down], &mut out, tokens);
    (be.to_host(&out), want)
}

/// `x * sigmoid(gate)`, elementwise.
pub fn sigmoid_mul_inplace<B: Backend>(be: &B, x: &[f32], gate: &[f32]) -> Outputs {
    let mut want = x.to_vec();
    ReferenceBackend.sigmoid_mul_inplace(&mut want, &gate.to_vec());
    let mut got = be.upload(x);
    be.sigmoid_mul_inplace(&mut got, &be.upload(gate));
    (be.to_host(&got), want)
}

/// `x[t] * sigmoid(gate[t])` for rows of `dim`.
pub fn sigmoid_scale_rows<B: Backend>(be: &B, x: &[f32], gate: &[f32], dim: usize) -> Outputs {
    let mut want = x.to_vec();
    ReferenceBackend.sigmoid_scale_rows(&mut want, &gate.to_vec(), dim);
    let mut got = be.upload(x);
    be.sigmoid_scale_rows(&mut got, &be.upload(gate), dim);
    (be.to_host(&got), want)
}

/// Rotate-half RoPE on the first `rotary_dim` dims of every head of `x` `[T, heads, head_dim]`.
pub fn rope<B: Backend>(
    be: &B,
    x: &[f32],
    positions: &[u32],
    heads: usize,
    head_dim: usize,
    rotary_dim: usize,
    theta: f32,
) -> Outputs {
    let mut want = x.to_vec();
    ReferenceBackend.rope(&mut want, positions, heads, head_dim, rotary_dim, theta);
    let mut got = be.upload(x);
    be.rope(&mut got, positions, heads, head_dim, rotary_dim, theta);
    (be.to_host(&got), want)
}

/// `concat(a [T, a_dim], b [T, b_dim])` along columns.
pub fn concat_cols<B: Backend>(
    be: &B,
    a: &[f32],
    b: &[f32],
    a_dim: usize,
    b_dim: usize,
) -> Outputs {
    let rows = a
        .len()
        .checked_div(a_dim)
        .or(b.len().checked_div(b_dim))
        .unwrap_or(0);
    let mut want = vec![0.0; rows * (a_dim + b_dim)];
    ReferenceBackend.concat_cols(&a.to_vec(), &b.to_vec(), a_dim, b_dim, &mut want);
    let mut out = poisoned(be, want.len());
    be.concat_cols(&be.upload(a), &be.upload(b), a_dim, b_dim, &mut out);
    (be.to_host(&out), want)
}

/// `src[rows]`, rows of `dim`.
pub fn gather_rows<B: Backend>(be: &B, src: &[f32], dim: usize, rows: &[u32]) -> Outputs {
    let want = ReferenceBackend.gather_rows(&src.to_vec(), dim, rows);
    let got = be.gather_rows(&be.upload(src), dim, rows);
    (be.to_host(&got), want)
}

/// `acc[rows[i]] += weights[i] * src[i]`, rows of `dim` (a repeated row adds in list order).
pub fn scatter_add_rows<B: Backend>(
    be: &B,
    acc: &[f32],
    src: &[f32],
    dim: usize,
    rows: &[u32],
    weights: &[f32],
) -> Outputs {
    let mut want = acc.to_vec();
    ReferenceBackend.scatter_add_rows(&mut want, &src.to_vec(), dim, rows, weights);
    let mut got = be.upload(acc);
    be.scatter_add_rows(&mut got, &be.upload(src), dim, rows, weights);
    (be.to_host(&got), want)
}

/// The MoE router's softmax top-`k` over `logits [T, experts]`: `(ours, reference)` choices.
pub fn route_top_k<B: Backend>(
    be: &B,
    logits: &[f32],
    experts: usize,
    top_k: usize,
    renormalize: bool,
) -> (Vec<RouteChoice>, Vec<RouteChoice>) {
    let want = ReferenceBackend.route_top_k(&logits.to_vec(), experts, top_k, renormalize);
    let got = be.route_top_k(&be.upload(logits), experts, top_k, renormalize);
    (got, want)
}

/// The routed experts' output `[T, h]` for `x [T, h]` and the router's `logits [T, E]` (no shared
/// expert); the reference multiplies `x` as `operands` says.
pub fn moe_experts<B: Backend>(
    be: &B,
    experts: &Experts<B::Mat>,
    experts_ref: &Experts<RefMat>,
    x: &[f32],
    logits: &[f32],
    routing: MoeRouting,
    operands: Operands,
) -> Outputs {
    let tokens = x.len() / experts_ref.shape.hidden;
    let want = ReferenceBackend.moe_experts(
        &operands.seen(x),
        &logits.to_vec(),
        experts_ref,
        routing,
        tokens,
        None,
    );
    let got = be.moe_experts(
        &be.upload(x),
        &be.upload(logits),
        experts,
        routing,
        tokens,
        None,
    );
    (be.to_host(&got), want)
}

/// The GDN gates: `(g, beta)`, each `(ours, reference)`.
pub fn gdn_gates<B: Backend>(
    be: &B,
    a: &[f32],
    b: &[f32],
    a_log: &B::Buf,
    a_log_ref: &[f32],
    dt_bias: &B::Buf,
    dt_bias_ref: &[f32],
) -> (Outputs, Outputs) {
    let (mut g_ref, mut beta_ref) = (vec![0.0; a.len()], vec![0.0; a.len()]);
    ReferenceBackend.gdn_gates(
        &a.to_vec(),
        &b.to_vec(),
        &a_log_ref.to_vec(),
        &dt_bias_ref.to_vec(),
        &mut g_ref,
        &mut beta_ref,
    );
    let (mut g, mut beta) = (poisoned(be, a.len()), poisoned(be, a.len()));
    be.gdn_gates(
        &be.upload(a),
        &be.upload(b),
        a_log,
        dt_bias,
        &mut g,
        &mut beta,
    );
    ((be.to_host(&g), g_ref), (be.to_host(&beta), beta_ref))
}

/// Deterministic values in [-scale, scale) (a 64-bit LCG, the same on every machine).
pub struct Rng(pub u64);

impl Rng {
    /// The next value in [-1, 1).
    pub fn next_f32(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_f32() * scale).collect()
    }
}

/// The tests' error measure: max |got - want| relative to max(1, max |want|); panics above `tol`
/// (a NaN always does), naming `label` and where. Returns the error, printed for `--nocapture`.
pub fn check(label: &str, got: &[f32], want: &[f32], tol: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{label}: length");
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let mut worst = 0.0f32;
    let mut at = 0;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let e = (g - w).abs() / scale;
        if e > worst || e.is_nan() {
            worst = if e.is_nan() { f32::INFINITY } else { e };
            at = i;
        }
    }
    println!("{label}: max relative error {worst:.2e}");
    assert!(
        worst <= tol,
        "{label}: error {worst:e} at {at} ({} vs {}) above {tol:e}",
        got[at],
        want[at]
    );
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_blocks_scale_each_block_to_448_and_round_to_its_grid() {
        let mut x = vec![0.0f32; 256];
        x[..3].copy_from_slice(&[3.0, 1.0, -0.7]);
        let seen = Operands::E4m3Blocks.seen(&x);
        let scale = 3.0f32 / 448.0;
        // 1 / scale = 149.3 lies on e4m3's step of 16 in [128, 256); 0.7 / scale = 104.5 on its step
        // of 8 in [64, 128); the block's largest value maps to 448 and back.
        assert!((seen[0] - 3.0).abs() <= 3.0 * f32::EPSILON, "{}", seen[0]);
        assert_eq!(seen[1], 144.0 * scale);
        assert_eq!(seen[2], -104.0 * scale);
        assert!(
            seen[3..].iter().all(|&v| v == 0.0),
            "zeros and the all-zero block stay zero"
        );
    }

    #[test]
    fn the_reference_against_itself_is_exact_and_a_wrong_value_is_caught() {
        let be = ReferenceBackend;
        let mut rng = Rng(9);
        let (x, w) = (rng.vec(3 * 8, 2.0), rng.vec(8, 0.5));
        let (got, want) = rms_norm(&be, &w, &w, &x, 1e-6);
        assert_eq!(check("rms_norm reference", &got, &want, 0.0), 0.0);
        let mut wrong = got.clone();
        wrong[5] += 0.5;
        let caught = std::panic::catch_unwind(|| check("wrong", &wrong, &want, 1e-3));
        assert!(caught.is_err(), "a 0.5 error must fail a 1e-3 tolerance");
        let mut nan = got;
        nan[0] = f32::NAN;
        assert!(std::panic::catch_unwind(|| check("nan", &nan, &want, 1e9)).is_err());
    }

    #[test]
    fn the_pools_carry_context_and_the_reference_sees_rounded_operands_when_asked() {
        use crate::backend::AttnShape;
        use crate::batch::BatchLayout;
        use crate::kv_dtype::KvDtype;
        let be = ReferenceBackend;
        let mut rng = Rng(10);
        let shape = AttnShape {
            q_heads: 4,
            kv_heads: 2,
            head_dim: 8,
        };
        let steps = [(5usize, 0usize), (1, 5)];
        let inputs: Vec<_> = steps
            .iter()
            .map(|&(t, _)| {
                (
                    rng.vec(t * 32, 1.0),
                    rng.vec(t * 16, 1.0),
                    rng.vec(t * 16, 1.0),
                )
            })
            .collect();
        let run = |operands: Operands| {
            let mut pools = AttentionPools::new(&be, 2, 4, 2, 8, KvDtype::F32).seen_as(operands);
            let mut errors = Vec::new();
            for (&(n, pos), (q, k, v)) in steps.iter().zip(&inputs) {
                let batch = BatchLayout::packed(4, [(n, pos, vec![1, 0], 0)]);
                let (got, want) = pools.attend(&be, q, k, v, &batch, shape);
                errors.push(check("attention", &got, &want, 1e-2));
            }
            let ((k, k_ref), _) = pools.contents(&be);
            (errors, check("k pool", &k, &k_ref, 1e-2))
        };
        assert_eq!(run(Operands::Exact), (vec![0.0, 0.0], 0.0));
        let (errors, pool_error) = run(Operands::Bf16);
        // The decode attends over the prefill's keys: the reference's pool holds them rounded.
        assert!(errors.iter().all(|&e| e > 0.0) && pool_error > 0.0);

        let mut pools = StatePools::new(&be, 3, 6, 4, 1, 2, 2);
        let (conv, ssm) = (rng.vec(3 * 3 * 6, 1.0), rng.vec(3 * 4, 1.0));
        pools.hold(&be, &conv, &ssm);
        pools.copy_slot(&be, 0, 2);
        pools.reset_slot(&be, 1);
        let ((c, c_ref), (s, s_ref)) = pools.contents(&be);
        assert_eq!((&c, &s), (&c_ref, &s_ref));
        assert_eq!(c[..18], conv[..18]);
        assert_eq!(c[36..], conv[..18]);
        assert!(c[18..36].iter().all(|&v| v == 0.0));
    }
}
