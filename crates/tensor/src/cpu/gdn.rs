//! The gated delta rule (docs/model.md, "Gated DeltaNet": recurrent and chunked forms) in f32.
//! Value heads run in parallel; each task owns its head's slice of every state slot and walks the
//! sequences in batch order, so snapshot and slot semantics are exactly those of `reference::gdn`.

use super::isa::{multiversion, Isa};
use super::math::exp_f32;
use super::pack::transpose_f32;
use super::simd::dot;
use super::tile::matmul_nn;
use crate::backend::GdnShape;
use crate::batch::{BatchLayout, SeqLayout};
use rayon::prelude::*;

/// Chunk length of the chunked form (as `reference` and transformers/FLA).
const CHUNK: usize = 64;

/// Token rows per task of the q/k normalisation pass.
const ROWS_PER_TASK: usize = 16;

/// q (l2-normalised, times `key_dim^-0.5`) and k (l2-normalised) of every token: `[T, HK * dk]` each.
struct NormalizedQk {
    q: Vec<f32>,
    k: Vec<f32>,
}

multiversion! {
    /// `x[i] *= factor[i]`.
    fn scale_by(x: &mut [f32], factor: &[f32]) {
        for (v, &f) in x.iter_mut().zip(factor) {
            *v *= f;
        }
    }
}

multiversion! {
    fn scale_into(src: &[f32], factor: f32, dst: &mut [f32]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s * factor;
        }
    }
}

fn normalize_qk(
    isa: Isa,
    pool: &rayon::ThreadPool,
    mixed: &[f32],
    tokens: usize,
    shape: GdnShape,
) -> NormalizedQk {
    let (dk, key_len, conv_dim) = (
        shape.key_dim,
        shape.key_heads * shape.key_dim,
        shape.conv_dim(),
    );
    let mut q = vec![0.0f32; tokens * key_len];
    let mut k = vec![0.0f32; tokens * key_len];
    let q_scale = 1.0 / (dk as f32).sqrt();
    let l2 = |src: &[f32], extra: f32, dst: &mut [f32]| {
        for (s, d) in src.chunks(dk).zip(dst.chunks_mut(dk)) {
            let inv = 1.0 / (dot(isa, s, s) + 1e-6).sqrt();
            scale_into(isa, s, inv * extra, d);
        }
    };
    let row = |((qr, kr), m): ((&mut [f32], &mut [f32]), &[f32])| {
        l2(&m[..key_len], q_scale, qr);
        l2(&m[key_len..2 * key_len], 1.0, kr);
    };
    if key_len == 0 {
        return NormalizedQk { q, k };
    }
    let mixed = &mixed[..tokens * conv_dim];
    if tokens <= ROWS_PER_TASK {
        q.chunks_mut(key_len)
            .zip(k.chunks_mut(key_len))
            .zip(mixed.chunks(conv_dim))
            .for_each(row);
    } else {
        pool.install(|| {
            q.par_chunks_mut(key_len)
                .zip(k.par_chunks_mut(key_len))
                .zip(mixed.par_chunks(conv_dim))
                .with_min_len(ROWS_PER_TASK)
                .for_each(row)
        });
    }
    NormalizedQk { q, k }
}

