//! Reference Gated DeltaNet: causal conv with state, gates, and the delta rule in both its recurrent
//! and chunked forms (docs/model.md, "Gated DeltaNet"). State is f32 in the pool and f64 while
//! computing.

use super::{sigmoid, silu};
use crate::backend::GdnShape;
use crate::batch::BatchLayout;

/// Chunk length of the chunked (prefill) form, as in transformers and FLA.
pub const CHUNK: usize = 64;

/// Depthwise causal conv + SiLU per sequence. `conv_state`: `[slots, history, conv_dim]`.
pub fn causal_conv1d(
    x: &[f32],
    w: &[f32],
    conv_state: &mut [f32],
    conv_dim: usize,
    history: usize,
    batch: &BatchLayout,
    out: &mut [f32],
) {
    let kernel = history + 1;
    let slot_len = history * conv_dim;
    for seq in &batch.seqs {
        // Timeline = the stored window (oldest first) followed by the new inputs.
        let mut timeline: Vec<f32> =
            conv_state[seq.slot * slot_len..(seq.slot + 1) * slot_len].to_vec();
        timeline.extend_from_slice(&x[seq.start * conv_dim..(seq.start + seq.len) * conv_dim]);
        for i in 0..seq.len {
            let t = history + i;
            for c in 0..conv_dim {
                let acc: f64 = (0..kernel)
                    .map(|j| {
                        w[c * kernel + j] as f64
                            * timeline[(t + 1 + j - kernel) * conv_dim + c] as f64
                    })
                    .sum();
                out[(seq.start + i) * conv_dim + c] = silu(acc) as f32;
            }
            if let Some(&snap) = seq.snapshot_slots.get(i) {
                let window = &timeline[(t + 1 - history) * conv_dim..(t + 1) * conv_dim];
                conv_state[snap * slot_len..(snap + 1) * slot_len].copy_from_slice(window);
            }
        }
        let end = history + seq.len;
        conv_state[seq.slot * slot_len..(seq.slot + 1) * slot_len]
            .copy_from_slice(&timeline[(end - history) * conv_dim..end * conv_dim]);
    }
}

/// `g = -exp(a_log) * softplus(a + dt_bias)` (torch softplus: threshold 20), `beta = sigmoid(b)`.
pub fn gdn_gates(
    a: &[f32],
    b: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    g: &mut [f32],
    beta: &mut [f32],
) {
    let heads = a_log.len();
    for i in 0..a.len() {
        let h = i % heads;
        let x = a[i] as f64 + dt_bias[h] as f64;
        let softplus = if x > 20.0 { x } else { x.exp().ln_1p() };
        g[i] = (-(a_log[h] as f64).exp() * softplus) as f32;
        beta[i] = sigmoid(b[i] as f64) as f32;
    }
}

/// One token's q (l2-normed and scaled), k (l2-normed) and v, as f64, from a conv-output row.
pub struct TokenQkv {
    /// `[key_heads, key_dim]`
    pub q: Vec<f64>,
    /// `[key_heads, key_dim]`
    pub k: Vec<f64>,
    /// `[value_heads, value_dim]`
    pub v: Vec<f64>,
}

pub fn split_and_normalize_qkv(row: &[f32], shape: GdnShape) -> TokenQkv {
    let key_len = shape.key_heads * shape.key_dim;
    let l2 = |x: &[f32]| -> Vec<f64> {
        x.chunks(shape.key_dim)
            .flat_map(|head| {
                let inv =
                    1.0 / (head.iter().map(|&v| v as f64 * v as f64).sum::<f64>() + 1e-6).sqrt();
                head.iter().map(move |&v| v as f64 * inv)
            })
            .collect()
    };
    let scale = 1.0 / (shape.key_dim as f64).sqrt();
    let q = l2(&row[..key_len]).into_iter().map(|v| v * scale).collect();
    let k = l2(&row[key_len..2 * key_len]);
    let v = row[2 * key_len..].iter().map(|&x| x as f64).collect();
    TokenQkv { q, k, v }
}

/// One recurrent step for one value head: `S <- e^g S; S += k (beta (v - S^T k))^T; o = S^T q`.
/// `state`: `[key_dim, value_dim]`.
pub fn delta_rule_recurrent_step(
    state: &mut [f64],
    q: &[f64],
    k: &[f64],
    v: &[f64],
    g: f64,
    beta: f64,
    out: &mut [f64],
) {
    let (dk, dv) = (k.len(), v.len());
    let decay = g.exp();
    state.iter_mut().for_each(|s| *s *= decay);
    for j in 0..dv {
        let m: f64 = (0..dk).map(|i| state[i * dv + j] * k[i]).sum();
        let delta = beta * (v[j] - m);
        for i in 0..dk {
            state[i * dv + j] += k[i] * delta;
        }
    }
    for (j, o) in out.iter_mut().enumerate().take(dv) {
        *o = (0..dk).map(|i| state[i * dv + j] * q[i]).sum();
    }
}

