//! Sampling defaults read from a model's `generation_config.json` (temperature, top-p/k, min-p, penalties,
//! eos ids). Parsing only: deciding how request fields override these belongs to the API layer.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::tokenizer::TokenizerError;

/// What `generation_config.json` says about sampling. `None` means the file does not set the field.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    /// `false` means the model's authors intend greedy decoding by default.
    pub do_sample: Option<bool>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// `None` also when the file sets 0 or a negative value, which HF and vLLM read as "no top-k".
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub max_new_tokens: Option<u32>,
    /// `eos_token_id`, given in the file as one integer or a list.
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
}

impl GenerationDefaults {
    /// Reads and parses `generation_config.json`; errors name the file and the field.
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|source| TokenizerError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&value, path)
    }

    /// Parses the JSON object of a `generation_config.json`; `path` is only used in error messages.
    pub fn from_json(value: &Value, path: &Path) -> Result<Self, TokenizerError> {
        let Some(map) = value.as_object() else {
            return Err(field_error(path, "<root>", "a JSON object", value));
        };
        let fields = Fields { map, path };
        Ok(Self {
            do_sample: fields.bool("do_sample")?,
            temperature: fields.float("temperature")?,
            top_p: fields.float("top_p")?,
            top_k: fields
                .int("top_k")?
                .and_then(|k| u32::try_from(k).ok().filter(|&k| k > 0)),
            min_p: fields.float("min_p")?,
            repetition_penalty: fields.float("repetition_penalty")?,
            max_new_tokens: fields.token_count("max_new_tokens")?,
            eos_token_ids: fields.id_or_ids("eos_token_id")?,
            bos_token_id: fields.id("bos_token_id")?,
            pad_token_id: fields.id("pad_token_id")?,
        })
    }
}

struct Fields<'a> {
    map: &'a Map<String, Value>,
    path: &'a Path,
}

impl Fields<'_> {
    /// The field's value, with JSON `null` read as absent.
    fn get(&self, name: &str) -> Option<&Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    fn bool(&self, name: &str) -> Result<Option<bool>, TokenizerError> {
        self.get(name)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| field_error(self.path, name, "true or false", v))
            })
            .transpose()
    }

    fn float(&self, name: &str) -> Result<Option<f32>, TokenizerError> {
        self.get(name)
            .map(|v| {
                v.as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| field_error(self.path, name, "a number", v))
            })
            .transpose()
    }

    fn int(&self, name: &str) -> Result<Option<i64>, TokenizerError> {
        self.get(name)
            .map(|v| {
                v.as_i64()
                    .ok_or_else(|| field_error(self.path, name, "an integer", v))
            })
            .transpose()
    }

    fn token_count(&self, name: &str) -> Result<Option<u32>, TokenizerError> {
        self.get(name)
            .map(|v| {
                as_u32(v).ok_or_else(|| field_error(self.path, name, "a non-negative integer", v))
            })
            .transpose()
    }

    fn id(&self, name: &str) -> Result<Option<u32>, TokenizerError> {
        self.get(name)
            .map(|v| as_u32(v).ok_or_else(|| field_error(self.path, name, "a token id", v)))
            .transpose()
    }

    fn id_or_ids(&self, name: &str) -> Result<Vec<u32>, TokenizerError> {
        let expected = "a token id or a list of token ids";
        match self.get(name) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| as_u32(v).ok_or_else(|| field_error(self.path, name, expected, v)))
                .collect(),
            Some(v) => {
                Ok(vec![as_u32(v).ok_or_else(|| {
                    field_error(self.path, name, expected, v)
                })?])
            }
        }
    }
}

fn as_u32(value: &Value) -> Option<u32> {
    value.as_u64().and_then(|v| u32::try_from(v).ok())
}

fn field_error(path: &Path, field: &str, expected: &'static str, found: &Value) -> TokenizerError {
    TokenizerError::Field {
        path: PathBuf::from(path),
        field: field.to_string(),
        expected,
        found: found.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: Value) -> Result<GenerationDefaults, TokenizerError> {
        GenerationDefaults::from_json(&value, Path::new("generation_config.json"))
    }

    #[test]
    fn reads_every_sampling_field() {
        let d = parse(json!({
            "do_sample": true, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.05,
            "repetition_penalty": 1.05, "max_new_tokens": 512, "eos_token_id": [7, 9],
            "bos_token_id": 1, "pad_token_id": null
        }))
        .unwrap();
        assert_eq!(d.do_sample, Some(true));
        assert_eq!(d.temperature, Some(0.7));
        assert_eq!(d.top_p, Some(0.8));
        assert_eq!(d.top_k, Some(20));
        assert_eq!(d.min_p, Some(0.05));
        assert_eq!(d.repetition_penalty, Some(1.05));
        assert_eq!(d.max_new_tokens, Some(512));
        assert_eq!(d.eos_token_ids, vec![7, 9]);
        assert_eq!(d.bos_token_id, Some(1));
        assert_eq!(d.pad_token_id, None);
    }

    #[test]
    fn single_eos_id_and_disabled_top_k() {
        let d = parse(json!({"eos_token_id": 5, "top_k": 0})).unwrap();
        assert_eq!(d.eos_token_ids, vec![5]);
        assert_eq!(d.top_k, None);
        assert_eq!(parse(json!({"top_k": -1})).unwrap().top_k, None);
        assert_eq!(parse(json!({})).unwrap(), GenerationDefaults::default());
    }

    #[test]
    fn wrong_types_name_file_and_field() {
        let err = parse(json!({"temperature": "hot"}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("generation_config.json"), "{err}");
        assert!(err.contains("temperature"), "{err}");
        assert!(err.contains("\"hot\""), "{err}");
        let err = parse(json!({"eos_token_id": [1, -2]}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("eos_token_id") && err.contains("-2"), "{err}");
    }
}
