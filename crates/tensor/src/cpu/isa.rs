//! Which SIMD instruction set the fast CPU kernels may use, decided once at run time.
//! An `Isa` that names AVX2 or AVX-512 can only be made after the CPU was seen to support it; that
//! is the invariant every `unsafe` call into a `#[target_feature]` kernel of this backend leans on.

use std::fmt;

/// The environment variable that caps the kernel level of every cpu backend built with default
/// options (`scalar`, `avx2` or `avx512`): CI and users on a machine with more can run the others.
pub const CPU_LEVEL_ENV: &str = "DELTASERVE_CPU_LEVEL";

/// The instruction-set level of the kernels (for reporting and for tests that force one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum IsaLevel {
    /// Portable Rust; the compiler's baseline target only.
    Scalar,
    /// AVX2 with FMA (8-lane f32 registers).
    Avx2,
    /// AVX-512 F/BW/VL (with FMA and AVX2).
    Avx512,
}

impl IsaLevel {
    pub const ALL: [IsaLevel; 3] = [IsaLevel::Scalar, IsaLevel::Avx2, IsaLevel::Avx512];

    /// The name `DELTASERVE_CPU_LEVEL` and the reports use.
    pub fn name(self) -> &'static str {
        match self {
            IsaLevel::Scalar => "scalar",
            IsaLevel::Avx2 => "avx2",
            IsaLevel::Avx512 => "avx512",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|l| l.name() == name.trim())
    }

    /// The cap set by `DELTASERVE_CPU_LEVEL`: `Ok(None)` when unset, an error naming the accepted
    /// values when it holds anything else.
    pub fn from_env() -> Result<Option<Self>, String> {
        match std::env::var(CPU_LEVEL_ENV) {
            Err(std::env::VarError::NotPresent) => Ok(None),
            Ok(v) if v.trim().is_empty() => Ok(None),
            Ok(v) => Self::parse(&v).map(Some).ok_or_else(|| {
                format!("{CPU_LEVEL_ENV}={v:?}: expected one of scalar, avx2, avx512")
            }),
            Err(e) => Err(format!("{CPU_LEVEL_ENV}: {e}")),
        }
    }

    /// Whether this CPU runs kernels of this level.
    pub fn supported(self) -> bool {
        match self {
            IsaLevel::Scalar => true,
            IsaLevel::Avx2 => avx2_supported(),
            IsaLevel::Avx512 => avx512_supported(),
        }
    }

    /// Every level this CPU runs, lowest first (tests run each).
    pub fn available() -> Vec<Self> {
        Self::ALL.into_iter().filter(|l| l.supported()).collect()
    }
}

impl fmt::Display for IsaLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
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

    /// The best supported level that does not exceed `cap` (tests use it to force a lower level).
    pub fn at_most(cap: IsaLevel) -> Self {
        let level = IsaLevel::ALL
            .into_iter()
            .rev()
            .find(|&l| l <= cap && l.supported())
            .unwrap_or(IsaLevel::Scalar);
        Self {
            level,
            bf16_dot: level == IsaLevel::Avx512 && avx512_bf16_supported(),
        }
    }

    pub fn level(self) -> IsaLevel {
        self.level
    }

    pub fn avx512(self) -> bool {
        self.level == IsaLevel::Avx512
    }

    pub fn avx2(self) -> bool {
        self.level == IsaLevel::Avx2
    }

    /// Whether `vdpbf16ps` may be used (AVX-512 level and the CPU has AVX512_BF16).
    pub fn bf16_dot(self) -> bool {
        self.bf16_dot
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.level.name())?;
        if self.bf16_dot {
            f.write_str("+bf16")?;
        }
        Ok(())
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_supported() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_supported() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
fn avx512_supported() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && avx2_supported()
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
/// compiled three times, for the baseline target, with AVX2 + FMA and with AVX-512 enabled, and `isa`
/// picks one.
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
            #[target_feature(enable = "avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            fn avx2($($arg: $ty),*) $(-> $ret)? {
                body($($arg),*)
            }

            #[cfg(target_arch = "x86_64")]
            if isa.avx2() {
                // SAFETY: an `Isa` reports AVX2 only after run-time detection of AVX2 and FMA
                // (see `Isa::at_most`).
                return unsafe { avx2($($arg),*) };
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
        for cap in IsaLevel::ALL {
            let isa = Isa::at_most(cap);
            assert!(isa.level() <= cap, "{isa} above the cap {cap}");
            assert!(isa.level().supported());
            assert_eq!(isa.bf16_dot(), isa.avx512() && Isa::detect().bf16_dot());
            if cap.supported() {
                assert_eq!(isa.level(), cap, "a supported cap is the level itself");
            }
        }
        assert_eq!(
            Isa::detect().level(),
            *IsaLevel::available().last().unwrap()
        );
        if IsaLevel::Avx512.supported() {
            assert!(
                IsaLevel::Avx2.supported(),
                "AVX-512 detection implies AVX2 + FMA"
            );
        }
    }

    #[test]
    fn level_names_round_trip() {
        for level in IsaLevel::ALL {
            assert_eq!(IsaLevel::parse(level.name()), Some(level));
        }
        assert_eq!(IsaLevel::parse(" avx2\n"), Some(IsaLevel::Avx2));
        assert_eq!(IsaLevel::parse("avx"), None);
    }
}
