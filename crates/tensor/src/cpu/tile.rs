//! The register-tile kernels every matrix product of this backend ends in: `C[r, j] (+)= sum_e
//! A[r, e] * B[e, j]` for up to `MAX_ROWS` x `TILE_COLS` outputs, f32 (strided A) or bf16 pairs
//! (`vdpbf16ps`), plus a single-threaded strided matmul built on them. Packing and threads: callers.

use super::isa::Isa;
#[cfg(target_arch = "x86_64")]
use super::isa::IsaLevel;
#[cfg(target_arch = "x86_64")]
use super::vector::{Avx2, Avx512, F32Vec};

/// Rows of A (and C) one kernel call handles.
pub(crate) const MAX_ROWS: usize = 6;
/// Columns of B (and C) one kernel call handles: four 16-lane AVX-512 registers, or four strips of
/// two 8-lane AVX2 registers.
pub(crate) const TILE_COLS: usize = 64;

/// Raw form of one tile product, for callers that share C between threads. A's element `(r, e)`
/// is at `a + r*lda + e*acs` (`acs` = 1 for row-major A; larger to read a transposed matrix).
///
/// Safety: the CPU supports `isa`'s level (guaranteed by `Isa`); `1 <= rows <= MAX_ROWS`,
/// `ncols <= TILE_COLS`; `a` is valid for reads at `a + r*lda + e*acs`, `b` at `b + e*ldb + j` and
/// `c` for reads and writes at `c + r*ldc + j`, for `r < rows`, `e < k`, `j < ncols`; no other
/// thread accesses those elements of C during the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile_raw(
    isa: Isa,
    rows: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    acs: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    ncols: usize,
    accumulate: bool,
) {
    debug_assert!((1..=MAX_ROWS).contains(&rows) && ncols <= TILE_COLS);
    #[cfg(target_arch = "x86_64")]
    match isa.level() {
        IsaLevel::Avx512 => {
            return tile_avx512(rows, k, a, lda, acs, b, ldb, c, ldc, ncols, accumulate)
        }
        IsaLevel::Avx2 => {
            return tile_avx2(rows, k, a, lda, acs, b, ldb, c, ldc, ncols, accumulate)
        }
        IsaLevel::Scalar => {}
    }
    let _ = isa;
    for r in 0..rows {
        let mut acc = [0.0f32; TILE_COLS];
        if accumulate {
            for (j, v) in acc.iter_mut().enumerate().take(ncols) {
                *v = *c.add(r * ldc + j);
            }
        }
        for e in 0..k {
            let av = *a.add(r * lda + e * acs);
            let brow = b.add(e * ldb);
            for (j, v) in acc.iter_mut().enumerate().take(ncols) {
                *v += av * *brow.add(j);
            }
        }
        for (j, v) in acc.iter().enumerate().take(ncols) {
            *c.add(r * ldc + j) = *v;
        }
    }
}

/// The bf16 form of `tile_raw`: `C[r, j] (+)= sum_i dot2(A[r, pair i], B[i, j])` where A holds
/// bf16 values (pairs read as one u32: element 2i low, 2i+1 high) and B bf16 pairs packed as u32.
/// Products of bf16 values are exact in f32; sums are f32 (`vdpbf16ps`).
///
/// Safety: `isa.bf16_dot()`; `1 <= rows <= MAX_ROWS`, `ncols <= TILE_COLS`; `a` is valid for
/// reads of `2*pairs` u16 at `a + r*lda`, `b` for reads at `b + i*ldb + j` (`j < TILE_COLS`, whole
/// panel rows), `c` for reads and writes at `c + r*ldc + j` (`j < ncols`), for `r < rows`,
/// `i < pairs`; no other thread accesses those elements of C during the call.
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn tile_bf16_raw(
    rows: usize,
    pairs: usize,
    a: *const u16,
    lda: usize,
    b: *const u32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    ncols: usize,
    accumulate: bool,
) {
    debug_assert!((1..=MAX_ROWS).contains(&rows) && ncols <= TILE_COLS);
    macro_rules! go {
        ($r:literal) => {
            avx512::tile_bf16::<$r>(pairs, a, lda, b, ldb, c, ldc, ncols, accumulate)
        };
    }
    match rows {
        1 => go!(1),
        2 => go!(2),
        3 => go!(3),
        4 => go!(4),
        5 => go!(5),
        _ => go!(6),
    }
}

/// `C[m, n] (+)= A[m, k] @ B[k, n]` on row-major slices with leading dimensions; single-threaded.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_nn(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    matmul_strided(isa, m, n, k, a, lda, 1, b, ldb, c, ldc, accumulate);
}

