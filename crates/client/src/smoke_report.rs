//! The result of `deltaserve smoke`: one row per check (name, result, detail), rendered as a terminal
//! table or as JSON. Shapes and rendering only; the checks themselves live in smoke_checks.rs.

use std::fmt::Write;

use serde::Serialize;
use serde_json::Value;

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckResult {
    Pass,
    /// Worth a look, not a failure (e.g. the server does not report something optional).
    Warn,
    /// Not applicable to this server or model.
    Skip,
    Fail,
}

impl CheckResult {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Warn => "WARN",
            Self::Skip => "SKIP",
            Self::Fail => "FAIL",
        }
    }
}

/// One row of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckRow {
    pub check: String,
    pub result: CheckResult,
    pub detail: String,
}

impl CheckRow {
    pub fn new(check: &str, result: CheckResult, detail: impl Into<String>) -> Self {
        Self {
            check: check.to_string(),
            result,
            detail: detail.into(),
        }
    }
}

/// Everything `deltaserve smoke` found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SmokeReport {
    pub url: String,
    pub model: String,
    pub checks: Vec<CheckRow>,
    /// Wall time of the whole suite, in seconds.
    pub elapsed_s: f64,
}

/// Longest detail shown in a table cell; JSON carries the whole text.
const TABLE_DETAIL_CHARS: usize = 160;

impl SmokeReport {
    /// True when no check failed (warnings and skips pass).
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.result != CheckResult::Fail)
    }

    pub fn failures(&self) -> usize {
        self.checks
            .iter()
            .filter(|c| c.result == CheckResult::Fail)
            .count()
    }

    pub fn to_json(&self) -> Value {
        let mut value = serde_json::to_value(self).unwrap_or(Value::Null);
        value["passed"] = Value::Bool(self.passed());
        value
    }

    /// A readable table: check, result, detail (one line each), then a verdict line.
    pub fn table(&self) -> String {
        let name_width = self
            .checks
            .iter()
            .map(|c| c.check.chars().count())
            .max()
            .unwrap_or(0)
            .max("check".len());
        let mut out = String::new();
        let _ = writeln!(out, "smoke: {} (model {})", self.url, self.model);
        let _ = writeln!(out, "{:<name_width$}  {:<6}  detail", "check", "result");
        for row in &self.checks {
            let mut detail: String = row.detail.replace(['\n', '\r'], " ");
            if detail.chars().count() > TABLE_DETAIL_CHARS {
                detail = detail.chars().take(TABLE_DETAIL_CHARS).collect::<String>() + "...";
            }
            let _ = writeln!(
                out,
                "{:<name_width$}  {:<6}  {detail}",
                row.check,
                row.result.as_str()
            );
        }
        let _ = writeln!(
            out,
            "{} in {:.1} s: {} checks, {} failed",
            if self.passed() { "PASSED" } else { "FAILED" },
            self.elapsed_s,
            self.checks.len(),
            self.failures()
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_and_json_agree_on_the_verdict() {
        let report = SmokeReport {
            url: "http://127.0.0.1:1".into(),
            model: "m".into(),
            checks: vec![
                CheckRow::new("2+2 answer", CheckResult::Pass, "content \"4\""),
                CheckRow::new("degeneration", CheckResult::Fail, "x".repeat(400)),
                CheckRow::new("reasoning split", CheckResult::Skip, "no reasoning"),
            ],
            elapsed_s: 1.5,
        };
        assert!(!report.passed());
        let table = report.table();
        assert!(table.contains("2+2 answer       PASS"), "{table}");
        assert!(
            table.contains("FAILED in 1.5 s: 3 checks, 1 failed"),
            "{table}"
        );
        assert!(table.lines().all(|l| l.chars().count() < 220), "{table}");
        let json = report.to_json();
        assert_eq!(json["passed"], false);
        assert_eq!(json["checks"][1]["result"], "fail");
        assert_eq!(json["checks"][1]["detail"].as_str().unwrap().len(), 400);
    }
}
