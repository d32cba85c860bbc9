//! Which SIMD instruction set the fast CPU kernels may use, decided once at run time.
//! An `Isa` that names AVX-512 can only be made after the CPU was seen to support it; that is the
//! invariant every `unsafe` call into a `#[target_feature]` kernel of this backend leans on.

use std::fmt;

/// The instruction-set level of the kernels (for reporting and for tests that force one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum IsaLevel {
    /// Portable Rust; the compiler's baseline target only.
    Scalar,
    /// AVX-512 F/BW/VL (with FMA and AVX2).
    Avx512,
}

/// Kernel selection proven by run-time detection. The field is private so that safe code cannot
/// claim features the CPU lacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Isa {
    level: IsaLevel,
    /// AVX512_BF16 (`vdpbf16ps`) present; only meaningful with `IsaLevel::Avx512`.
    bf16_dot: bool,
}

impl Isa {
    /// The best level this CPU supports.
    pub fn detect() -> Self {
        Self::at_most(IsaLevel::Avx512)
    }

    /// The best supported level that does not exceed `cap` (tests use it to force the scalar path).
    pub fn at_most(cap: IsaLevel) -> Self {
        let avx512 = cap >= IsaLevel::Avx512 && avx512_supported();
        if avx512 {
            Self {
                level: IsaLevel::Avx512,
                bf16_dot: avx512_bf16_supported(),
            }
        } else {
            Self {
                level: IsaLevel::Scalar,
                bf16_dot: false,
            }
        }
    }

    pub fn level(self) -> IsaLevel {
        self.level
    }

    pub fn avx512(self) -> bool {
        self.level == IsaLevel::Avx512
    }

    /// Whether `vdpbf16ps` may be used (AVX-512 level and the CPU has AVX512_BF16).
    pub fn bf16_dot(self) -> bool {
        self.bf16_dot
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.level, self.bf16_dot) {
            (IsaLevel::Scalar, _) => f.write_str("scalar"),
            (IsaLevel::Avx512, false) => f.write_str("avx512"),
            (IsaLevel::Avx512, true) => f.write_str("avx512+bf16"),
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn avx512_supported() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512_supported() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
fn avx512_bf16_supported() -> bool {
    is_x86_feature_detected!("avx512bf16")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512_bf16_supported() -> bool {
    false
}

/// Defines `fn name(isa: Isa, args..)` from a plain-Rust body that the compiler vectorises: the body is
/// compiled twice, once for the baseline target and once with AVX-512 enabled, and `isa` picks one.
/// Meant for loops without floating-point horizontal reductions (those do not vectorise without
/// reassociation; use the explicit kernels in `simd` for them).
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name(isa: $crate::cpu::isa::Isa, $($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn body($($arg: $ty),*) $(-> $ret)? $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            fn avx512($($arg: $ty),*) $(-> $ret)? {
                body($($arg),*)
            }

            #[cfg(target_arch = "x86_64")]
            if isa.avx512() {
                // SAFETY: an `Isa` reports AVX-512 only after run-time detection of every feature
                // enabled on `avx512` (see `Isa::at_most`).
                return unsafe { avx512($($arg),*) };
            }
            let _ = isa;
            body($($arg),*)
        }
    };
}

pub(crate) use multiversion;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_detection_never_exceeds_the_cap() {
        let scalar = Isa::at_most(IsaLevel::Scalar);
        assert_eq!(scalar.level(), IsaLevel::Scalar);
        assert!(!scalar.bf16_dot());
        let best = Isa::detect();
        assert!(best.level() >= scalar.level());
        if !best.avx512() {
            assert!(!best.bf16_dot());
        }
    }
}
