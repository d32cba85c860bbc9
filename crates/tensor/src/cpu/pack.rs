//! Data rearrangement for the tile kernels: bf16 and block-FP8 weight blocks widened to f32, f32 transposes in
//! 16x16 register blocks, and activations rounded to bf16. No arithmetic beyond widening and
//! rounding, so nothing here changes a value.

use super::isa::{multiversion, Isa};

/// `dst[c*ldd + r] = src[r*lds + c]` for `r < rows`, `c < cols` (16x16 or 8x8 register blocks
/// where the CPU allows, scalar edges).
pub(crate) fn transpose_f32(
    isa: Isa,
    src: &[f32],
    lds: usize,
    rows: usize,
    cols: usize,
    dst: &mut [f32],
    ldd: usize,
) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(
        src.len() >= (rows - 1) * lds + cols && dst.len() >= (cols - 1) * ldd + rows,
        "transpose out of bounds"
    );
    let (mut r_done, mut c_done) = (0, 0);
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() || isa.avx2() {
        let block = if isa.avx512() { 16 } else { 8 };
        (r_done, c_done) = (rows / block * block, cols / block * block);
        for r in (0..r_done).step_by(block) {
            for c in (0..c_done).step_by(block) {
                let (from, to) = (src[r * lds + c..].as_ptr(), c * ldd + r);
                // SAFETY: the asserted bounds cover the block read at (r, c) and written at
                // (c, r); `isa` proves the level's features.
                unsafe {
                    let to = dst.as_mut_ptr().add(to);
                    if isa.avx512() {
                        avx512::transpose_f32_16x16(from, lds, to, ldd)
                    } else {
                        avx2::transpose_f32_8x8(from, lds, to, ldd)
                    }
                };
            }
        }
    }
    let _ = isa;
    for r in 0..rows {
        let c_from = if r < r_done { c_done } else { 0 };
        for c in c_from..cols {
            dst[c * ldd + r] = src[r * lds + c];
        }
    }
}

multiversion! {
    /// `dst[i] = src[i]` as f32 (exact: bf16 is the top half of an f32).
    pub(crate) fn widen_bf16(src: &[u16], dst: &mut [f32]) {
        for (d, &b) in dst.iter_mut().zip(src) {
            *d = f32::from_bits((b as u32) << 16);
        }
    }
}

multiversion! {
    /// `dst[i]` = the f32 value of e4m3fn code `src[i]` in a block whose scale times 2^120 is
    /// `factor` (`mat::Fp8Panels`: one rounding, the checkpoint's dequantized weight).
    pub(crate) fn widen_fp8(src: &[u8], factor: f32, dst: &mut [f32]) {
        for (d, &c) in dst.iter_mut().zip(src) {
            *d = f32::from_bits(super::mat::e4m3_bits_scaled_down(c)) * factor;
        }
    }
}