/// See `Backend::gated_delta_rule`. `ssm`: `[slots, HV, dk, dv]`, `out`: `[T, HV, dv]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gated_delta_rule(
    isa: Isa,
    pool: &rayon::ThreadPool,
    mixed: &[f32],
    g: &[f32],
    beta: &[f32],
    ssm: &mut [f32],
    batch: &BatchLayout,
    shape: GdnShape,
    out: &mut [f32],
) {
    let GdnShape {
        value_heads,
        key_dim: dk,
        value_dim: dv,
        ..
    } = shape;
    let tokens = batch.total_tokens();
    let head_state = dk * dv;
    if value_heads == 0 || head_state == 0 || tokens == 0 {
        return;
    }
    let qk = normalize_qk(isa, pool, mixed, tokens, shape);
    // Every slot's state of value head h, indexed by slot.
    let mut per_head: Vec<Vec<&mut [f32]>> = (0..value_heads).map(|_| Vec::new()).collect();
    for (i, state) in ssm.chunks_mut(head_state).enumerate() {
        per_head[i % value_heads].push(state);
    }
    let inputs = HeadInputs {
        mixed,
        g,
        beta,
        qk: &qk,
        shape,
    };
    let run = |(h, states): (usize, &mut Vec<&mut [f32]>)| {
        let mut o = vec![0.0f32; tokens * dv];
        let mut scratch = Scratch::new(dv);
        for seq in &batch.seqs {
            run_head(isa, &inputs, h, seq, states, &mut scratch, &mut o);
        }
        o
    };
    let outputs: Vec<Vec<f32>> =
        pool.install(|| per_head.par_iter_mut().enumerate().map(run).collect());
    for (h, o) in outputs.iter().enumerate() {
        for (row, src) in o.chunks(dv).enumerate() {
            out[(row * value_heads + h) * dv..][..dv].copy_from_slice(src);
        }
    }
}

/// Read-only inputs shared by all head tasks.
struct HeadInputs<'a> {
    mixed: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
    qk: &'a NormalizedQk,
    shape: GdnShape,
}

impl HeadInputs<'_> {
    fn q(&self, row: usize, kh: usize) -> &[f32] {
        let (dk, key_len) = (
            self.shape.key_dim,
            self.shape.key_heads * self.shape.key_dim,
        );
        &self.qk.q[row * key_len + kh * dk..][..dk]
    }

    fn k(&self, row: usize, kh: usize) -> &[f32] {
        let (dk, key_len) = (
            self.shape.key_dim,
            self.shape.key_heads * self.shape.key_dim,
        );
        &self.qk.k[row * key_len + kh * dk..][..dk]
    }

    /// Rows `row0..` of the normalised k (or q) of key head `kh`, with their row stride.
    fn key_rows<'b>(&self, which: &'b [f32], row0: usize, kh: usize) -> (&'b [f32], usize) {
        let (dk, key_len) = (
            self.shape.key_dim,
            self.shape.key_heads * self.shape.key_dim,
        );
        (&which[row0 * key_len + kh * dk..], key_len)
    }

    fn v(&self, row: usize, h: usize) -> &[f32] {
        let s = self.shape;
        let at = row * s.conv_dim() + 2 * s.key_heads * s.key_dim + h * s.value_dim;
        &self.mixed[at..at + s.value_dim]
    }

    fn gate(&self, row: usize, h: usize) -> f32 {
        self.g[row * self.shape.value_heads + h]
    }

    fn strength(&self, row: usize, h: usize) -> f32 {
        self.beta[row * self.shape.value_heads + h]
    }
}

/// Per-task working memory: a working copy of the state (for prefill and snapshots; decode updates
/// the slot in place), and for the chunked form the buffers of one chunk, all allocated on first use
/// so that decode steps do not pay for them.
struct Scratch {
    state: Vec<f32>,
    delta: Vec<f32>,
    gamma: Vec<f64>,
    a: Vec<f32>,
    p: Vec<f32>,
    w: Vec<f32>,
    u: Vec<f32>,
    qs: Vec<f32>,
    kt: Vec<f32>,
    /// e^(gamma_last - gamma_j) of the chunk.
    tail_decay: Vec<f32>,
}

impl Scratch {
    fn new(dv: usize) -> Self {
        Self {
            state: Vec::new(),
            delta: vec![0.0; dv],
            gamma: Vec::new(),
            a: Vec::new(),
            p: Vec::new(),
            w: Vec::new(),
            u: Vec::new(),
            qs: Vec::new(),
            kt: Vec::new(),
            tail_decay: Vec::new(),
        }
    }

    fn size_for_chunks(&mut self, dk: usize, dv: usize) {
        if self.gamma.len() < CHUNK {
            self.gamma = vec![0.0; CHUNK];
            self.a = vec![0.0; CHUNK * CHUNK];
            self.p = vec![0.0; CHUNK * CHUNK];
            self.w = vec![0.0; CHUNK * dk];
            self.u = vec![0.0; CHUNK * dv];
            self.qs = vec![0.0; CHUNK * dk];
            self.kt = vec![0.0; dk * CHUNK];
            self.tail_decay = vec![0.0; CHUNK];
        }
    }
}

