//! Horizontal reductions that the compiler will not vectorise on its own (float sums are not
//! reassociated): the dot product, with AVX-512 and AVX2 kernels and a portable fallback. Elementwise loops
//! do not belong here; they are plain Rust compiled through `multiversion!`.

use super::isa::Isa;

/// `sum_i a[i] * b[i]` over the common length, f32 accumulation in several partial sums.
pub(crate) fn dot(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        // SAFETY: `isa` proves AVX-512 F/BW/VL; both pointers are valid for `n` reads.
        return unsafe { avx512::dot(a.as_ptr(), b.as_ptr(), n) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: `isa` proves AVX2 and FMA; both pointers are valid for `n` reads.
        return unsafe { avx2::dot(a.as_ptr(), b.as_ptr(), n) };
    }
    let _ = isa;
    dot_portable(&a[..n], &b[..n])
}

pub(crate) fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    /// Mask of the first `n` (< 16) lanes.
    #[inline(always)]
    pub(crate) fn lanes(n: usize) -> __mmask16 {
        ((1u32 << n.min(16)) - 1) as __mmask16
    }

    /// Safety: the CPU supports AVX-512 F/BW/VL; `a` and `b` are valid for `n` f32 reads.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(crate) unsafe fn dot(a: *const f32, b: *const f32, n: usize) -> f32 {
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut i = 0;
        while i + 64 <= n {
            for (u, slot) in acc.iter_mut().enumerate() {
                let x = _mm512_loadu_ps(a.add(i + 16 * u));
                let y = _mm512_loadu_ps(b.add(i + 16 * u));
                *slot = _mm512_fmadd_ps(x, y, *slot);
            }
            i += 64;
        }
        while i + 16 <= n {
            acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(i)), _mm512_loadu_ps(b.add(i)), acc[0]);
            i += 16;
        }
        if i < n {
            let m = lanes(n - i);
            let x = _mm512_maskz_loadu_ps(m, a.add(i));
            let y = _mm512_maskz_loadu_ps(m, b.add(i));
            acc[1] = _mm512_fmadd_ps(x, y, acc[1]);
        }
        let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        _mm512_reduce_add_ps(sum)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Safety: the CPU supports AVX2 and FMA; `a` and `b` are valid for `n` f32 reads.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot(a: *const f32, b: *const f32, n: usize) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (u, slot) in acc.iter_mut().enumerate() {
                let x = _mm256_loadu_ps(a.add(i + 8 * u));
                let y = _mm256_loadu_ps(b.add(i + 8 * u));
                *slot = _mm256_fmadd_ps(x, y, *slot);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), acc[0]);
            i += 8;
        }
        let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let half = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps::<1>(sum));
        let pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
        let mut total = _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps::<1>(pairs, pairs)));
        while i < n {
            total = (*a.add(i)).mul_add(*b.add(i), total);
            i += 1;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::isa::IsaLevel;

    #[test]
    fn dot_matches_f64_for_every_tail_length() {
        for level in IsaLevel::available() {
            let isa = Isa::at_most(level);
            for n in [0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 130, 1000] {
                let a: Vec<f32> = (0..n)
                    .map(|i| ((i * 7919) % 113) as f32 / 57.0 - 1.0)
                    .collect();
                let b: Vec<f32> = (0..n)
                    .map(|i| ((i * 104729) % 97) as f32 / 49.0 - 1.0)
                    .collect();
                let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
                let got = dot(isa, &a, &b) as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{isa} n={n}: {got} vs {want}"
                );
            }
        }
    }
}
