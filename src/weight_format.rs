//! Which form the weights take at load: the block-FP8 scheme they are quantized with, if any, and
//! the line `serve` prints about it. One decision for the loader and for what the user is told.

use crate::model_flags::{LoadFormat, Quantization};
use deltaserve_model::config::ModelConfig;
use deltaserve_model::quantization::Fp8Quantization;

/// The scheme generated or bf16 weights are quantized with as they load; `None` when they are read
/// as stored. A block-FP8 checkpoint is already what `--quantization fp8` asks for, so its weights
/// are read as stored (quantizing its dequantized values again would change nothing but load
/// time). Dummy weights for an FP8 checkpoint's config take that checkpoint's format, as its real
/// weights would: generated, then quantized with the config's own scheme.
pub fn fp8_scheme_at_load(
    load_format: LoadFormat,
    stated: Option<&Fp8Quantization>,
    flag: Option<Quantization>,
) -> Option<Fp8Quantization> {
    match (load_format, stated, flag) {
        (LoadFormat::Dummy, Some(stated), _) => Some(stated.clone()),
        (_, None, Some(Quantization::Fp8)) => Some(Fp8Quantization::qwen_default()),
        _ => None,
    }
}

/// The weights' form and where it comes from, for the start-up summary.
pub fn describe_weights(
    config: &ModelConfig,
    load_format: LoadFormat,
    flag: Option<Quantization>,
) -> String {
    let dtype = config
        .dtype
        .map_or("unknown dtype".to_string(), |d| d.to_string());
    let stated = config.quantization.as_ref();
    let generated = load_format == LoadFormat::Dummy;
    let fp8 = |block: [usize; 2]| format!("block FP8 ({} x {} blocks)", block[0], block[1]);
    match (fp8_scheme_at_load(load_format, stated, flag), stated) {
        (Some(scheme), Some(_)) => format!(
            "{}, dummy values quantized as config.json's quantization_config states",
            fp8(scheme.block)
        ),
        (Some(scheme), None) => format!(
            "{}, quantized at load from {dtype}{} (--quantization fp8)",
            fp8(scheme.block),
            if generated { " dummy values" } else { "" }
        ),
        (None, Some(scheme)) => format!(
            "{}, as stored (config.json quantization_config)",
            fp8(scheme.block)
        ),
        (None, None) if generated => format!("{dtype}, dummy values"),
        (None, None) => format!("{dtype}, as stored"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bf16 fixture's config, or the FP8 fixture's (the same with a `quantization_config`).
    fn config(fp8: bool) -> ModelConfig {
        let name = if fp8 { "qwen35_fp8" } else { "qwen35_bf16" };
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        ModelConfig::from_dir(&dir).unwrap()
    }

    #[test]
    fn each_combination_says_where_its_weights_come_from() {
        let fp8 = Some(Quantization::Fp8);
        let cases = [
            (false, LoadFormat::Auto, None, "as stored", false),
            (false, LoadFormat::Dummy, None, "dummy values", false),
            (false, LoadFormat::Auto, fp8, "quantized at load", true),
            (false, LoadFormat::Dummy, fp8, "quantized at load", true),
            (
                true,
                LoadFormat::Auto,
                None,
                "as stored (config.json",
                false,
            ),
            (true, LoadFormat::Auto, fp8, "as stored (config.json", false),
            (
                true,
                LoadFormat::Dummy,
                None,
                "quantization_config states",
                true,
            ),
            (
                true,
                LoadFormat::Dummy,
                fp8,
                "quantization_config states",
                true,
            ),
        ];
        for (stated, format, flag, phrase, quantizes) in cases {
            let c = config(stated);
            let line = describe_weights(&c, format, flag);
            assert!(
                line.contains(phrase),
                "{stated} {format:?} {flag:?}: {line}"
            );
            assert_eq!(line.starts_with("block FP8"), stated || quantizes, "{line}");
            let scheme = fp8_scheme_at_load(format, c.quantization.as_ref(), flag);
            assert_eq!(scheme.is_some(), quantizes, "{stated} {format:?} {flag:?}");
        }
    }
}
