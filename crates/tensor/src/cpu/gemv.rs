//! Matrix-vector products for a few tokens at a time (decode, short verifies): each 64-row weight
//! panel is streamed from memory once per group of up to `MAX_TOKENS` tokens (2 at the AVX2 level),
//! bf16 widened exactly in registers. Panels are split across the backend's threads.
//! Bandwidth-bound by design.
//!
//! Every output is one sequential chain `acc = fma(x[e], w[e], acc)` over `e`, exactly as in the
//! GEMM's tile kernel, so a row's result does not depend on how many tokens share the call.

use super::isa::Isa;
use super::mat::{CpuMat, MatData, PANEL};
use super::pack::round_to_bf16;
use super::par::{split_aligned, SharedOut};
#[cfg(target_arch = "x86_64")]
use super::vector::{F32Vec, Lanes};
use crate::dtype::bf16_to_f32;
use rayon::prelude::*;

/// Tokens sharing one pass over the weights at most (4 x 4 AVX-512 accumulator registers per panel
/// step; the portable kernel's accumulator rows).
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
    gemv_group(isa, pool, &[w], x, tokens, &mut [out]);
}

/// `outs[i] [tokens, rows_i] = x [tokens, cols] @ ws[i]^T` for matrices that share their input, in
/// one parallel region: the panels of every matrix go to the threads together, so the group waits
/// for its last piece once instead of once per matrix (a decode step has ~60 fewer such waits).
/// Every output is computed panel by panel exactly as for the matrix alone.
pub(crate) fn gemv_group(
    isa: Isa,
    pool: &rayon::ThreadPool,
    ws: &[&CpuMat],
    x: &[f32],
    tokens: usize,
    outs: &mut [&mut [f32]],
) {
    assert_eq!(ws.len(), outs.len(), "matmul_group: one output per matrix");
    let k = ws.first().map_or(0, |w| w.cols());
    assert!(
        x.len() >= tokens * k,
        "matmul input holds {} values, {tokens} tokens of {k} need more",
        x.len()
    );
    for (w, out) in ws.iter().zip(outs.iter()) {
        let n = w.rows();
        assert_eq!(
            w.cols(),
            k,
            "matmul_group: matrices share their input width"
        );
        assert!(
            out.len() >= tokens * n,
            "matmul output holds {} values, {tokens} x {n} need more",
            out.len()
        );
    }
    if tokens == 0 {
        return;
    }
    let any_pairs = ws.iter().any(|w| matches!(w.data(), MatData::Bf16Pairs(_)));
    let bf16_x = any_pairs.then(|| Bf16Rows::new(isa, pool, x, tokens, k));
    let shared: Vec<SharedOut<'_>> = ws
        .iter()
        .zip(outs.iter_mut())
        .map(|(w, out)| SharedOut::new(&mut out[..tokens * w.rows()]))
        .collect();
    let run = |(i, panels): (usize, std::ops::Range<usize>)| {
        let per_pass = tokens_per_pass(isa);
        for t0 in (0..tokens).step_by(per_pass) {
            let nt = per_pass.min(tokens - t0);
            for p in panels.clone() {
                // SAFETY: the pieces handed to concurrent calls are disjoint panel ranges of their
                // matrix, so the elements `outs[i][t, panel rows]` written here belong to this call
                // alone; bounds asserted above.
                unsafe { panel_product(isa, ws[i], x, bf16_x.as_ref(), t0, nt, p, &shared[i]) };
            }
        }
    };
    let threads = pool.current_num_threads();
    let bytes: usize = ws.iter().map(|w| w.bytes()).sum();
    let panels = |w: &CpuMat| w.rows().div_ceil(PANEL);
    if bytes < PARALLEL_MIN_BYTES || threads == 1 {
        for (i, w) in ws.iter().enumerate() {
            run((i, 0..panels(w)));
        }
        return;
    }
    // Each matrix is cut as it would be alone; one small enough to run on the calling thread
    // alone is one piece.
    let pieces: Vec<(usize, std::ops::Range<usize>)> = ws
        .iter()
        .enumerate()
        .flat_map(|(i, w)| {
            let cuts = if w.bytes() < PARALLEL_MIN_BYTES {
                1
            } else {
                4 * threads
            };
            split_aligned(panels(w), cuts, 1)
                .into_iter()
                .map(move |r| (i, r))
        })
        .collect();
    pool.install(|| pieces.into_par_iter().for_each(run));
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
    // Every kernel call below runs at the level `isa` proves the CPU supports, on pointers the
    // caller's contract covers.
    #[cfg(target_arch = "x86_64")]
    {
        use super::isa::IsaLevel;
        let ldo = n;
        let none = BlockFactors::NONE;
        // The level's panel kernel on panel `p` of the weights `$w`, scaled by `$factors` or not.
        macro_rules! panel {
            ($kernel:ident, $scaled:literal, $w:expr, $factors:expr) => {{
                let w = $w.as_ptr().add(p * k * PANEL);
                let x = x.as_ptr();
                return $kernel::<_, $scaled>(nt, w, k, x, k, out_ptr, ldo, width, $factors);
            }};
        }
        match (isa.level(), w.data(), xb) {
            (IsaLevel::Scalar, ..) => {}
            (IsaLevel::Avx512, MatData::Bf16(bits), _) => panel!(panel_avx512, false, bits, none),
            (IsaLevel::Avx512, MatData::F32(vals), _) => panel!(panel_avx512, false, vals, none),
            (IsaLevel::Avx512, MatData::Fp8(fp8), _) => {
                panel!(panel_avx512, true, fp8.codes, fp8_factors(&fp8, p))
            }
            (IsaLevel::Avx512, MatData::Bf16Pairs(pairs), Some(xb)) if isa.bf16_dot() => {
                let depth = k.div_ceil(2);
                let w = pairs.as_ptr().add(p * depth * PANEL);
                let x = xb.bits.as_ptr().add(t0 * xb.stride);
                macro_rules! by_tokens {
                    ($nt:literal) => {
                        avx512::panel_pairs::<$nt>(w, depth, x, xb.stride, out_ptr, ldo, width)
                    };
                }
                match nt {
                    1 => by_tokens!(1),
                    2 => by_tokens!(2),
                    3 => by_tokens!(3),
                    _ => by_tokens!(4),
                }
                return;
            }
            (IsaLevel::Avx2, MatData::Bf16(bits), _) => {
                let w = bits.as_ptr().add(p * k * PANEL);
                return panel_avx2_bf16_pairs(nt, w, k, x.as_ptr(), k, out_ptr, ldo, width);
            }
            (IsaLevel::Avx2, MatData::F32(vals), _) => panel!(panel_avx2, false, vals, none),
            (IsaLevel::Avx2, MatData::Fp8(fp8), _) => {
                panel!(panel_avx2, true, fp8.codes, fp8_factors(&fp8, p))
            }
            // Pairs without `vdpbf16ps` (only made when the CPU has it; a capped level lacks it).
            (_, MatData::Bf16Pairs(_), _) => {}
        }
    }
    let _ = isa;
    panel_portable(w, x, xb, t0, nt, p, out_ptr);
}

