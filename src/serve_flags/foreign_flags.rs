//! SGLang and vLLM flags with no deltaserve setting behind them, decided flag by flag: accepted
//! because deltaserve already behaves that way, accepted with one start-up line saying what deltaserve
//! does instead, or refused because honouring them would change results in a way deltaserve cannot.
//! docs/compatibility-flags.md lists the same table for people.
//!
//! The table drives the parser (a hand-written `clap::Args`), so a flag is accepted exactly when it has
//! a verdict here.

use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};

/// What a foreign flag gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// deltaserve already behaves as the flag asks: accepted silently.
    Same,
    /// Accepted; the start-up prints this line saying what deltaserve does instead.
    Note(String),
    /// Refused at start-up with this reason.
    Refuse(String),
}

/// How many values a flag takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takes {
    Nothing,
    One,
    /// One or more (`--cuda-graph-bs 1 2 4 8`).
    Many,
}

/// Which server spells the flag this way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Sglang,
    Vllm,
    Both,
}

/// One flag of the table; `long` without the leading dashes.
pub struct ForeignFlag {
    pub long: &'static str,
    #[expect(
        dead_code,
        reason = "records for the reader which server spells the flag; no verdict depends on it"
    )]
    pub origin: Origin,
    pub takes: Takes,
    /// Decides from the flag as typed (`--name`) and its values.
    pub verdict: fn(&str, &[String]) -> Verdict,
}

fn note(text: &str) -> Verdict {
    Verdict::Note(text.to_string())
}

fn refuse(text: String) -> Verdict {
    Verdict::Refuse(text)
}

/// A count that deltaserve honours only as `expected` (parallel sizes, node counts, device ids).
fn only(flag: &str, values: &[String], expected: u64, why: &str) -> Verdict {
    match values.first().map(|v| v.parse::<u64>()) {
        Some(Ok(n)) if n == expected => Verdict::Same,
        Some(Ok(n)) => refuse(format!("{flag} {n} is not supported: {why}")),
        _ => refuse(format!("{flag} expects a whole number, found {values:?}")),
    }
}

const GRAPH_SIZES: &str =
    "deltaserve records every decode batch size up to --cuda-graph-max-bs (default 64) on first use; set that flag instead";
const NO_TORCH: &str =
    "deltaserve has no PyTorch to compile; its kernels are built by NVRTC at start-up (cuda) or ahead of time (cpu)";
const OWN_KERNELS: &str =
    "deltaserve runs its own attention kernels, each proven against the reference implementation";
const TEXT_ONLY: &str =
    "deltaserve serves the text model: requests with image or video inputs are refused with 400";
const NO_REQUEST_LOG: &str = "deltaserve writes no per-request log lines";
const ONE_DEVICE: &str =
    "deltaserve runs the whole model on one device (one GPU, or the cpu backend's threads)";