/// As `matmul_nn` with A's element `(r, e)` at `a[r*lda + e*acs]` (e.g. `lda = 1, acs = m` for
/// an A stored transposed).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_strided(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    acs: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        c.len() >= (m - 1) * ldc + n,
        "C holds {} elements, [{m}, {n}] with ldc {ldc} needs more",
        c.len()
    );
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                c[r * ldc..r * ldc + n].fill(0.0);
            }
        }
        return;
    }
    assert!(
        a.len() > (m - 1) * lda + (k - 1) * acs,
        "A holds {} elements, [{m}, {k}] with strides ({lda}, {acs}) need more",
        a.len()
    );
    assert!(
        b.len() >= (k - 1) * ldb + n,
        "B holds {} elements, [{k}, {n}] with ldb {ldb} needs more",
        b.len()
    );
    for r0 in (0..m).step_by(MAX_ROWS) {
        let rows = MAX_ROWS.min(m - r0);
        for j0 in (0..n).step_by(TILE_COLS) {
            let cols = TILE_COLS.min(n - j0);
            // SAFETY: the asserts above keep every element the tile touches inside a, b and c, and
            // `c` is exclusively borrowed.
            unsafe {
                tile_raw(
                    isa,
                    rows,
                    k,
                    a.as_ptr().add(r0 * lda),
                    lda,
                    acs,
                    b.as_ptr().add(j0),
                    ldb,
                    c.as_mut_ptr().add(r0 * ldc + j0),
                    ldc,
                    cols,
                    accumulate,
                );
            }
        }
    }
}

/// `tile_raw` with 16-lane registers: six rows x four registers (24 accumulators of 32).
///
/// Safety: the CPU supports AVX-512 F/BW/VL (and AVX2, FMA); the rest as `tile_raw`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_avx512(
    rows: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    acs: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    ncols: usize,
    accumulate: bool,
) {
    macro_rules! go {
        ($r:literal) => {
            tile_strips::<Avx512, $r, 4>(k, a, lda, acs, b, ldb, c, ldc, ncols, accumulate)
        };
    }
    match rows {
        1 => go!(1),
        2 => go!(2),
        3 => go!(3),
        4 => go!(4),
        5 => go!(5),
        _ => go!(6),
    }
}

/// `tile_raw` with 8-lane registers: six rows x two registers (12 accumulators of 16), in strips
/// of 16 columns.
///
/// Safety: the CPU supports AVX2 and FMA; the rest as `tile_raw`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_avx2(
    rows: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    acs: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    ncols: usize,
    accumulate: bool,
) {
    macro_rules! go {
        ($r:literal) => {
            tile_strips::<Avx2, $r, 2>(k, a, lda, acs, b, ldb, c, ldc, ncols, accumulate)
        };
    }
    match rows {
        1 => go!(1),
        2 => go!(2),
        3 => go!(3),
        4 => go!(4),
        5 => go!(5),
        _ => go!(6),
    }
}

/// The tile as strips of `U` registers of columns, each strip of `R` rows over the whole depth:
/// per output one chain of fused multiply-adds over `e`, starting from C or zero, as in the GEMV.
///
/// Safety: runs inside a function with `V`'s target features; the rest as `tile_raw` with
/// `rows == R`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_strips<V: F32Vec, const R: usize, const U: usize>(
    k: usize,
    a: *const f32,
    lda: usize,
    acs: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    ncols: usize,
    accumulate: bool,
) {
    let width = U * V::LANES;
    for j0 in (0..ncols).step_by(width) {
        let (b, c) = (b.add(j0), c.add(j0));
        if ncols - j0 >= width {
            tile_strip::<V, R, U, false>(k, a, lda, acs, b, ldb, c, ldc, width, accumulate);
        } else {
            tile_strip::<V, R, U, true>(k, a, lda, acs, b, ldb, c, ldc, ncols - j0, accumulate);
        }
    }
}

