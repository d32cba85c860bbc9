//! `ModelConfig`: the text-model hyper-parameters read from a Hugging Face `config.json` of Qwen3.5 /
//! Qwen3.6 (dense or MoE, nested under `text_config` or flat) and Qwen3-Next, validated once here so
//! the rest of the crate can trust them. It reads JSON only; it never opens checkpoints.

use crate::error::LoadError;
use crate::quantization::{Fp8Quantization, FP8_BLOCK};
use deltaserve_tensor::{AttnShape, DType, GdnShape};
use serde_json::{Map, Value};
use std::fmt;
use std::path::Path;

/// The model family, which decides tensor layouts and MoE rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// Qwen3.5 / Qwen3.6 dense (`qwen3_5`, `qwen3_5_text`).
    Qwen35,
    /// Qwen3.5 / Qwen3.6 MoE (`qwen3_5_moe`, `qwen3_5_moe_text`): every layer MoE, always renormalised.
    Qwen35Moe,
    /// Qwen3-Next (`qwen3_next`).
    Qwen3Next,
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Architecture::Qwen35 => "Qwen3.5",
            Architecture::Qwen35Moe => "Qwen3.5-MoE",
            Architecture::Qwen3Next => "Qwen3-Next",
        })
    }
}

/// The token mixer of one decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// Gated DeltaNet.
    LinearAttention,
    /// Gated full (softmax) attention with a KV cache.
    FullAttention,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub top_k: usize,
    pub moe_intermediate_size: usize,
    /// 0 = no shared expert.
    pub shared_expert_intermediate_size: usize,
    /// Renormalise the top-k router probabilities so they sum to 1.
    pub renormalize: bool,
    /// Per trunk layer: true when its MLP is an MoE block, false when dense.
    pub layer_is_moe: Vec<bool>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    /// The text model's `model_type` (e.g. `qwen3_5_text`, `qwen3_5_moe_text`, `qwen3_next`).
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Dense MLP width; 0 if the model has no dense MLP.
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub rms_norm_eps: f32,
    pub layer_types: Vec<LayerKind>,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// `int(head_dim * partial_rotary_factor)`: the leading dims of each head that RoPE rotates.
    pub rotary_dim: usize,
    pub rope_theta: f64,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel_dim: usize,
    pub tie_word_embeddings: bool,
    pub moe: Option<MoeConfig>,
    pub mtp_num_hidden_layers: usize,
    pub max_position_embeddings: usize,
    /// Union of the text-level and top-level `eos_token_id`s, text ones first, without repeats.
    pub eos_token_ids: Vec<u32>,
    /// `dtype` / `torch_dtype`, when given.
    pub dtype: Option<DType>,
    /// `quantization_config` of a block-FP8 checkpoint; `None` for an unquantized one.
    pub quantization: Option<Fp8Quantization>,
    /// Not from config.json: the token ids the draft model's head rows stand for, in order
    /// (`--speculative-token-map`, crate::draft_vocab); `None`: the whole vocabulary.
    pub draft_vocab: Option<Vec<u32>>,
}

/// HF defaults (transformers `Qwen3_5TextConfig`, `Qwen3_5MoeTextConfig`, `Qwen3NextConfig`).
const DEFAULT_RMS_NORM_EPS: f64 = 1e-6;
const DEFAULT_HEAD_DIM: usize = 256;
const DEFAULT_CONV_KERNEL: usize = 4;
const DEFAULT_FULL_ATTENTION_INTERVAL: usize = 4;
const DEFAULT_PARTIAL_ROTARY_FACTOR: f64 = 0.25;
const DEFAULT_ROPE_THETA: f64 = 10_000.0;
const DEFAULT_MAX_POSITIONS: usize = 32_768;

impl ModelConfig {
    /// The logits an MTP step gives each row: one per row of the draft head (the token map's
    /// length under `--speculative-token-map`, else the vocabulary).
    pub fn draft_vocab_size(&self) -> usize {
        self.draft_vocab.as_ref().map_or(self.vocab_size, Vec::len)
    }

    /// The token id column `column` of an MTP step's logits stands for.
    pub fn draft_token(&self, column: u32) -> u32 {
        match &self.draft_vocab {
            Some(ids) => ids[column as usize],
            None => column,
        }
    }

    /// Reads and validates `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, LoadError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| LoadError::io(&path, e))?;
        Self::from_json_str(&text, &path)
    }

    /// Parses and validates a config.json document; `origin` is only used in error messages.
    pub fn from_json_str(json: &str, origin: &Path) -> Result<Self, LoadError> {
        let root: Value = serde_json::from_str(json).map_err(|e| LoadError::Config {
            file: origin.to_path_buf(),
            field: "(document)".into(),
            message: format!("not valid JSON: {e}"),
        })?;
        let Value::Object(top_map) = &root else {
            return Err(LoadError::Config {
                file: origin.to_path_buf(),
                field: "(document)".into(),
                message: format!("expected a JSON object, found {}", json_kind(&root)),
            });
        };
        let top = Section {
            obj: top_map,
            prefix: String::new(),
            file: origin,
        };
        let text = match top.get("text_config") {
            None => None,
            Some(Value::Object(map)) => Some(Section {
                obj: map,
                prefix: "text_config.".into(),
                file: origin,
            }),
            Some(other) => {
                return Err(top.wrong_type("text_config", "an object", other));
            }
        };
        parse(&top, text.as_ref())
    }

    pub fn gdn_shape(&self) -> GdnShape {
        GdnShape {
            key_heads: self.linear_num_key_heads,
            value_heads: self.linear_num_value_heads,
            key_dim: self.linear_key_head_dim,
            value_dim: self.linear_value_head_dim,
        }
    }

    pub fn attn_shape(&self) -> AttnShape {
        AttnShape {
            q_heads: self.num_attention_heads,
            kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
        }
    }

    /// True when trunk layer `layer` is a gated full-attention layer (false for GDN layers and for
    /// indices past the last layer).
    pub fn is_full_attention(&self, layer: usize) -> bool {
        self.layer_types.get(layer) == Some(&LayerKind::FullAttention)
    }

    /// True when trunk layer `layer` has an MoE MLP.
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        self.moe
            .as_ref()
            .is_some_and(|m| m.layer_is_moe.get(layer) == Some(&true))
    }
}

/// One JSON object of the config (the top level or `text_config`) with the path prefix used to name
/// its fields in errors.
struct Section<'a> {
    obj: &'a Map<String, Value>,
    prefix: String,
    file: &'a Path,
}

