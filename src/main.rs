//! `deltaserve`: the command-line entry point. Parses arguments and hands each subcommand to its
//! module under `commands/`; no model math or serving logic lives here.

mod commands;
mod loading;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "deltaserve", version, about = "Inference server for Gated-DeltaNet hybrid LLMs (Qwen3.5, Qwen3.6, Qwen3-Next)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Greedy continuation of a prompt.
    Generate(commands::generate::GenerateArgs),
    /// Teacher-forced scoring of a token sequence: per-token log-probabilities and perplexity.
    Score(commands::score::ScoreArgs),
    /// Prefill and decode throughput of a model (real or `--load-format dummy`).
    Bench(commands::bench::BenchArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => commands::generate::run(args),
        Command::Score(args) => commands::score::run(args),
        Command::Bench(args) => commands::bench::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