/// The block factors of FP8 panel `p` (its grid row of scales times 2^120).
#[cfg(target_arch = "x86_64")]
fn fp8_factors(fp8: &super::mat::Fp8Panels<'_>, p: usize) -> BlockFactors {
    BlockFactors {
        factors: fp8.panel_scales(p).as_ptr(),
        cols: fp8.block[1],
    }
}

/// Tokens sharing one pass over the weights at `isa`'s level: as many as fit in registers next
/// to their accumulators (AVX2 has half the registers of AVX-512 and half the lanes per register).
fn tokens_per_pass(isa: Isa) -> usize {
    if isa.avx2() {
        AVX2_MAX_TOKENS
    } else {
        MAX_TOKENS
    }
}

/// Tokens per weight pass of the AVX2 kernels: 2 tokens x 4 accumulators per 32-row strip.
const AVX2_MAX_TOKENS: usize = 2;

/// One panel against `nt <= MAX_TOKENS` tokens with 16-lane registers: the whole 64-row panel in
/// four registers per token.
///
/// Safety: the CPU supports AVX-512 F/BW/VL (and AVX2, FMA); pointers as in `panel_strips`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn panel_avx512<E: Lanes, const SCALED: bool>(
    nt: usize,
    w: *const E,
    k: usize,
    x: *const f32,
    ldx: usize,
    out: *mut f32,
    ldo: usize,
    width: usize,
    scales: BlockFactors,
) {
    use super::vector::Avx512;
    let args = (w, k, x, ldx, out, ldo, width, scales);
    macro_rules! strips {
        ($nt:literal) => {{
            let (w, k, x, ldx, out, ldo, width, scales) = args;
            panel_strips::<Avx512, E, $nt, 4, SCALED>(w, k, x, ldx, out, ldo, width, scales)
        }};
    }
    match nt {
        1 => strips!(1),
        2 => strips!(2),
        3 => strips!(3),
        _ => strips!(4),
    }
}

