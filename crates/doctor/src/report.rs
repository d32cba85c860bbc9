//! One row of a doctor report: what was compared, how far apart the two backends were, and whether
//! that is within tolerance.

/// Error of a backend's output against the reference's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    pub max_abs: f32,
    /// `max_abs / max |reference|`: scale-free, so one tolerance fits every op.
    pub relative: f32,
}

impl Comparison {
    pub fn of(ours: &[f32], reference: &[f32]) -> Self {
        assert_eq!(
            ours.len(),
            reference.len(),
            "compared outputs differ in length"
        );
        let mut max_abs = 0.0f32;
        let mut scale = 0.0f32;
        for (&a, &b) in ours.iter().zip(reference) {
            let d = (a - b).abs();
            // A NaN anywhere must fail, never compare as small.
            max_abs = if d.is_nan() {
                f32::NAN
            } else if max_abs.is_nan() {
                max_abs
            } else {
                max_abs.max(d)
            };
            scale = scale.max(b.abs());
        }
        let relative = if scale > 0.0 {
            max_abs / scale
        } else {
            max_abs
        };
        Self { max_abs, relative }
    }

    /// Combines the comparisons of several outputs of one op (e.g. output and updated state).
    pub fn worst(self, other: Self) -> Self {
        let pick = |a: f32, b: f32| {
            if a.is_nan() || b.is_nan() {
                f32::NAN
            } else {
                a.max(b)
            }
        };
        Self {
            max_abs: pick(self.max_abs, other.max_abs),
            relative: pick(self.relative, other.relative),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct CheckRow {
    /// The op or stage, e.g. `attention (prefill, 2 sequences)` or `hidden after layer`.
    pub what: String,
    /// The layer whose weights or output were used, when there is one.
    pub layer: Option<usize>,
    /// `linear_attention`, `full_attention`, `mtp`, `model`.
    pub layer_kind: &'static str,
    pub comparison: Comparison,
    pub tolerance: f32,
}

impl CheckRow {
    pub fn passed(&self) -> bool {
        self.comparison.relative <= self.tolerance
    }

    pub fn location(&self) -> String {
        match self.layer {
            Some(l) => format!("layer {l} ({})", self.layer_kind),
            None => self.layer_kind.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_fails_and_relative_is_scale_free() {
        let c = Comparison::of(&[1.0, 2.0], &[1.0, 2.5]);
        assert_eq!(c.max_abs, 0.5);
        assert_eq!(c.relative, 0.2);
        let row = CheckRow {
            what: "x".into(),
            layer: None,
            layer_kind: "model",
            comparison: Comparison::of(&[f32::NAN], &[1.0]),
            tolerance: 1.0,
        };
        assert!(!row.passed());
    }
}
