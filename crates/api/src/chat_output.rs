//! Splits one choice's chat output into reasoning, content and tool calls, whole (non-streaming) or as
//! deltas (streaming), by chaining the deltaserve-text parsers: reasoning first (qwen3), then tool
//! calls (qwen3_coder XML or hermes JSON, as the model writes them) on the content. No engine, no JSON.

use deltaserve_text::{
    parse_hermes_tool_calls, parse_tool_calls, split_reasoning, HermesToolCallStream,
    ParsedToolCall, ReasoningStream, ToolCallChunk, ToolCallDelta, ToolCallFormat, ToolCallStream,
    ToolSchemas,
};

/// Which parsers a request's output goes through.
#[derive(Debug, Clone)]
pub struct OutputParsing {
    /// `Some(starts_in_reasoning)` when reasoning is split out.
    pub reasoning: Option<bool>,
    /// The tools' schemas when tool calls are parsed.
    pub tools: Option<ToolSchemas>,
    /// The syntax tool calls are written in.
    pub tool_format: ToolCallFormat,
    /// Prefix of the tool-call ids of this choice.
    pub call_id_prefix: String,
}

/// A whole assistant message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedMessage {
    pub reasoning: Option<String>,
    /// `None` when no answer text was produced.
    pub content: Option<String>,
    pub tool_calls: Vec<ParsedToolCall>,
}

impl OutputParsing {
    /// Parses a complete output.
    pub fn parse(&self, text: &str) -> ParsedMessage {
        let (reasoning, content) = match self.reasoning {
            Some(starts) => {
                let split = split_reasoning(text, starts);
                (split.reasoning, split.content)
            }
            None => (None, Some(text.to_string()).filter(|t| !t.is_empty())),
        };
        let (content, tool_calls) = match (&self.tools, content) {
            (Some(schemas), Some(content)) => {
                let split = match self.tool_format {
                    ToolCallFormat::Qwen3Coder => {
                        parse_tool_calls(&content, schemas, &self.call_id_prefix)
                    }
                    ToolCallFormat::Hermes => {
                        parse_hermes_tool_calls(&content, &self.call_id_prefix)
                    }
                };
                (split.content, split.calls)
            }
            (_, content) => (content, Vec::new()),
        };
        ParsedMessage {
            reasoning,
            content,
            tool_calls,
        }
    }

    /// A streaming parser for one choice.
    pub fn stream(&self) -> StreamParser {
        StreamParser {
            reasoning: self.reasoning.map(ReasoningStream::new),
            tools: self.tools.clone().map(|schemas| match self.tool_format {
                ToolCallFormat::Qwen3Coder => {
                    ToolParser::Xml(ToolCallStream::new(schemas, &self.call_id_prefix))
                }
                ToolCallFormat::Hermes => {
                    ToolParser::Json(HermesToolCallStream::new(&self.call_id_prefix))
                }
            }),
        }
    }
}

/// The streaming tool-call parser of one choice.
#[derive(Debug, Clone)]
enum ToolParser {
    Xml(ToolCallStream),
    Json(HermesToolCallStream),
}

impl ToolParser {
    fn push(&mut self, text: &str) -> ToolCallDelta {
        match self {
            Self::Xml(p) => p.push(text),
            Self::Json(p) => p.push(text),
        }
    }

    fn finish(&mut self) -> ToolCallDelta {
        match self {
            Self::Xml(p) => p.finish(),
            Self::Json(p) => p.finish(),
        }
    }

    fn call_count(&self) -> usize {
        match self {
            Self::Xml(p) => p.call_count(),
            Self::Json(p) => p.call_count(),
        }
    }
}

/// New output of one streamed step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageDelta {
    pub reasoning: String,
    pub content: String,
    pub tool_calls: Vec<ToolCallChunk>,
}

impl MessageDelta {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty() && self.tool_calls.is_empty()
    }
}

/// Streaming parser chain of one choice.
#[derive(Debug, Clone)]
pub struct StreamParser {
    reasoning: Option<ReasoningStream>,
    tools: Option<ToolParser>,
}

impl StreamParser {
    pub fn push(&mut self, text: &str) -> MessageDelta {
        let (reasoning, content) = match &mut self.reasoning {
            Some(parser) => {
                let delta = parser.push(text);
                (delta.reasoning, delta.content)
            }
            None => (String::new(), text.to_string()),
        };
        self.tools_step(reasoning, content, false)
    }

    /// Flushes everything held back at the end of the output.
    pub fn finish(&mut self) -> MessageDelta {
        let (reasoning, content) = match &mut self.reasoning {
            Some(parser) => {
                let delta = parser.finish();
                (delta.reasoning, delta.content)
            }
            None => (String::new(), String::new()),
        };
        self.tools_step(reasoning, content, true)
    }

    fn tools_step(&mut self, reasoning: String, content: String, at_end: bool) -> MessageDelta {
        let Some(tools) = &mut self.tools else {
            return MessageDelta {
                reasoning,
                content,
                tool_calls: Vec::new(),
            };
        };
        let mut delta = tools.push(&content);
        if at_end {
            let tail = tools.finish();
            delta.content.push_str(&tail.content);
            delta.tool_calls.extend(tail.tool_calls);
        }
        MessageDelta {
            reasoning,
            content: delta.content,
            tool_calls: delta.tool_calls,
        }
    }

    /// Tool calls emitted so far.
    pub fn call_count(&self) -> usize {
        self.tools.as_ref().map_or(0, ToolParser::call_count)
    }
}