/// One value head of one sequence: loads its state, runs the recurrent or chunked form, writes the
/// state (and snapshots) back. `o`: `[T, dv]` for this head, indexed by batch row.
fn run_head(
    isa: Isa,
    x: &HeadInputs<'_>,
    h: usize,
    seq: &SeqLayout,
    states: &mut [&mut [f32]],
    s: &mut Scratch,
    o: &mut [f32],
) {
    let GdnShape {
        key_heads,
        value_heads,
        value_dim: dv,
        ..
    } = x.shape;
    let kh = h / (value_heads / key_heads);
    let step = |state: &mut [f32], delta: &mut [f32], o: &mut [f32], row: usize| {
        recurrent_step(
            isa,
            state,
            x.q(row, kh),
            x.k(row, kh),
            x.v(row, h),
            (x.gate(row, h) as f64).exp() as f32,
            x.strength(row, h),
            delta,
            &mut o[row * dv..(row + 1) * dv],
        );
    };
    if seq.len == 1 && seq.snapshot_slots.is_empty() {
        // A decode token with no snapshot to take updates the slot's state in place: a working
        // copy would add a fill, a copy in and a copy out of the whole state per head and token.
        step(states[seq.slot], &mut s.delta, o, seq.start);
        return;
    }
    s.state.resize(states[seq.slot].len(), 0.0);
    s.state.copy_from_slice(states[seq.slot]);
    let recurrent = seq.len == 1 || !seq.snapshot_slots.is_empty();
    if recurrent {
        for i in 0..seq.len {
            step(&mut s.state, &mut s.delta, o, seq.start + i);
            if let Some(&snap) = seq.snapshot_slots.get(i) {
                states[snap].copy_from_slice(&s.state);
            }
        }
    } else {
        s.size_for_chunks(x.shape.key_dim, dv);
        for c0 in (0..seq.len).step_by(CHUNK) {
            let c = CHUNK.min(seq.len - c0);
            chunk(isa, x, h, kh, seq.start + c0, c, s, o);
        }
    }
    states[seq.slot].copy_from_slice(&s.state);
}

multiversion! {
    /// `S <- decay S; delta = beta (v - S^T k); S += k delta^T; out = S^T q`. `s`: `[dk, dv]`.
    fn recurrent_step(s: &mut [f32], q: &[f32], k: &[f32], v: &[f32], decay: f32, beta: f32, delta: &mut [f32], out: &mut [f32]) {
        let dv = v.len();
        delta.fill(0.0);
        for (row, &ki) in s.chunks_exact_mut(dv).zip(k) {
            for (sj, dj) in row.iter_mut().zip(delta.iter_mut()) {
                let decayed = *sj * decay;
                *sj = decayed;
                *dj += ki * decayed;
            }
        }
        for (dj, &vj) in delta.iter_mut().zip(v) {
            *dj = beta * (vj - *dj);
        }
        out.fill(0.0);
        for ((row, &ki), &qi) in s.chunks_exact_mut(dv).zip(k).zip(q) {
            for ((sj, &dj), oj) in row.iter_mut().zip(delta.iter()).zip(out.iter_mut()) {
                let updated = *sj + ki * dj;
                *sj = updated;
                *oj += qi * updated;
            }
        }
    }
}

