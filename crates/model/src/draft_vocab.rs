//! `--speculative-token-map` (SGLang's flag; FR-Spec): the draft model's output head limited to a
//! list of frequent token ids. On the 27B shape the head over the whole 248k vocabulary is 2.5 GB
//! of bf16, most of what a draft step reads; 32k rows of it are an eighth of that. A draft can
//! then only propose a listed token; verification still runs the trunk's whole head, so the text
//! is what plain decoding gives and only how often a draft is accepted can change.
//!
//! The file is a JSON array of token ids (`scripts/make_token_map.py` writes one from text, or
//! converts SGLang's `.pt` maps). Row i of the draft head is the trunk head's row `ids[i]`.

use crate::config::ModelConfig;
use crate::draft_fp8::{trunk_head_name, DRAFT_HEAD};
use crate::error::LoadError;
use crate::source::TensorSource;
use deltaserve_tensor::HostTensor;
use std::path::Path;

/// Why a token map cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenMapError {
    #[error("--speculative-token-map {path}: {message}")]
    Invalid { path: String, message: String },
}

/// The token ids the draft head's rows stand for, in the file's order.
pub fn read_token_map(path: &Path, vocab_size: usize) -> Result<Vec<u32>, TokenMapError> {
    let invalid = |message: String| TokenMapError::Invalid {
        path: path.display().to_string(),
        message,
    };
    if path.extension().is_some_and(|e| e == "pt") {
        return Err(invalid(
            "a PyTorch file; convert it to the JSON array of ids this flag reads with \
             `python scripts/make_token_map.py --from-pt MAP.pt --out MAP.json`"
                .into(),
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))?;
    let values: Vec<serde_json::Value> = match serde_json::from_str(&text) {
        Ok(serde_json::Value::Array(values)) => values,
        Ok(_) => return Err(invalid("expected a JSON array of token ids".into())),
        Err(e) => return Err(invalid(format!("not valid JSON: {e}"))),
    };
    token_ids(&values, vocab_size).map_err(invalid)
}

fn token_ids(values: &[serde_json::Value], vocab_size: usize) -> Result<Vec<u32>, String> {
    if values.is_empty() {
        return Err("the map lists no token ids".into());
    }
    let mut seen = vec![false; vocab_size];
    let mut ids = Vec::with_capacity(values.len());
    for (i, value) in values.iter().enumerate() {
        let id = value.as_u64().ok_or_else(|| {
            format!("entry {i} ({value}) is not a token id (a whole number >= 0)")
        })?;
        let index = usize::try_from(id)
            .ok()
            .filter(|&index| index < vocab_size)
            .ok_or_else(|| {
                format!("entry {i}: token id {id} is outside the model's vocabulary ({vocab_size} tokens)")
            })?;
        if std::mem::replace(&mut seen[index], true) {
            return Err(format!("entry {i}: token id {id} is listed twice"));
        }
        ids.push(index as u32);
    }
    Ok(ids)
}

/// `source` with the draft head limited to `ids`, and `config` told so (`draft_vocab`: the rows
/// the weights load and the ids drafts map back to, which must be these).
pub fn limit_draft_head(
    config: &mut ModelConfig,
    source: Box<dyn TensorSource>,
    ids: Vec<u32>,
) -> TokenMapSource {
    config.draft_vocab = Some(ids.clone());
    TokenMapSource::new(source, ids, config.vocab_size, config.tie_word_embeddings)
}

/// A source whose draft head is the listed rows of the trunk head.
/// `--speculative-draft-model-quantization fp8` wraps this source, so it quantizes the listed rows.
pub struct TokenMapSource {
    inner: Box<dyn TensorSource>,
    ids: Vec<u32>,
    vocab_size: usize,
    trunk_head: &'static str,
}

impl TokenMapSource {
    pub fn new(
        inner: Box<dyn TensorSource>,
        ids: Vec<u32>,
        vocab_size: usize,
        tied_embeddings: bool,
    ) -> Self {
        Self {
            inner,
            ids,
            vocab_size,
            trunk_head: trunk_head_name(tied_embeddings),
        }
    }

    /// The listed rows as ranges of consecutive ids (a map of 0..n is one range).
    fn row_ranges(&self) -> Vec<(usize, usize)> {
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for &id in &self.ids {
            let id = id as usize;
            match ranges.last_mut() {
                Some((_, to)) if *to == id => *to += 1,
                _ => ranges.push((id, id + 1)),
            }
        }
        ranges
    }
}

impl TensorSource for TokenMapSource {
    fn get(&self, name: &str, shape: &[usize]) -> Result<HostTensor, LoadError> {
        if name != DRAFT_HEAD {
            return self.inner.get(name, shape);
        }
        let [rows, cols] = shape[..] else {
            return Err(LoadError::Tensor(deltaserve_tensor::TensorError::Invalid {
                name: name.into(),
                message: format!("the draft head is a matrix, asked for shape {shape:?}"),
            }));
        };
        if rows != self.ids.len() {
            return Err(LoadError::ShapeMismatch {
                tensor: name.into(),
                file: "--speculative-token-map".into(),
                expected: shape.to_vec(),
                found: vec![self.ids.len(), cols],
            });
        }
        let head = self.inner.get(self.trunk_head, &[self.vocab_size, cols])?;
        let mut listed = head.gather_rows(&self.row_ranges());
        listed.name = name.into();
        Ok(listed)
    }

    fn contains(&self, name: &str) -> bool {
        name == DRAFT_HEAD || self.inner.contains(name)
    }

    /// The draft head is gathered on the host (`get`); the rest is the inner source's.
    fn generated_matrix(
        &self,
        name: &str,
        shape: [usize; 2],
    ) -> Option<deltaserve_tensor::GeneratedMatrix> {
        if name == DRAFT_HEAD {
            return None;
        }
        self.inner.generated_matrix(name, shape)
    }

    fn describe(&self) -> String {
        format!(
            "{}, the draft head limited to {} listed tokens (--speculative-token-map)",
            self.inner.describe(),
            self.ids.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draft_fp8::DraftFp8Source;
    use crate::dummy::DummySource;
    use crate::quantization::Fp8Quantization;
    use deltaserve_tensor::DType;

    fn ids(json: &str, vocab: usize) -> Result<Vec<u32>, String> {
        let values: Vec<serde_json::Value> = serde_json::from_str(json).unwrap();
        token_ids(&values, vocab)
    }

    #[test]
    fn a_map_lists_distinct_ids_inside_the_vocabulary() {
        assert_eq!(ids("[5, 0, 9]", 10).unwrap(), vec![5, 0, 9]);
        for (json, why) in [
            ("[]", "no token ids"),
            ("[3, 10]", "outside the model's vocabulary"),
            ("[1, 2, 1]", "listed twice"),
            ("[1, -2]", "not a token id"),
            ("[1.5]", "not a token id"),
            ("[\"7\"]", "not a token id"),
        ] {
            let err = ids(json, 10).unwrap_err();
            assert!(err.contains(why), "{json}: {err}");
        }
    }

    #[test]
    fn files_that_are_not_a_json_array_are_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("token-map-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cases = [
            ("map.pt", "x", "make_token_map.py"),
            ("object.json", "{\"ids\": [1]}", "expected a JSON array"),
            ("broken.json", "[1, 2", "not valid JSON"),
            ("missing.json", "", "No such file"),
        ];
        for (file, text, why) in cases {
            let path = dir.join(file);
            if file != "missing.json" {
                std::fs::write(&path, text).unwrap();
            }
            let err = read_token_map(&path, 10).unwrap_err().to_string();
            assert!(err.starts_with("--speculative-token-map"), "{err}");
            assert!(err.contains(why), "{file}: {err}");
        }
        let good = dir.join("good.json");
        std::fs::write(&good, "[4, 2]").unwrap();
        assert_eq!(read_token_map(&good, 10).unwrap(), vec![4, 2]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn mapped(ids: Vec<u32>, tied: bool) -> TokenMapSource {
        TokenMapSource::new(
            Box::new(DummySource::new(DType::BF16, 7).with_tied_embeddings(tied)),
            ids,
            256,
            tied,
        )
    }

    #[test]
    fn the_draft_head_is_the_listed_rows_of_the_trunk_head() {
        for tied in [false, true] {
            let trunk = if tied {
                "embed_tokens.weight"
            } else {
                "lm_head.weight"
            };
            let ids = vec![200, 3, 4, 5, 0, 255];
            let source = mapped(ids.clone(), tied);
            assert!(source.contains(DRAFT_HEAD));
            assert_eq!(source.generated_matrix(DRAFT_HEAD, [6, 128]), None);
            let head = source.get(DRAFT_HEAD, &[6, 128]).unwrap().to_f32_vec();
            let whole = DummySource::new(DType::BF16, 7)
                .with_tied_embeddings(tied)
                .get(trunk, &[256, 128])
                .unwrap()
                .to_f32_vec();
            for (row, &id) in ids.iter().enumerate() {
                let id = id as usize;
                assert_eq!(
                    head[row * 128..][..128],
                    whole[id * 128..][..128],
                    "tied {tied}, row {row}"
                );
            }
            let wrong = source.get(DRAFT_HEAD, &[7, 128]).unwrap_err();
            assert!(matches!(wrong, LoadError::ShapeMismatch { .. }), "{wrong}");
        }
    }

    #[test]
    fn the_fp8_draft_head_quantizes_the_listed_rows() {
        let ids: Vec<u32> = (0..128).rev().collect();
        let quantized = DraftFp8Source::new(
            Box::new(mapped(ids.clone(), false)),
            Fp8Quantization::qwen_default(),
            false,
        );
        let head = quantized.get(DRAFT_HEAD, &[128, 128]).unwrap();
        let fp8 = head.block_fp8().expect("the draft head is FP8");
        assert_eq!(fp8.scales.len(), 1);
        let listed = mapped(ids, false).get(DRAFT_HEAD, &[128, 128]).unwrap();
        let again = crate::online_fp8::quantized_to_block_fp8(listed, [128, 128]);
        assert_eq!(fp8.codes, again.block_fp8().unwrap().codes);
    }
}
