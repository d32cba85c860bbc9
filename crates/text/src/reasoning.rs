//! The `qwen3` reasoning parser (docs/serving.md, "Reasoning output"): splits model output into
//! reasoning (the think block) and content, whole or as streamed text deltas, and counts reasoning
//! tokens from ids. It leaves tool calls in the content for tool_calls.rs and never touches token
//! decoding.

use crate::tag_scan::{find_first, partial_tag_len, trailing_whitespace_len};
use crate::tokenizer::Tokenizer;
use crate::tool_calls::TOOL_CALL_START;

pub const THINK_START: &str = "<think>";
pub const THINK_END: &str = "</think>";

/// Tags that end reasoning; a `<tool_call>` is kept as content, `</think>` is dropped. Qwen3.5 sometimes
/// starts a tool call without closing its think block.
const REASONING_ENDS: [&str; 2] = [THINK_END, TOOL_CALL_START];

/// Output split into reasoning and content. `None` when that part has no text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReasoningSplit {
    pub reasoning: Option<String>,
    pub content: Option<String>,
}

/// Whether a rendered prompt ends inside an open think block (the Qwen3.5 generation prompt
/// `<|im_start|>assistant\n<think>\n`), so that the output starts in reasoning.
pub fn prompt_opens_reasoning(prompt: &str) -> bool {
    match (prompt.rfind(THINK_START), prompt.rfind(THINK_END)) {
        (Some(start), Some(end)) => start > end,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// Splits a complete output. `starts_in_reasoning`: the prompt opened the think block
/// ([`prompt_opens_reasoning`]); otherwise reasoning is recognised only when the output starts (after
/// whitespace) with `<think>`.
///
/// Reasoning is the think block's text, trimmed; it ends at the first `</think>` or at a `<tool_call>`,
/// or at the end of the output when cut off. Content is the text after, without leading blank lines.
pub fn split_reasoning(output: &str, starts_in_reasoning: bool) -> ReasoningSplit {
    let body = match output.trim_start().strip_prefix(THINK_START) {
        Some(rest) => rest,
        None if starts_in_reasoning => output,
        None => {
            return ReasoningSplit {
                reasoning: None,
                content: non_empty(output),
            }
        }
    };
    let (reasoning, content) = match find_first(body, &REASONING_ENDS) {
        Some((pos, 0)) => (
            &body[..pos],
            strip_leading_blank_lines(&body[pos + THINK_END.len()..]),
        ),
        Some((pos, _)) => (&body[..pos], strip_leading_blank_lines(&body[pos..])),
        None => (body, ""),
    };
    ReasoningSplit {
        reasoning: non_empty(reasoning.trim()),
        content: non_empty(content),
    }
}

fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_string())
}

/// Drops whitespace-only lines at the start; the indentation of the first real line is kept. Text that is
/// whitespace only becomes empty.
fn strip_leading_blank_lines(text: &str) -> &str {
    let rest = text.trim_start();
    if rest.is_empty() {
        return rest;
    }
    let leading = &text[..text.len() - rest.len()];
    match leading.rfind('\n') {
        Some(newline) => &text[newline + 1..],
        None => text,
    }
}

/// New reasoning and content text from one streamed chunk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReasoningDelta {
    pub reasoning: String,
    pub content: String,
}

impl ReasoningDelta {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing decided yet: waiting to see whether the output opens with `<think>`.
    Start { forced: bool },
    /// Inside the think block; `emitted` once any reasoning text went out (leading whitespace is dropped
    /// until then).
    Reasoning { emitted: bool },
    /// Just after `</think>`: leading blank lines are dropped.
    AfterThink,
    /// Everything from here on is content.
    Content,
}

/// Streaming form of [`split_reasoning`]: feed text deltas, get reasoning / content deltas whose
/// concatenations equal the non-streaming split. Partial tags are held back, never leaked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReasoningStream {
    phase: Phase,
    /// Text received but not yet emitted.
    pending: String,
}

impl ReasoningStream {
    pub fn new(starts_in_reasoning: bool) -> Self {
        Self {
            phase: Phase::Start {
                forced: starts_in_reasoning,
            },
            pending: String::new(),
        }
    }

    /// Whether the parser is (still) inside the think block.
    pub fn in_reasoning(&self) -> bool {
        matches!(
            self.phase,
            Phase::Reasoning { .. } | Phase::Start { forced: true }
        )
    }

    pub fn push(&mut self, text: &str) -> ReasoningDelta {
        self.pending.push_str(text);
        let mut delta = ReasoningDelta::default();
        loop {
            let before = (self.phase, self.pending.len());
            self.advance(&mut delta);
            if (self.phase, self.pending.len()) == before {
                return delta;
            }
        }
    }

