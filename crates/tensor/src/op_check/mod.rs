//! One op harness for every backend: each function runs one op on a backend and on `ReferenceBackend`
//! with the same host inputs and returns both outputs on the host, `(ours, reference)`. The cpu
//! backend's tests, the cuda backend's tests and `doctor` call it, so an op is exercised the same way
//! everywhere; they differ only in inputs (random shapes at the edges of the kernels, or a model's
//! real weights) and in tolerance. The weights come in both forms (the backend's, the reference's)
//! because doctor holds them loaded. Also here: the deterministic inputs and the error measure of the
//! tests.

use crate::backend::Backend;
use crate::reference::{RefMat, ReferenceBackend};

/// `(ours, reference)`, both on the host.
pub type Outputs = (Vec<f32>, Vec<f32>);

/// `out = x @ w^T` for `tokens` rows of `x`.
pub fn matmul<B: Backend>(be: &B, w: &B::Mat, w_ref: &RefMat, x: &[f32], tokens: usize) -> Outputs {
    let mut want = vec![0.0; tokens * w_ref.rows];
    ReferenceBackend.matmul(&x.to_vec(), w_ref, &mut want, tokens);
    let mut out = be.zeros(tokens * w_ref.rows);
    be.matmul(&be.upload(x), w, &mut out, tokens);
    (be.to_host(&out), want)
}

/// Zero-centred RMSNorm over rows of `dim`.
pub fn rms_norm<B: Backend>(be: &B, w: &B::Buf, w_ref: &[f32], x: &[f32], eps: f32) -> Outputs {
    let dim = w_ref.len();
    let mut want = vec![0.0; x.len()];
    ReferenceBackend.rms_norm(&x.to_vec(), &w_ref.to_vec(), eps, dim, &mut want);
    let mut out = be.zeros(x.len());
    be.rms_norm(&be.upload(x), w, eps, dim, &mut out);
    (be.to_host(&out), want)
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
    let mut out = be.zeros(x.len());
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
    let mut out = be.zeros(gate.len());
    be.silu_mul(&be.upload(gate), &be.upload(up), &mut out);
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
}
