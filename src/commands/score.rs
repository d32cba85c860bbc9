//! `deltaserve score`: teacher-forced scoring of a JSON array of token ids. Prints
//! `{"token_logprobs": [null, lp1, ...], "perplexity": x, "tokens": n}`; `--logits-out` writes every
//! position's logits as a float32 .npy of shape [n, vocab_size].

use crate::loading::{load_model, with_model};
use crate::model_flags::ModelFlags;
use anyhow::{bail, Context, Result};
use clap::Args;
use deltaserve_model::{npy, ForwardInput};
use deltaserve_tensor::{Backend, BatchLayout};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub model: ModelFlags,
    /// JSON file holding an array of token ids.
    #[arg(long)]
    pub tokens: PathBuf,
    /// Write all logits here as a float32 .npy file, shape [n, vocab_size].
    #[arg(long = "logits-out")]
    pub logits_out: Option<PathBuf>,
}

/// log-softmax of `row` at `index`, in f64.
fn log_prob(row: &[f32], index: usize) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    row[index] as f64 - max - sum.ln()
}

pub fn run(args: ScoreArgs) -> Result<()> {
    let settings = args.model.clone().settings()?.resolved()?;
    let text = std::fs::read_to_string(&args.tokens)
        .with_context(|| format!("reading --tokens {}", args.tokens.display()))?;
    let ids: Vec<u32> = serde_json::from_str(&text).with_context(|| {
        format!(
            "--tokens {}: expected a JSON array of non-negative integer token ids",
            args.tokens.display()
        )
    })?;
    if ids.is_empty() {
        bail!("--tokens {}: the array is empty", args.tokens.display());
    }
    let model = load_model(&settings)?;
    let logits = with_model!(&model, m => {
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= m.config.vocab_size) {
            bail!("--tokens {}: token id {bad} is outside the vocabulary (vocab_size {})", args.tokens.display(), m.config.vocab_size);
        }
        let mut cache = m.single_sequence_cache(ids.len());
        let blocks = (0..cache.geometry.num_blocks as u32).collect();
        let batch = BatchLayout::packed(cache.geometry.block_size, [(ids.len(), 0, blocks, 0)]);
        let rows: Vec<u32> = (0..ids.len() as u32).collect();
        let out = m.forward(&ForwardInput { tokens: &ids, batch: &batch, logit_rows: &rows, hidden_rows: &[] }, &mut cache);
        m.backend.to_host(&out.logits)
    });
    let vocab = logits.len() / ids.len();
    let mut token_logprobs: Vec<Option<f64>> = vec![None];
    for i in 1..ids.len() {
        token_logprobs.push(Some(log_prob(
            &logits[(i - 1) * vocab..i * vocab],
            ids[i] as usize,
        )));
    }
    let scored: Vec<f64> = token_logprobs.iter().flatten().copied().collect();
    let perplexity = if scored.is_empty() {
        None
    } else {
        Some((-scored.iter().sum::<f64>() / scored.len() as f64).exp())
    };
    if let Some(path) = &args.logits_out {
        npy::write_f32(path, &[ids.len(), vocab], &logits)
            .with_context(|| format!("writing --logits-out {}", path.display()))?;
    }
    let report = serde_json::json!({ "token_logprobs": token_logprobs, "perplexity": perplexity, "tokens": ids.len() });
    println!("{report}");
    Ok(())
}
