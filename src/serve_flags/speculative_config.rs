//! vLLM's `--speculative-config` JSON (`{"method": "mtp", "num_speculative_tokens": 2}`), read into
//! the same settings as SGLang's `--speculative-algorithm NEXTN --speculative-num-steps N`.

use serde_json::{Map, Value};

use crate::serve_flags::args::ArgsError;

/// The settings a vLLM speculative config asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VllmSpeculation {
    /// Draft tokens per step (SGLang's `--speculative-num-steps` with top-k 1).
    pub num_speculative_tokens: usize,
    /// vLLM's `disable_by_batch_size` (SGLang's `--speculative-disable-batch-size`).
    pub disable_by_batch_size: Option<usize>,
}

/// Methods that draft with the model's own MTP head.
const MTP_METHODS: [&str; 3] = ["mtp", "qwen3_next_mtp", "qwen3_5_mtp"];
/// Methods that need another drafter.
const OTHER_METHODS: [&str; 8] = [
    "eagle",
    "eagle3",
    "ngram",
    "medusa",
    "mlp_speculator",
    "draft_model",
    "suffix",
    "deepseek_mtp",
];
const KEYS: &str =
    "method, num_speculative_tokens, disable_by_batch_size, draft_tensor_parallel_size";
/// vLLM's default draft length for an MTP head: the model's one MTP layer.
const DEFAULT_MTP_TOKENS: usize = 1;

fn refuse<T>(message: String) -> Result<T, ArgsError> {
    Err(ArgsError(format!("--speculative-config: {message}")))
}

/// Parses the JSON object of `--speculative-config`.
pub fn parse(json: &str) -> Result<VllmSpeculation, ArgsError> {
    let value: Value = match serde_json::from_str(json) {
        Ok(value) => value,
        Err(e) => return refuse(format!("{json:?} is not JSON ({e})")),
    };
    let Some(object) = value.as_object() else {
        return refuse(format!("expected a JSON object, found {value}"));
    };
    if let Some(key) = object
        .keys()
        .find(|k| !KEYS.split(", ").any(|known| known == k.as_str()))
    {
        let why = if key == "model" {
            " (deltaserve drafts with the model's own MTP head, never with a separate draft model)"
        } else {
            ""
        };
        return refuse(format!(
            "key {key:?} is not supported{why}; accepted keys: {KEYS}"
        ));
    }
    match object.get("method").map(|m| (m, m.as_str())) {
        None => return refuse(r#"no "method"; use {"method": "mtp", ...}"#.to_string()),
        Some((_, Some(method))) if MTP_METHODS.contains(&method) => {}
        Some((_, Some(method))) if OTHER_METHODS.contains(&method) => {
            return refuse(format!(
                "method {method:?} is not supported: deltaserve drafts with the model's own MTP head; use \
                 \"mtp\" (or \"qwen3_next_mtp\")"
            ))
        }
        Some((m, _)) => {
            return refuse(format!(
                "method {m} is unknown; the supported methods are {}",
                MTP_METHODS.join(", ")
            ))
        }
    }
    let num_speculative_tokens =
        count(object, "num_speculative_tokens")?.unwrap_or(DEFAULT_MTP_TOKENS);
    if num_speculative_tokens == 0 {
        return refuse("num_speculative_tokens must be at least 1, found 0".into());
    }
    if let Some(tp) = count(object, "draft_tensor_parallel_size")? {
        if tp != 1 {
            return refuse(format!(
                "draft_tensor_parallel_size {tp} is not supported: the MTP head runs on the target's one device"
            ));
        }
    }
    Ok(VllmSpeculation {
        num_speculative_tokens,
        disable_by_batch_size: count(object, "disable_by_batch_size")?,
    })
}

fn count(object: &Map<String, Value>, key: &str) -> Result<Option<usize>, ArgsError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => match value.as_u64().and_then(|n| usize::try_from(n).ok()) {
            Some(n) => Ok(Some(n)),
            None => refuse(format!(
                "{key} must be a non-negative integer, found {value}"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtp_methods_map_to_draft_counts() {
        let spec = parse(r#"{"method":"mtp","num_speculative_tokens":2}"#).unwrap();
        assert_eq!(
            spec,
            VllmSpeculation {
                num_speculative_tokens: 2,
                disable_by_batch_size: None
            }
        );
        let spec = parse(
            r#"{"method": "qwen3_next_mtp", "num_speculative_tokens": 3, "disable_by_batch_size": 8}"#,
        )
        .unwrap();
        assert_eq!(
            (spec.num_speculative_tokens, spec.disable_by_batch_size),
            (3, Some(8))
        );
        assert_eq!(
            parse(r#"{"method":"mtp"}"#).unwrap().num_speculative_tokens,
            1
        );
    }

    #[test]
    fn refusals_say_why() {
        let e = parse(r#"{"method":"eagle3","num_speculative_tokens":3}"#)
            .unwrap_err()
            .0;
        assert!(e.contains("eagle3") && e.contains("own MTP head"), "{e}");
        let e = parse(r#"{"method":"mtp","model":"x/y"}"#).unwrap_err().0;
        assert!(e.contains("\"model\"") && e.contains("draft model"), "{e}");
        let e = parse("{method: mtp}").unwrap_err().0;
        assert!(
            e.contains("--speculative-config") && e.contains("not JSON"),
            "{e}"
        );
        let e = parse(r#"{"num_speculative_tokens":2}"#).unwrap_err().0;
        assert!(e.contains("method"), "{e}");
        let e = parse(r#"{"method":"mtp","num_speculative_tokens":-1}"#)
            .unwrap_err()
            .0;
        assert!(e.contains("num_speculative_tokens"), "{e}");
        let e = parse(r#"{"method":"mtp","num_speculative_tokens":0}"#)
            .unwrap_err()
            .0;
        assert!(e.contains("at least 1"), "{e}");
    }
}
