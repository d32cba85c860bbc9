//! Loads a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json, chat_template.jinja,
//! generation_config.json) and owns encode / decode / special-token lookup. It does not render templates
//! (chat_template.rs) or parse model output (reasoning.rs, tool_calls.rs).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::AddedToken;

use crate::generation_config::GenerationDefaults;

/// Errors while loading or using a tokenizer. Loading errors name the file they come from.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path} is not a tokenizer.json the tokenizers library can load: {message}")]
    TokenizerJson { path: PathBuf, message: String },
    #[error("{path}: field `{field}`: expected {expected}, found {found}")]
    Field {
        path: PathBuf,
        field: String,
        expected: &'static str,
        found: String,
    },
    #[error(
        "{path}: added token {content:?} is declared with id {declared}, but the tokenizer gives it id {actual}"
    )]
    AddedTokenId {
        path: PathBuf,
        content: String,
        declared: u32,
        actual: u32,
    },
    #[error("no tokenizer.json in {dir}")]
    MissingTokenizerJson { dir: PathBuf },
    #[error("encoding {chars} characters failed: {message}")]
    Encode { chars: usize, message: String },
    #[error("decoding {ids} token ids failed: {message}")]
    Decode { ids: usize, message: String },
}

/// The files of one tokenizer. `from_dir` fills in the ones that exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerFiles {
    pub tokenizer_json: PathBuf,
    pub tokenizer_config: Option<PathBuf>,
    /// A separate template file; when present it wins over `chat_template` in tokenizer_config.json.
    pub chat_template: Option<PathBuf>,
    pub generation_config: Option<PathBuf>,
}

impl TokenizerFiles {
    /// The standard file names in a model directory; optional files are `None` when absent.
    pub fn in_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let tokenizer_json = dir.join("tokenizer.json");
        if !tokenizer_json.is_file() {
            return Err(TokenizerError::MissingTokenizerJson {
                dir: dir.to_path_buf(),
            });
        }
        let optional = |name: &str| Some(dir.join(name)).filter(|p| p.is_file());
        Ok(Self {
            tokenizer_json,
            tokenizer_config: optional("tokenizer_config.json"),
            chat_template: optional("chat_template.jinja"),
            generation_config: optional("generation_config.json"),
        })
    }
}

/// The special-token strings a chat template sees as variables (`eos_token`, `bos_token`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokenStrings {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    pub unk_token: Option<String>,
}

impl SpecialTokenStrings {
    /// Name/value pairs in the form HF passes them to templates (its `special_tokens_map`).
    pub fn template_variables(&self) -> Vec<(&'static str, &str)> {
        [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
            ("unk_token", &self.unk_token),
            ("pad_token", &self.pad_token),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.as_deref().map(|v| (name, v)))
        .collect()
    }
}

/// A loaded tokenizer with its chat template(s) and generation defaults.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    special_strings: SpecialTokenStrings,
    special_ids: HashSet<u32>,
    /// Named templates; the unnamed one of tokenizer_config.json / chat_template.jinja is "default".
    chat_templates: BTreeMap<String, String>,
    generation: GenerationDefaults,
    stop_ids: Vec<u32>,
    /// Counted once: the tokenizers crate builds its whole vocabulary map to count it.
    vocab_size: usize,
}

