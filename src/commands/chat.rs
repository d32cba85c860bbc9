//! `deltaserve chat [MESSAGE]`: talk to a model in the terminal without a server. One-shot with a
//! message, interactive without one. Reasoning is shown dimmed as it streams, then the answer.

use crate::loading::{load_model, with_model};
use crate::model_flags::ModelFlags;
use anyhow::{bail, Context, Result};
use clap::Args;
use deltaserve_engine::{
    EngineConfig, EngineEvent, EngineHandle, GenerationRequest, LocalEngine, PrefixCacheConfig,
    SamplingParams,
};
use deltaserve_text::{
    prompt_opens_reasoning, ChatMessage, ChatTemplate, Detokenizer, ReasoningStream, RenderOptions,
    Tokenizer,
};
use std::io::{BufRead, IsTerminal, Write};

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelFlags,
    /// The message to send; without it, chat interactively (one message per line, empty line or EOF ends).
    pub message: Option<String>,
    /// An optional system prompt.
    #[arg(long)]
    pub system: Option<String>,
    #[arg(long = "max-tokens", default_value_t = 1024)]
    pub max_tokens: usize,
    /// Sampling temperature (default: the model's generation_config.json; 0 = greedy).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Seed for sampling, for reproducible replies.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Answer without the reasoning phase (`enable_thinking: false`).
    #[arg(long = "no-think")]
    pub no_think: bool,
    /// Hide the reasoning instead of printing it dimmed.
    #[arg(long = "hide-reasoning")]
    pub hide_reasoning: bool,
}

const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

struct Session {
    tokenizer: Tokenizer,
    template: ChatTemplate,
    engine: std::sync::Arc<LocalEngine>,
    sampling: SamplingParams,
    color: bool,
}

impl Session {
    /// Streams one reply to stdout; returns the answer text (reasoning excluded).
    fn reply(&self, messages: &[ChatMessage], args: &ChatArgs) -> Result<String> {
        let mut options = RenderOptions {
            add_generation_prompt: true,
            ..Default::default()
        };
        options.kwargs.insert(
            "enable_thinking".into(),
            serde_json::Value::Bool(!args.no_think),
        );
        let prompt = self.template.render(messages, &options)?;
        let prompt_ids = self.tokenizer.encode(&prompt, false)?;
        let stop = self.tokenizer.stop_token_ids().to_vec();
        let request = GenerationRequest {
            prompt_ids,
            sampling: self.sampling.clone(),
            max_new_tokens: args.max_tokens,
            stop_token_ids: stop.clone(),
            disable_speculation: false,
        };
        let (_, mut rx) = self.engine.submit(request)?;
        // Special tokens stay in the text: some tokenizers mark `</think>` special, and the reasoning
        // split needs it. Stop tokens never reach the detokenizer.
        let mut detok = Detokenizer::new(false);
        let mut split = ReasoningStream::new(prompt_opens_reasoning(&prompt));
        let mut answer = String::new();
        let mut out = std::io::stdout().lock();
        let mut in_reasoning = false;
        let mut held_newlines = 0;
        let mut show = |delta: deltaserve_text::ReasoningDelta,
                        out: &mut std::io::StdoutLock,
                        answer: &mut String|
         -> Result<()> {
            if !delta.reasoning.is_empty() && !args.hide_reasoning {
                if self.color && !in_reasoning {
                    write!(out, "{DIM}")?;
                }
                in_reasoning = true;
                // Trailing newlines are held back: the last ones only separate reasoning from answer.
                let text = delta.reasoning.trim_end_matches('\n');
                if !text.is_empty() {
                    write!(out, "{}{text}", "\n".repeat(held_newlines))?;
                    held_newlines = 0;
                }
                held_newlines += delta.reasoning.len() - text.len();
            }
            // The answer's leading blank lines are the template's separator, not text.
            let content = if answer.is_empty() {
                delta.content.trim_start_matches('\n')
            } else {
                delta.content.as_str()
            };
            if !content.is_empty() {
                if in_reasoning {
                    writeln!(out, "{}", if self.color { RESET } else { "" })?;
                    in_reasoning = false;
                }
                write!(out, "{content}")?;
                answer.push_str(content);
            }
            out.flush()?;
            Ok(())
        };
        while let Some(event) = rx.blocking_recv() {
            match event {
                EngineEvent::Token { id, .. } if stop.contains(&id) => {}
                EngineEvent::Token { id, .. } => {
                    let piece = detok.step(&self.tokenizer, id)?;
                    show(split.push(&piece), &mut out, &mut answer)?;
                }
                EngineEvent::Finished { .. } => break,
                EngineEvent::Error { message } => bail!("generation failed: {message}"),
            }
        }
        let tail = detok.finish(&self.tokenizer)?;
        let mut last = split.push(&tail);
        let rest = split.finish();
        last.reasoning.push_str(&rest.reasoning);
        last.content.push_str(&rest.content);
        show(last, &mut out, &mut answer)?;
        if in_reasoning && self.color {
            write!(out, "{RESET}")?;
        }
        writeln!(out)?;
        Ok(answer)
    }
}