impl<'a> Section<'a> {
    /// The value of `key`; JSON `null` counts as absent (HF writes `null` for unset optionals).
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn field(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn err(&self, key: &str, message: impl Into<String>) -> LoadError {
        LoadError::Config {
            file: self.file.to_path_buf(),
            field: self.field(key),
            message: message.into(),
        }
    }

    fn wrong_type(&self, key: &str, expected: &str, found: &Value) -> LoadError {
        self.err(
            key,
            format!("expected {expected}, found {}", describe_value(found)),
        )
    }

    fn missing(&self, key: &str) -> LoadError {
        self.err(key, "required field is missing")
    }

    fn usize_opt(&self, key: &str) -> Result<Option<usize>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => value_as_usize(v)
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, "a non-negative integer", v)),
        }
    }

    fn usize_req(&self, key: &str) -> Result<usize, LoadError> {
        self.usize_opt(key)?.ok_or_else(|| self.missing(key))
    }

    /// A required count that must be at least 1.
    fn positive_req(&self, key: &str) -> Result<usize, LoadError> {
        let n = self.usize_req(key)?;
        if n == 0 {
            return Err(self.err(key, "must be at least 1, found 0"));
        }
        Ok(n)
    }

    fn f64_opt(&self, key: &str) -> Result<Option<f64>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, "a number", v)),
        }
    }

    fn bool_opt(&self, key: &str) -> Result<Option<bool>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, "true or false", v)),
        }
    }

    fn str_opt(&self, key: &str) -> Result<Option<&'a str>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, "a string", v)),
        }
    }

    fn array_opt(&self, key: &str) -> Result<Option<&'a Vec<Value>>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, "a list", v)),
        }
    }

    fn object_opt(&self, key: &str) -> Result<Option<Section<'a>>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Section {
                obj: map,
                prefix: format!("{}.", self.field(key)),
                file: self.file,
            })),
            Some(v) => Err(self.wrong_type(key, "an object", v)),
        }
    }

    /// A list of non-negative integers; errors name the offending element (`key[i]`).
    fn usize_list_opt(&self, key: &str) -> Result<Option<Vec<usize>>, LoadError> {
        let Some(items) = self.array_opt(key)? else {
            return Ok(None);
        };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                value_as_usize(v).ok_or_else(|| {
                    self.wrong_type(&format!("{key}[{i}]"), "a non-negative integer", v)
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}

fn value_as_usize(v: &Value) -> Option<usize> {
    v.as_u64().and_then(|n| usize::try_from(n).ok())
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The JSON kind plus a short rendering of scalars, for "expected X, found Y" messages.
fn describe_value(v: &Value) -> String {
    match v {
        Value::Array(_) | Value::Object(_) | Value::Null => json_kind(v).to_string(),
        scalar => format!("{} ({scalar})", json_kind(v)),
    }
}

/// Layout of the `model_type` / `architectures` names we know.
fn architecture_of_model_type(model_type: &str) -> Option<Architecture> {
    match model_type {
        "qwen3_5" | "qwen3_5_text" => Some(Architecture::Qwen35),
        "qwen3_5_moe" | "qwen3_5_moe_text" => Some(Architecture::Qwen35Moe),
        "qwen3_next" => Some(Architecture::Qwen3Next),
        _ => None,
    }
}

fn architecture_of_class(class: &str) -> Option<Architecture> {
    match class {
        "Qwen3_5ForConditionalGeneration" | "Qwen3_5ForCausalLM" => Some(Architecture::Qwen35),
        "Qwen3_5MoeForConditionalGeneration" | "Qwen3_5MoeForCausalLM" => {
            Some(Architecture::Qwen35Moe)
        }
        "Qwen3NextForCausalLM" => Some(Architecture::Qwen3Next),
        _ => None,
    }
}

/// Multimodal wrappers whose text fields must sit in `text_config`.
fn is_multimodal_model_type(model_type: &str) -> bool {
    matches!(model_type, "qwen3_5" | "qwen3_5_moe")
}

const SUPPORTED_MODEL_TYPES: &str =
    "qwen3_5, qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text, qwen3_next";
const SUPPORTED_CLASSES: &str = "Qwen3_5ForConditionalGeneration, Qwen3_5ForCausalLM, \
     Qwen3_5MoeForConditionalGeneration, Qwen3_5MoeForCausalLM, Qwen3NextForCausalLM";

/// Decides the architecture from the top-level `model_type`, `text_config.model_type` and
/// `architectures`; every one that is present must be known and all must agree.
fn detect_architecture(
    top: &Section,
    text: Option<&Section>,
) -> Result<(Architecture, String), LoadError> {
    let mut votes: Vec<(String, Architecture)> = Vec::new();

    let top_type = top.str_opt("model_type")?;
    if let Some(t) = top_type {
        let arch = architecture_of_model_type(t).ok_or_else(|| {
            top.err(
                "model_type",
                format!("unsupported model_type `{t}` (supported: {SUPPORTED_MODEL_TYPES})"),
            )
        })?;
        votes.push((top.field("model_type"), arch));
        if is_multimodal_model_type(t) && text.is_none() {
            return Err(top.err(
                "text_config",
                format!("required for model_type `{t}` (its text fields live in text_config)"),
            ));
        }
    }

    let text_type = match text {
        Some(text) => {
            let t = text.str_opt("model_type")?;
            if let Some(t) = t {
                let arch = architecture_of_model_type(t).ok_or_else(|| {
                    text.err(
                        "model_type",
                        format!(
                            "unsupported model_type `{t}` (supported: {SUPPORTED_MODEL_TYPES})"
                        ),
                    )
                })?;
                votes.push((text.field("model_type"), arch));
            }
            t
        }
        None => None,
    };

    if let Some(classes) = top.array_opt("architectures")? {
        let mut names = Vec::new();
        for (i, class) in classes.iter().enumerate() {
            let name = class
                .as_str()
                .ok_or_else(|| top.wrong_type(&format!("architectures[{i}]"), "a string", class))?;
            names.push(name);
        }
        let known: Vec<Architecture> = names
            .iter()
            .filter_map(|n| architecture_of_class(n))
            .collect();
        match known.first() {
            Some(&arch) => votes.push((top.field("architectures"), arch)),
            // Unknown class names are tolerated when a known model_type already decides.
            None if votes.is_empty() => {
                return Err(top.err(
                    "architectures",
                    format!("unsupported architectures {names:?} (supported: {SUPPORTED_CLASSES})"),
                ))
            }
            None => {}
        }
    }

    let Some((_, arch)) = votes.first().cloned() else {
        return Err(top.err(
            "model_type",
            format!(
                "missing, and no `architectures` either: cannot tell the model (supported model_type: {SUPPORTED_MODEL_TYPES})"
            ),
        ));
    };
    if let Some((field, other)) = votes.iter().find(|(_, a)| *a != arch) {
        return Err(top.err(
            &votes[0].0.clone(),
            format!("says {arch} but `{field}` says {other}"),
        ));
    }

    let model_type = match (text_type, top_type) {
        (Some(t), _) => t.to_string(),
        (None, Some(t)) if !is_multimodal_model_type(t) => t.to_string(),
        _ => match arch {
            Architecture::Qwen35 => "qwen3_5_text",
            Architecture::Qwen35Moe => "qwen3_5_moe_text",
            Architecture::Qwen3Next => "qwen3_next",
        }
        .to_string(),
    };
    Ok((arch, model_type))
}

fn parse(top: &Section, nested: Option<&Section>) -> Result<ModelConfig, LoadError> {
    let (architecture, model_type) = detect_architecture(top, nested)?;
    let text = nested.unwrap_or(top);

    let quantization = parse_quantization(top)?;

    let vocab_size = text.positive_req("vocab_size")?;
    let hidden_size = text.positive_req("hidden_size")?;
    let num_hidden_layers = text.positive_req("num_hidden_layers")?;
    let rms_norm_eps = text
        .f64_opt("rms_norm_eps")?
        .unwrap_or(DEFAULT_RMS_NORM_EPS);
    if !(rms_norm_eps > 0.0 && rms_norm_eps < 1.0) {
        return Err(text.err(
            "rms_norm_eps",
            format!("must be in (0, 1), found {rms_norm_eps}"),
        ));
    }

    let layer_types = parse_layer_types(text, num_hidden_layers)?;

    // Gated full attention.
    let num_attention_heads = text.positive_req("num_attention_heads")?;
    let num_key_value_heads = text.positive_req("num_key_value_heads")?;
    if num_attention_heads % num_key_value_heads != 0 {
        return Err(text.err(
            "num_key_value_heads",
            format!(
                "{num_key_value_heads} does not divide num_attention_heads = {num_attention_heads}"
            ),
        ));
    }
    let head_dim = text.usize_opt("head_dim")?.unwrap_or(DEFAULT_HEAD_DIM);
    if head_dim == 0 {
        return Err(text.err("head_dim", "must be at least 1, found 0"));
    }
    if text.bool_opt("attn_output_gate")? == Some(false) {
        return Err(text.err(
            "attn_output_gate",
            "false is not supported: Qwen3.5/Qwen3-Next attention always has an output gate",
        ));
    }
    let (rope_theta, rotary_dim) = parse_rope(text, head_dim)?;

    // Gated DeltaNet.
    let linear_num_key_heads = text.positive_req("linear_num_key_heads")?;
    let linear_num_value_heads = text.positive_req("linear_num_value_heads")?;
    if linear_num_value_heads % linear_num_key_heads != 0 {
        return Err(text.err(
            "linear_num_value_heads",
            format!(
                "{linear_num_value_heads} is not a multiple of linear_num_key_heads = {linear_num_key_heads}"
            ),
        ));
    }
    let linear_key_head_dim = text.positive_req("linear_key_head_dim")?;
    let linear_value_head_dim = text.positive_req("linear_value_head_dim")?;
    let linear_conv_kernel_dim = text
        .usize_opt("linear_conv_kernel_dim")?
        .unwrap_or(DEFAULT_CONV_KERNEL);
    if linear_conv_kernel_dim == 0 {
        return Err(text.err("linear_conv_kernel_dim", "must be at least 1, found 0"));
    }

    // MLP.
    let moe = parse_moe(architecture, text, num_hidden_layers)?;
    let has_dense_layer = match &moe {
        None => true,
        Some(m) => m.layer_is_moe.iter().any(|&is_moe| !is_moe),
    };
    let intermediate_size = match architecture {
        // Qwen3.5-MoE removed `intermediate_size`: every layer is MoE.
        Architecture::Qwen35Moe => 0,
        Architecture::Qwen35 => text.positive_req("intermediate_size")?,
        Architecture::Qwen3Next => {
            let size = text.usize_opt("intermediate_size")?.unwrap_or(0);
            if size == 0 && has_dense_layer {
                return Err(text.err(
                    "intermediate_size",
                    "required (and at least 1): some layers have a dense MLP (mlp_only_layers / decoder_sparse_step / num_experts = 0)",
                ));
            }
            size
        }
    };

    // `text_config` wins over the top level when it sets the field.
    let tie_word_embeddings = match nested
        .map(|t| t.bool_opt("tie_word_embeddings"))
        .transpose()?
    {
        Some(Some(tie)) => tie,
        _ => top.bool_opt("tie_word_embeddings")?.unwrap_or(false),
    };
    let mtp_num_hidden_layers = match text.usize_opt("mtp_num_hidden_layers")? {
        Some(n) => n,
        // vLLM's Qwen3-Next MTP reads this older name.
        None => text.usize_opt("num_nextn_predict_layers")?.unwrap_or(0),
    };
    let max_position_embeddings = text
        .usize_opt("max_position_embeddings")?
        .unwrap_or(DEFAULT_MAX_POSITIONS);

    let mut eos_token_ids = Vec::new();
    if let Some(text) = nested {
        collect_eos(text, &mut eos_token_ids)?;
    }
    collect_eos(top, &mut eos_token_ids)?;

    let mut dtype = None;
    for section in nested.into_iter().chain(std::iter::once(top)) {
        if dtype.is_some() {
            break;
        }
        dtype = parse_dtype(section)?;
    }

    Ok(ModelConfig {
        architecture,
        model_type,
        vocab_size,
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        rms_norm_eps: rms_norm_eps as f32,
        layer_types,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        rotary_dim,
        rope_theta,
        linear_num_key_heads,
        linear_num_value_heads,
        linear_key_head_dim,
        linear_value_head_dim,
        linear_conv_kernel_dim,
        tie_word_embeddings,
        moe,
        mtp_num_hidden_layers,
        max_position_embeddings,
        eos_token_ids,
        dtype,
        quantization,
        draft_vocab: None,
    })
}

/// `quantization_config`: absent for unquantized checkpoints; otherwise it must describe the block
/// FP8 scheme deltaserve reads (e4m3 codes, dynamic activations, 128 x 128 weight blocks), and any
/// other method or variant is refused naming the field.
fn parse_quantization(top: &Section) -> Result<Option<Fp8Quantization>, LoadError> {
    let Some(q) = top.object_opt("quantization_config")? else {
        return Ok(None);
    };
    let method = q
        .str_opt("quant_method")?
        .ok_or_else(|| q.missing("quant_method"))?;
    if method != "fp8" {
        return Err(q.err(
            "quant_method",
            format!("`{method}` is not supported: deltaserve reads block-FP8 checkpoints (`fp8`) and unquantized bf16/f16/f32 ones"),
        ));
    }
    // `fmt` is what Qwen's and DeepSeek's configs carry; the tensors' own dtype is checked again
    // per tensor when they are read.
    if let Some(fmt) = q.str_opt("fmt")? {
        if fmt != "e4m3" {
            return Err(q.err(
                "fmt",
                format!("`{fmt}` is not supported: FP8 weights must be e4m3 (float8_e4m3fn)"),
            ));
        }
    }
    match q.str_opt("activation_scheme")? {
        None | Some("dynamic") => {}
        Some(other) => {
            return Err(q.err(
                "activation_scheme",
                format!("`{other}` is not supported: only `dynamic` (no stored activation scales)"),
            ))
        }
    }
    let block = q.usize_list_opt("weight_block_size")?.ok_or_else(|| {
        q.err(
            "weight_block_size",
            "required field is missing (per-tensor FP8 without blocks is not supported)",
        )
    })?;
    if block != FP8_BLOCK {
        return Err(q.err(
            "weight_block_size",
            format!("{block:?} is not supported: FP8 weights must use {FP8_BLOCK:?} blocks"),
        ));
    }
    let modules_to_not_convert = match q.array_opt("modules_to_not_convert")? {
        None => Vec::new(),
        Some(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    q.wrong_type(&format!("modules_to_not_convert[{i}]"), "a string", v)
                })
            })
            .collect::<Result<_, _>>()?,
    };
    Ok(Some(Fp8Quantization {
        block: FP8_BLOCK,
        modules_to_not_convert,
    }))
}

