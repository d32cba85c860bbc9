//! The canary: a fixed prompt answered greedily, judged by the degeneration detector and, when the
//! model directory says what the answer must contain (`deltaserve_canary.json`), by that answer.
//! Health means "generates correct text": `serve` runs it before reporting ready, `doctor` at the end.

use deltaserve_health::{Config, DegenerationDetector, StreamEnd, Verdict};
use deltaserve_text::{
    prompt_opens_reasoning, split_reasoning, ChatMessage, ChatTemplate, RenderOptions, Tokenizer,
};
use std::path::Path;

/// The question every canary asks unless the model directory says otherwise.
pub const DEFAULT_QUESTION: &str = "What is 2+2? Answer briefly.";
/// Enough tokens for a short reasoned answer, and for a loop to show itself.
pub const DEFAULT_MAX_TOKENS: usize = 256;
/// Optional file in a model directory: `{"question": "...", "expect": "4", "max_tokens": 256}`.
pub const CANARY_FILE: &str = "deltaserve_canary.json";

#[derive(Clone, Debug, Default, serde::Deserialize)]
struct CanaryFile {
    question: Option<String>,
    expect: Option<String>,
    max_tokens: Option<usize>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CanarySpec {
    pub question: Option<String>,
    pub prompt_ids: Vec<u32>,
    /// Text the answer (after reasoning) must contain.
    pub expect: Option<String>,
    pub max_tokens: usize,
    /// The rendered prompt leaves a `<think>` block open: output starts in reasoning.
    pub opens_reasoning: bool,
    /// False for models without a tokenizer and chat template (e.g. random-weight test models):
    /// their output has no meaning, so loops in it are reported but do not fail the canary.
    pub judged: bool,
}

impl CanarySpec {
    /// The canary for a model directory: its chat template and tokenizer when it has them (the
    /// question as a user turn), else fixed token ids judged by the detector alone.
    pub fn for_model(
        dir: &Path,
        tokenizer: Option<&Tokenizer>,
        vocab_size: usize,
    ) -> Result<Self, String> {
        let file_path = dir.join(CANARY_FILE);
        let file: CanaryFile = if file_path.is_file() {
            let text = std::fs::read_to_string(&file_path)
                .map_err(|e| format!("{}: {e}", file_path.display()))?;
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file_path.display()))?
        } else {
            CanaryFile::default()
        };
        let max_tokens = file.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        let Some(tokenizer) = tokenizer.filter(|t| t.chat_template().is_some()) else {
            let prompt_ids = (0..16u32)
                .map(|i| (i * 7919 + 17) % vocab_size as u32)
                .collect();
            return Ok(Self {
                question: None,
                prompt_ids,
                expect: None,
                max_tokens,
                opens_reasoning: false,
                judged: false,
            });
        };
        let question = file
            .question
            .unwrap_or_else(|| DEFAULT_QUESTION.to_string());
        let template = ChatTemplate::from_tokenizer(tokenizer, false)
            .map_err(|e| format!("chat template: {e}"))?;
        let options = RenderOptions {
            add_generation_prompt: true,
            ..Default::default()
        };
        let prompt = template
            .render(&[ChatMessage::text("user", &question)], &options)
            .map_err(|e| format!("chat template: {e}"))?;
        let prompt_ids = tokenizer
            .encode(&prompt, false)
            .map_err(|e| format!("tokenizing the canary prompt: {e}"))?;
        Ok(Self {
            question: Some(question),
            prompt_ids,
            expect: file.expect,
            max_tokens,
            opens_reasoning: prompt_opens_reasoning(&prompt),
            judged: true,
        })
    }
}

#[derive(Clone, Debug)]
pub struct CanaryOutcome {
    pub tokens: Vec<u32>,
    pub text: String,
    pub verdict: Option<Verdict>,
    /// `Some(false)` when an expected answer was given and the reply's answer lacks it.
    pub answer_ok: Option<bool>,
    /// The reply ended with a stop token rather than the token limit.
    pub stopped: bool,
    /// Whether the verdict counts (see `CanarySpec::judged`).
    pub judged: bool,
}

impl CanaryOutcome {
    pub fn healthy(&self) -> bool {
        self.failure().is_none()
    }

    /// Why the canary failed, in one line, or `None` when it passed.
    pub fn failure(&self) -> Option<String> {
        if !self.judged {
            return None;
        }
        if let Some(v) = &self.verdict {
            return Some(format!("degenerate output: {v}"));
        }
        if self.answer_ok == Some(false) {
            return Some(format!("wrong answer: {:?}", truncate(&self.text, 200)));
        }
        None
    }
}

fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

/// Judges generated `tokens` of the canary: the detector over the stream, then the expected answer.
pub fn judge(
    spec: &CanarySpec,
    tokens: &[u32],
    stopped: bool,
    tokenizer: Option<&Tokenizer>,
) -> CanaryOutcome {
    // Invariant: the default config is valid (the health crate tests it).
    let mut detector =
        DegenerationDetector::new(Config::default()).expect("the default detector config is valid");
    if spec.opens_reasoning {
        detector.start_reasoning();
    }
    let mut text = String::new();
    let mut detok = deltaserve_text::Detokenizer::new(false);
    for &id in tokens {
        let piece = tokenizer
            .and_then(|t| detok.step(t, id).ok())
            .unwrap_or_default();
        text.push_str(&piece);
        detector.push(id, &piece);
    }
    let end = if stopped {
        StreamEnd::Stop
    } else {
        StreamEnd::Length
    };
    let verdict = detector.finish(end).cloned();
    let answer_ok = spec.expect.as_ref().map(|expect| {
        let split = split_reasoning(&text, spec.opens_reasoning);
        split
            .content
            .as_deref()
            .is_some_and(|c| c.contains(expect.as_str()))
    });
    CanaryOutcome {
        tokens: tokens.to_vec(),
        text,
        verdict,
        answer_ok,
        stopped,
        judged: spec.judged,
    }
}