/// The chunked form over tokens `row0 .. row0 + c` (one chunk, `c <= CHUNK`) of value head `h`,
/// updating `s.state` and writing `o[row0 .., :]`. Same steps as `reference::delta_rule_chunked`.
#[allow(clippy::too_many_arguments)]
fn chunk(
    isa: Isa,
    x: &HeadInputs<'_>,
    h: usize,
    kh: usize,
    row0: usize,
    c: usize,
    s: &mut Scratch,
    o: &mut [f32],
) {
    let (dk, dv) = (x.shape.key_dim, x.shape.value_dim);
    // 1. gamma = cumulative log-decay (f64: differences of long sums must not lose digits).
    let mut acc = 0.0f64;
    for i in 0..c {
        acc += x.gate(row0 + i, h) as f64;
        s.gamma[i] = acc;
    }
    // 2. -A[i][j] = -beta_i (k_i . k_j) e^(gamma_i - gamma_j) for j < i (negated for step 3), and
    //    P[i][j] = (q_i . k_j) e^(gamma_i - gamma_j) for j <= i (for step 6), zero elsewhere; the
    //    dot products as K K^T and Q K^T through the tile kernel.
    let (k_rows, ldk) = x.key_rows(&x.qk.k, row0, kh);
    let (q_rows, ldq) = x.key_rows(&x.qk.q, row0, kh);
    transpose_f32(isa, k_rows, ldk, c, dk, &mut s.kt, c);
    matmul_nn(isa, c, c, dk, k_rows, ldk, &s.kt, c, &mut s.a, c, false);
    matmul_nn(isa, c, c, dk, q_rows, ldq, &s.kt, c, &mut s.p, c, false);
    for i in 0..c {
        let bi = x.strength(row0 + i, h);
        for j in 0..c {
            let decay = if j <= i {
                exp_f32((s.gamma[i] - s.gamma[j]) as f32)
            } else {
                0.0
            };
            s.a[i * c + j] = if j < i {
                -bi * s.a[i * c + j] * decay
            } else {
                0.0
            };
            s.p[i * c + j] *= decay;
        }
    }
    // 3-4. W = (I+A)^-1 diag(beta e^gamma) K, U = (I+A)^-1 diag(beta) V, row by row (forward
    //      substitution: row i subtracts A[i, <i] times the finished rows).
    for i in 0..c {
        let bi = x.strength(row0 + i, h);
        let e = (s.gamma[i].exp()) as f32;
        for (wd, &kd) in s.w[i * dk..(i + 1) * dk].iter_mut().zip(x.k(row0 + i, kh)) {
            *wd = bi * e * kd;
        }
        for (ud, &vd) in s.u[i * dv..(i + 1) * dv].iter_mut().zip(x.v(row0 + i, h)) {
            *ud = bi * vd;
        }
        let (done_w, row_w) = s.w.split_at_mut(i * dk);
        matmul_nn(isa, 1, dk, i, &s.a[i * c..], c, done_w, dk, row_w, dk, true);
        let (done_u, row_u) = s.u.split_at_mut(i * dv);
        matmul_nn(isa, 1, dv, i, &s.a[i * c..], c, done_u, dv, row_u, dv, true);
    }
    // 5. V' = U - W S (into `u`).
    s.w[..c * dk].iter_mut().for_each(|v| *v = -*v);
    matmul_nn(isa, c, dv, dk, &s.w, dk, &s.state, dv, &mut s.u, dv, true);
    // 6. O = diag(e^gamma) Q S + P V'.
    for i in 0..c {
        let e = (s.gamma[i].exp()) as f32;
        for (qd, &src) in s.qs[i * dk..(i + 1) * dk].iter_mut().zip(x.q(row0 + i, kh)) {
            *qd = e * src;
        }
    }
    let out = &mut o[row0 * dv..(row0 + c) * dv];
    matmul_nn(isa, c, dv, dk, &s.qs, dk, &s.state, dv, out, dv, false);
    matmul_nn(isa, c, dv, c, &s.p, c, &s.u, dv, out, dv, true);
    // 7. S <- e^gamma_last S + sum_j e^(gamma_last - gamma_j) k_j V'_j^T (K^T scaled in place).
    let last = s.gamma[c - 1];
    for j in 0..c {
        s.tail_decay[j] = ((last - s.gamma[j]).exp()) as f32;
    }
    for row in s.kt[..dk * c].chunks_mut(c) {
        scale_by(isa, row, &s.tail_decay[..c]);
    }
    let e_last = last.exp() as f32;
    s.state.iter_mut().for_each(|v| *v *= e_last);
    matmul_nn(isa, dk, dv, c, &s.kt, c, &s.u, dv, &mut s.state, dv, true);
}