multiversion! {
    /// Rounds `x` to bf16 (nearest, ties to even; NaN stays NaN) into `out`, which may be longer
    /// (the padding is left as it is).
    pub(crate) fn round_to_bf16(x: &[f32], out: &mut [u16]) {
        for (o, &v) in out.iter_mut().zip(x) {
            let b = v.to_bits();
            let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
            *o = if v.is_nan() { 0x7FC0 } else { rounded };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Transposes 16 rows of 16 32-bit lanes: `out[c]` lane `r` = `rows[r]` lane `c`. (No closures
    /// in here: they would not inherit the caller's target features and the intrinsics would turn
    /// into calls.)
    #[inline(always)]
    unsafe fn transpose(rows: [__m512i; 16]) -> [__m512i; 16] {
        let mut r = [_mm512_setzero_ps(); 16];
        for i in 0..16 {
            r[i] = _mm512_castsi512_ps(rows[i]);
        }
        // 1. Interleave row pairs: t[2i] has columns 4L, 4L+1 of rows 2i, 2i+1 in lane L; t[2i+1]
        //    columns 4L+2, 4L+3.
        let mut t = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // 2. u[4g + c] holds, in 128-bit lane L, column 4L + c of rows 4g .. 4g+4.
        let mut u = [_mm512_setzero_ps(); 16];
        for g in 0..4 {
            let (a, b) = (_mm512_castps_pd(t[4 * g]), _mm512_castps_pd(t[4 * g + 2]));
            let (c, d) = (
                _mm512_castps_pd(t[4 * g + 1]),
                _mm512_castps_pd(t[4 * g + 3]),
            );
            u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
            u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
            u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
        }
        // 3. Gather lane L of u[c], u[4+c], u[8+c], u[12+c] into column 4L + c.
        let mut out = [_mm512_setzero_si512(); 16];
        for c in 0..4 {
            let va = _mm512_shuffle_f32x4::<0x88>(u[c], u[4 + c]);
            let vb = _mm512_shuffle_f32x4::<0xdd>(u[c], u[4 + c]);
            let wa = _mm512_shuffle_f32x4::<0x88>(u[8 + c], u[12 + c]);
            let wb = _mm512_shuffle_f32x4::<0xdd>(u[8 + c], u[12 + c]);
            out[c] = _mm512_castps_si512(_mm512_shuffle_f32x4::<0x88>(va, wa));
            out[8 + c] = _mm512_castps_si512(_mm512_shuffle_f32x4::<0xdd>(va, wa));
            out[4 + c] = _mm512_castps_si512(_mm512_shuffle_f32x4::<0x88>(vb, wb));
            out[12 + c] = _mm512_castps_si512(_mm512_shuffle_f32x4::<0xdd>(vb, wb));
        }
        out
    }

    /// `dst[e*ldd + r] = src[r*lds + e]` for r, e < 16.
    /// Safety: AVX-512 F/BW/VL present; `src` valid for those 256 reads, `dst` for those writes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn transpose_f32_16x16(
        src: *const f32,
        lds: usize,
        dst: *mut f32,
        ldd: usize,
    ) {
        let mut rows = [_mm512_setzero_si512(); 16];
        for (r, v) in rows.iter_mut().enumerate() {
            *v = _mm512_castps_si512(_mm512_loadu_ps(src.add(r * lds)));
        }
        for (e, v) in transpose(rows).iter().enumerate() {
            _mm512_storeu_ps(dst.add(e * ldd), _mm512_castsi512_ps(*v));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// `dst[e*ldd + r] = src[r*lds + e]` for r, e < 8.
    /// Safety: AVX2 present; `src` valid for those 64 reads, `dst` for those writes.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn transpose_f32_8x8(src: *const f32, lds: usize, dst: *mut f32, ldd: usize) {
        let mut r = [_mm256_setzero_ps(); 8];
        for (i, v) in r.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(src.add(i * lds));
        }
        // 1. t[2i], t[2i+1]: rows 2i and 2i+1 interleaved (low and high pairs of each 128-bit half).
        let mut t = [_mm256_setzero_ps(); 8];
        for i in 0..4 {
            t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // 2. u[4g + c]: column c (and c + 4 in the high half) of rows 4g .. 4g + 4.
        let mut u = [_mm256_setzero_ps(); 8];
        for g in 0..2 {
            let (lo, hi, lo2, hi2) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
            u[4 * g] = _mm256_shuffle_ps::<0x44>(lo, lo2);
            u[4 * g + 1] = _mm256_shuffle_ps::<0xEE>(lo, lo2);
            u[4 * g + 2] = _mm256_shuffle_ps::<0x44>(hi, hi2);
            u[4 * g + 3] = _mm256_shuffle_ps::<0xEE>(hi, hi2);
        }
        // 3. Join the halves: column c from u[c] and u[4 + c] low halves, c + 4 from the high ones.
        for c in 0..4 {
            let low = _mm256_permute2f128_ps::<0x20>(u[c], u[4 + c]);
            let high = _mm256_permute2f128_ps::<0x31>(u[c], u[4 + c]);
            _mm256_storeu_ps(dst.add(c * ldd), low);
            _mm256_storeu_ps(dst.add((c + 4) * ldd), high);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::isa::IsaLevel;

    #[test]
    fn transpose_handles_partial_blocks() {
        for level in IsaLevel::available() {
            for (rows, cols) in [(1, 1), (16, 16), (37, 21), (64, 128), (5, 40)] {
                let (lds, ldd) = (cols + 3, rows + 1);
                let src: Vec<f32> = (0..rows * lds).map(|i| i as f32).collect();
                let mut dst = vec![-1.0; cols * ldd];
                transpose_f32(Isa::at_most(level), &src, lds, rows, cols, &mut dst, ldd);
                for r in 0..rows {
                    for c in 0..cols {
                        assert_eq!(dst[c * ldd + r], src[r * lds + c]);
                    }
                }
                assert!((0..cols).all(|c| dst[c * ldd + rows..(c + 1) * ldd]
                    .iter()
                    .all(|&v| v == -1.0)));
            }
        }
    }

    #[test]
    fn rounding_to_bf16_matches_the_dtype_module() {
        let x: Vec<f32> = (0..1000)
            .map(|i| (i as f32 - 500.0) * 0.01731 + 1.0 / 256.0)
            .chain([f32::INFINITY, -0.0, 1.0 + 1.0 / 256.0])
            .collect();
        for level in IsaLevel::available() {
            let mut out = vec![0u16; x.len()];
            round_to_bf16(Isa::at_most(level), &x, &mut out);
            for (&v, &o) in x.iter().zip(&out) {
                assert_eq!(o, crate::dtype::f32_to_bf16(v), "{v}");
            }
        }
        let mut nan = [0u16];
        round_to_bf16(Isa::detect(), &[f32::NAN], &mut nan);
        assert!(crate::dtype::bf16_to_f32(nan[0]).is_nan());
    }
}
