//! Whole-text analysis for `deltaserve lint-output`: a finished text, or one parsed chat-completion
//! response (each choice's `reasoning_content` and `content`), streamed through the detector as
//! pseudo-tokens. Owns the JSON field handling; reading files and printing belong to the CLI.

use crate::config::{Config, ConfigError};
use crate::detector::{DegenerationDetector, StreamEnd};
use crate::pseudo_tokens::{pseudo_token_id, PseudoTokenizer};
use crate::verdict::Verdict;
use serde::Serialize;
use serde_json::Value;
use thiserror::Error;

/// A response that is not shaped like an OpenAI chat (or text) completion.
#[derive(Debug, Error)]
pub enum LintError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("chat completion: expected a JSON object, found {found}")]
    NotAnObject { found: &'static str },
    #[error("chat completion: expected a `choices` array, found {found}")]
    Choices { found: &'static str },
    #[error("chat completion choices[{index}].{field}: expected {expected}, found {found}")]
    Field {
        index: usize,
        field: &'static str,
        expected: &'static str,
        found: &'static str,
    },
}

fn json_type(value: Option<&Value>) -> &'static str {
    match value {
        None => "nothing (field missing)",
        Some(Value::Null) => "null",
        Some(Value::Bool(_)) => "a boolean",
        Some(Value::Number(_)) => "a number",
        Some(Value::String(_)) => "a string",
        Some(Value::Array(_)) => "an array",
        Some(Value::Object(_)) => "an object",
    }
}

/// The verdict for one choice of a response.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChoiceReport {
    /// The choice's `index` (its position when the field is missing).
    pub index: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    /// Characters of reasoning and of answer text read.
    pub reasoning_chars: usize,
    pub content_chars: usize,
    pub verdict: Option<Verdict>,
}

impl DegenerationDetector {
    /// Pushes every pseudo-token of `text`; returns the verdict as soon as one fires.
    pub fn push_text(&mut self, text: &str, tokenizer: PseudoTokenizer) -> Option<&Verdict> {
        for piece in tokenizer.pieces(text) {
            if self.verdict().is_some() {
                break;
            }
            self.push(pseudo_token_id(piece), piece);
        }
        self.verdict()
    }

    /// Forgets the previous stream and analyses a finished text (reasoning off at the start; literal
    /// think tags are followed when `scan_think_tags` is on).
    pub fn analyze_text(
        &mut self,
        text: &str,
        tokenizer: PseudoTokenizer,
        end: StreamEnd,
    ) -> Option<Verdict> {
        self.reset();
        self.push_text(text, tokenizer);
        self.finish(end).cloned()
    }
}

/// The verdict for a finished text, fed as BPE-like word pieces; how the stream ended is unknown, so
/// the length-cut rule does not apply, but the end-of-text rules do (a loop still running at the
/// last character, see [`Config`]).
pub fn analyze_text(text: &str, config: &Config) -> Result<Option<Verdict>, ConfigError> {
    let mut detector = DegenerationDetector::new(config.clone())?;
    Ok(detector.analyze_text(text, PseudoTokenizer::WordPieces, StreamEnd::Unknown))
}