/// Only the `quantization_config` of `dir/config.json` (what the checkpoint reader needs to decode
/// FP8 tensors), validated as `ModelConfig::from_dir` validates it.
pub fn quantization_from_dir(dir: &Path) -> Result<Option<Fp8Quantization>, LoadError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| LoadError::io(&path, e))?;
    let root: Value = serde_json::from_str(&text).map_err(|e| LoadError::Config {
        file: path.clone(),
        field: "(document)".into(),
        message: format!("not valid JSON: {e}"),
    })?;
    let Value::Object(map) = &root else {
        return Err(LoadError::Config {
            file: path.clone(),
            field: "(document)".into(),
            message: format!("expected a JSON object, found {}", json_kind(&root)),
        });
    };
    parse_quantization(&Section {
        obj: map,
        prefix: String::new(),
        file: &path,
    })
}

/// `layer_types`, or the pattern of `full_attention_interval` (layer i is full iff (i+1) % n == 0).
fn parse_layer_types(text: &Section, num_layers: usize) -> Result<Vec<LayerKind>, LoadError> {
    if let Some(items) = text.array_opt("layer_types")? {
        if items.len() != num_layers {
            return Err(text.err(
                "layer_types",
                format!(
                    "has {} entries but num_hidden_layers = {num_layers}",
                    items.len()
                ),
            ));
        }
        return items
            .iter()
            .enumerate()
            .map(|(i, v)| match v.as_str() {
                Some("linear_attention") => Ok(LayerKind::LinearAttention),
                Some("full_attention") => Ok(LayerKind::FullAttention),
                _ => Err(text.err(
                    &format!("layer_types[{i}]"),
                    format!(
                        "expected \"linear_attention\" or \"full_attention\", found {}",
                        describe_value(v)
                    ),
                )),
            })
            .collect();
    }
    let interval = text
        .usize_opt("full_attention_interval")?
        .unwrap_or(DEFAULT_FULL_ATTENTION_INTERVAL);
    if interval == 0 {
        return Err(text.err("full_attention_interval", "must be at least 1, found 0"));
    }
    Ok((0..num_layers)
        .map(|i| {
            if (i + 1) % interval == 0 {
                LayerKind::FullAttention
            } else {
                LayerKind::LinearAttention
            }
        })
        .collect())
}

