//! RMSNorm (zero-centred, `1 + w`) and the gated RMSNorm of the GDN output, row by row in f32;
//! rows are split across the backend's threads when there are many.

use super::isa::{multiversion, Isa};
use super::math::silu_f32;
use super::simd::dot;
use rayon::prelude::*;

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 16;

multiversion! {
    fn scale_row(x: &[f32], w: &[f32], inv: f32, out: &mut [f32]) {
        for ((o, &v), &wi) in out.iter_mut().zip(x).zip(w) {
            *o = v * inv * (1.0 + wi);
        }
    }
}

multiversion! {
    fn gated_scale_row(x: &[f32], z: &[f32], w: &[f32], inv: f32, out: &mut [f32]) {
        for (((o, &v), &zi), &wi) in out.iter_mut().zip(x).zip(z).zip(w) {
            *o = wi * (v * inv) * silu_f32(zi);
        }
    }
}

fn inv_rms(isa: Isa, row: &[f32], eps: f32) -> f32 {
    let mean_square = dot(isa, row, row) / row.len() as f32;
    1.0 / (mean_square + eps).sqrt()
}

/// `out = x * rsqrt(mean(x^2) + eps) * (1 + w)` over rows of `dim`.
pub(crate) fn rms_norm(
    isa: Isa,
    pool: &rayon::ThreadPool,
    x: &[f32],
    w: &[f32],
    eps: f32,
    dim: usize,
    out: &mut [f32],
) {
    if dim == 0 {
        return;
    }
    let w = &w[..dim];
    let row = |(o, xr): (&mut [f32], &[f32])| scale_row(isa, xr, w, inv_rms(isa, xr, eps), o);
    let rows = x.len() / dim;
    if rows <= ROWS_PER_TASK {
        out.chunks_mut(dim).zip(x.chunks(dim)).for_each(row);
    } else {
        pool.install(|| {
            out.par_chunks_mut(dim)
                .zip(x.par_chunks(dim))
                .with_min_len(ROWS_PER_TASK)
                .for_each(row)
        });
    }
}

/// `out = w * x * rsqrt(mean(x^2) + eps) * silu(z)` over rows of `dim`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gated_rms_norm(
    isa: Isa,
    pool: &rayon::ThreadPool,
    x: &[f32],
    z: &[f32],
    w: &[f32],
    eps: f32,
    dim: usize,
    out: &mut [f32],
) {
    if dim == 0 {
        return;
    }
    let w = &w[..dim];
    let row = |((o, xr), zr): ((&mut [f32], &[f32]), &[f32])| {
        gated_scale_row(isa, xr, zr, w, inv_rms(isa, xr, eps), o)
    };
    let rows = x.len() / dim;
    if rows <= ROWS_PER_TASK {
        out.chunks_mut(dim)
            .zip(x.chunks(dim))
            .zip(z.chunks(dim))
            .for_each(row);
    } else {
        pool.install(|| {
            out.par_chunks_mut(dim)
                .zip(x.par_chunks(dim))
                .zip(z.par_chunks(dim))
                .with_min_len(ROWS_PER_TASK)
                .for_each(row)
        });
    }
}
