//! `deltaserve lint-output [FILE|-]`: runs the degeneration detector over a text, or over a JSONL
//! file of chat completion responses (one per line), and prints one JSON verdict per item. Exits 1
//! when any item is degenerate, 2 when the input cannot be read (check_outcome.rs). A plain text is read as a reply whose end is not known (so a loop
//! that runs to its end counts, see `deltaserve_health::Config`), without the file's final line break.

use crate::check_outcome::CheckOutcome;
use anyhow::{Context, Result};
use clap::Args;
use deltaserve_health::{analyze_chat_completion, analyze_text, Config};
use std::io::Read;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct LintOutputArgs {
    /// A text file, a JSONL file of chat completion responses, or `-` (the default) for standard input.
    #[arg(default_value = "-")]
    pub input: PathBuf,
}

/// True when every non-empty line is a JSON object with `choices`: a JSONL file of responses.
fn is_response_jsonl(text: &str) -> bool {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty()).peekable();
    lines.peek().is_some()
        && lines.all(|l| {
            serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| v.get("choices").is_some())
        })
}

/// The reply in a text file: without the newline that ends the file's last line, which belongs to
/// the file, not to the reply (the detector asks whether the reply ends inside its loop).
fn reply_text(file: &str) -> &str {
    file.strip_suffix('\n')
        .map_or(file, |t| t.strip_suffix('\r').unwrap_or(t))
}

/// Lints and prints; `Problems` when anything was degenerate.
pub fn run(args: LintOutputArgs) -> Result<CheckOutcome> {
    let text = if args.input.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading standard input")?;
        s
    } else {
        std::fs::read_to_string(&args.input)
            .with_context(|| format!("reading {}", args.input.display()))?
    };
    let config = Config::default();
    let mut degenerate = false;
    if is_response_jsonl(&text) {
        for (line_no, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let value: serde_json::Value =
                serde_json::from_str(line).with_context(|| format!("line {}", line_no + 1))?;
            let reports = analyze_chat_completion(&value, &config)
                .with_context(|| format!("line {}", line_no + 1))?;
            let bad = reports.iter().any(|r| r.verdict.is_some());
            degenerate |= bad;
            let id = value.get("id").cloned().unwrap_or(serde_json::Value::Null);
            println!(
                "{}",
                serde_json::json!({"line": line_no + 1, "id": id, "degenerate": bad, "choices": reports})
            );
        }
    } else {
        let verdict = analyze_text(reply_text(&text), &config)?;
        degenerate = verdict.is_some();
        println!(
            "{}",
            serde_json::json!({"degenerate": degenerate, "verdict": verdict})
        );
    }
    Ok(CheckOutcome::from_problems(degenerate))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_file_loses_only_its_final_line_break() {
        assert_eq!(reply_text("a\nb\n"), "a\nb");
        assert_eq!(reply_text("a\r\n"), "a");
        assert_eq!(reply_text("a\n\n"), "a\n");
        assert_eq!(reply_text("a"), "a");
        // A line of 230 `=` saved by an editor is still a loop that runs to the end.
        let file = format!("{}\n", "=".repeat(230));
        assert!(analyze_text(reply_text(&file), &Config::default())
            .unwrap()
            .is_some());
    }
}