/// The chunked form for one value head over `n` tokens (docs/model.md, "Gated DeltaNet", chunked
/// form). `q`, `k`: `[n, dk]` (already normalised and scaled), `v`: `[n, dv]`, `g`, `beta`: `[n]`.
/// Updates `state [dk, dv]`, writes `out [n, dv]`.
#[allow(clippy::too_many_arguments)]
pub fn delta_rule_chunked(
    state: &mut [f64],
    q: &[f64],
    k: &[f64],
    v: &[f64],
    g: &[f64],
    beta: &[f64],
    dk: usize,
    dv: usize,
    out: &mut [f64],
) {
    let n = g.len();
    for c0 in (0..n).step_by(CHUNK) {
        let c = CHUNK.min(n - c0);
        let kr = |i: usize| &k[(c0 + i) * dk..(c0 + i + 1) * dk];
        let qr = |i: usize| &q[(c0 + i) * dk..(c0 + i + 1) * dk];
        let vr = |i: usize| &v[(c0 + i) * dv..(c0 + i + 1) * dv];
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        // 1. gamma = cumulative log-decay within the chunk.
        let mut gamma = vec![0.0; c];
        let mut acc = 0.0;
        for i in 0..c {
            acc += g[c0 + i];
            gamma[i] = acc;
        }
        // 2. A[i][j] = beta_i (k_i . k_j) exp(gamma_i - gamma_j), strictly lower triangular.
        let mut a = vec![0.0; c * c];
        for i in 0..c {
            for j in 0..i {
                a[i * c + j] = beta[c0 + i] * dot(kr(i), kr(j)) * (gamma[i] - gamma[j]).exp();
            }
        }
        // 3-4. W = (I+A)^-1 diag(beta e^gamma) K and U = (I+A)^-1 diag(beta) V by forward substitution.
        let mut w = vec![0.0; c * dk];
        let mut u = vec![0.0; c * dv];
        for i in 0..c {
            let bi = beta[c0 + i];
            let e = gamma[i].exp();
            for d in 0..dk {
                w[i * dk + d] = bi * e * kr(i)[d];
            }
            for d in 0..dv {
                u[i * dv + d] = bi * vr(i)[d];
            }
            for j in 0..i {
                let aij = a[i * c + j];
                for d in 0..dk {
                    w[i * dk + d] -= aij * w[j * dk + d];
                }
                for d in 0..dv {
                    u[i * dv + d] -= aij * u[j * dv + d];
                }
            }
        }
        // 5. V' = U - W S.
        let mut v_new = vec![0.0; c * dv];
        for i in 0..c {
            for d in 0..dv {
                let ws: f64 = (0..dk).map(|e| w[i * dk + e] * state[e * dv + d]).sum();
                v_new[i * dv + d] = u[i * dv + d] - ws;
            }
        }
        // 6. O_i = e^gamma_i q_i S + sum_{j<=i} (q_i . k_j) e^(gamma_i - gamma_j) V'_j.
        for i in 0..c {
            let e = gamma[i].exp();
            let o = &mut out[(c0 + i) * dv..(c0 + i + 1) * dv];
            for d in 0..dv {
                o[d] = e * (0..dk).map(|x| qr(i)[x] * state[x * dv + d]).sum::<f64>();
            }
            for j in 0..=i {
                let coef = dot(qr(i), kr(j)) * (gamma[i] - gamma[j]).exp();
                for d in 0..dv {
                    o[d] += coef * v_new[j * dv + d];
                }
            }
        }
        // 7. S <- e^gamma_last S + sum_j e^(gamma_last - gamma_j) k_j V'_j^T.
        let last = gamma[c - 1];
        let e_last = last.exp();
        state.iter_mut().for_each(|s| *s *= e_last);
        for j in 0..c {
            let f = (last - gamma[j]).exp();
            for x in 0..dk {
                let kx = f * kr(j)[x];
                for d in 0..dv {
                    state[x * dv + d] += kx * v_new[j * dv + d];
                }
            }
        }
    }
}