/// Returns `(rope_theta, rotary_dim)`. Values in `rope_scaling` (when not null) or `rope_parameters`
/// win over the flat `rope_theta` / `partial_rotary_factor`, as in HF's standardisation.
fn parse_rope(text: &Section, head_dim: usize) -> Result<(f64, usize), LoadError> {
    let mut params = match text.object_opt("rope_scaling")? {
        Some(p) if !p.obj.is_empty() => Some(p),
        _ => text.object_opt("rope_parameters")?,
    };
    // transformers 5 may nest the parameters per layer type; only full-attention layers use RoPE.
    if let Some(p) = &params {
        if let Some(full) = p.object_opt("full_attention")? {
            params = Some(full);
        }
    }

    let mut theta = None;
    let mut factor = None;
    if let Some(p) = &params {
        let (type_key, rope_type) = match p.str_opt("rope_type")? {
            Some(t) => ("rope_type", Some(t)),
            None => ("type", p.str_opt("type")?),
        };
        match rope_type {
            // Interleaved M-RoPE with equal text positions on all axes is plain 1-D RoPE.
            None | Some("default") | Some("mrope") => {}
            Some(other) => {
                return Err(p.err(
                    type_key,
                    format!("RoPE type `{other}` is not supported yet (only `default` / `mrope`, which is plain 1-D RoPE for text)"),
                ))
            }
        }
        theta = p.f64_opt("rope_theta")?;
        factor = p.f64_opt("partial_rotary_factor")?;
    }
    let theta = match theta {
        Some(t) => t,
        None => text.f64_opt("rope_theta")?.unwrap_or(DEFAULT_ROPE_THETA),
    };
    if !(theta.is_finite() && theta > 1.0) {
        return Err(text.err(
            "rope_theta",
            format!("must be a finite number > 1, found {theta}"),
        ));
    }
    let factor = match factor {
        Some(f) => f,
        None => text
            .f64_opt("partial_rotary_factor")?
            .unwrap_or(DEFAULT_PARTIAL_ROTARY_FACTOR),
    };
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(text.err(
            "partial_rotary_factor",
            format!("must be in (0, 1], found {factor}"),
        ));
    }
    // `int(head_dim * partial_rotary_factor)` as HF computes it (truncation).
    let rotary_dim = (head_dim as f64 * factor) as usize;
    if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
        return Err(text.err(
            "partial_rotary_factor",
            format!(
                "gives rotary dim int({head_dim} * {factor}) = {rotary_dim}, which must be even and at least 2"
            ),
        ));
    }
    Ok((theta, rotary_dim))
}

fn parse_moe(
    architecture: Architecture,
    text: &Section,
    num_layers: usize,
) -> Result<Option<MoeConfig>, LoadError> {
    let (num_experts, renormalize, layer_is_moe) = match architecture {
        Architecture::Qwen35 => return Ok(None),
        Architecture::Qwen35Moe => (
            text.positive_req("num_experts")?,
            true,
            vec![true; num_layers],
        ),
        Architecture::Qwen3Next => {
            let num_experts = text.usize_req("num_experts")?;
            if num_experts == 0 {
                return Ok(None);
            }
            let renormalize = text.bool_opt("norm_topk_prob")?.unwrap_or(true);
            let step = text.usize_opt("decoder_sparse_step")?.unwrap_or(1);
            if step == 0 {
                return Err(text.err("decoder_sparse_step", "must be at least 1, found 0"));
            }
            let mlp_only = text.usize_list_opt("mlp_only_layers")?.unwrap_or_default();
            if let Some(&bad) = mlp_only.iter().find(|&&l| l >= num_layers) {
                return Err(text.err(
                    "mlp_only_layers",
                    format!("layer {bad} does not exist (num_hidden_layers = {num_layers})"),
                ));
            }
            let layers: Vec<bool> = (0..num_layers)
                .map(|i| !mlp_only.contains(&i) && (i + 1) % step == 0)
                .collect();
            if !layers.contains(&true) {
                return Ok(None);
            }
            (num_experts, renormalize, layers)
        }
    };
    let top_k = text.positive_req("num_experts_per_tok")?;
    if top_k > num_experts {
        return Err(text.err(
            "num_experts_per_tok",
            format!("{top_k} is more than num_experts = {num_experts}"),
        ));
    }
    let moe_intermediate_size = text.positive_req("moe_intermediate_size")?;
    let shared_expert_intermediate_size = text
        .usize_opt("shared_expert_intermediate_size")?
        .unwrap_or(0);
    Ok(Some(MoeConfig {
        num_experts,
        top_k,
        moe_intermediate_size,
        shared_expert_intermediate_size,
        renormalize,
        layer_is_moe,
    }))
}

/// Appends `eos_token_id` (an int or a list of ints) of `section` to `out`, skipping repeats.
fn collect_eos(section: &Section, out: &mut Vec<u32>) -> Result<(), LoadError> {
    let Some(value) = section.get("eos_token_id") else {
        return Ok(());
    };
    let as_id = |v: &Value, field: &str| {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| section.wrong_type(field, "a token id (non-negative integer)", v))
    };
    let ids: Vec<u32> = match value {
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| as_id(v, &format!("eos_token_id[{i}]")))
            .collect::<Result<_, _>>()?,
        v => vec![as_id(v, "eos_token_id")?],
    };
    for id in ids {
        if !out.contains(&id) {
            out.push(id);
        }
    }
    Ok(())
}