    /// Flushes held-back text at the end of the output.
    pub fn finish(&mut self) -> ReasoningDelta {
        let pending = std::mem::take(&mut self.pending);
        let mut delta = ReasoningDelta::default();
        match self.phase {
            Phase::Start { forced: false } | Phase::Content => delta.content = pending,
            Phase::Start { forced: true } | Phase::Reasoning { emitted: false } => {
                delta.reasoning = pending.trim().to_string()
            }
            Phase::Reasoning { emitted: true } => delta.reasoning = pending.trim_end().to_string(),
            Phase::AfterThink => delta.content = strip_leading_blank_lines(&pending).to_string(),
        }
        self.phase = Phase::Content;
        delta
    }

    /// One step of the state machine on `pending`; the caller repeats while it makes progress.
    fn advance(&mut self, delta: &mut ReasoningDelta) {
        match self.phase {
            Phase::Start { forced } => {
                let trimmed = self.pending.trim_start();
                if let Some(rest) = trimmed.strip_prefix(THINK_START) {
                    self.pending = rest.to_string();
                    self.phase = Phase::Reasoning { emitted: false };
                } else if THINK_START.starts_with(trimmed) {
                    // Whitespace or the beginning of `<think>`: wait for more.
                } else if forced {
                    self.phase = Phase::Reasoning { emitted: false };
                } else {
                    self.phase = Phase::Content;
                }
            }
            Phase::Reasoning { emitted } => {
                if !emitted {
                    let start = self.pending.len() - self.pending.trim_start().len();
                    self.pending.drain(..start);
                }
                if let Some((pos, tag)) = find_first(&self.pending, &REASONING_ENDS) {
                    let reasoning = self.pending[..pos].trim_end();
                    delta.reasoning.push_str(reasoning);
                    let skip = if tag == 0 { pos + THINK_END.len() } else { pos };
                    self.pending.drain(..skip);
                    self.phase = Phase::AfterThink;
                    return;
                }
                let partial = partial_tag_len(&self.pending, &REASONING_ENDS);
                let text_end = self.pending.len() - partial;
                let hold_from = text_end - trailing_whitespace_len(&self.pending[..text_end]);
                if hold_from > 0 {
                    delta.reasoning.extend(self.pending.drain(..hold_from));
                    self.phase = Phase::Reasoning { emitted: true };
                }
            }
            Phase::AfterThink => {
                if !self.pending.trim_start().is_empty() {
                    let kept = strip_leading_blank_lines(&self.pending).len();
                    let skip = self.pending.len() - kept;
                    self.pending.drain(..skip);
                    self.phase = Phase::Content;
                }
            }
            Phase::Content => delta.content.push_str(&std::mem::take(&mut self.pending)),
        }
    }
}

/// Token ids of the think tags, for counting reasoning tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinkTokenIds {
    pub start: Option<u32>,
    pub end: u32,
    pub tool_call: Option<u32>,
}

impl ThinkTokenIds {
    /// The ids of `<think>`, `</think>` and `<tool_call>`; `None` when the vocabulary has no `</think>`.
    pub fn from_tokenizer(tokenizer: &Tokenizer) -> Option<Self> {
        Some(Self {
            start: tokenizer.token_to_id(THINK_START),
            end: tokenizer.token_to_id(THINK_END)?,
            tool_call: tokenizer.token_to_id(TOOL_CALL_START),
        })
    }
}

