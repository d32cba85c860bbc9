//! The f32 register the matrix kernels (`gemv`, `tile`) are written against, one implementation per
//! SIMD level: 16 lanes of AVX-512, 8 lanes of AVX2. A kernel is one generic body; each level only
//! picks how many registers it holds at once (AVX2 has 16 registers, AVX-512 32).
//!
//! Every method is `unsafe` and `#[inline(always)]`: it may only run inside a function compiled
//! with the level's target features (where it is inlined, so the intrinsics become instructions),
//! and pointers must be valid for the lanes they name.

/// One SIMD register of f32 lanes.
pub(crate) trait F32Vec: Copy {
    const LANES: usize;
    unsafe fn zero() -> Self;
    unsafe fn splat(v: f32) -> Self;
    /// `LANES` values from `p`.
    unsafe fn load(p: *const f32) -> Self;
    /// The first `n` lanes from `p` (never reading beyond them), the rest zero.
    unsafe fn load_first(p: *const f32, n: usize) -> Self;
    /// `LANES` bf16 values from `p`, widened exactly.
    unsafe fn load_bf16(p: *const u16) -> Self;
    /// `LANES` e4m3fn codes from `p`, each as its value times 2^-120 (`mat::e4m3_bits_scaled_down`).
    unsafe fn load_e4m3_scaled_down(p: *const u8) -> Self;
    unsafe fn store(self, p: *mut f32);
    /// The first `n` lanes to `p` (never writing beyond them; nothing for `n == 0`).
    unsafe fn store_first(self, p: *mut f32, n: usize);
    /// `a * b + acc` with one rounding.
    unsafe fn mul_add(a: Self, b: Self, acc: Self) -> Self;
    unsafe fn mul(a: Self, b: Self) -> Self;
}

/// An element type weights are stored in, read into registers as f32.
pub(crate) trait Lanes: Copy {
    unsafe fn load<V: F32Vec>(p: *const Self) -> V;
}

impl Lanes for f32 {
    #[inline(always)]
    unsafe fn load<V: F32Vec>(p: *const Self) -> V {
        V::load(p)
    }
}

/// Raw bf16 bits.
impl Lanes for u16 {
    #[inline(always)]
    unsafe fn load<V: F32Vec>(p: *const Self) -> V {
        V::load_bf16(p)
    }
}

/// e4m3fn codes, read as their values times 2^-120 (the kernels multiply by the block's scale
/// times 2^120, `mat::Fp8Panels`).
impl Lanes for u8 {
    #[inline(always)]
    unsafe fn load<V: F32Vec>(p: *const Self) -> V {
        V::load_e4m3_scaled_down(p)
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::F32Vec;
    use crate::cpu::simd::avx512::lanes;
    use std::arch::x86_64::*;

    /// Sixteen f32 lanes (AVX-512 F/BW/VL).
    #[derive(Clone, Copy)]
    pub(crate) struct Avx512(__m512);

    impl F32Vec for Avx512 {
        const LANES: usize = 16;

        #[inline(always)]
        unsafe fn zero() -> Self {
            Self(_mm512_setzero_ps())
        }

        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            Self(_mm512_set1_ps(v))
        }

        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            Self(_mm512_loadu_ps(p))
        }

        #[inline(always)]
        unsafe fn load_first(p: *const f32, n: usize) -> Self {
            Self(_mm512_maskz_loadu_ps(lanes(n), p))
        }

        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> Self {
            let bits = _mm256_loadu_si256(p as *const __m256i);
            Self(_mm512_castsi512_ps(_mm512_slli_epi32::<16>(
                _mm512_cvtepu16_epi32(bits),
            )))
        }

        #[inline(always)]
        unsafe fn load_e4m3_scaled_down(p: *const u8) -> Self {
            // Sign-extended, shifted by 20: the sign lands on bit 31 (with copies on 27-30, masked
            // off) and exponent and mantissa on bits 20-26.
            let codes = _mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i));
            let bits = _mm512_and_si512(
                _mm512_slli_epi32::<20>(codes),
                _mm512_set1_epi32(0x87F0_0000u32 as i32),
            );
            Self(_mm512_castsi512_ps(bits))
        }

        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            _mm512_storeu_ps(p, self.0)
        }

        #[inline(always)]
        unsafe fn store_first(self, p: *mut f32, n: usize) {
            _mm512_mask_storeu_ps(p, lanes(n), self.0)
        }

        #[inline(always)]
        unsafe fn mul_add(a: Self, b: Self, acc: Self) -> Self {
            Self(_mm512_fmadd_ps(a.0, b.0, acc.0))
        }

        #[inline(always)]
        unsafe fn mul(a: Self, b: Self) -> Self {
            Self(_mm512_mul_ps(a.0, b.0))
        }
    }

    /// Eight f32 lanes (AVX2 + FMA).
    #[derive(Clone, Copy)]
    pub(crate) struct Avx2(__m256);

    /// Lane mask of the first `n` lanes (sign bit set) for `vmaskmovps`.
    #[inline(always)]
    unsafe fn first_lanes(n: usize) -> __m256i {
        let index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n.min(8) as i32), index)
    }

    impl F32Vec for Avx2 {
        const LANES: usize = 8;

        #[inline(always)]
        unsafe fn zero() -> Self {
            Self(_mm256_setzero_ps())
        }

        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            Self(_mm256_set1_ps(v))
        }

        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            Self(_mm256_loadu_ps(p))
        }

        #[inline(always)]
        unsafe fn load_first(p: *const f32, n: usize) -> Self {
            // Masked-off lanes of `vmaskmovps` are not accessed (no fault past the end).
            Self(_mm256_maskload_ps(p, first_lanes(n)))
        }

        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> Self {
            let bits = _mm_loadu_si128(p as *const __m128i);
            Self(_mm256_castsi256_ps(_mm256_slli_epi32::<16>(
                _mm256_cvtepu16_epi32(bits),
            )))
        }

        #[inline(always)]
        unsafe fn load_e4m3_scaled_down(p: *const u8) -> Self {
            // As for AVX-512: sign-extend, shift by 20, keep bit 31 and bits 20-26.
            let codes = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i));
            let bits = _mm256_and_si256(
                _mm256_slli_epi32::<20>(codes),
                _mm256_set1_epi32(0x87F0_0000u32 as i32),
            );
            Self(_mm256_castsi256_ps(bits))
        }

        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            _mm256_storeu_ps(p, self.0)
        }

        #[inline(always)]
        unsafe fn store_first(self, p: *mut f32, n: usize) {
            _mm256_maskstore_ps(p, first_lanes(n), self.0)
        }

        #[inline(always)]
        unsafe fn mul_add(a: Self, b: Self, acc: Self) -> Self {
            Self(_mm256_fmadd_ps(a.0, b.0, acc.0))
        }

        #[inline(always)]
        unsafe fn mul(a: Self, b: Self) -> Self {
            Self(_mm256_mul_ps(a.0, b.0))
        }
    }
}
