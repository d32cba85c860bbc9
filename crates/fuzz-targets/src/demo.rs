//! The demo model's tokenizer and chat templates (models/demo), loaded once per process and shared by
//! the targets that render, encode or decode the way the server does. Read-only after loading.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use deltaserve_text::{ChatTemplate, Tokenizer};

/// What the server builds from the demo model at start-up.
pub struct Demo {
    pub tokenizer: Tokenizer,
    /// The template for requests without tools.
    pub plain: ChatTemplate,
    /// The template for requests with tools.
    pub with_tools: ChatTemplate,
    /// `max_position_embeddings` of the demo config, the server's default context length.
    pub context_length: usize,
    /// Ids of the tokenizer, added tokens included (computed once: the tokenizers crate builds the
    /// whole vocabulary map to count it).
    pub vocab_size: usize,
}

impl Demo {
    pub fn template(&self, with_tools: bool) -> &ChatTemplate {
        if with_tools {
            &self.with_tools
        } else {
            &self.plain
        }
    }
}

/// models/demo of this checkout.
pub fn demo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo")
}

/// The demo model's text side, loaded on first use.
pub fn demo() -> &'static Demo {
    static DEMO: OnceLock<Demo> = OnceLock::new();
    DEMO.get_or_init(load)
}

/// Panics with the reason when models/demo is missing or broken: that is a broken checkout, which no
/// fuzz run can work around, not a finding about fuzzed input.
fn load() -> Demo {
    let dir = demo_dir();
    let tokenizer = Tokenizer::from_dir(&dir)
        .unwrap_or_else(|e| panic!("the demo tokenizer in {} must load: {e}", dir.display()));
    let plain = ChatTemplate::from_tokenizer(&tokenizer, false)
        .unwrap_or_else(|e| panic!("the demo chat template must compile: {e}"));
    let with_tools = ChatTemplate::from_tokenizer(&tokenizer, true)
        .unwrap_or_else(|e| panic!("the demo tool chat template must compile: {e}"));
    let config_path = dir.join("config.json");
    let config: serde_json::Value = std::fs::read(&config_path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_else(|| panic!("{} must be readable JSON", config_path.display()));
    let context_length = config
        .get("max_position_embeddings")
        .or_else(|| config.pointer("/text_config/max_position_embeddings"))
        .and_then(serde_json::Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or_else(|| {
            panic!(
                "{} must hold max_position_embeddings",
                config_path.display()
            )
        });
    let vocab_size = tokenizer.vocab_size();
    Demo {
        vocab_size,
        tokenizer,
        plain,
        with_tools,
        context_length,
    }
}