/// Whether prompt ids end inside an open think block (token-id form of [`prompt_opens_reasoning`]).
pub fn prompt_ids_open_reasoning(prompt: &[u32], tags: &ThinkTokenIds) -> bool {
    let Some(start) = tags.start else {
        return false;
    };
    match (
        prompt.iter().rposition(|&id| id == start),
        prompt.iter().rposition(|&id| id == tags.end),
    ) {
        (Some(s), Some(e)) => s > e,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// How many generated ids are reasoning: the ids inside the think block, tags excluded. The block is
/// open from the start when `starts_in_reasoning`, or when the first id is `<think>`; it ends at the first
/// `</think>` or `<tool_call>` id, or at the end when the output was cut off inside it.
pub fn count_reasoning_tokens(
    generated: &[u32],
    tags: &ThinkTokenIds,
    starts_in_reasoning: bool,
) -> usize {
    let opens_with_tag = tags.start.is_some() && generated.first().copied() == tags.start;
    if !opens_with_tag && !starts_in_reasoning {
        return 0;
    }
    let body = if opens_with_tag {
        &generated[1..]
    } else {
        generated
    };
    body.iter()
        .position(|&id| id == tags.end || Some(id) == tags.tool_call)
        .unwrap_or(body.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(output: &str, forced: bool) -> (Option<String>, Option<String>) {
        let s = split_reasoning(output, forced);
        (s.reasoning, s.content)
    }

    /// Every rule of docs/serving.md, "Reasoning output", with the expected (reasoning, content),
    /// for both starting modes.
    pub(crate) const CASES: &[(&str, bool, Option<&str>, Option<&str>)] = &[
        // Prompt opened the think block: output is reasoning, then the answer.
        (
            "Let me think.\n</think>\n\nThe answer is 4.",
            true,
            Some("Let me think."),
            Some("The answer is 4."),
        ),
        // Cut by max_tokens inside reasoning: everything is reasoning, content null.
        (
            "Still thinking about",
            true,
            Some("Still thinking about"),
            None,
        ),
        // Reasoning then nothing after the tag: content null.
        ("Done.\n</think>\n\n", true, Some("Done."), None),
        // Empty think block (enable_thinking style output), answer only.
        ("\n</think>\n\nHi", true, None, Some("Hi")),
        // Model repeats <think> although the prompt opened it.
        (
            "<think>\nplan\n</think>\n\nok",
            true,
            Some("plan"),
            Some("ok"),
        ),
        // Not opened by the prompt, output starts with <think>.
        (
            "<think>\nhmm\n</think>\n\nYes.",
            false,
            Some("hmm"),
            Some("Yes."),
        ),
        ("\n <think>a</think>b", false, Some("a"), Some("b")),
        // No reasoning at all (thinking disabled): everything is content, kept as is.
        ("  Plain answer.\n", false, None, Some("  Plain answer.\n")),
        ("", false, None, None),
        ("", true, None, None),
        // <think> later in the text is not a think block.
        ("Use <think> tags.", false, None, Some("Use <think> tags.")),
        // Tool call inside an unterminated think block ends reasoning; the call stays content.
        (
            "I should call it.\n\n<tool_call>\n<function=f>\n</function>\n</tool_call>",
            true,
            Some("I should call it."),
            Some("<tool_call>\n<function=f>\n</function>\n</tool_call>"),
        ),
        // Only the first </think> ends reasoning; later tags are content.
        (
            "r</think>\n\na</think>b<think>c",
            true,
            Some("r"),
            Some("a</think>b<think>c"),
        ),
        // Leading blank lines are dropped, indentation of the first line is kept.
        (
            "r</think>\n \n    code()\n",
            true,
            Some("r"),
            Some("    code()\n"),
        ),
        ("r</think>   x", true, Some("r"), Some("   x")),
        // Partial tags at the end of a cut-off output are text.
        ("thinking </thi", true, Some("thinking </thi"), None),
        ("<thi", false, None, Some("<thi")),
        ("  <thi", true, Some("<thi"), None),
        // Multi-byte text around tags.
        (
            "日本 😀\n</think>\n\n答え 👍",
            true,
            Some("日本 😀"),
            Some("答え 👍"),
        ),
        // Whitespace-only answer is no answer.
        ("r</think>\n\n  \n", true, Some("r"), None),
    ];

    #[test]
    fn non_streaming_cases() {
        for &(output, forced, reasoning, content) in CASES {
            let expected = (reasoning.map(String::from), content.map(String::from));
            assert_eq!(
                split(output, forced),
                expected,
                "output {output:?} forced {forced}"
            );
        }
    }

    fn stream(chunks: &[&str], forced: bool) -> (String, String) {
        let mut parser = ReasoningStream::new(forced);
        let (mut reasoning, mut content) = (String::new(), String::new());
        for chunk in chunks {
            let d = parser.push(chunk);
            reasoning.push_str(&d.reasoning);
            content.push_str(&d.content);
        }
        let d = parser.finish();
        reasoning.push_str(&d.reasoning);
        content.push_str(&d.content);
        (reasoning, content)
    }

    /// All ways to cut `text` at char boundaries (2^(chars-1) chunkings), capped to `max_cuts` cut points
    /// chosen among the first boundaries when the string is long.
    fn all_chunkings(text: &str, max_cuts: usize, mut each: impl FnMut(&[&str])) {
        let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).skip(1).collect();
        let positions: Vec<usize> = if bounds.len() <= max_cuts {
            bounds
        } else {
            // Spread the cut points over the whole string.
            (0..max_cuts)
                .map(|k| bounds[k * bounds.len() / max_cuts])
                .collect()
        };
        for mask in 0u32..(1 << positions.len()) {
            let mut chunks = Vec::new();
            let mut last = 0;
            for (bit, &pos) in positions.iter().enumerate() {
                if mask & (1 << bit) != 0 {
                    chunks.push(&text[last..pos]);
                    last = pos;
                }
            }
            chunks.push(&text[last..]);
            each(&chunks);
        }
    }

    #[test]
    fn streaming_equals_non_streaming_for_every_chunking() {
        let mut checked = 0usize;
        for &(output, forced, reasoning, content) in CASES {
            let expected = (
                reasoning.unwrap_or("").to_string(),
                content.unwrap_or("").to_string(),
            );
            all_chunkings(output, 14, |chunks| {
                assert_eq!(
                    stream(chunks, forced),
                    expected,
                    "chunks {chunks:?} forced {forced}"
                );
                checked += 1;
            });
            // Char by char too (covers every boundary for long strings).
            let chars: Vec<String> = output.chars().map(String::from).collect();
            let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
            assert_eq!(stream(&chars, forced), expected, "char by char {output:?}");
        }
        assert!(checked > 50_000, "only {checked} chunkings checked");
    }

    #[test]
    fn exhaustive_chunking_of_a_sample_with_tags() {
        // 19 chars: every one of its 2^18 chunkings is tried.
        let sample = "<think>a</think>\nb<";
        assert_eq!(sample.chars().count(), 19);
        let split = split_reasoning(sample, false);
        assert_eq!(
            (split.reasoning.as_deref(), split.content.as_deref()),
            (Some("a"), Some("b<"))
        );
        let expected = ("a".to_string(), "b<".to_string());
        let mut n = 0;
        all_chunkings(sample, 18, |chunks| {
            assert_eq!(stream(chunks, false), expected, "{chunks:?}");
            n += 1;
        });
        assert_eq!(n, 1 << 18);
    }

    #[test]
    fn partial_tags_are_never_leaked() {
        let mut parser = ReasoningStream::new(true);
        assert_eq!(parser.push("abc </th").reasoning, "abc");
        let d = parser.push("ink>");
        assert!(d.is_empty(), "{d:?}");
        assert!(!parser.in_reasoning());
        assert_eq!(parser.push("\n\nHi <").content, "Hi <");
        let mut parser = ReasoningStream::new(false);
        assert!(parser.push("<thi").is_empty());
        assert!(parser.push("nk>").is_empty());
        assert!(parser.in_reasoning());
        assert_eq!(parser.push("x<tool_").reasoning, "x");
        assert_eq!(parser.push("call>").content, "<tool_call>");
    }

    #[test]
    fn prompt_detection() {
        assert!(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_reasoning(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(!prompt_opens_reasoning("<|im_start|>assistant\n"));
        assert!(prompt_opens_reasoning(
            "<think>\nold\n</think>\n\nx<|im_end|>\n<|im_start|>assistant\n<think>\n"
        ));
        let tags = ThinkTokenIds {
            start: Some(1),
            end: 2,
            tool_call: Some(3),
        };
        assert!(prompt_ids_open_reasoning(&[9, 1, 5], &tags));
        assert!(!prompt_ids_open_reasoning(&[9, 1, 5, 2, 5], &tags));
        assert!(!prompt_ids_open_reasoning(&[9], &tags));
    }

    #[test]
    fn reasoning_token_counts() {
        let tags = ThinkTokenIds {
            start: Some(1),
            end: 2,
            tool_call: Some(3),
        };
        assert_eq!(
            count_reasoning_tokens(&[10, 11, 12, 2, 20, 21], &tags, true),
            3
        );
        assert_eq!(count_reasoning_tokens(&[1, 10, 11, 2, 20], &tags, false), 2);
        assert_eq!(count_reasoning_tokens(&[1, 10, 11, 2, 20], &tags, true), 2);
        assert_eq!(
            count_reasoning_tokens(&[10, 11, 12], &tags, true),
            3,
            "cut off inside reasoning"
        );
        assert_eq!(
            count_reasoning_tokens(&[10, 3, 12], &tags, true),
            1,
            "tool call ends reasoning"
        );
        assert_eq!(
            count_reasoning_tokens(&[10, 11, 2], &tags, false),
            0,
            "thinking disabled"
        );
        assert_eq!(
            count_reasoning_tokens(&[2, 20], &tags, true),
            0,
            "empty think block"
        );
        assert_eq!(count_reasoning_tokens(&[], &tags, true), 0);
    }
}
