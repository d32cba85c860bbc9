//! Reference norms and rotary embedding (docs/model.md, "Norms" and "Gated attention" step 3).

use super::silu;

/// Zero-centred RMSNorm: `x * rsqrt(mean(x^2) + eps) * (1 + w)` over rows of `dim`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, dim: usize, out: &mut [f32]) {
    for (xr, or) in x.chunks(dim).zip(out.chunks_mut(dim)) {
        let ms = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / dim as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for ((o, &v), &wi) in or.iter_mut().zip(xr).zip(w) {
            *o = (v as f64 * inv * (1.0 + wi as f64)) as f32;
        }
    }
}

/// Plain gated RMSNorm of the GDN output: `w * x * rsqrt(mean(x^2) + eps) * silu(z)`.
pub fn gated_rms_norm(x: &[f32], z: &[f32], w: &[f32], eps: f32, dim: usize, out: &mut [f32]) {
    for ((xr, zr), or) in x.chunks(dim).zip(z.chunks(dim)).zip(out.chunks_mut(dim)) {
        let ms = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / dim as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for (((o, &v), &zi), &wi) in or.iter_mut().zip(xr).zip(zr).zip(w) {
            *o = (wi as f64 * v as f64 * inv * silu(zi as f64)) as f32;
        }
    }
}

/// cos and sin of the `rotary_dim / 2` frequencies at `position`. The inverse frequencies and the
/// angle are computed in f32 exactly as transformers does, so long positions round the same way.
pub fn rope_cos_sin(position: u32, rotary_dim: usize, theta: f32) -> Vec<(f64, f64)> {
    (0..rotary_dim / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / rotary_dim as f32;
            let inv_freq = 1.0f32 / theta.powf(exponent);
            let angle = position as f32 * inv_freq;
            ((angle as f64).cos(), (angle as f64).sin())
        })
        .collect()
}

/// Rotate-half RoPE on dims `[0, rotary_dim)` of every head of `x [T, heads, head_dim]`.
pub fn rope_in_place(
    x: &mut [f32],
    positions: &[u32],
    heads: usize,
    head_dim: usize,
    rotary_dim: usize,
    theta: f32,
) {
    let half = rotary_dim / 2;
    for (t, &p) in positions.iter().enumerate() {
        let cs = rope_cos_sin(p, rotary_dim, theta);
        for h in 0..heads {
            let base = (t * heads + h) * head_dim;
            let v = &mut x[base..base + rotary_dim];
            for (i, &(c, s)) in cs.iter().enumerate() {
                let (a, b) = (v[i] as f64, v[i + half] as f64);
                v[i] = (a * c - b * s) as f32;
                v[i + half] = (b * c + a * s) as f32;
            }
        }
    }
}
