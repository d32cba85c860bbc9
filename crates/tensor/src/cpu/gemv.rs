//! Matrix-vector products for a few tokens at a time (decode, short verifies): each 64-row weight
//! panel is streamed from memory once per group of up to `MAX_TOKENS` tokens, bf16 widened exactly
//! in registers. Panels are split across the backend's threads. Bandwidth-bound by design.
//!
//! Every output is one sequential chain `acc = fma(x[e], w[e], acc)` over `e`, exactly as in the
//! GEMM's tile kernel, so a row's result does not depend on how many tokens share the call.

use super::isa::Isa;
use super::mat::{CpuMat, MatData, PANEL};
use super::pack::round_to_bf16;
use super::par::{split_aligned, SharedOut};
use crate::dtype::bf16_to_f32;
use rayon::prelude::*;

/// Tokens sharing one pass over the weights (4 x 4 accumulator registers per panel step).
pub(crate) const MAX_TOKENS: usize = 4;
/// Below this many weight bytes the product runs on the calling thread (a task costs microseconds).
const PARALLEL_MIN_BYTES: usize = 256 * 1024;

/// Activations as bf16, `[tokens, cols rounded up to even]` (the pad column is zero): what the
/// bf16-pair kernels multiply.
pub(crate) struct Bf16Rows {
    pub(crate) bits: Vec<u16>,
    pub(crate) stride: usize,
}

impl Bf16Rows {
    pub(crate) fn new(
        isa: Isa,
        pool: &rayon::ThreadPool,
        x: &[f32],
        tokens: usize,
        k: usize,
    ) -> Self {
        let stride = k.next_multiple_of(2);
        let mut bits = vec![0u16; tokens * stride];
        if stride > 0 {
            let rows = bits.par_chunks_mut(stride).zip(x.par_chunks(k.max(1)));
            pool.install(|| rows.for_each(|(o, r)| round_to_bf16(isa, r, o)));
        }
        Self { bits, stride }
    }
}

/// `out [tokens, rows] = x [tokens, cols] @ w^T`, for any `tokens` (groups of `MAX_TOKENS`).
pub(crate) fn gemv(
    isa: Isa,
    pool: &rayon::ThreadPool,
    w: &CpuMat,
    x: &[f32],
    tokens: usize,
    out: &mut [f32],
) {
    let (n, k) = (w.rows(), w.cols());
    assert!(
        x.len() >= tokens * k,
        "matmul input holds {} values, {tokens} tokens of {k} need more",
        x.len()
    );
    assert!(
        out.len() >= tokens * n,
        "matmul output holds {} values, {tokens} x {n} need more",
        out.len()
    );
    if n == 0 || tokens == 0 {
        return;
    }
    let bf16_x =
        matches!(w.data(), MatData::Bf16Pairs(_)).then(|| Bf16Rows::new(isa, pool, x, tokens, k));
    let shared = SharedOut::new(&mut out[..tokens * n]);
    let run = |panels: std::ops::Range<usize>| {
        for t0 in (0..tokens).step_by(MAX_TOKENS) {
            let nt = MAX_TOKENS.min(tokens - t0);
            for p in panels.clone() {
                // SAFETY: panel ranges handed to concurrent calls are disjoint, so the elements
                // `out[t, panel rows]` written here belong to this call alone; bounds asserted above.
                unsafe { panel_product(isa, w, x, bf16_x.as_ref(), t0, nt, p, &shared) };
            }
        }
    };
    let panels = n.div_ceil(PANEL);
    if w.bytes() < PARALLEL_MIN_BYTES || pool.current_num_threads() == 1 {
        run(0..panels);
    } else {
        let pieces = split_aligned(panels, 4 * pool.current_num_threads(), 1);
        pool.install(|| pieces.into_par_iter().for_each(run));
    }
}

