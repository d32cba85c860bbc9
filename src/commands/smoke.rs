//! `deltaserve smoke --url URL [--model NAME] [--json]`: runs the fixed correctness suite of
//! deltaserve-client's `smoke` module against any OpenAI-compatible server and prints its report. Only
//! flags and printing live here; the client and the checks are in crates/client.

use crate::check_outcome::CheckOutcome;
use anyhow::Result;
use deltaserve_client::{run_smoke_blocking, SmokeArgs};

/// Runs the suite and prints the table (or JSON with `--json`).
pub fn run(args: SmokeArgs) -> Result<CheckOutcome> {
    let report = run_smoke_blocking(&args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.table());
    }
    Ok(CheckOutcome::from_problems(!report.passed()))
}
