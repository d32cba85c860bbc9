//! One module per subcommand.

pub mod bench;
mod bench_picks;
mod bench_runs;
pub mod bench_serve;
pub mod chat;
pub mod doctor;
pub mod generate;
pub mod lint_output;
pub mod score;
pub mod serve;
pub mod smoke;