/// Computes `out[t0 + t, p*PANEL + j]` for `t < nt` and the rows `j` of panel `p`, where `out` is
/// `[tokens, w.rows()]` and `x` `[tokens, w.cols()]` (`xb` its bf16 rows when `w` holds pairs).
///
/// Safety: `t0 + nt <= tokens`, `p < panels(w)`; `out` holds `tokens * w.rows()` values and no
/// other thread touches `out[t0 .. t0 + nt, panel p rows]` during the call.
#[allow(clippy::too_many_arguments)]
unsafe fn panel_product(
    isa: Isa,
    w: &CpuMat,
    x: &[f32],
    xb: Option<&Bf16Rows>,
    t0: usize,
    nt: usize,
    p: usize,
    out: &SharedOut<'_>,
) {
    let (n, k) = (w.rows(), w.cols());
    let width = PANEL.min(n - p * PANEL);
    let out_ptr = out.ptr_at(t0 * n + p * PANEL);
    let x = &x[t0 * k..(t0 + nt) * k];
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        macro_rules! by_tokens {
            ($f:ident, $w:expr, $depth:expr, $x:expr, $ldx:expr) => {
                match nt {
                    1 => avx512::$f::<1>($w, $depth, $x, $ldx, out_ptr, n, width),
                    2 => avx512::$f::<2>($w, $depth, $x, $ldx, out_ptr, n, width),
                    3 => avx512::$f::<3>($w, $depth, $x, $ldx, out_ptr, n, width),
                    _ => avx512::$f::<4>($w, $depth, $x, $ldx, out_ptr, n, width),
                }
            };
        }
        match (w.data(), xb) {
            (MatData::Bf16(bits), _) => by_tokens!(
                panel_bf16,
                bits.as_ptr().add(p * k * PANEL),
                k,
                x.as_ptr(),
                k
            ),
            (MatData::F32(vals), _) => by_tokens!(
                panel_f32,
                vals.as_ptr().add(p * k * PANEL),
                k,
                x.as_ptr(),
                k
            ),
            (MatData::Bf16Pairs(pairs), Some(xb)) if isa.bf16_dot() => {
                let depth = k.div_ceil(2);
                by_tokens!(
                    panel_pairs,
                    pairs.as_ptr().add(p * depth * PANEL),
                    depth,
                    xb.bits.as_ptr().add(t0 * xb.stride),
                    xb.stride
                )
            }
            (MatData::Bf16Pairs(_), _) => panel_portable(w, x, xb, t0, nt, p, out_ptr),
        }
        return;
    }
    let _ = isa;
    panel_portable(w, x, xb, t0, nt, p, out_ptr);
}

