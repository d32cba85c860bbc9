//! Value types of the `serve` flags that SGLang and vLLM share with deltaserve (`--dtype`,
//! `--kv-cache-dtype`, `--log-level`, `--schedule-policy`) and what each value means here. Values
//! deltaserve cannot honour are refused while parsing, with a message that says why and what to use.

use clap::ValueEnum;
use serde_json::{Map, Value};

use crate::serve_flags::args::ArgsError;

/// `--dtype`: the data type the weights run in. deltaserve runs them as the checkpoint stores them,
/// so a value is a check against the checkpoint, never a conversion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelDtype {
    /// Whatever the checkpoint stores.
    #[default]
    Auto,
    BFloat16,
    Float16,
    Float32,
}

impl ModelDtype {
    /// Parses SGLang's and vLLM's spellings.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "bfloat16" | "bf16" => Ok(Self::BFloat16),
            "float16" | "half" | "fp16" => Ok(Self::Float16),
            "float32" | "float" | "fp32" => Ok(Self::Float32),
            _ => Err(format!(
                "{value:?} is not a dtype; accepted: auto, bfloat16 (bf16), float16 (half), float32 (float)"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::BFloat16 => "bfloat16",
            Self::Float16 => "float16",
            Self::Float32 => "float32",
        }
    }

    /// Refuses a `--dtype` that differs from the checkpoint's: converting the weights would change
    /// every output, and the reference checks prove the backends on the stored dtype only.
    pub fn check_against(self, checkpoint: ModelDtype) -> Result<(), ArgsError> {
        if self == Self::Auto || checkpoint == Self::Auto || self == checkpoint {
            return Ok(());
        }
        Err(ArgsError(format!(
            "--dtype {} would convert the checkpoint's {} weights, which changes every output; deltaserve runs \
             weights in the dtype they are stored in (use --dtype auto or --dtype {})",
            self.as_str(),
            checkpoint.as_str(),
            checkpoint.as_str()
        )))
    }
}

/// `--kv-cache-dtype`, as given; `kv_cache_dtype::resolve_kv_cache_dtype` decides what it means on
/// the backend that runs the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCacheDtype {
    #[default]
    Auto,
    BFloat16,
    Float32,
}

impl KvCacheDtype {
    /// Parses SGLang's and vLLM's spellings; fp8 variants are refused with the reason.
    pub fn parse(value: &str) -> Result<Self, String> {
        let lower = value.to_ascii_lowercase();
        match lower.as_str() {
            "auto" => Ok(Self::Auto),
            "bf16" | "bfloat16" => Ok(Self::BFloat16),
            "fp32" | "float32" => Ok(Self::Float32),
            _ if lower.starts_with("fp8") => Err(format!(
                "{value} is refused: an fp8 KV cache changes the model's outputs and deltaserve has no fp8 \
                 attention kernels proven against the reference; use auto (the backend's choice), bf16 or fp32"
            )),
            _ => Err(format!(
                "{value:?} is not supported; accepted: auto, bf16 (bfloat16), fp32 (float32)"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::BFloat16 => "bf16",
            Self::Float32 => "fp32",
        }
    }
}

/// `--log-level` (SGLang's levels; vLLM's `VLLM_LOGGING_LEVEL` uses the same names).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum LogLevel {
    Debug,
    /// Start-up summary, canary result, periodic decode lines and warnings.
    #[default]
    Info,
    /// Warnings (degenerate output, compatibility notes) and errors only.
    #[value(alias = "warn")]
    Warning,
    Error,
    #[value(alias = "fatal")]
    Critical,
}

impl LogLevel {
    /// Parses a level case-insensitively (environment variables are usually upper case).
    pub fn parse(value: &str) -> Option<Self> {
        <Self as ValueEnum>::from_str(value, true).ok()
    }

    /// Informational lines (start-up summary, decode statistics) are printed.
    pub fn shows_info(self) -> bool {
        self <= Self::Info
    }

