//! The float8 e4m3fn number format (torch `float8_e4m3fn`, safetensors `F8_E4M3`): 1 sign bit, a
//! 4-bit exponent with bias 7 and a 3-bit mantissa. Exponent 0 holds the subnormals `m * 2^-9`;
//! there is no infinity, and the two codes with every exponent and mantissa bit set (0x7f, 0xff)
//! are NaN, so the largest finite magnitude is 0x7e = 1.75 * 2^8 = 448.

/// The largest finite e4m3fn magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// The scale of a block of values whose largest magnitude is `amax`, as Qwen's and DeepSeek's FP8
/// recipe sets it for weights (128 x 128) and activations (1 x 128): `amax / 448`, so the block's
/// codes span e4m3's range; 1 for an all-zero block.
pub fn block_scale(amax: f32) -> f32 {
    if amax > 0.0 {
        amax / E4M3_MAX
    } else {
        1.0
    }
}

/// The value of one e4m3fn code, exactly (every code is an f32).
pub fn e4m3_to_f32(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((code >> 3) & 0x0f);
    let mantissa = f32::from(code & 0x07);
    let magnitude = match exponent {
        15 if mantissa == 7.0 => return f32::NAN,
        0 => mantissa * 2f32.powi(-9),
        _ => (8.0 + mantissa) * 2f32.powi(exponent - 10),
    };
    sign * magnitude
}

/// The e4m3fn code nearest to `x`, ties to the even code (the rounding of torch's cast). Finite
/// values beyond +-448 saturate to +-448, as quantizers clamp before the cast (torch itself turns
/// magnitudes from 464 up into NaN); NaN gives 0x7f.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    // Below the smallest normal (2^-6) the step is 2^-9: the code is the rounded multiple, and a
    // multiple of 8 is the smallest normal's code, 0x08, by the same arithmetic.
    if a < 2f32.powi(-6) {
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    // Normal: a = s * 2^(e-3) with s in [8, 16); scaling by a power of two is exact in f32.
    let mut e = a.log2().floor() as i32;
    // log2 may land one off right at a power of two; fix the binade so s lands in [8, 16).
    if a < 2f32.powi(e) {
        e -= 1;
    } else if a >= 2f32.powi(e + 1) {
        e += 1;
    }
    let mut significand = (a * 2f32.powi(3 - e)).round_ties_even() as i32;
    if significand == 16 {
        significand = 8;
        e += 1;
    }
    let biased = e + 7;
    if biased > 15 || (biased == 15 && significand > 14) {
        return sign | 0x7e;
    }
    sign | ((biased as u8) << 3) | (significand - 8) as u8
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// `tests/fixtures/e4m3fn_torch.txt`, written by scripts/make_fp8_fixture.py with torch.
    struct TorchTable {
        /// The f32 bits torch gives for each of the 256 codes.
        decoded: Vec<u32>,
        /// (f32 bits of a probe value, the code torch casts it to).
        casts: Vec<(u32, u8)>,
    }

    fn torch_table() -> TorchTable {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/e4m3fn_torch.txt");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut table = TorchTable {
            decoded: Vec::new(),
            casts: Vec::new(),
        };
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let hex = |s: &str| u32::from_str_radix(s, 16).unwrap();
            match fields.as_slice() {
                ["decode", code, bits] => {
                    assert_eq!(hex(code) as usize, table.decoded.len(), "codes in order");
                    table.decoded.push(hex(bits));
                }
                ["cast", bits, code] => table.casts.push((hex(bits), hex(code) as u8)),
                other => panic!("unexpected line {other:?}"),
            }
        }
        table
    }

    #[test]
    fn every_code_decodes_as_torch_does() {
        let table = torch_table();
        assert_eq!(table.decoded.len(), 256);
        for (code, &bits) in table.decoded.iter().enumerate() {
            let ours = e4m3_to_f32(code as u8);
            let theirs = f32::from_bits(bits);
            if theirs.is_nan() {
                assert!(ours.is_nan(), "code {code:#04x}: torch NaN, ours {ours}");
            } else {
                assert_eq!(ours.to_bits(), bits, "code {code:#04x}: {ours} vs {theirs}");
            }
        }
        let nans: Vec<usize> = (0..256)
            .filter(|&c| e4m3_to_f32(c as u8).is_nan())
            .collect();
        assert_eq!(nans, [0x7f, 0xff]);
        assert_eq!(e4m3_to_f32(0x7e), E4M3_MAX);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn casts_round_to_nearest_even_as_torch_does() {
        let table = torch_table();
        assert!(table.casts.len() > 500, "{} probes", table.casts.len());
        for &(bits, code) in &table.casts {
            let x = f32::from_bits(bits);
            assert_eq!(
                f32_to_e4m3(x),
                code,
                "{x:e} ({bits:#010x}): torch gives {code:#04x}"
            );
        }
    }

    #[test]
    fn every_finite_code_round_trips() {
        for code in 0..=255u8 {
            let value = e4m3_to_f32(code);
            if !value.is_nan() {
                assert_eq!(f32_to_e4m3(value), code, "{value}");
            }
        }
        assert_eq!(f32_to_e4m3(1e9), 0x7e);
        assert_eq!(f32_to_e4m3(-500.0), 0xfe);
        assert_eq!(f32_to_e4m3(f32::NAN), 0x7f);
        assert_eq!(
            f32_to_e4m3(2f32.powi(-11)),
            0,
            "a quarter step rounds to zero"
        );
    }
}