/// The portable panel product: the same sequential chain per output, as separate multiply and add
/// (matching the portable tile kernel). Pairs are widened and multiplied with the bf16 activations.
///
/// Safety: as `panel_product`, with `out` pointing at `out[t0, p*PANEL]` and `x` the `nt` rows.
unsafe fn panel_portable(
    w: &CpuMat,
    x: &[f32],
    xb: Option<&Bf16Rows>,
    t0: usize,
    nt: usize,
    p: usize,
    out: *mut f32,
) {
    let (n, k) = (w.rows(), w.cols());
    let width = PANEL.min(n - p * PANEL);
    let mut acc = [[0.0f32; PANEL]; MAX_TOKENS];
    let mut lanes = [0.0f32; PANEL];
    for e in 0..k {
        match w.data() {
            MatData::Bf16(bits) => {
                for (l, &b) in lanes.iter_mut().zip(&bits[(p * k + e) * PANEL..][..PANEL]) {
                    *l = bf16_to_f32(b);
                }
            }
            MatData::F32(vals) => lanes.copy_from_slice(&vals[(p * k + e) * PANEL..][..PANEL]),
            MatData::Bf16Pairs(pairs) => {
                let step = &pairs[(p * k.div_ceil(2) + e / 2) * PANEL..][..PANEL];
                for (l, &pair) in lanes.iter_mut().zip(step) {
                    *l = bf16_to_f32((pair >> (16 * (e % 2))) as u16);
                }
            }
        }
        for (t, row) in acc.iter_mut().enumerate().take(nt) {
            let xv = match xb {
                Some(xb) => bf16_to_f32(xb.bits[(t0 + t) * xb.stride + e]),
                None => x[t * k + e],
            };
            for (a, &l) in row.iter_mut().zip(&lanes) {
                *a += xv * l;
            }
        }
    }
    for (t, row) in acc.iter().enumerate().take(nt) {
        for (j, &v) in row.iter().enumerate().take(width) {
            *out.add(t * n + j) = v;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::PANEL;
    use crate::cpu::simd::avx512::lanes;
    use std::arch::x86_64::*;

    /// Registers per panel step: 64 rows as four 16-lane vectors.
    const V: usize = PANEL / 16;

    /// Writes `acc[t][u]` to `out + t*ldo + 16u`, the first `width` rows only.
    #[inline(always)]
    unsafe fn store<const NT: usize>(
        acc: &[[__m512; V]; NT],
        out: *mut f32,
        ldo: usize,
        width: usize,
    ) {
        for (t, row) in acc.iter().enumerate() {
            for (u, v) in row.iter().enumerate() {
                _mm512_mask_storeu_ps(
                    out.add(t * ldo + 16 * u),
                    lanes(width.saturating_sub(16 * u)),
                    *v,
                );
            }
        }
    }

    /// One bf16 panel `[k, 64]` against `NT` token rows of `x` (row stride `ldx`).
    /// Safety: AVX-512 F/BW/VL present; `w` valid for `k * 64` reads, `x` for `NT` rows of `k`,
    /// `out` for writes at `out + t*ldo + j`, `t < NT`, `j < width <= 64`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn panel_bf16<const NT: usize>(
        w: *const u16,
        k: usize,
        x: *const f32,
        ldx: usize,
        out: *mut f32,
        ldo: usize,
        width: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); V]; NT];
        for e in 0..k {
            let step = w.add(e * PANEL);
            let mut wv = [_mm512_setzero_ps(); V];
            for (u, v) in wv.iter_mut().enumerate() {
                let bits = _mm256_loadu_si256(step.add(16 * u) as *const __m256i);
                *v = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits)));
            }
            for (t, row) in acc.iter_mut().enumerate() {
                let xv = _mm512_set1_ps(*x.add(t * ldx + e));
                for (u, a) in row.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(xv, wv[u], *a);
                }
            }
        }
        store(&acc, out, ldo, width);
    }

    /// As `panel_bf16` for an f32 panel.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn panel_f32<const NT: usize>(
        w: *const f32,
        k: usize,
        x: *const f32,
        ldx: usize,
        out: *mut f32,
        ldo: usize,
        width: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); V]; NT];
        for e in 0..k {
            let step = w.add(e * PANEL);
            let mut wv = [_mm512_setzero_ps(); V];
            for (u, v) in wv.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(step.add(16 * u));
            }
            for (t, row) in acc.iter_mut().enumerate() {
                let xv = _mm512_set1_ps(*x.add(t * ldx + e));
                for (u, a) in row.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(xv, wv[u], *a);
                }
            }
        }
        store(&acc, out, ldo, width);
    }

    /// A bf16-pair panel `[pairs, 64]` against `NT` bf16 token rows (row stride `ldx`, read as
    /// pairs) through `vdpbf16ps`, the same instruction sequence as the bf16 tile kernel.
    /// Safety: AVX-512 F/BW/VL and AVX512_BF16 present; `w` valid for `pairs * 64` reads, `x` for
    /// `NT` rows of `2 * pairs`, `out` as in `panel_bf16`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) unsafe fn panel_pairs<const NT: usize>(
        w: *const u32,
        pairs: usize,
        x: *const u16,
        ldx: usize,
        out: *mut f32,
        ldo: usize,
        width: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); V]; NT];
        for i in 0..pairs {
            let step = w.add(i * PANEL);
            let mut wv = [_mm512_setzero_si512(); V];
            for (u, v) in wv.iter_mut().enumerate() {
                *v = _mm512_loadu_si512(step.add(16 * u) as *const __m512i);
            }
            for (t, row) in acc.iter_mut().enumerate() {
                let pair = (x.add(t * ldx + 2 * i) as *const i32).read_unaligned();
                let xv: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                for (u, a) in row.iter_mut().enumerate() {
                    *a = _mm512_dpbf16_ps(*a, xv, std::mem::transmute::<__m512i, __m512bh>(wv[u]));
                }
            }
        }
        store(&acc, out, ldo, width);
    }
}
