//! Elementwise ops on activations: residual add, SiLU-gated product, sigmoid gates. f32 math with
//! the vectorisable `exp` of `math`; large buffers are split across the backend's threads.

use super::isa::{multiversion, Isa};
use super::math::{sigmoid_f32, silu_f32};
use rayon::prelude::*;

/// Elements per parallel task; smaller buffers run on the calling thread.
const CHUNK: usize = 1 << 15;

multiversion! {
    fn add_chunk(acc: &mut [f32], x: &[f32]) {
        for (a, &b) in acc.iter_mut().zip(x) {
            *a += b;
        }
    }
}

multiversion! {
    fn silu_mul_chunk(gate: &[f32], up: &[f32], out: &mut [f32]) {
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = silu_f32(g) * u;
        }
    }
}

multiversion! {
    fn sigmoid_mul_chunk(x: &mut [f32], gate: &[f32]) {
        for (a, &g) in x.iter_mut().zip(gate) {
            *a *= sigmoid_f32(g);
        }
    }
}

multiversion! {
    fn scale_rows_chunk(x: &mut [f32], gate: &[f32], dim: usize) {
        for (row, &g) in x.chunks_mut(dim).zip(gate) {
            let s = sigmoid_f32(g);
            for v in row {
                *v *= s;
            }
        }
    }
}

/// `acc += x`.
pub(crate) fn add_inplace(isa: Isa, pool: &rayon::ThreadPool, acc: &mut [f32], x: &[f32]) {
    let n = acc.len().min(x.len());
    if n <= CHUNK {
        return add_chunk(isa, &mut acc[..n], &x[..n]);
    }
    pool.install(|| {
        acc[..n]
            .par_chunks_mut(CHUNK)
            .zip(x[..n].par_chunks(CHUNK))
            .for_each(|(a, b)| add_chunk(isa, a, b))
    });
}

/// `out = silu(gate) * up`.
pub(crate) fn silu_mul(
    isa: Isa,
    pool: &rayon::ThreadPool,
    gate: &[f32],
    up: &[f32],
    out: &mut [f32],
) {
    let n = out.len().min(gate.len()).min(up.len());
    if n <= CHUNK {
        return silu_mul_chunk(isa, &gate[..n], &up[..n], &mut out[..n]);
    }
    pool.install(|| {
        out[..n]
            .par_chunks_mut(CHUNK)
            .zip(gate[..n].par_chunks(CHUNK))
            .zip(up[..n].par_chunks(CHUNK))
            .for_each(|((o, g), u)| silu_mul_chunk(isa, g, u, o))
    });
}

/// `x *= sigmoid(gate)`.
pub(crate) fn sigmoid_mul(isa: Isa, pool: &rayon::ThreadPool, x: &mut [f32], gate: &[f32]) {
    let n = x.len().min(gate.len());
    if n <= CHUNK {
        return sigmoid_mul_chunk(isa, &mut x[..n], &gate[..n]);
    }
    pool.install(|| {
        x[..n]
            .par_chunks_mut(CHUNK)
            .zip(gate[..n].par_chunks(CHUNK))
            .for_each(|(a, g)| sigmoid_mul_chunk(isa, a, g))
    });
}

/// `x[t] *= sigmoid(gate[t])` for rows of `dim`.
pub(crate) fn sigmoid_scale_rows(
    isa: Isa,
    pool: &rayon::ThreadPool,
    x: &mut [f32],
    gate: &[f32],
    dim: usize,
) {
    if dim == 0 {
        return;
    }
    let rows_per = (CHUNK / dim).max(1);
    if x.len() <= CHUNK {
        return scale_rows_chunk(isa, x, gate, dim);
    }
    pool.install(|| {
        x.par_chunks_mut(rows_per * dim)
            .zip(gate.par_chunks(rows_per))
            .for_each(|(rows, g)| scale_rows_chunk(isa, rows, g, dim))
    });
}
