//! Scalar f32 math written so the compiler can vectorise it inside `multiversion!` bodies: `exp`
//! without a libm call, and the activations built on it. No SIMD intrinsics and no state here.

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in a part with few mantissa bits (exact products with small integers) and the rest.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 * 2^23: adding it rounds an f32 of magnitude < 2^22 to an integer held in the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;
/// Below this, e^x (< 4.5e-38) is returned as 0 so that 2^n stays a normal number.
const EXP_LOW: f32 = -86.0;
/// Above this, e^x overflows f32.
const EXP_HIGH: f32 = 88.722_83;

/// e^x with a relative error below 3e-7 for x in [-86, 88.72]; 0 below, +inf above, NaN for NaN.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    let xc = x.clamp(EXP_LOW, EXP_HIGH);
    let shifted = xc * LOG2E + ROUND_MAGIC;
    let n = shifted - ROUND_MAGIC;
    let n_int = shifted.to_bits() as i32 - ROUND_MAGIC.to_bits() as i32;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    // Taylor series of e^r to degree 7 on |r| <= ln2/2 (truncation error < 5e-9 relative).
    let p = 1.0 / 5040.0;
    let p = p * r + 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    // 2^n as 2 * 2^(n-1) so that n = 128 (x near the top of the range) still has a valid exponent.
    let scale = f32::from_bits(((n_int + 126) as u32) << 23);
    let value = p * scale * 2.0;
    if x < EXP_LOW {
        0.0
    } else if x > EXP_HIGH {
        f32::INFINITY
    } else {
        value
    }
}

/// `x * sigmoid(x)`.
#[inline(always)]
pub(crate) fn silu_f32(x: f32) -> f32 {
    x / (1.0 + exp_f32(-x))
}

/// `1 / (1 + e^-x)`.
#[inline(always)]
pub(crate) fn sigmoid_f32(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate_over_its_range() {
        let mut worst = 0.0f64;
        let mut x = -86.0f32;
        while x <= 88.7 {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst:e}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-100.0), 0.0);
        assert_eq!(exp_f32(89.0), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
    }

    #[test]
    fn activations_saturate_cleanly() {
        assert_eq!(sigmoid_f32(-200.0), 0.0);
        assert_eq!(sigmoid_f32(200.0), 1.0);
        assert_eq!(silu_f32(-200.0), 0.0);
        assert!((silu_f32(1.0) - 0.731_058_6).abs() < 1e-6);
    }
}