/// One panel against `nt <= AVX2_MAX_TOKENS` tokens with 8-lane registers: a single token keeps
/// the whole panel in eight accumulators (one contiguous stream); two tokens take it in two
/// 32-row strips of four accumulators each.
///
/// Safety: the CPU supports AVX2 and FMA; pointers as in `panel_strips`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn panel_avx2<E: Lanes, const SCALED: bool>(
    nt: usize,
    w: *const E,
    k: usize,
    x: *const f32,
    ldx: usize,
    out: *mut f32,
    ldo: usize,
    width: usize,
    scales: BlockFactors,
) {
    use super::vector::Avx2;
    match nt {
        1 => panel_strips::<Avx2, E, 1, 8, SCALED>(w, k, x, ldx, out, ldo, width, scales),
        _ => panel_strips::<Avx2, E, 2, 4, SCALED>(w, k, x, ldx, out, ldo, width, scales),
    }
}

/// `panel_avx2` for bf16 weights, widened a pair at a time: a 256-bit load holds the weights of 16
/// consecutive rows for one input element as 8 pairs of bf16; `pair << 16` is the f32 of the even
/// row's weight and `pair & 0xffff0000` the odd row's, two plain integer operations per 16 weights
/// instead of a zero-extending shuffle and a shift per 8 (which Zen 1 runs as two 128-bit halves
/// each). Even and odd rows keep accumulators of their own, each row one chain of multiply-adds
/// over `e` in order, so every output is bit for bit `panel_strips`'; the two are interleaved back
/// at the store. One token takes the 64-row panel as four 16-row loads (eight accumulators), two
/// tokens as two 32-row strips.
///
/// Safety: the CPU supports AVX2 and FMA; `w` is a bf16 panel `[k, PANEL]`, other pointers as in
/// `panel_strips`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn panel_avx2_bf16_pairs(
    nt: usize,
    w: *const u16,
    k: usize,
    x: *const f32,
    ldx: usize,
    out: *mut f32,
    ldo: usize,
    width: usize,
) {
    match nt {
        1 => pair_strips::<1, 4>(w, k, x, ldx, out, ldo, width),
        _ => pair_strips::<2, 2>(w, k, x, ldx, out, ldo, width),
    }
}

/// How far ahead of its loads `pair_strips` asks for a panel's lines. The hardware prefetcher alone
/// left the AVX2 GEMV at 83-90 % of the streaming read on Zen 1 (gemv_bench (b), 121 matrices of the
/// 0.8B shape, 2 threads); 512-1024 bytes ahead took it to 96-101 %, 2048 to 87-91 % (session 18).
#[cfg(target_arch = "x86_64")]
const PAIR_PREFETCH_BYTES: usize = 1024;

/// `panel_avx2_bf16_pairs` for `NT` tokens over strips of `P` 16-row loads.
///
/// Safety: as `panel_avx2_bf16_pairs`, inside a function with AVX2 and FMA enabled.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pair_strips<const NT: usize, const P: usize>(
    w: *const u16,
    k: usize,
    x: *const f32,
    ldx: usize,
    out: *mut f32,
    ldo: usize,
    width: usize,
) {
    use std::arch::x86_64::*;
    let odd_half = _mm256_set1_epi32(0xffff_0000_u32 as i32);
    for c0 in (0..width).step_by(16 * P) {
        let mut even = [[_mm256_setzero_ps(); P]; NT];
        let mut odd = [[_mm256_setzero_ps(); P]; NT];
        for e in 0..k {
            let step = w.add(e * PANEL + c0);
            // The panel's two cache lines PAIR_PREFETCH_BYTES ahead (a hint: past the panel's end
            // it fetches nothing harmful and faults on nothing).
            let ahead = (step as *const i8).wrapping_add(PAIR_PREFETCH_BYTES);
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
            let mut we = [_mm256_setzero_ps(); P];
            let mut wo = [_mm256_setzero_ps(); P];
            for u in 0..P {
                let pairs = _mm256_loadu_si256(step.add(16 * u) as *const __m256i);
                we[u] = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(pairs));
                wo[u] = _mm256_castsi256_ps(_mm256_and_si256(pairs, odd_half));
            }
            for t in 0..NT {
                let xv = _mm256_set1_ps(*x.add(t * ldx + e));
                for u in 0..P {
                    even[t][u] = _mm256_fmadd_ps(xv, we[u], even[t][u]);
                    odd[t][u] = _mm256_fmadd_ps(xv, wo[u], odd[t][u]);
                }
            }
        }
        for t in 0..NT {
            for u in 0..P {
                // Rows 0-3 and 8-11 of the 16, then 4-7 and 12-15; the halves put back in order.
                let low = _mm256_unpacklo_ps(even[t][u], odd[t][u]);
                let high = _mm256_unpackhi_ps(even[t][u], odd[t][u]);
                let rows = [
                    _mm256_permute2f128_ps::<0x20>(low, high),
                    _mm256_permute2f128_ps::<0x31>(low, high),
                ];
                for (h, v) in rows.into_iter().enumerate() {
                    let first = c0 + 16 * u + 8 * h;
                    let at = out.add(t * ldo + first);
                    let valid = width.saturating_sub(first);
                    if valid >= 8 {
                        _mm256_storeu_ps(at, v);
                    } else if valid > 0 {
                        let mut lanes = [0.0f32; 8];
                        _mm256_storeu_ps(lanes.as_mut_ptr(), v);
                        std::ptr::copy_nonoverlapping(lanes.as_ptr(), at, valid);
                    }
                }
            }
        }
    }
}