/// One strip of `R` rows x `U` registers; `PARTIAL` strips (`ncols < U * LANES`) never read B
/// or touch C at or beyond column `ncols`.
///
/// Safety: as `tile_strips`, with `ncols <= U * V::LANES` columns from `b` and `c`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_strip<V: F32Vec, const R: usize, const U: usize, const PARTIAL: bool>(
    k: usize,
    a: *const f32,
    lda: usize,
    acs: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    ncols: usize,
    accumulate: bool,
) {
    let mut valid = [0usize; U];
    for (u, n) in valid.iter_mut().enumerate() {
        *n = ncols.saturating_sub(u * V::LANES);
    }
    let mut acc = [[V::zero(); U]; R];
    if accumulate {
        for (r, row) in acc.iter_mut().enumerate() {
            for (u, v) in row.iter_mut().enumerate() {
                let at = c.add(r * ldc + u * V::LANES);
                *v = if PARTIAL {
                    V::load_first(at, valid[u])
                } else {
                    V::load(at)
                };
            }
        }
    }
    for e in 0..k {
        let brow = b.add(e * ldb);
        let mut bv = [V::zero(); U];
        for (u, v) in bv.iter_mut().enumerate() {
            let at = brow.add(u * V::LANES);
            *v = if PARTIAL {
                V::load_first(at, valid[u])
            } else {
                V::load(at)
            };
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let av = V::splat(*a.add(r * lda + e * acs));
            for (v, &bu) in row.iter_mut().zip(&bv) {
                *v = V::mul_add(av, bu, *v);
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (u, v) in row.iter().enumerate() {
            let at = c.add(r * ldc + u * V::LANES);
            if PARTIAL {
                v.store_first(at, valid[u]);
            } else {
                v.store(at);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::TILE_COLS;
    use crate::cpu::simd::avx512::lanes;
    use std::arch::x86_64::*;

    /// Safety: as `tile_bf16_raw` with `rows == R`, and the CPU supports AVX512_BF16 besides
    /// AVX-512 F/BW/VL. B is read in whole 64-column panel rows (padding columns included); C
    /// columns at or beyond `ncols` are masked off.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile_bf16<const R: usize>(
        pairs: usize,
        a: *const u16,
        lda: usize,
        b: *const u32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        ncols: usize,
        accumulate: bool,
    ) {
        const V: usize = TILE_COLS / 16;
        let mut mask = [0 as __mmask16; V];
        for (u, m) in mask.iter_mut().enumerate() {
            *m = lanes(ncols.saturating_sub(16 * u));
        }
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        if accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                for (u, v) in row.iter_mut().enumerate() {
                    *v = _mm512_maskz_loadu_ps(mask[u], c.add(r * ldc + 16 * u));
                }
            }
        }
        for i in 0..pairs {
            let brow = b.add(i * ldb);
            let mut bv = [_mm512_setzero_si512(); V];
            for (u, v) in bv.iter_mut().enumerate() {
                *v = _mm512_loadu_si512(brow.add(16 * u) as *const __m512i);
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let pair = (a.add(r * lda + 2 * i) as *const i32).read_unaligned();
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                for (u, v) in row.iter_mut().enumerate() {
                    *v = _mm512_dpbf16_ps(*v, av, std::mem::transmute::<__m512i, __m512bh>(bv[u]));
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (u, v) in row.iter().enumerate() {
                _mm512_mask_storeu_ps(c.add(r * ldc + 16 * u), mask[u], *v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::isa::IsaLevel;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i + seed) * 2654435761) % 1009) as f32 / 504.5 - 1.0)
            .collect()
    }

    #[test]
    fn matmul_nn_matches_f64_on_ragged_shapes() {
        for level in IsaLevel::available() {
            let isa = Isa::at_most(level);
            for (m, n, k) in [
                (1, 1, 1),
                (7, 65, 3),
                (13, 130, 64),
                (6, 64, 0),
                (5, 17, 129),
                (8, 33, 40),
                (12, 64, 7),
            ] {
                let (lda, ldb, ldc) = (k + 3, n + 5, n + 2);
                let a = values(m * lda, 1);
                let b = values(k.max(1) * ldb, 2);
                let mut c = values(m * ldc, 3);
                let before = c.clone();
                if (m + n) % 2 == 0 {
                    matmul_nn(isa, m, n, k, &a, lda, &b, ldb, &mut c, ldc, true);
                } else {
                    // The same A read through transposed strides from a transposed copy.
                    let mut at = vec![0.0; k.max(1) * m];
                    for r in 0..m {
                        for e in 0..k {
                            at[e * m + r] = a[r * lda + e];
                        }
                    }
                    matmul_strided(isa, m, n, k, &at, 1, m, &b, ldb, &mut c, ldc, true);
                }
                for r in 0..m {
                    for j in 0..ldc {
                        let want = if j < n {
                            before[r * ldc + j] as f64
                                + (0..k)
                                    .map(|e| a[r * lda + e] as f64 * b[e * ldb + j] as f64)
                                    .sum::<f64>()
                        } else {
                            before[r * ldc + j] as f64
                        };
                        let got = c[r * ldc + j] as f64;
                        assert!(
                            (got - want).abs() < 1e-5 * (1.0 + k as f64),
                            "{isa} {m}x{n}x{k} at ({r},{j}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