impl Tokenizer {
    /// Loads `tokenizer.json` and whichever of the other standard files exist in `dir`.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        Self::from_files(&TokenizerFiles::in_dir(dir)?)
    }

    pub fn from_files(files: &TokenizerFiles) -> Result<Self, TokenizerError> {
        let text = read(&files.tokenizer_json)?;
        let mut inner: tokenizers::Tokenizer =
            text.parse()
                .map_err(|e: tokenizers::Error| TokenizerError::TokenizerJson {
                    path: files.tokenizer_json.clone(),
                    message: e.to_string(),
                })?;

        let mut special_strings = SpecialTokenStrings::default();
        let mut chat_templates = BTreeMap::new();
        if let Some(path) = &files.tokenizer_config {
            let config = read_json(path)?;
            let Some(config) = config.as_object() else {
                return Err(field(path, "<root>", "a JSON object", &config));
            };
            if let Some(added) = config.get("added_tokens_decoder") {
                register_added_tokens(&mut inner, added, path)?;
            }
            special_strings = SpecialTokenStrings {
                bos_token: token_string(config.get("bos_token"), "bos_token", path)?,
                eos_token: token_string(config.get("eos_token"), "eos_token", path)?,
                pad_token: token_string(config.get("pad_token"), "pad_token", path)?,
                unk_token: token_string(config.get("unk_token"), "unk_token", path)?,
            };
            if let Some(template) = config.get("chat_template") {
                chat_templates = named_templates(template, path)?;
            }
        }
        if let Some(path) = &files.chat_template {
            chat_templates.insert(DEFAULT_TEMPLATE.to_string(), read(path)?);
        }
        let generation = match &files.generation_config {
            Some(path) => GenerationDefaults::from_file(path)?,
            None => GenerationDefaults::default(),
        };

        let special_ids: HashSet<u32> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, _)| id)
            .collect();
        let mut stop_ids = generation.eos_token_ids.clone();
        let config_eos = special_strings
            .eos_token
            .as_deref()
            .and_then(|t| inner.token_to_id(t));
        if let Some(id) = config_eos {
            if !stop_ids.contains(&id) {
                stop_ids.push(id);
            }
        }
        Ok(Self {
            vocab_size: inner.get_vocab_size(true),
            inner,
            special_strings,
            special_ids,
            chat_templates,
            generation,
            stop_ids,
        })
    }

    /// The tokenizer as tokenizer.json would hold it (with the added tokens of tokenizer_config.json
    /// registered), for libraries that read a vocabulary in that form (the grammar engine).
    pub fn to_json(&self) -> Result<Value, TokenizerError> {
        serde_json::to_value(&self.inner).map_err(|e| TokenizerError::Encode {
            chars: 0,
            message: format!("serializing the tokenizer: {e}"),
        })
    }

    /// Token ids of `text`. `add_special_tokens` applies the tokenizer's post-processor (BOS etc.);
    /// chat prompts are encoded without it because the template already wrote every special token.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode_fast(text, add_special_tokens)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode {
                chars: text.chars().count(),
                message: e.to_string(),
            })
    }

    /// Text of `ids`. Ids outside the vocabulary are dropped, as HF does; invalid UTF-8 from byte-level
    /// tokens becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Decode {
                ids: ids.len(),
                message: e.to_string(),
            })
    }

    /// Id of a token string such as `<think>` or `<|im_end|>` (vocabulary or added token).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token string of `id` in the tokenizer's own alphabet (byte-level tokens look like `Ġword`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Whether `id` is an added token marked special (skipped by `decode(.., true)`).
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn special_token_strings(&self) -> &SpecialTokenStrings {
        &self.special_strings
    }

    /// The default chat template, if the model ships one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template_named(DEFAULT_TEMPLATE)
    }

    /// A named template from a tokenizer_config.json that lists several (e.g. "tool_use").
    pub fn chat_template_named(&self, name: &str) -> Option<&str> {
        self.chat_templates.get(name).map(String::as_str)
    }

    /// The template HF would pick: "tool_use" when tools are given and it exists, else "default".
    pub fn chat_template_for(&self, with_tools: bool) -> Option<&str> {
        with_tools
            .then(|| self.chat_template_named("tool_use"))
            .flatten()
            .or_else(|| self.chat_template())
    }

    /// Replaces every template the model ships (default and named ones) by `source`: an operator's
    /// `--chat-template` applies to requests with and without tools alike.
    pub fn with_chat_template(mut self, source: String) -> Self {
        self.chat_templates.clear();
        self.chat_templates
            .insert(DEFAULT_TEMPLATE.to_string(), source);
        self
    }

    pub fn generation_defaults(&self) -> &GenerationDefaults {
        &self.generation
    }

    /// Ids that end generation: generation_config's eos ids plus tokenizer_config's eos_token.
    pub fn stop_token_ids(&self) -> &[u32] {
        &self.stop_ids
    }
}

const DEFAULT_TEMPLATE: &str = "default";