pub fn run(args: ChatArgs) -> Result<()> {
    let settings = args.model.clone().settings()?.resolved()?;
    let dir = settings.model_path.clone();
    let tokenizer =
        Tokenizer::from_dir(&dir).with_context(|| format!("--model-path {}", dir.display()))?;
    let template = ChatTemplate::from_tokenizer(&tokenizer, false)
        .with_context(|| format!("{} has no usable chat template", dir.display()))?;
    let defaults = tokenizer.generation_defaults().clone();
    let greedy_by_default = defaults.do_sample == Some(false);
    let sampling = SamplingParams {
        temperature: args.temperature.unwrap_or(if greedy_by_default {
            0.0
        } else {
            defaults.temperature.unwrap_or(1.0)
        }),
        top_p: defaults.top_p.unwrap_or(1.0),
        top_k: defaults.top_k.unwrap_or(0) as usize,
        min_p: defaults.min_p.unwrap_or(0.0),
        repetition_penalty: defaults.repetition_penalty.unwrap_or(1.0),
        seed: args.seed,
        ..Default::default()
    };
    if sampling.temperature.is_nan() || sampling.temperature < 0.0 {
        bail!("--temperature {}: must be 0 or more", sampling.temperature);
    }
    let model = load_model(&settings)?;
    let context = with_model!(&model, m => m.config.max_position_embeddings).min(32_768);
    let config = EngineConfig {
        max_running_requests: 1,
        num_kv_blocks: context.div_ceil(16),
        block_size: 16,
        // One slot for the reply being generated, the rest for prefix-cache snapshots: each turn
        // resumes from the previous prompt's last message (docs/prefix-cache.md).
        state_slots: 1 + 8,
        chunked_prefill_size: 256,
        context_length: context,
        max_queued_requests: 4,
        decode_log_interval: 0,
        speculative: None,
    };
    let prefix = PrefixCacheConfig {
        boundary_tokens: tokenizer.token_to_id("<|im_start|>").into_iter().collect(),
        ..PrefixCacheConfig::default()
    };
    let engine = with_model!(model, m => LocalEngine::spawn_with_cache(m, config, prefix));
    let session = Session {
        tokenizer,
        template,
        engine,
        sampling,
        color: std::io::stdout().is_terminal(),
    };
    let mut messages: Vec<ChatMessage> = args
        .system
        .iter()
        .map(|s| ChatMessage::text("system", s))
        .collect();
    if let Some(message) = &args.message {
        messages.push(ChatMessage::text("user", message));
        session.reply(&messages, &args)?;
        return Ok(());
    }
    eprintln!(
        "chatting with {} (empty line or Ctrl-D ends)",
        dir.display()
    );
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            return Ok(());
        }
        messages.push(ChatMessage::text("user", line.trim_end()));
        let answer = session.reply(&messages, &args)?;
        messages.push(ChatMessage::text("assistant", &answer));
    }
}