/// The whole delta-rule op over a batch (see `Backend::gated_delta_rule`). `ssm`: `[slots, HV, dk, dv]`.
pub fn gated_delta_rule(
    mixed: &[f32],
    g: &[f32],
    beta: &[f32],
    ssm: &mut [f32],
    batch: &BatchLayout,
    shape: GdnShape,
    out: &mut [f32],
) {
    let GdnShape {
        key_heads,
        value_heads,
        key_dim: dk,
        value_dim: dv,
    } = shape;
    let conv_dim = shape.conv_dim();
    let ratio = value_heads / key_heads;
    let head_state = dk * dv;
    let slot_len = value_heads * head_state;
    for seq in &batch.seqs {
        let tokens: Vec<TokenQkv> = (0..seq.len)
            .map(|i| {
                split_and_normalize_qkv(
                    &mixed[(seq.start + i) * conv_dim..(seq.start + i + 1) * conv_dim],
                    shape,
                )
            })
            .collect();
        let recurrent = seq.len == 1 || !seq.snapshot_slots.is_empty();
        for h in 0..value_heads {
            let kh = h / ratio;
            let at = seq.slot * slot_len + h * head_state;
            let mut state: Vec<f64> = ssm[at..at + head_state].iter().map(|&s| s as f64).collect();
            let gate = |i: usize| g[(seq.start + i) * value_heads + h] as f64;
            let strength = |i: usize| beta[(seq.start + i) * value_heads + h] as f64;
            let mut o = vec![0.0; seq.len * dv];
            if recurrent {
                for (i, tok) in tokens.iter().enumerate() {
                    let (q, k) = (
                        &tok.q[kh * dk..(kh + 1) * dk],
                        &tok.k[kh * dk..(kh + 1) * dk],
                    );
                    let v = &tok.v[h * dv..(h + 1) * dv];
                    delta_rule_recurrent_step(
                        &mut state,
                        q,
                        k,
                        v,
                        gate(i),
                        strength(i),
                        &mut o[i * dv..(i + 1) * dv],
                    );
                    // The cached state is f32: round after every token so that running k tokens here
                    // equals k single-token steps bitwise (speculative rollback relies on it).
                    state.iter_mut().for_each(|s| *s = *s as f32 as f64);
                    if let Some(&snap) = seq.snapshot_slots.get(i) {
                        let dst = snap * slot_len + h * head_state;
                        for (d, &s) in ssm[dst..dst + head_state].iter_mut().zip(&state) {
                            *d = s as f32;
                        }
                    }
                }
            } else {
                let gather = |f: &dyn Fn(&TokenQkv) -> &[f64]| -> Vec<f64> {
                    tokens.iter().flat_map(|t| f(t).iter().copied()).collect()
                };
                let q = gather(&|t| &t.q[kh * dk..(kh + 1) * dk]);
                let k = gather(&|t| &t.k[kh * dk..(kh + 1) * dk]);
                let v = gather(&|t| &t.v[h * dv..(h + 1) * dv]);
                let gs: Vec<f64> = (0..seq.len).map(gate).collect();
                let bs: Vec<f64> = (0..seq.len).map(strength).collect();
                delta_rule_chunked(&mut state, &q, &k, &v, &gs, &bs, dk, dv, &mut o);
            }
            for (d, &s) in ssm[at..at + head_state].iter_mut().zip(&state) {
                *d = s as f32;
            }
            for i in 0..seq.len {
                let row = seq.start + i;
                for d in 0..dv {
                    out[(row * value_heads + h) * dv + d] = o[i * dv + d] as f32;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn chunked_equals_recurrent_across_chunk_boundaries() {
        let (n, dk, dv) = (150, 8, 6);
        let normalise = |x: Vec<f64>| -> Vec<f64> {
            x.chunks(dk)
                .flat_map(|r| {
                    let inv = 1.0 / r.iter().map(|v| v * v).sum::<f64>().sqrt();
                    r.iter().map(move |v| v * inv).collect::<Vec<_>>()
                })
                .collect()
        };
        let q = normalise(pseudo_random(n * dk, 1));
        let k = normalise(pseudo_random(n * dk, 2));
        let v = pseudo_random(n * dv, 3);
        let g: Vec<f64> = pseudo_random(n, 4)
            .iter()
            .map(|x| -0.3 * (x + 1.0))
            .collect();
        let beta: Vec<f64> = pseudo_random(n, 5).iter().map(|x| 0.5 + 0.5 * x).collect();
        let init = pseudo_random(dk * dv, 6);

        let mut s_rec = init.clone();
        let mut o_rec = vec![0.0; n * dv];
        for i in 0..n {
            delta_rule_recurrent_step(
                &mut s_rec,
                &q[i * dk..(i + 1) * dk],
                &k[i * dk..(i + 1) * dk],
                &v[i * dv..(i + 1) * dv],
                g[i],
                beta[i],
                &mut o_rec[i * dv..(i + 1) * dv],
            );
        }
        let mut s_chk = init;
        let mut o_chk = vec![0.0; n * dv];
        delta_rule_chunked(&mut s_chk, &q, &k, &v, &g, &beta, dk, dv, &mut o_chk);
        let max_diff = |a: &[f64], b: &[f64]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max)
        };
        assert!(
            max_diff(&o_rec, &o_chk) < 1e-9,
            "outputs differ by {}",
            max_diff(&o_rec, &o_chk)
        );
        assert!(
            max_diff(&s_rec, &s_chk) < 1e-9,
            "states differ by {}",
            max_diff(&s_rec, &s_chk)
        );
    }
}
