//! Live health signals of deltaserve. Today: the degeneration detector, which watches a request's
//! output token by token and flags loops, babble and reasoning that never closes (docs/serving.md,
//! "Degeneration detector"). Nothing here touches the engine, the model or HTTP; the server feeds
//! it and decides what to do.
//!
//! # What is degenerate, what is not
//! A broken forward pass repeats itself until `max_tokens`; healthy output repeats structure but
//! keeps changing content. The rules (numbers in [`Config`]):
//! - **Periodic loop**: the output ends in an exactly periodic stretch, on characters, token ids or
//!   words, that repeats `many_repeats` times over `short_loop_bytes`, or `min_repeats` times over
//!   `long_loop_bytes`. Anything that increments (counting, multiplication tables, `x[i] = i`, logs
//!   with timestamps, JSON objects with ids) breaks exact periodicity at the first change; a word
//!   asked for a few times, a divider, a small empty grid or a refrain between verses stays under
//!   the repeat and length bounds. Units without any letter (digits, symbols) need more text.
//! - **N-gram collapse**: over a sliding window of words, very few distinct words (distinct-1) or
//!   phrases (distinct-4), sustained. Tables, code and lists bring new names and numbers every line;
//!   windows made mostly of numbers and marks (0/1 matrices) must stay collapsed much longer.
//! - **Unclosed reasoning**: more than `reasoning_budget_tokens` inside a `<think>` block that has
//!   not closed.
//! - At the end of a stream cut by the length limit, a loop still running there counts with lower
//!   bounds (`length_cut_*`): a loop that only the limit stopped is the signature of the failure.
//! - At the end of any stream the model did not stop itself (cut, or an end not known, as for a
//!   stored text), a loop still running at the last character counts with the `end_loop_*` bounds
//!   (a dozen repeats over 160 bytes), and one that stops in the middle of one of its words with
//!   `min_repeats` over `mid_word_min_bytes`: a short reply cut by `max_tokens` gives a loop little
//!   room, but a text that ends inside its loop is strong evidence. A reply that ends after ten
//!   requested lines, a divider or a repeating decimal stays below.
//!
//! ```
//! use deltaserve_health::{analyze_text, Config, DegenerationKind};
//!
//! let broken = format!(
//!     "We are tasked with a simple arithmetic problem: {}",
//!     "2 + 2 = 2.".repeat(100)
//! );
//! let verdict = analyze_text(&broken, &Config::default()).unwrap().unwrap();
//! assert_eq!(verdict.kind, DegenerationKind::PeriodicLoop);
//! assert_eq!(verdict.evidence.span, "2 + 2 = 2.");
//! ```

mod analyze;
mod collapse;
mod config;
mod count_table;
mod detector;
mod ledger;
mod ngram_window;
mod periodic;
mod pseudo_tokens;
mod think_tags;
mod verdict;
mod words;

pub use analyze::{analyze_chat_completion, analyze_text, ChoiceReport, LintError};
pub use config::{Config, ConfigError};
pub use detector::{DegenerationDetector, StreamEnd};
pub use pseudo_tokens::{pseudo_token_id, Pieces, PseudoTokenizer};
pub use verdict::{DegenerationKind, Evidence, Rule, Signal, Verdict};
