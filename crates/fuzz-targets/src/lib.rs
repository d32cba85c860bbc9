//! The fuzz targets of deltaserve as plain library functions: each module's `run(data)` feeds arbitrary
//! bytes to one input-facing parser and asserts the invariants it promises (a failed assertion is a
//! finding; nothing else may panic). The libFuzzer binaries in fuzz/ and the corpus replay test call
//! these; no serving logic lives here.

pub mod chat_template;
pub mod chunks;
mod demo;
pub mod detokenizer;
pub mod reasoning_tool_stream;
pub mod request_json;
pub mod safetensors_header;

/// A target's body: panics only when the code under test breaks one of its promises.
pub type Target = fn(&[u8]);

/// Every target by name, as the fuzz/ binaries and corpus directories are named.
pub const TARGETS: [(&str, Target); 5] = [
    ("request_json", request_json::run),
    ("chat_template", chat_template::run),
    ("reasoning_tool_stream", reasoning_tool_stream::run),
    ("detokenizer", detokenizer::run),
    ("safetensors_header", safetensors_header::run),
];
