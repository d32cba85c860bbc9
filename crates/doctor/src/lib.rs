//! `doctor`: proves a compute backend against `reference` on a model's real weights and shapes:
//! first every op in isolation, then one prompt through both forward passes with the hidden state
//! compared after every layer. The first failing row names the op and the layer that diverge.
//! It computes and reports; printing and exit codes are the CLI's.

pub mod canary;
pub mod inputs;
pub mod layers;
pub mod ops;
pub mod report;

pub use report::{CheckRow, Comparison};