/// Per-block factors a panel's loaded weights are multiplied by before they meet the activations
/// (block-FP8: the block's scale times 2^120, `mat::Fp8Panels`): `factors[e / cols]` for step `e`.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct BlockFactors {
    factors: *const f32,
    cols: usize,
}

#[cfg(target_arch = "x86_64")]
impl BlockFactors {
    /// Weights used as loaded (bf16, f32): one block over the whole depth, never read.
    const NONE: Self = Self {
        factors: std::ptr::null(),
        cols: usize::MAX,
    };
}

/// `out[t, j] = sum_e x[t, e] * panel[e, j]` for `t < NT`, `j < width`, in strips of `R`
/// registers of rows: per output one chain of fused multiply-adds over `e`, whatever `NT` and `R`.
/// With `SCALED` each loaded weight vector is first multiplied by its block's factor (one
/// rounding: the weight's f32 value, `mat::Fp8Panels`); the chain is the same.
///
/// Safety: runs inside a function with `V`'s target features; `w` (a panel `[k, PANEL]`) is valid
/// for `k * PANEL` reads, `x` for `NT` rows of `k` (row stride `ldx`), `out` for writes at
/// `out + t*ldo + j`, `t < NT`, `j < width <= PANEL`; with `SCALED`, `scales.factors` holds
/// `k.div_ceil(scales.cols)` values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn panel_strips<V: F32Vec, E: Lanes, const NT: usize, const R: usize, const SCALED: bool>(
    w: *const E,
    k: usize,
    x: *const f32,
    ldx: usize,
    out: *mut f32,
    ldo: usize,
    width: usize,
    scales: BlockFactors,
) {
    let block = if SCALED { scales.cols.max(1) } else { k.max(1) };
    for c0 in (0..width).step_by(R * V::LANES) {
        let mut acc = [[V::zero(); R]; NT];
        for b0 in (0..k).step_by(block) {
            let factor = if SCALED {
                V::splat(*scales.factors.add(b0 / block))
            } else {
                V::zero()
            };
            for e in b0..k.min(b0 + block) {
                let step = w.add(e * PANEL + c0);
                let mut wv = [V::zero(); R];
                for (u, v) in wv.iter_mut().enumerate() {
                    let loaded = E::load::<V>(step.add(u * V::LANES));
                    *v = if SCALED {
                        V::mul(loaded, factor)
                    } else {
                        loaded
                    };
                }
                for (t, row) in acc.iter_mut().enumerate() {
                    let xv = V::splat(*x.add(t * ldx + e));
                    for (a, &wu) in row.iter_mut().zip(&wv) {
                        *a = V::mul_add(xv, wu, *a);
                    }
                }
            }
        }
        for (t, row) in acc.iter().enumerate() {
            for (u, v) in row.iter().enumerate() {
                let at = out.add(t * ldo + c0 + u * V::LANES);
                let valid = width.saturating_sub(c0 + u * V::LANES);
                if valid >= V::LANES {
                    v.store(at);
                } else {
                    v.store_first(at, valid);
                }
            }
        }
    }
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
            MatData::Fp8(fp8) => {
                for (j, l) in lanes.iter_mut().enumerate() {
                    *l = fp8.value(p, k, e, j);
                }
            }
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
