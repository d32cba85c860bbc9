//! The `reference` backend: plain scalar Rust that mirrors docs/model.md line by line,
//! f32 storage with f64 accumulation. Slow and obviously correct; it is the yardstick every
//! other backend is tested against and must never be optimised.

mod attention;
mod dense;
mod gdn;
mod moe;

pub use attention::paged_attention;
pub use dense::{gated_rms_norm, rms_norm, rope_cos_sin, rope_in_place};
pub use gdn::{
    causal_conv1d, delta_rule_chunked, delta_rule_recurrent_step, gdn_gates,
    split_and_normalize_qkv,
};
pub use moe::route_top_k;

use crate::backend::{AttnShape, Backend, GdnShape, RouteChoice};
use crate::batch::BatchLayout;
use crate::cache::{KvLayerPool, StateLayerPool};
use crate::host::{HostTensor, TensorError};

/// A matrix `[rows, cols]` widened to f32.
pub struct RefMat {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

/// The reference backend. Stateless.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReferenceBackend;

pub(crate) fn matrix_dims(t: &HostTensor) -> Result<(usize, usize), TensorError> {
    match t.shape.as_slice() {
        [rows, cols] => Ok((*rows, *cols)),
        other => Err(TensorError::Invalid {
            name: t.name.clone(),
            message: format!("expected a 2-D matrix, found shape {other:?}"),
        }),
    }
}

impl Backend for ReferenceBackend {
    type Buf = Vec<f32>;
    type Mat = RefMat;

    fn name(&self) -> &'static str {
        "reference"
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

    fn load_mat(&self, t: &HostTensor) -> Result<RefMat, TensorError> {
        let (rows, cols) = matrix_dims(t)?;
        Ok(RefMat {
            rows,
            cols,
            data: t.to_f32_vec(),
        })
    }

    fn mat_shape(&self, m: &RefMat) -> (usize, usize) {
        (m.rows, m.cols)
    }

    fn mat_bytes(&self, m: &RefMat) -> usize {
        m.data.len() * std::mem::size_of::<f32>()
    }

    fn embedding(&self, table: &RefMat, ids: &[u32], out: &mut Vec<f32>) {
        let h = table.cols;
        for (t, &id) in ids.iter().enumerate() {
            let row = id as usize;
            out[t * h..(t + 1) * h].copy_from_slice(&table.data[row * h..(row + 1) * h]);
        }
    }

    fn matmul(&self, x: &Vec<f32>, w: &RefMat, out: &mut Vec<f32>, tokens: usize) {
        let (n, k) = (w.rows, w.cols);
        for t in 0..tokens {
            let xr = &x[t * k..(t + 1) * k];
            for o in 0..n {
                let wr = &w.data[o * k..(o + 1) * k];
                let acc: f64 = xr.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum();
                out[t * n + o] = acc as f32;
            }
        }
    }

    fn rms_norm(&self, x: &Vec<f32>, w: &Vec<f32>, eps: f32, dim: usize, out: &mut Vec<f32>) {
        rms_norm(x, w, eps, dim, out);
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
        gated_rms_norm(x, z, w, eps, dim, out);
    }

    fn add_inplace(&self, acc: &mut Vec<f32>, x: &Vec<f32>) {
        for (a, &b) in acc.iter_mut().zip(x) {
            *a += b;
        }
    }

    fn silu_mul(&self, gate: &Vec<f32>, up: &Vec<f32>, out: &mut Vec<f32>) {
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = (silu(g as f64) * u as f64) as f32;
        }
    }

    fn sigmoid_mul_inplace(&self, x: &mut Vec<f32>, gate: &Vec<f32>) {
        for (a, &g) in x.iter_mut().zip(gate) {
            *a = (*a as f64 * sigmoid(g as f64)) as f32;
        }
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
        rope_in_place(x, positions, heads, head_dim, rotary_dim, theta);
    }

    fn concat_cols(
        &self,
        a: &Vec<f32>,
        b: &Vec<f32>,
        a_dim: usize,
        b_dim: usize,
        out: &mut Vec<f32>,
    ) {
        let rows = a.len() / a_dim;
        for r in 0..rows {
            let o = &mut out[r * (a_dim + b_dim)..(r + 1) * (a_dim + b_dim)];
            o[..a_dim].copy_from_slice(&a[r * a_dim..(r + 1) * a_dim]);
            o[a_dim..].copy_from_slice(&b[r * b_dim..(r + 1) * b_dim]);
        }
    }

    fn gather_rows(&self, src: &Vec<f32>, dim: usize, rows: &[u32]) -> Vec<f32> {
        rows.iter()
            .flat_map(|&r| {
                src[r as usize * dim..(r as usize + 1) * dim]
                    .iter()
                    .copied()
            })
            .collect()
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
                *d = (*d as f64 + w as f64 * s as f64) as f32;
            }
        }
    }

    fn sigmoid_scale_rows(&self, x: &mut Vec<f32>, gate: &Vec<f32>, dim: usize) {
        for (row, &g) in x.chunks_mut(dim).zip(gate) {
            let s = sigmoid(g as f64);
            for v in row {
                *v = (*v as f64 * s) as f32;
            }
        }
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
        paged_attention(q, k, v, pool, batch, shape, out);
    }

    fn causal_conv1d(
        &self,
        x: &Vec<f32>,
        w: &Vec<f32>,
        pool: &mut StateLayerPool<Self>,
        batch: &BatchLayout,
        out: &mut Vec<f32>,
    ) {
        causal_conv1d(
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
        gdn_gates(a, b, a_log, dt_bias, g, beta);
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
        gdn::gated_delta_rule(mixed, g, beta, &mut pool.ssm, batch, shape, out);
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
        route_top_k(logits, experts, top_k, renormalize)
    }
}

pub fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}