/// `dtype` (transformers 5) or `torch_dtype` (older) of one section.
fn parse_dtype(section: &Section) -> Result<Option<DType>, LoadError> {
    for key in ["dtype", "torch_dtype"] {
        if let Some(name) = section.str_opt(key)? {
            return DType::parse(name).map(Some).ok_or_else(|| {
                section.err(
                    key,
                    format!("unsupported dtype `{name}` (expected bfloat16, float16 or float32)"),
                )
            });
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ORIGIN: &str = "/models/test/config.json";

    fn parse_str(text: &str) -> Result<ModelConfig, LoadError> {
        ModelConfig::from_json_str(text, Path::new(ORIGIN))
    }

    fn parse_value(v: &Value) -> Result<ModelConfig, LoadError> {
        parse_str(&v.to_string())
    }

    /// `["linear_attention", ..., "full_attention", ...]` for `n` layers, full every 4th.
    fn layer_types_json(n: usize) -> String {
        let items: Vec<&str> = (0..n)
            .map(|i| {
                if (i + 1) % 4 == 0 {
                    "\"full_attention\""
                } else {
                    "\"linear_attention\""
                }
            })
            .collect();
        format!("[{}]", items.join(", "))
    }

    /// Modelled on Qwen/Qwen3.5-27B config.json (multimodal wrapper, text fields in text_config).
    fn qwen35_27b() -> String {
        r#"{
          "architectures": ["Qwen3_5ForConditionalGeneration"],
          "eos_token_id": 248046,
          "image_token_id": 248056,
          "model_type": "qwen3_5",
          "text_config": {
            "attention_bias": false,
            "attention_dropout": 0.0,
            "attn_output_gate": true,
            "dtype": "bfloat16",
            "eos_token_id": 248044,
            "full_attention_interval": 4,
            "head_dim": 256,
            "hidden_act": "silu",
            "hidden_size": 5120,
            "initializer_range": 0.02,
            "intermediate_size": 17408,
            "layer_types": LAYER_TYPES,
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 48,
            "linear_value_head_dim": 128,
            "mamba_ssm_dtype": "float32",
            "max_position_embeddings": 262144,
            "model_type": "qwen3_5_text",
            "mtp_num_hidden_layers": 1,
            "mtp_use_dedicated_embeddings": false,
            "num_attention_heads": 24,
            "num_hidden_layers": 64,
            "num_key_value_heads": 4,
            "rms_norm_eps": 1e-06,
            "rope_parameters": {
              "mrope_interleaved": true,
              "mrope_section": [11, 11, 10],
              "partial_rotary_factor": 0.25,
              "rope_theta": 10000000,
              "rope_type": "default"
            },
            "use_cache": true,
            "vocab_size": 248320
          },
          "tie_word_embeddings": false,
          "transformers_version": "4.57.0.dev0",
          "video_token_id": 248057,
          "vision_config": {
            "deepstack_visual_indexes": [],
            "depth": 27,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": 1152,
            "in_channels": 3,
            "initializer_range": 0.02,
            "intermediate_size": 4304,
            "model_type": "qwen3_5",
            "num_heads": 16,
            "num_position_embeddings": 2304,
            "out_hidden_size": 5120,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2
          },
          "vision_end_token_id": 248054,
          "vision_start_token_id": 248053
        }"#
        .replace("LAYER_TYPES", &layer_types_json(64))
    }

    /// Modelled on Qwen/Qwen3.5-35B-A3B config.json (MoE, nested).
    fn qwen35_35b_a3b() -> String {
        r#"{
          "architectures": ["Qwen3_5MoeForConditionalGeneration"],
          "image_token_id": 248056,
          "model_type": "qwen3_5_moe",
          "text_config": {
            "attention_bias": false,
            "attention_dropout": 0.0,
            "attn_output_gate": true,
            "dtype": "bfloat16",
            "eos_token_id": 248044,
            "full_attention_interval": 4,
            "head_dim": 256,
            "hidden_act": "silu",
            "hidden_size": 2048,
            "initializer_range": 0.02,
            "layer_types": LAYER_TYPES,
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 32,
            "linear_value_head_dim": 128,
            "mamba_ssm_dtype": "float32",
            "max_position_embeddings": 262144,
            "model_type": "qwen3_5_moe_text",
            "moe_intermediate_size": 512,
            "mtp_num_hidden_layers": 1,
            "mtp_use_dedicated_embeddings": false,
            "num_attention_heads": 16,
            "num_experts": 256,
            "num_experts_per_tok": 8,
            "num_hidden_layers": 40,
            "num_key_value_heads": 2,
            "output_router_logits": false,
            "rms_norm_eps": 1e-06,
            "rope_parameters": {
              "mrope_interleaved": true,
              "mrope_section": [11, 11, 10],
              "partial_rotary_factor": 0.25,
              "rope_theta": 10000000,
              "rope_type": "default"
            },
            "router_aux_loss_coef": 0.001,
            "shared_expert_intermediate_size": 512,
            "use_cache": true,
            "vocab_size": 248320
          },
          "tie_word_embeddings": false,
          "transformers_version": "4.57.0.dev0",
          "video_token_id": 248057,
          "vision_config": {"depth": 27, "hidden_size": 1152, "model_type": "qwen3_5_moe",
                            "num_heads": 16, "out_hidden_size": 2048},
          "vision_end_token_id": 248054,
          "vision_start_token_id": 248053
        }"#
        .replace("LAYER_TYPES", &layer_types_json(40))
    }

    /// A flat text-only export (`Qwen3_5ForCausalLM.save_pretrained`) of a 0.8B-sized model:
    /// tied embeddings, no layer_types, flat rope fields, eos as a list.
    fn qwen35_text_flat() -> &'static str {
        r#"{
          "architectures": ["Qwen3_5ForCausalLM"],
          "attention_bias": false,
          "eos_token_id": [248046, 248044],
          "full_attention_interval": 4,
          "head_dim": 256,
          "hidden_act": "silu",
          "hidden_size": 1024,
          "intermediate_size": 3584,
          "linear_conv_kernel_dim": 4,
          "linear_key_head_dim": 128,
          "linear_num_key_heads": 16,
          "linear_num_value_heads": 16,
          "linear_value_head_dim": 128,
          "max_position_embeddings": 262144,
          "model_type": "qwen3_5_text",
          "num_attention_heads": 8,
          "num_hidden_layers": 24,
          "num_key_value_heads": 2,
          "partial_rotary_factor": 0.25,
          "rms_norm_eps": 1e-06,
          "rope_theta": 10000000,
          "tie_word_embeddings": true,
          "torch_dtype": "bfloat16",
          "vocab_size": 248320
        }"#
    }

    /// Modelled on Qwen/Qwen3-Next-80B-A3B-Instruct config.json (flat, per-layer rules for MoE).
    fn qwen3_next_80b() -> &'static str {
        r#"{
          "architectures": ["Qwen3NextForCausalLM"],
          "attention_bias": false,
          "attention_dropout": 0.0,
          "bos_token_id": 151643,
          "decoder_sparse_step": 1,
          "eos_token_id": 151645,
          "full_attention_interval": 4,
          "head_dim": 256,
          "hidden_act": "silu",
          "hidden_size": 2048,
          "initializer_range": 0.02,
          "intermediate_size": 5120,
          "linear_conv_kernel_dim": 4,
          "linear_key_head_dim": 128,
          "linear_num_key_heads": 16,
          "linear_num_value_heads": 32,
          "linear_value_head_dim": 128,
          "max_position_embeddings": 262144,
          "mlp_only_layers": [],
          "model_type": "qwen3_next",
          "moe_intermediate_size": 512,
          "norm_topk_prob": true,
          "num_attention_heads": 16,
          "num_experts": 512,
          "num_experts_per_tok": 10,
          "num_hidden_layers": 48,
          "num_key_value_heads": 2,
          "output_router_logits": false,
          "partial_rotary_factor": 0.25,
          "rms_norm_eps": 1e-06,
          "rope_scaling": null,
          "rope_theta": 10000000,
          "router_aux_loss_coef": 0.001,
          "shared_expert_intermediate_size": 512,
          "tie_word_embeddings": false,
          "torch_dtype": "bfloat16",
          "transformers_version": "4.57.0.dev0",
          "use_cache": true,
          "use_sliding_window": false,
          "vocab_size": 151936
        }"#
    }

    fn full_layers(c: &ModelConfig) -> Vec<usize> {
        (0..c.num_hidden_layers)
            .filter(|&i| c.is_full_attention(i))
            .collect()
    }

    #[test]
    fn qwen35_27b_nested() {
        let c = parse_str(&qwen35_27b()).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen35);
        assert_eq!(c.model_type, "qwen3_5_text");
        assert_eq!(
            (c.vocab_size, c.hidden_size, c.intermediate_size),
            (248320, 5120, 17408)
        );
        assert_eq!(c.num_hidden_layers, 64);
        assert_eq!(c.layer_types.len(), 64);
        let full = full_layers(&c);
        assert_eq!(full.len(), 16);
        assert_eq!(&full[..3], &[3, 7, 11]);
        assert!(!c.is_full_attention(0) && !c.is_full_attention(64));
        assert_eq!(
            c.attn_shape(),
            AttnShape {
                q_heads: 24,
                kv_heads: 4,
                head_dim: 256
            }
        );
        let gdn = c.gdn_shape();
        assert_eq!(
            (gdn.key_heads, gdn.value_heads, gdn.key_dim, gdn.value_dim),
            (16, 48, 128, 128)
        );
        assert_eq!(gdn.conv_dim(), 10240);
        assert_eq!(c.rotary_dim, 64);
        assert_eq!(c.rope_theta, 1e7);
        assert_eq!(c.rms_norm_eps, 1e-6);
        assert_eq!(c.linear_conv_kernel_dim, 4);
        assert!(!c.tie_word_embeddings);
        assert_eq!(c.moe, None);
        assert!(!c.is_moe_layer(0));
        assert_eq!(c.mtp_num_hidden_layers, 1);
        assert_eq!(c.max_position_embeddings, 262144);
        // text_config first, then the top level.
        assert_eq!(c.eos_token_ids, vec![248044, 248046]);
        assert_eq!(c.dtype, Some(DType::BF16));
    }

    #[test]
    fn qwen35_35b_a3b_moe_nested() {
        let c = parse_str(&qwen35_35b_a3b()).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen35Moe);
        assert_eq!(c.model_type, "qwen3_5_moe_text");
        assert_eq!(c.intermediate_size, 0);
        assert_eq!(c.num_hidden_layers, 40);
        assert_eq!(full_layers(&c).len(), 10);
        let moe = c.moe.as_ref().unwrap();
        assert_eq!(
            (
                moe.num_experts,
                moe.top_k,
                moe.moe_intermediate_size,
                moe.shared_expert_intermediate_size
            ),
            (256, 8, 512, 512)
        );
        assert!(moe.renormalize);
        assert_eq!(moe.layer_is_moe, vec![true; 40]);
        assert!(c.is_moe_layer(39) && !c.is_moe_layer(40));
        assert_eq!(
            c.attn_shape(),
            AttnShape {
                q_heads: 16,
                kv_heads: 2,
                head_dim: 256
            }
        );
        assert_eq!(c.gdn_shape().value_heads, 32);
        assert_eq!(c.eos_token_ids, vec![248044]);
        assert_eq!(c.mtp_num_hidden_layers, 1);
    }

    #[test]
    fn qwen35_text_flat_layout() {
        let c = parse_str(qwen35_text_flat()).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen35);
        assert_eq!(c.model_type, "qwen3_5_text");
        assert_eq!(c.hidden_size, 1024);
        assert_eq!(c.intermediate_size, 3584);
        assert_eq!(full_layers(&c), vec![3, 7, 11, 15, 19, 23]);
        assert!(c.tie_word_embeddings);
        assert_eq!(c.rope_theta, 1e7);
        assert_eq!(c.rotary_dim, 64);
        assert_eq!(c.eos_token_ids, vec![248046, 248044]);
        assert_eq!(c.dtype, Some(DType::BF16));
        assert_eq!(c.mtp_num_hidden_layers, 0);
    }

    #[test]
    fn flat_moe_text_with_only_model_type() {
        let mut v: Value = serde_json::from_str(&qwen35_35b_a3b()).unwrap();
        let mut text = v["text_config"].take();
        let c = parse_value(&text).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen35Moe);
        assert_eq!(c.model_type, "qwen3_5_moe_text");
        assert_eq!(c.moe.unwrap().num_experts, 256);
        // Only the class name `Qwen3_5MoeForCausalLM`: the same family, text model_type derived.
        text["architectures"] = json!(["Qwen3_5MoeForCausalLM"]);
        text.as_object_mut().unwrap().remove("model_type");
        let c = parse_value(&text).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen35Moe);
        assert_eq!(c.model_type, "qwen3_5_moe_text");
    }

    #[test]
    fn qwen3_next_80b_flat() {
        let c = parse_str(qwen3_next_80b()).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen3Next);
        assert_eq!(c.model_type, "qwen3_next");
        assert_eq!(c.vocab_size, 151936);
        assert_eq!(c.intermediate_size, 5120);
        assert_eq!(full_layers(&c).len(), 12);
        assert_eq!(c.rope_theta, 1e7);
        assert_eq!(c.rotary_dim, 64);
        let moe = c.moe.as_ref().unwrap();
        assert_eq!(
            (
                moe.num_experts,
                moe.top_k,
                moe.shared_expert_intermediate_size
            ),
            (512, 10, 512)
        );
        assert!(moe.renormalize);
        assert!(moe.layer_is_moe.iter().all(|&m| m));
        assert_eq!(c.eos_token_ids, vec![151645]);
        assert_eq!(c.mtp_num_hidden_layers, 0);
        assert_eq!(c.dtype, Some(DType::BF16));
    }

    #[test]
    fn qwen3_next_sparse_step_and_mlp_only_layers() {
        let mut v: Value = serde_json::from_str(qwen3_next_80b()).unwrap();
        v["decoder_sparse_step"] = json!(2);
        v["mlp_only_layers"] = json!([5]);
        v["norm_topk_prob"] = json!(false);
        v["num_nextn_predict_layers"] = json!(1);
        let c = parse_value(&v).unwrap();
        let moe = c.moe.as_ref().unwrap();
        assert!(!moe.renormalize);
        // MoE iff (i+1) % 2 == 0 and i != 5.
        assert_eq!(
            &moe.layer_is_moe[..8],
            &[false, true, false, true, false, false, false, true]
        );
        assert_eq!(c.mtp_num_hidden_layers, 1);

        // Without experts the model is dense and needs intermediate_size.
        v["num_experts"] = json!(0);
        assert_eq!(parse_value(&v).unwrap().moe, None);
        v.as_object_mut().unwrap().remove("intermediate_size");
        let err = parse_value(&v).unwrap_err().to_string();
        assert!(err.contains("`intermediate_size`"), "{err}");

        let mut v: Value = serde_json::from_str(qwen3_next_80b()).unwrap();
        v["decoder_sparse_step"] = json!(0);
        let err = parse_value(&v).unwrap_err().to_string();
        assert!(
            err.contains("decoder_sparse_step") && err.contains("at least 1"),
            "{err}"
        );
        v["decoder_sparse_step"] = json!(1);
        v["mlp_only_layers"] = json!([48]);
        let err = parse_value(&v).unwrap_err().to_string();
        assert!(
            err.contains("mlp_only_layers") && err.contains("layer 48"),
            "{err}"
        );
    }

    #[test]
    fn defaults_when_optional_fields_are_absent() {
        let mut v: Value = serde_json::from_str(qwen3_next_80b()).unwrap();
        let obj = v.as_object_mut().unwrap();
        for key in [
            "head_dim",
            "rms_norm_eps",
            "linear_conv_kernel_dim",
            "full_attention_interval",
            "partial_rotary_factor",
            "rope_theta",
            "max_position_embeddings",
            "norm_topk_prob",
            "decoder_sparse_step",
            "mlp_only_layers",
            "shared_expert_intermediate_size",
            "tie_word_embeddings",
            "torch_dtype",
            "eos_token_id",
        ] {
            obj.remove(key);
        }
        let c = parse_value(&v).unwrap();
        // HF defaults: head_dim 256, theta 10000, factor 0.25, interval 4, max positions 32768.
        assert_eq!(c.head_dim, 256);
        assert_eq!(c.rope_theta, 10_000.0);
        assert_eq!(c.rotary_dim, 64);
        assert_eq!(full_layers(&c).len(), 12);
        assert_eq!(c.max_position_embeddings, 32768);
        assert_eq!(c.rms_norm_eps, 1e-6);
        assert_eq!(c.linear_conv_kernel_dim, 4);
        let moe = c.moe.unwrap();
        assert!(moe.renormalize && moe.layer_is_moe.iter().all(|&m| m));
        assert_eq!(moe.shared_expert_intermediate_size, 0);
        assert!(!c.tie_word_embeddings);
        assert_eq!(c.dtype, None);
        assert!(c.eos_token_ids.is_empty());
    }

    #[test]
    fn layer_types_from_interval() {
        let mut v: Value = serde_json::from_str(qwen3_next_80b()).unwrap();
        v["full_attention_interval"] = json!(3);
        v["num_hidden_layers"] = json!(7);
        let c = parse_value(&v).unwrap();
        assert_eq!(full_layers(&c), vec![2, 5]);
        assert_eq!(c.layer_types.len(), 7);
    }

    #[test]
    fn tie_word_embeddings_text_config_wins() {
        let mut v: Value = serde_json::from_str(&qwen35_27b()).unwrap();
        v["tie_word_embeddings"] = json!(true);
        assert!(
            parse_value(&v).unwrap().tie_word_embeddings,
            "top level used when text_config is silent"
        );
        v["text_config"]["tie_word_embeddings"] = json!(false);
        assert!(!parse_value(&v).unwrap().tie_word_embeddings);
        v["tie_word_embeddings"] = json!(false);
        v["text_config"]["tie_word_embeddings"] = json!(true);
        assert!(parse_value(&v).unwrap().tie_word_embeddings);
    }

    #[test]
    fn eos_from_both_levels_deduplicated() {
        let mut v: Value = serde_json::from_str(&qwen35_27b()).unwrap();
        v["text_config"]["eos_token_id"] = json!([248046, 248044, 248046]);
        v["eos_token_id"] = json!([248044, 7]);
        assert_eq!(
            parse_value(&v).unwrap().eos_token_ids,
            vec![248046, 248044, 7]
        );
        v["eos_token_id"] = json!("248044");
        let err = parse_value(&v).unwrap_err().to_string();
        assert!(
            err.contains("field `eos_token_id`") && err.contains("found a string"),
            "{err}"
        );
    }

    #[test]
    fn rope_variants() {
        let mut v: Value = serde_json::from_str(&qwen35_27b()).unwrap();
        // rope_scaling (legacy name) with an mrope type is plain RoPE for text.
        let params = v["text_config"]["rope_parameters"].take();
        v["text_config"]["rope_scaling"] = json!({"type": "mrope", "mrope_section": [11, 11, 10]});
        v["text_config"]["rope_theta"] = json!(5000000);
        v["text_config"]["partial_rotary_factor"] = json!(0.5);
        let c = parse_value(&v).unwrap();
        assert_eq!((c.rope_theta, c.rotary_dim), (5e6, 128));

        // Values in rope_parameters win over the flat fields.
        v["text_config"]["rope_scaling"] = Value::Null;
        v["text_config"]["rope_parameters"] = params;
        let c = parse_value(&v).unwrap();
        assert_eq!((c.rope_theta, c.rotary_dim), (1e7, 64));

        v["text_config"]["rope_parameters"]["rope_type"] = json!("yarn");
        let err = parse_value(&v).unwrap_err().to_string();
        assert!(
            err.contains("text_config.rope_parameters.rope_type")
                && err.contains("`yarn` is not supported yet"),
            "{err}"
        );

        v["text_config"]["rope_parameters"]["rope_type"] = json!("default");
        // 256 * 0.254 = 65.02 -> 65: odd.
        v["text_config"]["rope_parameters"]["partial_rotary_factor"] = json!(0.254);
        let err = parse_value(&v).unwrap_err().to_string();
        assert!(
            err.contains("partial_rotary_factor") && err.contains("= 65"),
            "{err}"
        );
    }

    #[test]
    fn missing_field_names_field_and_file() {
        let mut v: Value = serde_json::from_str(&qwen35_27b()).unwrap();
        v["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("hidden_size");
        let err = parse_value(&v).unwrap_err();
        match &err {
            LoadError::Config { file, field, .. } => {
                assert_eq!(file, Path::new(ORIGIN));
                assert_eq!(field, "text_config.hidden_size");
            }
            other => panic!("unexpected error {other}"),
        }
        let text = err.to_string();
        assert!(text.contains(ORIGIN) && text.contains("missing"), "{text}");

        let mut v: Value = serde_json::from_str(qwen3_next_80b()).unwrap();
        v.as_object_mut().unwrap().remove("num_experts_per_tok");
        let err = parse_value(&v).unwrap_err().to_string();
        assert!(
            err.contains("field `num_experts_per_tok`: required field is missing"),
            "{err}"
        );

        let mut v: Value = serde_json::from_str(&qwen35_27b()).unwrap();
        v.as_object_mut().unwrap().remove("text_config");
        let err = parse_value(&v).unwrap_err().to_string();
        assert!(
            err.contains("`text_config`") && err.contains("qwen3_5"),
            "{err}"
        );
    }

    #[test]
    fn wrong_json_types() {
        let mut v: Value = serde_json::from_str(&qwen35_27b()).unwrap();
        v["text_config"]["num_attention_heads"] = json!("24");
        let err = parse_value(&v).unwrap_err().to_string();
        assert!(
            err.contains("text_config.num_attention_heads")
                && err.contains("expected a non-negative integer, found a string"),
            "{err}"
        );
        let mut v: Value = serde_json::from_str(&qwen35_27b()).unwrap();
        v["text_config"]["num_hidden_layers"] = json!(-1);
        assert!(parse_value(&v)
            .unwrap_err()
            .to_string()
            .contains("text_config.num_hidden_layers"));
        v["text_config"] = json!([1, 2]);
        assert!(parse_value(&v)
            .unwrap_err()
            .to_string()
            .contains("field `text_config`: expected an object"));
        let err = parse_str("[1]").unwrap_err().to_string();
        assert!(
            err.contains(ORIGIN) && err.contains("expected a JSON object"),
            "{err}"
        );
        let err = parse_str("{\"model_type\": ").unwrap_err().to_string();
        assert!(err.contains("not valid JSON"), "{err}");
    }

    #[test]
    fn unsupported_architecture() {
        let err =
            parse_value(&json!({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("field `model_type`") && err.contains("unsupported model_type `llama`"),
            "{err}"
        );
        let err = parse_value(&json!({"architectures": ["LlamaForCausalLM"], "hidden_size": 8}))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("field `architectures`") && err.contains("LlamaForCausalLM"),
            "{err}"
        );
        let err = parse_value(&json!({"hidden_size": 8}))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("field `model_type`") && err.contains("missing"),
            "{err}"
        );
        // Disagreeing names are an error rather than a guess.
        let mut v: Value = serde_json::from_str(qwen3_next_80b()).unwrap();
        v["architectures"] = json!(["Qwen3_5ForCausalLM"]);
        let err = parse_value(&v).unwrap_err().to_string();
        assert!(
            err.contains("Qwen3-Next") && err.contains("Qwen3.5"),
            "{err}"
        );
        let mut v: Value = serde_json::from_str(qwen3_next_80b()).unwrap();
        v["quantization_config"] = json!({"quant_method": "awq", "bits": 4});
        let err = parse_value(&v).unwrap_err().to_string();
        assert!(
            err.contains("quantization_config.quant_method") && err.contains("`awq`"),
            "{err}"
        );
    }

    #[test]
    fn block_fp8_quantization_config() {
        let qwen = json!({
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
            "modules_to_not_convert": ["lm_head", "model.language_model.layers.0.linear_attn.in_proj_a"],
        });
        let mut v: Value = serde_json::from_str(&qwen35_27b()).unwrap();
        assert_eq!(parse_value(&v).unwrap().quantization, None);
        v["quantization_config"] = qwen.clone();
        let q = parse_value(&v).unwrap().quantization.unwrap();
        assert_eq!(q.block, [128, 128]);
        assert_eq!(q.modules_to_not_convert.len(), 2);

        for (change, field, needle) in [
            (json!({"fmt": "e5m2"}), "quantization_config.fmt", "`e5m2`"),
            (
                json!({"weight_block_size": [64, 64]}),
                "quantization_config.weight_block_size",
                "[64, 64]",
            ),
            (
                json!({"weight_block_size": null}),
                "quantization_config.weight_block_size",
                "per-tensor",
            ),
            (
                json!({"activation_scheme": "static"}),
                "quantization_config.activation_scheme",
                "`static`",
            ),
            (
                json!({"modules_to_not_convert": ["lm_head", 3]}),
                "quantization_config.modules_to_not_convert[1]",
                "a string",
            ),
            (
                json!({"quant_method": "gptq"}),
                "quantization_config.quant_method",
                "`gptq`",
            ),
        ] {
            let mut q = qwen.clone();
            for (k, value) in change.as_object().unwrap() {
                q[k] = value.clone();
            }
            v["quantization_config"] = q;
            let err = parse_value(&v).unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(&err, LoadError::Config { field: f, .. } if f == field)
                    && text.contains(needle),
                "{change}: {text}"
            );
        }
    }

    #[test]
    fn inconsistent_numbers() {
        let mut v: Value = serde_json::from_str(&qwen35_27b()).unwrap();
        v["text_config"]["num_hidden_layers"] = json!(63);
        let err = parse_value(&v).unwrap_err().to_string();
        assert!(
            err.contains("text_config.layer_types")
                && err.contains("64 entries")
                && err.contains("63"),
            "{err}"
        );

        let mut v: Value = serde_json::from_str(&qwen35_27b()).unwrap();
        v["text_config"]["layer_types"][5] = json!("sliding_attention");
        let err = parse_value(&v).unwrap_err().to_string();
        assert!(
            err.contains("text_config.layer_types[5]") && err.contains("sliding_attention"),
            "{err}"
        );

        let mut v: Value = serde_json::from_str(&qwen35_27b()).unwrap();
        v["text_config"]["num_key_value_heads"] = json!(5);
        let err = parse_value(&v).unwrap_err().to_string();
        assert!(
            err.contains("num_key_value_heads") && err.contains("does not divide"),
            "{err}"
        );

        let mut v: Value = serde_json::from_str(&qwen35_27b()).unwrap();
        v["text_config"]["linear_num_value_heads"] = json!(40);
        let err = parse_value(&v).unwrap_err().to_string();
        assert!(
            err.contains("linear_num_value_heads")
                && err.contains("not a multiple of linear_num_key_heads = 16"),
            "{err}"
        );

        let mut v: Value = serde_json::from_str(&qwen35_35b_a3b()).unwrap();
        v["text_config"]["num_experts_per_tok"] = json!(300);
        let err = parse_value(&v).unwrap_err().to_string();
        assert!(
            err.contains("num_experts_per_tok") && err.contains("num_experts = 256"),
            "{err}"
        );

        let mut v: Value = serde_json::from_str(&qwen35_27b()).unwrap();
        v["text_config"]["attn_output_gate"] = json!(false);
        assert!(parse_value(&v)
            .unwrap_err()
            .to_string()
            .contains("attn_output_gate"));
    }

    #[test]
    fn from_dir_reads_config_json() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), qwen3_next_80b()).unwrap();
        let c = ModelConfig::from_dir(dir.path()).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen3Next);

        let empty = tempfile::tempdir().unwrap();
        let err = ModelConfig::from_dir(empty.path()).unwrap_err();
        assert!(matches!(err, LoadError::Io { .. }));
        assert!(err.to_string().contains("config.json"), "{err}");

        std::fs::write(
            dir.path().join("config.json"),
            "{\"model_type\": \"qwen3_next\"}",
        )
        .unwrap();
        let err = ModelConfig::from_dir(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains(&dir.path().join("config.json").display().to_string()),
            "{err}"
        );
    }
}