/// Every foreign flag deltaserve accepts or refuses, in the order of docs/compatibility-flags.md.
pub static FOREIGN_FLAGS: &[ForeignFlag] = &[
    ForeignFlag {
        long: "trust-remote-code",
        origin: Origin::Both,
        takes: Takes::Nothing,
        verdict: |_, _| {
            note("deltaserve never runs code from a model directory; Qwen3.5, Qwen3.6 and Qwen3-Next are built in")
        },
    },
    ForeignFlag {
        long: "enable-torch-compile",
        origin: Origin::Sglang,
        takes: Takes::Nothing,
        verdict: |_, _| note(NO_TORCH),
    },
    ForeignFlag {
        long: "torch-compile-max-bs",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |_, _| note(NO_TORCH),
    },
    ForeignFlag {
        long: "compilation-config",
        origin: Origin::Vllm,
        takes: Takes::One,
        verdict: |_, _| note(NO_TORCH),
    },
    ForeignFlag {
        long: "cuda-graph-bs",
        origin: Origin::Sglang,
        takes: Takes::Many,
        verdict: |_, _| note(GRAPH_SIZES),
    },
    ForeignFlag {
        long: "max-cudagraph-capture-size",
        origin: Origin::Vllm,
        takes: Takes::One,
        verdict: |_, _| note(GRAPH_SIZES),
    },
    ForeignFlag {
        long: "prefill-attention-backend",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |_, _| note(OWN_KERNELS),
    },
    ForeignFlag {
        long: "decode-attention-backend",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |_, _| note(OWN_KERNELS),
    },
    ForeignFlag {
        long: "sampling-backend",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |_, _| {
            note("deltaserve samples with its own sampler (on the GPU with --backend cuda)")
        },
    },
    ForeignFlag {
        long: "moe-runner-backend",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |_, _| note("deltaserve runs its own MoE kernels, proven against the reference"),
    },
    ForeignFlag {
        long: "moe-a2a-backend",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |_, _| note(ONE_DEVICE),
    },
    ForeignFlag {
        long: "enable-flashinfer-allreduce-fusion",
        origin: Origin::Sglang,
        takes: Takes::Nothing,
        verdict: |_, _| note(ONE_DEVICE),
    },
    ForeignFlag {
        long: "disable-custom-all-reduce",
        origin: Origin::Both,
        takes: Takes::Nothing,
        verdict: |_, _| Verdict::Same,
    },
    ForeignFlag {
        long: "enable-dp-attention",
        origin: Origin::Sglang,
        takes: Takes::Nothing,
        verdict: |_, _| note(ONE_DEVICE),
    },
    ForeignFlag {
        long: "enable-expert-parallel",
        origin: Origin::Vllm,
        takes: Takes::Nothing,
        verdict: |_, _| note(ONE_DEVICE),
    },
    ForeignFlag {
        long: "ep-size",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |flag, v| only(flag, v, 1, ONE_DEVICE),
    },
    ForeignFlag {
        long: "ep",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |flag, v| only(flag, v, 1, ONE_DEVICE),
    },
    ForeignFlag {
        long: "expert-parallel-size",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |flag, v| only(flag, v, 1, ONE_DEVICE),
    },
    ForeignFlag {
        long: "pp-size",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |flag, v| only(flag, v, 1, ONE_DEVICE),
    },
    ForeignFlag {
        long: "pipeline-parallel-size",
        origin: Origin::Both,
        takes: Takes::One,
        verdict: |flag, v| only(flag, v, 1, ONE_DEVICE),
    },
    ForeignFlag {
        long: "nnodes",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |flag, v| only(flag, v, 1, "deltaserve runs in one process on one machine"),
    },
    ForeignFlag {
        long: "node-rank",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |flag, v| only(flag, v, 0, "deltaserve runs in one process on one machine"),
    },
    ForeignFlag {
        long: "base-gpu-id",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |flag, v| {
            only(
                flag,
                v,
                0,
                "deltaserve uses the first visible GPU; choose it with CUDA_VISIBLE_DEVICES",
            )
        },
    },
    ForeignFlag {
        long: "distributed-executor-backend",
        origin: Origin::Vllm,
        takes: Takes::One,
        verdict: |_, _| note("deltaserve runs in one process; there is no executor to choose"),
    },
    ForeignFlag {
        long: "enable-prefix-caching",
        origin: Origin::Vllm,
        takes: Takes::Nothing,
        verdict: |_, _| Verdict::Same,
    },
    // Folded into --disable-radix-cache by `resolve_compat`.
    ForeignFlag {
        long: "no-enable-prefix-caching",
        origin: Origin::Vllm,
        takes: Takes::Nothing,
        verdict: |_, _| Verdict::Same,
    },
    ForeignFlag {
        long: "enable-hierarchical-cache",
        origin: Origin::Sglang,
        takes: Takes::Nothing,
        verdict: |_, _| {
            note("the prefix cache lives in the device's pools only; there is no host-memory tier")
        },
    },
    ForeignFlag {
        long: "mamba-scheduler-strategy",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |_, _| {
            note("the prefix cache snapshots GDN state at message ends and every --mamba-track-interval tokens (docs/prefix-cache.md); there is no strategy to pick")
        },
    },
    ForeignFlag {
        long: "disable-overlap-schedule",
        origin: Origin::Sglang,
        takes: Takes::Nothing,
        verdict: |_, _| Verdict::Same,
    },
    ForeignFlag {
        long: "async-scheduling",
        origin: Origin::Vllm,
        takes: Takes::Nothing,
        verdict: |_, _| note("deltaserve schedules each step after the previous one finished"),
    },
    ForeignFlag {
        long: "enable-mixed-chunk",
        origin: Origin::Sglang,
        takes: Takes::Nothing,
        verdict: |_, _| {
            note(
                "deltaserve's scheduler decides itself how prefill chunks and decodes share a step",
            )
        },
    },
    ForeignFlag {
        long: "max-prefill-tokens",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |_, _| note("the prompt tokens of one step are bounded by --chunked-prefill-size"),
    },
    ForeignFlag {
        long: "stream-interval",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |_, values| match values.first().map(String::as_str) {
            Some("1") => Verdict::Same,
            _ => note("deltaserve streams every token as soon as it is decoded"),
        },
    },
    ForeignFlag {
        long: "swap-space",
        origin: Origin::Vllm,
        takes: Takes::One,
        verdict: |_, _| {
            note("deltaserve swaps nothing to host memory: a preempted request is recomputed")
        },
    },
    ForeignFlag {
        long: "cpu-offload-gb",
        origin: Origin::Vllm,
        takes: Takes::One,
        verdict: |_, _| note("deltaserve keeps every weight on the device it computes on"),
    },
    ForeignFlag {
        long: "enable-multimodal",
        origin: Origin::Sglang,
        takes: Takes::Nothing,
        verdict: |_, _| note(TEXT_ONLY),
    },
    ForeignFlag {
        long: "mm-attention-backend",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |_, _| note(TEXT_ONLY),
    },
    ForeignFlag {
        long: "limit-mm-per-prompt",
        origin: Origin::Vllm,
        takes: Takes::One,
        verdict: |_, _| note(TEXT_ONLY),
    },
    ForeignFlag {
        long: "mm-encoder-tp-mode",
        origin: Origin::Vllm,
        takes: Takes::One,
        verdict: |_, _| note(TEXT_ONLY),
    },
    ForeignFlag {
        long: "language-model-only",
        origin: Origin::Vllm,
        takes: Takes::Nothing,
        verdict: |_, _| Verdict::Same,
    },
    ForeignFlag {
        long: "enable-auto-tool-choice",
        origin: Origin::Vllm,
        takes: Takes::Nothing,
        verdict: |_, _| Verdict::Same,
    },
    ForeignFlag {
        long: "enable-reasoning",
        origin: Origin::Vllm,
        takes: Takes::Nothing,
        verdict: |_, _| Verdict::Same,
    },
    ForeignFlag {
        long: "grammar-backend",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |_, values| {
            match values.first().map(String::as_str) {
            Some("llguidance") => Verdict::Same,
            _ => note("deltaserve constrains output (response_format, regex, ebnf, forced tool calls) with llguidance, whatever backend is named"),
        }
        },
    },
    ForeignFlag {
        long: "tokenizer-mode",
        origin: Origin::Both,
        takes: Takes::One,
        verdict: |_, values| {
            match values.first().map(String::as_str) {
            Some("auto") => Verdict::Same,
            _ => note("deltaserve has one tokenizer implementation (Hugging Face tokenizers, tokenizer.json)"),
        }
        },
    },
    ForeignFlag {
        long: "download-dir",
        origin: Origin::Both,
        takes: Takes::One,
        verdict: |_, _| {
            note("deltaserve never downloads: the model path must be a local directory")
        },
    },
    ForeignFlag {
        long: "log-level-http",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |_, _| note(NO_REQUEST_LOG),
    },
    ForeignFlag {
        long: "log-requests",
        origin: Origin::Sglang,
        takes: Takes::Nothing,
        verdict: |_, _| note(NO_REQUEST_LOG),
    },
    ForeignFlag {
        long: "enable-log-requests",
        origin: Origin::Vllm,
        takes: Takes::Nothing,
        verdict: |_, _| note(NO_REQUEST_LOG),
    },
    ForeignFlag {
        long: "disable-log-requests",
        origin: Origin::Vllm,
        takes: Takes::Nothing,
        verdict: |_, _| Verdict::Same,
    },
    ForeignFlag {
        long: "uvicorn-log-level",
        origin: Origin::Vllm,
        takes: Takes::One,
        verdict: |_, _| note(NO_REQUEST_LOG),
    },
    ForeignFlag {
        long: "skip-tokenizer-init",
        origin: Origin::Both,
        takes: Takes::Nothing,
        verdict: |flag, _| {
            refuse(format!(
                "{flag} is refused: deltaserve needs the tokenizer for chat templates, stop strings, reasoning \
                 and tool-call parsing; remove the flag"
            ))
        },
    },
    ForeignFlag {
        long: "json-model-override-args",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |flag, _| {
            refuse(format!(
                "{flag} is refused: it changes the model's configuration behind config.json; edit a copy \
                 of the model directory instead"
            ))
        },
    },
    ForeignFlag {
        long: "hf-overrides",
        origin: Origin::Vllm,
        takes: Takes::One,
        verdict: |flag, _| {
            refuse(format!(
                "{flag} is refused: it changes the model's configuration behind config.json; edit a copy \
                 of the model directory instead"
            ))
        },
    },
    ForeignFlag {
        long: "speculative-draft-model-path",
        origin: Origin::Sglang,
        takes: Takes::One,
        verdict: |flag, _| {
            refuse(format!(
                "{flag} is refused: deltaserve drafts with the model's own MTP head, never a separate draft \
                 model; remove it and keep --speculative-algorithm NEXTN"
            ))
        },
    },
    ForeignFlag {
        long: "ssl-keyfile",
        origin: Origin::Both,
        takes: Takes::One,
        verdict: |flag, _| {
            refuse(format!(
                "{flag} is refused: deltaserve speaks plain HTTP only, and serving it where TLS was asked for \
                 would expose the traffic; terminate TLS in a reverse proxy in front of deltaserve"
            ))
        },
    },
    ForeignFlag {
        long: "ssl-certfile",
        origin: Origin::Both,
        takes: Takes::One,
        verdict: |flag, _| {
            refuse(format!(
                "{flag} is refused: deltaserve speaks plain HTTP only, and serving it where TLS was asked for \
                 would expose the traffic; terminate TLS in a reverse proxy in front of deltaserve"
            ))
        },
    },
];

