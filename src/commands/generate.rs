//! `deltaserve generate`: greedy continuation of a prompt given as text (needs tokenizer.json in the
//! model directory) or as token ids; prints text when a tokenizer is present, else ids.

use crate::loading::{load_model, with_model};
use crate::model_flags::ModelFlags;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::Write;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelFlags,
    /// Prompt text (tokenized with the model's tokenizer.json).
    #[arg(long, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,
    /// Prompt as comma-separated token ids, e.g. 1,2,3.
    #[arg(long = "prompt-ids", value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    #[arg(long = "max-tokens", default_value_t = 32)]
    pub max_tokens: usize,
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let settings = args.model.settings()?.resolved()?;
    let tokenizer_path = settings.model_path.join("tokenizer.json");
    let tokenizer = if tokenizer_path.is_file() {
        Some(deltaserve_text::Tokenizer::from_dir(&settings.model_path)?)
    } else {
        None
    };
    let prompt_ids: Vec<u32> = match (&args.prompt, &args.prompt_ids) {
        (Some(text), None) => {
            let Some(tok) = &tokenizer else {
                bail!(
                    "--prompt needs {} to tokenize the text; pass --prompt-ids instead",
                    tokenizer_path.display()
                );
            };
            tok.encode(text, false).context("tokenizing --prompt")?
        }
        (None, Some(ids)) => ids.clone(),
        _ => bail!("give exactly one of --prompt TEXT or --prompt-ids 1,2,3"),
    };
    if prompt_ids.is_empty() {
        bail!("the prompt is empty: give at least one token");
    }
    let model = load_model(&settings)?;
    let (vocab, eos) =
        with_model!(&model, m => (m.config.vocab_size, m.config.eos_token_ids.clone()));
    if let Some(bad) = prompt_ids.iter().find(|&&id| id as usize >= vocab) {
        bail!("prompt token id {bad} is outside the vocabulary (vocab_size {vocab})");
    }
    let stdout = std::io::stdout();
    let generated = with_model!(&model, m => m.generate_greedy(&prompt_ids, args.max_tokens, &eos, &mut |_| {}));
    let mut out = stdout.lock();
    match &tokenizer {
        Some(tok) => {
            let text = tok
                .decode(&generated, false)
                .context("decoding the output")?;
            writeln!(out, "{text}").context("writing to stdout")?;
        }
        None => {
            let ids: Vec<String> = generated.iter().map(u32::to_string).collect();
            writeln!(out, "{}", ids.join(",")).context("writing to stdout")?;
        }
    }
    Ok(())
}