    /// Warnings (and compatibility notes) are printed.
    pub fn shows_warnings(self) -> bool {
        self <= Self::Warning
    }
}

/// `--schedule-policy` (SGLang) / `--scheduling-policy` (vLLM): the order waiting requests are
/// admitted in. deltaserve admits first come, first served.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchedulePolicy {
    #[default]
    Fcfs,
    Lpm,
    Random,
    DfsWeight,
    Lof,
    Priority,
}

impl SchedulePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fcfs => "fcfs",
            Self::Lpm => "lpm",
            Self::Random => "random",
            Self::DfsWeight => "dfs-weight",
            Self::Lof => "lof",
            Self::Priority => "priority",
        }
    }
}

/// `--default-chat-template-kwargs` (vLLM): a JSON object of template variables every chat request
/// starts from (`{"enable_thinking": false}`); a request's own `chat_template_kwargs` win.
pub fn parse_template_kwargs(value: &str) -> Result<Map<String, Value>, String> {
    let object = match serde_json::from_str::<Value>(value) {
        Ok(Value::Object(object)) => object,
        Ok(other) => return Err(format!("expected a JSON object, found {other}")),
        Err(e) => return Err(format!("{value:?} is not JSON ({e})")),
    };
    if let Some(name) = object
        .keys()
        .find(|k| deltaserve_text::RESERVED_VARIABLES.contains(&k.as_str()))
    {
        return Err(format!(
            "{name:?} is set by the server itself and cannot be a template kwarg"
        ));
    }
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_kwargs_are_an_object_without_reserved_names() {
        let kwargs = parse_template_kwargs(r#"{"enable_thinking": false}"#).unwrap();
        assert_eq!(kwargs["enable_thinking"], Value::Bool(false));
        assert!(parse_template_kwargs("[1]").unwrap_err().contains("object"));
        assert!(parse_template_kwargs("{enable_thinking}")
            .unwrap_err()
            .contains("not JSON"));
        assert!(parse_template_kwargs(r#"{"messages": []}"#)
            .unwrap_err()
            .contains("\"messages\""));
    }

    #[test]
    fn dtype_spellings_and_checkpoint_check() {
        assert_eq!(ModelDtype::parse("half"), Ok(ModelDtype::Float16));
        assert_eq!(ModelDtype::parse("BF16"), Ok(ModelDtype::BFloat16));
        assert!(ModelDtype::parse("int8").is_err());
        assert!(ModelDtype::Auto.check_against(ModelDtype::BFloat16).is_ok());
        assert!(ModelDtype::BFloat16
            .check_against(ModelDtype::BFloat16)
            .is_ok());
        let e = ModelDtype::Float16
            .check_against(ModelDtype::BFloat16)
            .unwrap_err()
            .0;
        assert!(
            e.contains("--dtype float16") && e.contains("--dtype bfloat16"),
            "{e}"
        );
    }

    #[test]
    fn kv_cache_dtype_refuses_fp8_with_the_reason() {
        assert_eq!(KvCacheDtype::parse("bfloat16"), Ok(KvCacheDtype::BFloat16));
        assert_eq!(KvCacheDtype::parse("fp32"), Ok(KvCacheDtype::Float32));
        assert_eq!(KvCacheDtype::parse("auto"), Ok(KvCacheDtype::Auto));
        for fp8 in ["fp8", "fp8_e4m3", "fp8_e5m2"] {
            let e = KvCacheDtype::parse(fp8).unwrap_err();
            assert!(e.contains("fp8 KV cache") && e.contains("bf16"), "{e}");
        }
        assert!(KvCacheDtype::parse("float16")
            .unwrap_err()
            .contains("accepted"));
    }

    #[test]
    fn log_levels_order() {
        assert_eq!(LogLevel::parse("WARNING"), Some(LogLevel::Warning));
        assert_eq!(LogLevel::parse("warn"), Some(LogLevel::Warning));
        assert_eq!(LogLevel::parse("loud"), None);
        assert!(LogLevel::Debug.shows_info() && LogLevel::Info.shows_info());
        assert!(!LogLevel::Warning.shows_info() && LogLevel::Warning.shows_warnings());
        assert!(!LogLevel::Error.shows_warnings());
    }
}
