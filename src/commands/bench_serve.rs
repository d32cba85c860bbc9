//! `deltaserve bench serve`: the flags of deltaserve-client's load generator, and its report printed
//! (and written with `--output-file`). The load generator itself is in crates/client.

use anyhow::{Context, Result};
use clap::Args;
use deltaserve_client::{run_bench_serve_blocking, BenchEndpoint, BenchServeConfig};

/// Flags of `deltaserve bench serve`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct BenchServeArgs {
    /// Server root, e.g. http://127.0.0.1:30000 (a trailing /v1 is accepted). Plain HTTP only.
    #[arg(long)]
    pub url: String,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Requests sent in total.
    #[arg(long, default_value_t = 64)]
    pub num_prompts: usize,
    /// Prompt length in words (about one token each for common English words).
    #[arg(long, default_value_t = 256)]
    pub input_len: usize,
    /// Tokens to generate per request (`max_tokens`, with `ignore_eos`).
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Model name to send (default: the first model of GET /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// Stream responses (needed for TTFT, TPOT and ITL).
    #[arg(long)]
    pub stream: bool,
    /// Which API to drive.
    #[arg(long, value_parser = endpoint_parser(), default_value = "completions")]
    pub endpoint: BenchEndpoint,
    /// Sampling temperature sent with every request.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Also send `min_tokens = --output-len` (vLLM, SGLang); deltaserve refuses it.
    #[arg(long)]
    pub min_tokens: bool,
    /// Do not send `ignore_eos: true` (for servers that reject unknown fields).
    #[arg(long)]
    pub no_ignore_eos: bool,
    /// Seed of the random prompts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600)]
    pub request_timeout: u64,
    /// Multi-turn mode (chat endpoint): each of the --num-prompts conversations sends this many
    /// turns one after the other, each resending the history; 1 = single requests.
    #[arg(long, default_value_t = 1)]
    pub multi_turn: usize,
    /// Shared-prefix mode: every prompt (or conversation) starts with the same system prompt of
    /// this many words; 0 = none.
    #[arg(long, default_value_t = 0)]
    pub shared_prefix_len: usize,
    /// A JSON object sent as `chat_template_kwargs` with every chat request, e.g.
    /// '{"enable_thinking": false}'.
    #[arg(long, value_name = "JSON", value_parser = json_object)]
    pub chat_template_kwargs: Option<serde_json::Value>,
    /// Agent loop (chat endpoint, with --multi-turn): the requests carry a `lookup` tool, and every
    /// turn after the first resends the previous reply as a call of it followed by the call's result.
    #[arg(long)]
    pub tool_calls: bool,
    /// Resend each reply's reasoning as `reasoning_content` in the history (by default only the
    /// content goes back, as most clients do).
    #[arg(long)]
    pub resend_reasoning: bool,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "PATH")]
    pub output_file: Option<std::path::PathBuf>,
}

/// `--chat-template-kwargs`: a JSON object.
fn json_object(text: &str) -> Result<serde_json::Value, String> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value) if value.is_object() => Ok(value),
        Ok(_) => Err("must be a JSON object, e.g. '{\"enable_thinking\": false}'".to_string()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

/// `--endpoint` values (the client's `BenchEndpoint`).
fn endpoint_parser() -> impl clap::builder::TypedValueParser<Value = BenchEndpoint> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["completions", "chat"]).map(|value| {
        match value.as_str() {
            "chat" => BenchEndpoint::Chat,
            _ => BenchEndpoint::Completions,
        }
    })
}

impl BenchServeArgs {
    /// The load generator's settings.
    pub fn config(&self) -> BenchServeConfig {
        BenchServeConfig {
            url: self.url.clone(),
            concurrency: self.concurrency,
            num_prompts: self.num_prompts,
            input_len: self.input_len,
            output_len: self.output_len,
            model: self.model.clone(),
            stream: self.stream,
            endpoint: self.endpoint,
            temperature: self.temperature,
            min_tokens: self.min_tokens,
            no_ignore_eos: self.no_ignore_eos,
            seed: self.seed,
            request_timeout: self.request_timeout,
            multi_turn: self.multi_turn,
            shared_prefix_len: self.shared_prefix_len,
            chat_template_kwargs: self.chat_template_kwargs.clone(),
            tool_calls: self.tool_calls,
            resend_reasoning: self.resend_reasoning,
        }
    }
}

/// Runs the load test, prints the report and writes it to `--output-file` when given.
pub fn run(args: BenchServeArgs) -> Result<()> {
    let report = run_bench_serve_blocking(&args.config())?;
    println!("{}", report.render());
    if let Some(path) = &args.output_file {
        let text = serde_json::to_string_pretty(&report.to_json())?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("--output-file {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchServeArgs,
    }

    #[test]
    fn flags_build_the_clients_config() {
        let parse = |line: &str| {
            Cli::try_parse_from(std::iter::once("serve").chain(line.split_whitespace()))
                .map(|cli| cli.bench.config())
        };
        let config = parse("--url http://h:1").unwrap();
        assert_eq!(config.endpoint, BenchEndpoint::Completions);
        assert_eq!((config.concurrency, config.num_prompts), (8, 64));
        assert_eq!((config.input_len, config.output_len), (256, 128));
        assert_eq!(
            (config.multi_turn, config.shared_prefix_len, config.seed),
            (1, 0, 0)
        );
        let config =
            parse("--url u --endpoint chat --multi-turn 3 --stream --no-ignore-eos").unwrap();
        assert_eq!(config.endpoint, BenchEndpoint::Chat);
        assert!(config.stream && config.no_ignore_eos && !config.min_tokens);
        assert_eq!(config.multi_turn, 3);
        assert!(parse("--url u --endpoint embeddings").is_err());
        let config = parse(
            "--url u --endpoint chat --tool-calls --resend-reasoning --chat-template-kwargs {\"enable_thinking\":false}",
        )
        .unwrap();
        assert!(config.tool_calls && config.resend_reasoning);
        assert_eq!(
            config.chat_template_kwargs,
            Some(serde_json::json!({"enable_thinking": false}))
        );
        for bad in ["[1]", "{oops"] {
            let error = parse(&format!("--url u --chat-template-kwargs {bad}")).unwrap_err();
            assert!(
                error.to_string().contains("--chat-template-kwargs"),
                "{error}"
            );
        }
    }
}
