//! `deltaserve`: the command-line entry point. Parses arguments and hands each subcommand to its
//! module under `commands/`; no model math or serving logic lives here.

mod check_outcome;
mod commands;
mod demo_model;
mod kv_cache_dtype;
mod loading;
mod model_flags;
mod serve_flags;
mod spellings;
mod watchdog;
mod weight_format;

use check_outcome::CheckOutcome;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "deltaserve",
    version,
    about = "Inference server for Gated-DeltaNet hybrid LLMs (Qwen3.5, Qwen3.6, Qwen3-Next)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a model over an OpenAI-compatible HTTP API.
    #[command(
        after_help = "SGLang's and vLLM's other serve flags are accepted, noted or refused as \
docs/compatibility-flags.md lists them (`deltaserve serve MODEL ...` takes vLLM's form)."
    )]
    Serve(Box<serve_flags::ServeArgs>),
    /// Chat with a model in the terminal (one-shot with MESSAGE, interactive without).
    Chat(commands::chat::ChatArgs),
    /// Greedy continuation of a prompt.
    Generate(commands::generate::GenerateArgs),
    /// Teacher-forced scoring of a token sequence: per-token log-probabilities and perplexity.
    Score(commands::score::ScoreArgs),
    /// Prefill and decode throughput of a model (real or `--load-format dummy`); `bench serve` load-tests
    /// any OpenAI-compatible server.
    Bench(Box<commands::bench::BenchCli>),
    /// Check a backend against the reference on the model's weights (every op, every layer), then
    /// run the canary through the degeneration detector. Exits 1 when a check fails, 2 when it cannot
    /// run.
    Doctor(commands::doctor::DoctorArgs),
    /// Run the degeneration detector on a text or a JSONL file of chat completion responses. Exits 1
    /// when a text is degenerate, 2 when the input cannot be read.
    LintOutput(commands::lint_output::LintOutputArgs),
    /// Check that any OpenAI-compatible server answers correctly: fixed prompts, reasoning split,
    /// usage, streaming = non-streaming, degeneration detector. Exits 1 when a check fails, 2 when the
    /// suite cannot run.
    Smoke(commands::smoke::SmokeArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse_from(serve_flags::compat_argv::normalize(std::env::args_os()));
    let result = match cli.command {
        Command::Serve(args) => commands::serve::run(*args),
        Command::Chat(args) => commands::chat::run(args),
        Command::Generate(args) => commands::generate::run(args),
        Command::Score(args) => commands::score::run(args),
        Command::Bench(cli) => commands::bench::dispatch(*cli),
        Command::Doctor(args) => return CheckOutcome::exit_code(commands::doctor::run(args)),
        Command::LintOutput(args) => {
            return CheckOutcome::exit_code(commands::lint_output::run(args))
        }
        Command::Smoke(args) => return CheckOutcome::exit_code(commands::smoke::run(args)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