/// A string field that may be missing or null; chat `content` may also be an array of parts with
/// `text`, joined in order.
fn text_field(message: &Value, names: &[&'static str], index: usize) -> Result<String, LintError> {
    for &name in names {
        match message.get(name) {
            None | Some(Value::Null) => continue,
            Some(Value::String(s)) => return Ok(s.clone()),
            Some(Value::Array(parts)) if name == "content" => {
                return Ok(parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect());
            }
            other => {
                return Err(LintError::Field {
                    index,
                    field: name,
                    expected: "a string or null",
                    found: json_type(other),
                })
            }
        }
    }
    Ok(String::new())
}

/// Verdicts for each choice of one parsed response of `/v1/chat/completions` (`message` or a merged
/// stream `delta`) or `/v1/completions` (`text`).
///
/// `reasoning_content` (or `reasoning`) is read as an open think block; the block counts as closed
/// unless the choice was cut by the length limit without any answer text (the docs/serving.md,
/// "Reasoning output", case of
/// `content: null`, `finish_reason: "length"`). `finish_reason: "length"` turns on the length-cut
/// rule; `length` or no finish reason at all turns on the end-of-text rules (any other reason means
/// the model stopped by itself). Reasoning tokens are counted as pseudo-tokens (about one per word or digit), so set the
/// budget in those units when linting stored responses.
pub fn analyze_chat_completion(
    response: &Value,
    config: &Config,
) -> Result<Vec<ChoiceReport>, LintError> {
    if !response.is_object() {
        return Err(LintError::NotAnObject {
            found: json_type(Some(response)),
        });
    }
    let choices = match response.get("choices") {
        Some(Value::Array(choices)) => choices,
        other => {
            return Err(LintError::Choices {
                found: json_type(other),
            })
        }
    };
    let mut detector = DegenerationDetector::new(config.clone())?;
    let mut reports = Vec::with_capacity(choices.len());
    for (position, choice) in choices.iter().enumerate() {
        if !choice.is_object() {
            return Err(LintError::Field {
                index: position,
                field: "(choice)",
                expected: "an object",
                found: json_type(Some(choice)),
            });
        }
        let finish_reason = match choice.get("finish_reason") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            other => {
                return Err(LintError::Field {
                    index: position,
                    field: "finish_reason",
                    expected: "a string or null",
                    found: json_type(other),
                })
            }
        };
        let (reasoning, content) = match choice.get("message").or_else(|| choice.get("delta")) {
            Some(message @ Value::Object(_)) => (
                text_field(message, &["reasoning_content", "reasoning"], position)?,
                text_field(message, &["content"], position)?,
            ),
            Some(other) => {
                return Err(LintError::Field {
                    index: position,
                    field: "message",
                    expected: "an object",
                    found: json_type(Some(other)),
                })
            }
            None => (String::new(), text_field(choice, &["text"], position)?),
        };
        let cut = finish_reason.as_deref() == Some("length");
        let end = match finish_reason.as_deref() {
            Some("length") => StreamEnd::Length,
            Some(_) => StreamEnd::Stop,
            None => StreamEnd::Unknown,
        };
        detector.reset();
        if !reasoning.is_empty() {
            detector.start_reasoning();
            detector.push_text(&reasoning, PseudoTokenizer::WordPieces);
            if !(cut && content.is_empty()) {
                detector.end_reasoning();
            }
        }
        detector.push_text(&content, PseudoTokenizer::WordPieces);
        let verdict = detector.finish(end).cloned();
        reports.push(ChoiceReport {
            index: choice
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(position as u64),
            finish_reason,
            reasoning_chars: reasoning.chars().count(),
            content_chars: content.chars().count(),
            verdict,
        });
    }
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::DegenerationKind;
    use serde_json::json;

    #[test]
    fn analyzes_plain_text() {
        let config = Config::default();
        assert_eq!(
            analyze_text("Paris is the capital of France.", &config).unwrap(),
            None
        );
        let verdict = analyze_text(&"prime ".repeat(200), &config)
            .unwrap()
            .unwrap();
        assert_eq!(verdict.kind, DegenerationKind::PeriodicLoop);
        assert_eq!(verdict.evidence.span.trim(), "prime");
        let bad = Config {
            collapse_window: 0,
            ..Config::default()
        };
        assert!(analyze_text("x", &bad).is_err());
    }

    #[test]
    fn reads_reasoning_and_content_of_each_choice() {
        let response = json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [
                {"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "2 + 2 = 4.",
                             "reasoning_content": "Simple addition: two plus two is four."}},
                {"index": 1, "finish_reason": "length",
                 "message": {"role": "assistant", "content": null,
                             "reasoning_content": format!("We are tasked with a simple arithmetic problem: {}", "2 + 2 = 2.".repeat(100))}}
            ]
        });
        let reports = analyze_chat_completion(&response, &Config::default()).unwrap();
        assert_eq!(reports.len(), 2);
        assert_eq!(reports[0].verdict, None);
        assert_eq!(reports[0].finish_reason.as_deref(), Some("stop"));
        let verdict = reports[1].verdict.as_ref().unwrap();
        assert_eq!(verdict.kind, DegenerationKind::PeriodicLoop);
        assert_eq!(verdict.evidence.span, "2 + 2 = 2.");
        assert_eq!(reports[1].content_chars, 0);
    }

    #[test]
    fn unclosed_reasoning_cut_by_length_counts_against_the_budget() {
        let config = Config {
            reasoning_budget_tokens: Some(100),
            ..Config::default()
        };
        let reasoning: String = (0..150).map(|i| format!("Consider case {i}. ")).collect();
        let cut = json!({"choices": [{"finish_reason": "length",
            "message": {"content": null, "reasoning_content": reasoning}}]});
        let reports = analyze_chat_completion(&cut, &config).unwrap();
        let verdict = reports[0].verdict.as_ref().unwrap();
        assert_eq!(verdict.kind, DegenerationKind::UnclosedReasoning);
        // A short reasoning block followed by a long answer: only the block counts.
        let short: String = (0..10).map(|i| format!("Consider case {i}. ")).collect();
        let closed = json!({"choices": [{"finish_reason": "stop",
            "message": {"content": reasoning, "reasoning_content": short}}]});
        let reports = analyze_chat_completion(&closed, &config).unwrap();
        assert_eq!(reports[0].verdict, None);
    }

    #[test]
    fn text_completions_and_content_parts_are_read() {
        let response = json!({"choices": [
            {"text": "the the the the ".repeat(30), "finish_reason": "length"},
            {"message": {"content": [{"type": "text", "text": "Fine. "}, {"type": "text", "text": "Thanks."}]}}
        ]});
        let reports = analyze_chat_completion(&response, &Config::default()).unwrap();
        assert!(reports[0].verdict.is_some());
        assert_eq!(reports[1].index, 1);
        assert_eq!(reports[1].content_chars, "Fine. Thanks.".len());
    }

    #[test]
    fn malformed_responses_say_what_was_expected() {
        let config = Config::default();
        let err = analyze_chat_completion(&json!([1]), &config).unwrap_err();
        assert!(
            err.to_string()
                .contains("expected a JSON object, found an array"),
            "{err}"
        );
        let err = analyze_chat_completion(&json!({"id": "x"}), &config).unwrap_err();
        assert!(err.to_string().contains("`choices`"), "{err}");
        let err =
            analyze_chat_completion(&json!({"choices": [{"message": {"content": 5}}]}), &config)
                .unwrap_err();
        assert!(
            err.to_string()
                .contains("choices[0].content: expected a string or null, found a number"),
            "{err}"
        );
    }
}
