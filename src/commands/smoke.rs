//! `deltaserve smoke --url URL [--model NAME] [--json]`: runs the fixed correctness suite of
//! deltaserve-client's `smoke` module against any OpenAI-compatible server and prints its report. Only
//! flags and printing live here; the client and the checks are in crates/client.

use crate::check_outcome::CheckOutcome;
use anyhow::Result;
use clap::Args;
use deltaserve_client::{run_smoke_blocking, SmokeConfig};

/// Flags of `deltaserve smoke`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct SmokeArgs {
    /// Server root, e.g. http://127.0.0.1:30000 (a trailing /v1 is accepted). Plain HTTP only.
    #[arg(long)]
    pub url: String,
    /// Model name to send (default: the first model of GET /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// `max_tokens` of every request: room for a reasoning model to think and answer.
    #[arg(long, default_value_t = 2048)]
    pub max_tokens: usize,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
}

impl SmokeArgs {
    /// The client's settings.
    pub fn config(&self) -> SmokeConfig {
        SmokeConfig {
            url: self.url.clone(),
            model: self.model.clone(),
            max_tokens: self.max_tokens,
            timeout: self.timeout,
        }
    }
}

/// Runs the suite and prints the table (or JSON with `--json`).
pub fn run(args: SmokeArgs) -> Result<CheckOutcome> {
    let report = run_smoke_blocking(&args.config())?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.table());
    }
    Ok(CheckOutcome::from_problems(!report.passed()))
}
