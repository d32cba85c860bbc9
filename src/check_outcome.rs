//! The exit status of the commands that check something (`doctor`, `smoke`, `lint-output`), one
//! convention for all three, the one grep and most linters follow: 0 when the check ran and found
//! nothing, 1 when it ran and found a problem (a diverging op, a failing smoke row, a degenerate
//! text), 2 when it could not run (an unreadable file, an unreachable server, a bad flag). A script
//! can so tell "the server is broken" from "the check itself is broken".

use std::process::ExitCode;

/// What a check found, when it could run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckOutcome {
    Clean,
    Problems,
}

impl CheckOutcome {
    pub fn from_problems(found: bool) -> Self {
        if found {
            Self::Problems
        } else {
            Self::Clean
        }
    }

    /// The exit status of a check that ran (0 or 1) or could not (2, after printing why).
    pub fn exit_code(outcome: anyhow::Result<Self>) -> ExitCode {
        match outcome {
            Ok(Self::Clean) => ExitCode::SUCCESS,
            Ok(Self::Problems) => ExitCode::from(1),
            Err(err) => {
                eprintln!("error: {err:#}");
                ExitCode::from(2)
            }
        }
    }
}