fn read(path: &Path) -> Result<String, TokenizerError> {
    std::fs::read_to_string(path).map_err(|source| TokenizerError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn read_json(path: &Path) -> Result<Value, TokenizerError> {
    serde_json::from_str(&read(path)?).map_err(|source| TokenizerError::Json {
        path: path.to_path_buf(),
        source,
    })
}

fn field(path: &Path, name: &str, expected: &'static str, found: &Value) -> TokenizerError {
    TokenizerError::Field {
        path: path.to_path_buf(),
        field: name.to_string(),
        expected,
        found: found.to_string(),
    }
}

/// A special token written either as a plain string or as an AddedToken object `{"content": ...}`.
fn token_string(
    value: Option<&Value>,
    name: &str,
    path: &Path,
) -> Result<Option<String>, TokenizerError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v @ Value::Object(map)) => match map.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(field(
                path,
                name,
                "a string or an object with a string `content`",
                v,
            )),
        },
        Some(v) => Err(field(
            path,
            name,
            "a string or an object with a string `content`",
            v,
        )),
    }
}

/// `chat_template` is either one template or a list of `{"name", "template"}` entries.
fn named_templates(value: &Value, path: &Path) -> Result<BTreeMap<String, String>, TokenizerError> {
    let expected = "a template string or a list of {\"name\", \"template\"} objects";
    match value {
        Value::Null => Ok(BTreeMap::new()),
        Value::String(s) => Ok(BTreeMap::from([(DEFAULT_TEMPLATE.to_string(), s.clone())])),
        Value::Array(entries) => entries
            .iter()
            .map(|entry| {
                let name = entry.get("name").and_then(Value::as_str);
                let template = entry.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some(n), Some(t)) => Ok((n.to_string(), t.to_string())),
                    _ => Err(field(path, "chat_template", expected, entry)),
                }
            })
            .collect(),
        other => Err(field(path, "chat_template", expected, other)),
    }
}

/// Makes sure every token of `added_tokens_decoder` exists with the id the config declares, adding the
/// ones tokenizer.json lacks (HF does the same when it loads the pair).
fn register_added_tokens(
    inner: &mut tokenizers::Tokenizer,
    added: &Value,
    path: &Path,
) -> Result<(), TokenizerError> {
    let Some(entries) = added.as_object() else {
        return Err(field(
            path,
            "added_tokens_decoder",
            "an object of id -> token",
            added,
        ));
    };
    let mut declared: Vec<(u32, &Value)> = Vec::with_capacity(entries.len());
    for (id_text, entry) in entries {
        let id = id_text.parse::<u32>().map_err(|_| {
            field(
                path,
                "added_tokens_decoder",
                "token ids as keys",
                &Value::String(id_text.clone()),
            )
        })?;
        declared.push((id, entry));
    }
    // Ascending ids so that missing tokens are appended in the order their ids require.
    declared.sort_by_key(|(id, _)| *id);
    for (id, entry) in declared {
        let content = entry
            .get("content")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                field(
                    path,
                    &format!("added_tokens_decoder.{id}.content"),
                    "a string",
                    entry,
                )
            })?;
        let flag =
            |name: &str, default: bool| entry.get(name).and_then(Value::as_bool).unwrap_or(default);
        let actual = match inner.token_to_id(content) {
            Some(actual) => actual,
            None => {
                let special = flag("special", false);
                let token = AddedToken::from(content.to_string(), special)
                    .lstrip(flag("lstrip", false))
                    .rstrip(flag("rstrip", false))
                    .single_word(flag("single_word", false))
                    .normalized(flag("normalized", !special));
                if special {
                    inner.add_special_tokens(&[token]);
                } else {
                    inner.add_tokens(&[token]);
                }
                // u32::MAX is never a declared id, so a token the library refused reports as a mismatch.
                inner.token_to_id(content).unwrap_or(u32::MAX)
            }
        };
        if actual != id {
            return Err(TokenizerError::AddedTokenId {
                path: path.to_path_buf(),
                content: content.to_string(),
                declared: id,
                actual,
            });
        }
    }
    Ok(())
}