/// The foreign flags given on one command line, in table order, with their values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ForeignFlags {
    pub given: Vec<(&'static ForeignFlag, Vec<String>)>,
}

impl PartialEq for ForeignFlag {
    fn eq(&self, other: &Self) -> bool {
        self.long == other.long
    }
}

impl Eq for ForeignFlag {}

impl std::fmt::Debug for ForeignFlag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "--{}", self.long)
    }
}

impl ForeignFlags {
    /// Each given flag as typed (`--cuda-graph-max-bs 256`) with its verdict.
    pub fn verdicts(&self) -> Vec<(String, Verdict)> {
        self.given
            .iter()
            .map(|(flag, values)| {
                let name = format!("--{}", flag.long);
                let verdict = (flag.verdict)(&name, values);
                let typed = std::iter::once(name)
                    .chain(values.iter().cloned())
                    .collect::<Vec<_>>()
                    .join(" ");
                (typed, verdict)
            })
            .collect()
    }
}

impl FromArgMatches for ForeignFlags {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut given = Vec::new();
        for flag in FOREIGN_FLAGS {
            match flag.takes {
                Takes::Nothing => {
                    if matches.get_flag(flag.long) {
                        given.push((flag, Vec::new()));
                    }
                }
                Takes::One | Takes::Many => {
                    if let Some(values) = matches.get_many::<String>(flag.long) {
                        given.push((flag, values.cloned().collect()));
                    }
                }
            }
        }
        Ok(Self { given })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for ForeignFlags {
    /// The flags are hidden from `--help` (docs/compatibility-flags.md lists them): they change
    /// nothing here, and listing dozens of them would bury deltaserve's own flags.
    fn augment_args(command: Command) -> Command {
        FOREIGN_FLAGS.iter().fold(command, |command, flag| {
            let arg = Arg::new(flag.long).long(flag.long).hide(true);
            command.arg(match flag.takes {
                Takes::Nothing => arg.action(ArgAction::SetTrue),
                Takes::One => arg.num_args(1).action(ArgAction::Set),
                Takes::Many => arg.num_args(1..).action(ArgAction::Set),
            })
        })
    }

    fn augment_args_for_update(command: Command) -> Command {
        Self::augment_args(command)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        foreign: ForeignFlags,
    }

    fn verdicts(flags: &str) -> Vec<(String, Verdict)> {
        let argv = std::iter::once("serve").chain(flags.split_whitespace());
        Cli::try_parse_from(argv).unwrap().foreign.verdicts()
    }

    #[test]
    fn each_flag_gets_its_verdict_with_the_values_as_typed() {
        let v = verdicts(
            "--trust-remote-code --cuda-graph-bs 1 2 4 --no-enable-prefix-caching --ep-size 1",
        );
        let typed: Vec<&str> = v.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(
            typed,
            [
                "--trust-remote-code",
                "--cuda-graph-bs 1 2 4",
                "--ep-size 1",
                "--no-enable-prefix-caching"
            ]
        );
        assert!(matches!(&v[0].1, Verdict::Note(n) if n.contains("never runs code")));
        assert!(matches!(&v[1].1, Verdict::Note(n) if n.contains("--cuda-graph-max-bs")));
        assert_eq!(v[2].1, Verdict::Same);
        assert_eq!(v[3].1, Verdict::Same);
    }

    #[test]
    fn refusals_name_the_flag_and_the_way_out() {
        let v = verdicts("--ep-size 8 --skip-tokenizer-init --ssl-keyfile k.pem");
        let reasons: Vec<String> = v
            .into_iter()
            .map(|(_, verdict)| match verdict {
                Verdict::Refuse(why) => why,
                other => panic!("expected a refusal, found {other:?}"),
            })
            .collect();
        assert!(reasons[0].contains("--ep-size 8") && reasons[0].contains("one device"));
        assert!(reasons[1].contains("--skip-tokenizer-init") && reasons[1].contains("tokenizer"));
        assert!(reasons[2].contains("--ssl-keyfile") && reasons[2].contains("reverse proxy"));
        let v = verdicts("--nnodes two");
        assert!(matches!(&v[0].1, Verdict::Refuse(why) if why.contains("whole number")));
    }

    #[test]
    fn every_flag_is_documented() {
        let doc = include_str!("../../docs/compatibility-flags.md");
        for flag in FOREIGN_FLAGS {
            assert!(
                doc.contains(&format!("`--{} ", flag.long))
                    || doc.contains(&format!("`--{}`", flag.long)),
                "--{} is missing from docs/compatibility-flags.md",
                flag.long
            );
        }
        let spellings = crate::serve_flags::compat::CompatArgs::augment_args(Command::new("serve"));
        for arg in spellings.get_arguments() {
            if let Some(long) = arg.get_long() {
                assert!(
                    doc.contains(&format!("--{long}")),
                    "--{long} is missing from docs/compatibility-flags.md"
                );
            }
        }
    }

    #[test]
    fn table_has_no_duplicates() {
        let mut names: Vec<&str> = FOREIGN_FLAGS.iter().map(|f| f.long).collect();
        names.sort_unstable();
        let count = names.len();
        names.dedup();
        assert_eq!(names.len(), count);
    }
}
