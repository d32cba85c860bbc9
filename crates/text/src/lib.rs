//! Text side of deltaserve: HF tokenizer loading, chat-template rendering, incremental detokenizing and
//! the parsers that split model output into reasoning, content and tool calls. Pure functions over text
//! and token ids: no engine, no HTTP, no tensors.

mod chat_template;
mod detokenizer;
mod generation_config;
mod hermes;
mod messages;
mod pyformat;
mod reasoning;
mod strftime;
mod tag_scan;
mod tokenizer;
mod tool_calls;

pub use chat_template::{ChatTemplate, RenderOptions, TemplateError, RESERVED_VARIABLES};
pub use detokenizer::Detokenizer;
pub use generation_config::GenerationDefaults;
pub use hermes::{parse_hermes_tool_calls, HermesToolCallStream, ToolCallFormat};
pub use messages::{ChatMessage, FunctionCall, MessageContent, ToolCall};
pub use reasoning::{
    count_reasoning_tokens, prompt_ids_open_reasoning, prompt_opens_reasoning, split_reasoning,
    ReasoningDelta, ReasoningSplit, ReasoningStream, ThinkTokenIds, THINK_END, THINK_START,
};
pub use tokenizer::{SpecialTokenStrings, Tokenizer, TokenizerError, TokenizerFiles};
pub use tool_calls::{
    parse_tool_calls, ParsedToolCall, ToolCallChunk, ToolCallDelta, ToolCallSplit, ToolCallStream,
    ToolSchemas, TOOL_CALL_END, TOOL_CALL_START,
};
