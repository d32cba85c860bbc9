//! SGLang's and vLLM's other spellings of deltaserve's own settings (`--tp`, `--tensor-parallel-size`,
//! `--max-model-len`, `--gpu-memory-utilization`, `serve MODEL`, `--speculative-config`, ...) and the
//! one place they are folded into `ServeArgs`: a setting given in two spellings with different values
//! is an error naming both flags. Also turns the foreign flags (`foreign_flags.rs`) and foreign values
//! of deltaserve's own flags (`--attention-backend flashinfer`) into start-up notes or refusals.

use std::path::PathBuf;

use clap::Args;

use crate::model_flags::{BackendKind, OTHER_SPELLINGS_HEADING};
use crate::serve_flags::args::{ArgsError, ServeArgs};
use crate::serve_flags::flag_values::{LogLevel, SchedulePolicy};
use crate::serve_flags::foreign_flags::{ForeignFlags, Verdict};
use crate::spellings::merge;
use deltaserve_api::ApiKey;

/// Environment variable vLLM reads the API key from.
pub const VLLM_API_KEY: &str = "VLLM_API_KEY";
/// Environment variable vLLM reads its log level from.
pub const VLLM_LOGGING_LEVEL: &str = "VLLM_LOGGING_LEVEL";

/// Other servers' spellings of deltaserve settings. Each is listed under its own help heading and
/// folded into the deltaserve flag it names by `ServeArgs::resolve_compat`.
#[derive(Args, Debug, Clone, PartialEq, Default)]
#[command(next_help_heading = OTHER_SPELLINGS_HEADING)]
pub struct CompatArgs {
    /// vLLM's `serve MODEL`: the model directory as a positional argument (= --model-path).
    #[arg(value_name = "MODEL")]
    pub model: Option<PathBuf>,
    /// = --dp-size.
    #[arg(long, value_name = "N")]
    pub dp: Option<usize>,
    /// = --dp-size (vLLM, SGLang; `-dp` too).
    #[arg(long, value_name = "N")]
    pub data_parallel_size: Option<usize>,
    /// = --context-length (vLLM; `32k` = 32000, `32K` = 32768).
    #[arg(long, value_name = "TOKENS", value_parser = parse_token_count)]
    pub max_model_len: Option<usize>,
    /// = --max-running-requests (vLLM).
    #[arg(long, value_name = "N")]
    pub max_num_seqs: Option<usize>,
    /// = --mem-fraction-static (vLLM).
    #[arg(long, value_name = "FRACTION")]
    pub gpu_memory_utilization: Option<f32>,
    /// = --chunked-prefill-size (vLLM: the prompt tokens of one step).
    #[arg(long, value_name = "TOKENS", value_parser = parse_token_count)]
    pub max_num_batched_tokens: Option<usize>,
    /// = --page-size (vLLM).
    #[arg(long, value_name = "TOKENS")]
    pub block_size: Option<usize>,
    /// = --tokenizer-path (vLLM).
    #[arg(long, value_name = "DIR")]
    pub tokenizer: Option<PathBuf>,
    /// = --random-seed (vLLM).
    #[arg(long, value_name = "SEED")]
    pub seed: Option<u64>,
    /// = --schedule-policy (vLLM).
    #[arg(long, value_enum, value_name = "POLICY")]
    pub scheduling_policy: Option<SchedulePolicy>,
    /// = --speculative-algorithm.
    #[arg(long, value_name = "NAME")]
    pub speculative_algo: Option<String>,
    /// vLLM's speculative decoding as JSON: {"method": "mtp", "num_speculative_tokens": N}
    /// (= --speculative-algorithm NEXTN --speculative-num-steps N).
    #[arg(long, value_name = "JSON")]
    pub speculative_config: Option<String>,
    /// = --skip-canary (SGLang's warm-up request is deltaserve's canary).
    #[arg(long)]
    pub skip_server_warmup: bool,
    /// = --backend (`cuda` or `cpu`).
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<String>,
    /// = --decode-log-interval 0 (vLLM: no periodic statistics lines).
    #[arg(long)]
    pub disable_log_stats: bool,
    /// = --disable-cuda-graph (vLLM).
    #[arg(long)]
    pub enforce_eager: bool,
    #[command(flatten)]
    pub foreign: ForeignFlags,
}

/// One start-up line about a flag deltaserve accepted but handles its own way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompatNote {
    /// The flag as typed, with its values.
    pub flag: String,
    pub text: String,
}

impl std::fmt::Display for CompatNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.flag, self.text)
    }
}

/// `32768`, or vLLM's human-readable `32k` (x1000) / `32K` (x1024), `1m` / `1M`.
fn parse_token_count(value: &str) -> Result<usize, String> {
    let (digits, scale) = match value.char_indices().last() {
        Some((i, 'k')) => (&value[..i], 1_000),
        Some((i, 'K')) => (&value[..i], 1 << 10),
        Some((i, 'm')) => (&value[..i], 1_000_000),
        Some((i, 'M')) => (&value[..i], 1 << 20),
        _ => (value, 1),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("{value:?} is not a token count (e.g. 32768, 32k, 32K)"))
}

/// Attention kernels of SGLang and vLLM (`--attention-backend`, vLLM's `VLLM_ATTENTION_BACKEND`
/// names): each selects something deltaserve does with its own kernels.
const FOREIGN_ATTENTION_BACKENDS: [&str; 20] = [
    "triton",
    "flashinfer",
    "fa3",
    "fa4",
    "flashmla",
    "cutlass_mla",
    "trtllm_mla",
    "trtllm_mha",
    "torch_native",
    "flex_attention",
    "aiter",
    "wave",
    "intel_amx",
    "ascend",
    "flash_attn",
    "triton_attn",
    "torch_sdpa",
    "xformers",
    "flashinfer_mla",
    "hybrid_linear_attn",
];

/// The start-up notes of the foreign flags given; the first refusal, or a contradiction between
/// them, is an error.
fn foreign_notes(
    foreign: &ForeignFlags,
    disable_radix_cache: bool,
) -> Result<Vec<CompatNote>, ArgsError> {
    let verdicts = foreign.verdicts();
    let given = |name: &str| {
        verdicts.iter().any(|(typed, _)| typed == name)
            || (name == "--disable-radix-cache" && disable_radix_cache)
    };
    if given("--enable-prefix-caching") {
        for off in ["--no-enable-prefix-caching", "--disable-radix-cache"] {
            if given(off) {
                return Err(ArgsError(format!(
                    "--enable-prefix-caching and {off} contradict each other; give one of them"
                )));
            }
        }
    }
    let mut notes = Vec::new();
    for (typed, verdict) in verdicts {
        match verdict {
            Verdict::Same => {}
            Verdict::Note(text) => notes.push(CompatNote { flag: typed, text }),
            Verdict::Refuse(why) => return Err(ArgsError(why)),
        }
    }
    Ok(notes)
}

impl ServeArgs {
    /// Folds SGLang's and vLLM's spellings into deltaserve's flags and returns the start-up notes of
    /// flags accepted with a different behaviour. `env` reads environment variables (`VLLM_API_KEY`,
    /// `VLLM_LOGGING_LEVEL`). Call before `validate`.
    pub fn resolve_compat(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Vec<CompatNote>, ArgsError> {
        let compat = self.compat.clone();
        self.fold_spellings(&compat)?;
        self.resolve_speculative(&compat)?;
        self.resolve_device(compat.device.as_deref())?;
        self.resolve_environment(env)?;

        let mut notes = Vec::new();
        self.attention_backend_note(&mut notes);
        self.reasoning_parser_note(&mut notes);
        self.schedule_policy_note(&mut notes);
        notes.extend(foreign_notes(&compat.foreign, self.disable_radix_cache)?);
        if compat
            .foreign
            .given
            .iter()
            .any(|(flag, _)| flag.long == "no-enable-prefix-caching")
        {
            self.disable_radix_cache = true;
        }
        Ok(notes)
    }

    /// The other spellings of deltaserve's flags, folded into them.
    fn fold_spellings(&mut self, compat: &CompatArgs) -> Result<(), ArgsError> {
        // Tensor parallelism is implemented: every spelling folds into --tp-size.
        self.model.fold_spellings(compat.model.clone())?;
        // So is data parallelism (replicas in one process): every spelling folds into --dp-size.
        merge(
            &mut self.dp_size,
            "--dp-size",
            &[
                ("--dp", compat.dp),
                ("--data-parallel-size", compat.data_parallel_size),
            ],
        )?;
        merge(
            &mut self.context_length,
            "--context-length",
            &[("--max-model-len", compat.max_model_len)],
        )?;
        merge(
            &mut self.max_running_requests,
            "--max-running-requests",
            &[("--max-num-seqs", compat.max_num_seqs)],
        )?;
        merge(
            &mut self.mem_fraction_static,
            "--mem-fraction-static",
            &[("--gpu-memory-utilization", compat.gpu_memory_utilization)],
        )?;
        merge(
            &mut self.chunked_prefill_size,
            "--chunked-prefill-size",
            &[(
                "--max-num-batched-tokens",
                compat.max_num_batched_tokens.map(|n| n as i64),
            )],
        )?;
        merge(
            &mut self.page_size,
            "--page-size",
            &[("--block-size", compat.block_size)],
        )?;
        merge(
            &mut self.tokenizer_path,
            "--tokenizer-path",
            &[("--tokenizer", compat.tokenizer.clone())],
        )?;
        merge(
            &mut self.random_seed,
            "--random-seed",
            &[("--seed", compat.seed)],
        )?;
        merge(
            &mut self.schedule_policy,
            "--schedule-policy",
            &[("--scheduling-policy", compat.scheduling_policy)],
        )?;
        merge(
            &mut self.decode_log_interval,
            "--decode-log-interval",
            &[("--disable-log-stats", compat.disable_log_stats.then_some(0))],
        )?;
        self.skip_canary |= compat.skip_server_warmup;
        self.model.disable_cuda_graph |= compat.enforce_eager;
        Ok(())
    }

    /// `--speculative-algo` and vLLM's `--speculative-config` onto SGLang's speculative flags.
    fn resolve_speculative(&mut self, compat: &CompatArgs) -> Result<(), ArgsError> {
        merge(
            &mut self.speculative_algorithm,
            "--speculative-algorithm",
            &[("--speculative-algo", compat.speculative_algo.clone())],
        )?;
        let Some(json) = &compat.speculative_config else {
            return Ok(());
        };
        let vllm = crate::serve_flags::speculative_config::parse(json)?;
        if let Some(algorithm) = &self.speculative_algorithm {
            if !matches!(algorithm.to_ascii_uppercase().as_str(), "NEXTN" | "MTP") {
                return Err(ArgsError(format!(
                    "--speculative-algorithm {algorithm} and --speculative-config (MTP) set the same thing \
                     differently; give one of them"
                )));
            }
        }
        self.speculative_algorithm
            .get_or_insert_with(|| "NEXTN".to_string());
        merge(
            &mut self.speculative_num_steps,
            "--speculative-num-steps",
            &[(
                "--speculative-config num_speculative_tokens",
                Some(vllm.num_speculative_tokens),
            )],
        )?;
        merge(
            &mut self.speculative_disable_batch_size,
            "--speculative-disable-batch-size",
            &[(
                "--speculative-config disable_by_batch_size",
                vllm.disable_by_batch_size,
            )],
        )?;
        Ok(())
    }

    /// SGLang's `--device cuda|cpu` is deltaserve's `--backend`.
    fn resolve_device(&mut self, device: Option<&str>) -> Result<(), ArgsError> {
        let Some(device) = device else { return Ok(()) };
        let backend = match device.to_ascii_lowercase().as_str() {
            "cuda" | "gpu" => BackendKind::Cuda,
            "cpu" => BackendKind::Cpu,
            "auto" => BackendKind::Auto,
            _ => {
                return Err(ArgsError(format!(
                    "--device {device:?} is not supported; deltaserve runs on cuda or cpu (see --backend)"
                )))
            }
        };
        match self.model.backend {
            BackendKind::Auto => self.model.backend = backend,
            current if backend == BackendKind::Auto || current == backend => {}
            _ => {
                return Err(ArgsError(format!(
                    "--backend {} and --device {device} set the same thing differently; give one of them",
                    self.model.backend.name()
                )))
            }
        }
        Ok(())
    }

    /// vLLM's environment variables for settings deltaserve has. A flag wins over `VLLM_LOGGING_LEVEL`;
    /// an API key that differs between `--api-key`/`DELTASERVE_API_KEY` and `VLLM_API_KEY` is an error,
    /// since guessing which key guards the server is not safe.
    fn resolve_environment(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), ArgsError> {
        if let Some(key) = env(VLLM_API_KEY) {
            let key = ApiKey::new(key);
            match &self.api_key {
                None => self.api_key = Some(key),
                Some(current) if *current == key => {}
                Some(_) => {
                    return Err(ArgsError(format!(
                        "--api-key (or DELTASERVE_API_KEY) and {VLLM_API_KEY} give different keys; set one of them"
                    )))
                }
            }
        }
        if self.log_level.is_none() {
            if let Some(level) = env(VLLM_LOGGING_LEVEL) {
                self.log_level = Some(LogLevel::parse(&level).ok_or_else(|| {
                    ArgsError(format!(
                        "{VLLM_LOGGING_LEVEL}={level:?} is not a log level (debug, info, warning, error, critical)"
                    ))
                })?);
            }
        }
        Ok(())
    }

    /// GPU attention kernels named by SGLang or vLLM select nothing here: deltaserve has one proven
    /// attention implementation per backend.
    fn attention_backend_note(&mut self, notes: &mut Vec<CompatNote>) {
        let Some(name) = &self.model.attention_backend else {
            return;
        };
        if FOREIGN_ATTENTION_BACKENDS.contains(&name.to_ascii_lowercase().as_str()) {
            notes.push(CompatNote {
                flag: format!("--attention-backend {name}"),
                text:
                    "deltaserve runs its own attention kernels, each proven against the reference \
                       implementation (one per --backend)"
                        .into(),
            });
            self.model.attention_backend = None;
        }
    }

    /// vLLM recipes for Qwen3 thinking models name `deepseek_r1` because their chat template opens the
    /// `<think>` block in the prompt; deltaserve's qwen3 parser handles that case itself.
    fn reasoning_parser_note(&mut self, notes: &mut Vec<CompatNote>) {
        let Some(name) = &self.reasoning_parser else {
            return;
        };
        if matches!(name.as_str(), "deepseek_r1" | "deepseek-r1") {
            notes.push(CompatNote {
                flag: format!("--reasoning-parser {name}"),
                text: "deltaserve uses its qwen3 parser, which also splits <think> blocks the chat template \
                       opens in the prompt"
                    .into(),
            });
            self.reasoning_parser = Some("qwen3".into());
        }
    }

    fn schedule_policy_note(&self, notes: &mut Vec<CompatNote>) {
        if let Some(policy) = self.schedule_policy {
            if policy != SchedulePolicy::Fcfs {
                notes.push(CompatNote {
                    flag: format!("--schedule-policy {}", policy.as_str()),
                    text: "deltaserve admits waiting requests first come, first served (the order changes \
                           latency, never outputs)"
                        .into(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve_flags::flag_values::KvCacheDtype;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn parse(flags: &str) -> ServeArgs {
        let argv = std::iter::once("serve").chain(flags.split_whitespace());
        Cli::try_parse_from(argv).unwrap().serve
    }

    fn resolved(flags: &str) -> (ServeArgs, Vec<CompatNote>) {
        let mut args = parse(flags);
        let notes = args.resolve_compat(&no_env).unwrap();
        (args, notes)
    }

    fn refused(flags: &str) -> String {
        parse(flags).resolve_compat(&no_env).unwrap_err().0
    }

    #[test]
    fn vllm_spellings_land_on_the_sglang_settings() {
        let (args, notes) = resolved(
            "/models/q --tensor-parallel-size 1 --gpu-memory-utilization 0.9 --max-model-len 32k \
             --max-num-seqs 64 --max-num-batched-tokens 8192 --block-size 32 --seed 7 --tokenizer /t \
             --scheduling-policy fcfs",
        );
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(args.model_path(), PathBuf::from("/models/q"));
        assert_eq!(args.model.tp_size, Some(1));
        assert_eq!(args.mem_fraction_static, Some(0.9));
        assert_eq!(args.context_length, Some(32_000));
        assert_eq!(args.max_running_requests, Some(64));
        assert_eq!(args.chunked_prefill_size, Some(8192));
        assert_eq!(args.page_size, Some(32));
        assert_eq!(args.random_seed, Some(7));
        assert_eq!(args.tokenizer_path, Some(PathBuf::from("/t")));
        assert_eq!(args.schedule_policy, Some(SchedulePolicy::Fcfs));
        assert!(args.validate().is_ok());
        let (args, _) = resolved("--max-model-len 32K");
        assert_eq!(args.context_length, Some(32_768));
    }

    #[test]
    fn same_value_in_two_spellings_is_fine_different_values_name_both_flags() {
        let (args, _) = resolved("--tp 1 --tp-size 1 --tensor-parallel-size 1");
        assert_eq!(args.model.tp_size, Some(1));
        let e = refused("--context-length 4096 --max-model-len 8192");
        assert!(
            e.contains("--context-length 4096") && e.contains("--max-model-len 8192"),
            "{e}"
        );
        let e = refused("--model-path /a /b");
        assert!(
            e.contains("--model-path") && e.contains("MODEL (positional)"),
            "{e}"
        );
        let (args, _) = resolved("--model-path /a /a");
        assert_eq!(args.model_path(), PathBuf::from("/a"));
        let e = refused("--mem-fraction-static 0.8 --gpu-memory-utilization 0.9");
        assert!(
            e.contains("--mem-fraction-static") && e.contains("--gpu-memory-utilization"),
            "{e}"
        );
        let e = refused("--tp 2 --tensor-parallel-size 4");
        assert!(
            e.contains("--tp 2") && e.contains("--tensor-parallel-size 4"),
            "{e}"
        );
        let (args, _) = resolved("--tensor-parallel-size 8");
        assert_eq!(args.model.tp_size, Some(8));
        let (args, _) = resolved("--dp 2");
        assert_eq!(args.dp_size, Some(2));
        let e = refused("--random-seed 1 --seed 2");
        assert!(
            e.contains("--random-seed 1") && e.contains("--seed 2"),
            "{e}"
        );
        let e = refused("--backend cpu --device cuda");
        assert!(
            e.contains("--backend cpu") && e.contains("--device cuda"),
            "{e}"
        );
        let e = refused("--enable-prefix-caching --disable-radix-cache");
        assert!(e.contains("--disable-radix-cache"), "{e}");
        let (args, _) = resolved("--no-enable-prefix-caching");
        assert!(
            args.disable_radix_cache,
            "vLLM's spelling of --disable-radix-cache"
        );
    }

    #[test]
    fn tp_and_dp_spellings_fold_and_other_parallel_sizes_stay_refused() {
        // Tensor and data parallelism are accepted under every spelling.
        for flags in ["--tp 2", "--tensor-parallel-size 2", "--tp-size 2"] {
            let (args, _) = resolved(flags);
            assert_eq!(args.model.tp_size, Some(2), "{flags}");
        }
        for flags in ["--dp 2", "--data-parallel-size 2", "--dp-size 2"] {
            let (args, _) = resolved(flags);
            assert_eq!(args.dp_size, Some(2), "{flags}");
        }
        let e = refused("--dp 2 --data-parallel-size 4");
        assert!(
            e.contains("--dp 2") && e.contains("--data-parallel-size 4"),
            "{e}"
        );
        for flags in ["--ep 2", "--pipeline-parallel-size 2"] {
            let e = refused(flags);
            assert!(
                e.contains(flags) && e.contains("not supported"),
                "{flags}: {e}"
            );
        }
        let (args, _) = resolved("--tp 1 --dp 1 --dp-size 1 --ep-size 1 --pp-size 1");
        assert!(args.validate().is_ok());
    }

    #[test]
    fn vllm_speculative_config_is_nextn() {
        let (args, _) =
            resolved(r#"--speculative-config {"method":"mtp","num_speculative_tokens":2}"#);
        let spec = args.validate().unwrap().unwrap();
        assert_eq!((spec.num_steps, spec.num_draft_tokens), (2, 3));
        let (args, _) = resolved(
            r#"--speculative-algo NEXTN --speculative-num-steps 2 --speculative-config {"method":"qwen3_next_mtp","num_speculative_tokens":2}"#,
        );
        assert_eq!(args.validate().unwrap().unwrap().num_steps, 2);
        let e = refused(
            r#"--speculative-num-steps 3 --speculative-config {"method":"mtp","num_speculative_tokens":2}"#,
        );
        assert!(
            e.contains("--speculative-num-steps 3") && e.contains("num_speculative_tokens"),
            "{e}"
        );
        let e = refused(r#"--speculative-config {"method":"ngram"}"#);
        assert!(e.contains("own MTP head"), "{e}");
    }

    #[test]
    fn class_two_flags_print_one_line_each() {
        let (args, notes) = resolved(
            "--trust-remote-code --attention-backend fa3 --enable-torch-compile --schedule-policy lpm \
             --kv-cache-dtype bf16 --enable-prefix-caching",
        );
        let flags: Vec<&str> = notes.iter().map(|n| n.flag.as_str()).collect();
        assert_eq!(
            flags,
            [
                "--attention-backend fa3",
                "--schedule-policy lpm",
                "--trust-remote-code",
                "--enable-torch-compile",
            ]
        );
        assert!(
            !args.disable_radix_cache,
            "the prefix cache is on by default"
        );
        assert_eq!(args.model.attention_backend, None);
        assert_eq!(args.model.kv_cache_dtype, KvCacheDtype::BFloat16);
        assert!(args.validate().is_ok());
        let (args, notes) = resolved("--attention-backend warp-drive");
        assert!(notes.is_empty());
        let e = args.validate().unwrap_err().0;
        assert!(e.contains("warp-drive"), "{e}");
        let (args, notes) = resolved("--reasoning-parser deepseek_r1");
        assert_eq!(args.reasoning_parser.as_deref(), Some("qwen3"));
        assert_eq!(notes[0].flag, "--reasoning-parser deepseek_r1");
        let (args, _) = resolved("--tool-call-parser hermes");
        assert!(args.validate().is_ok());
        let (args, _) = resolved("--tool-call-parser llama3_json");
        let e = args.validate().unwrap_err().0;
        assert!(
            e.contains("llama3_json") && e.contains("qwen3_coder"),
            "{e}"
        );
    }

    #[test]
    fn vllm_environment_variables() {
        let env = |name: &str| match name {
            VLLM_API_KEY => Some("sk-env".to_string()),
            VLLM_LOGGING_LEVEL => Some("WARNING".to_string()),
            _ => None,
        };
        let mut args = parse("");
        args.resolve_compat(&env).unwrap();
        assert_eq!(args.api_key, Some(ApiKey::new("sk-env")));
        assert_eq!(args.log_level, Some(LogLevel::Warning));
        let mut args = parse("--api-key sk-env --log-level debug");
        args.resolve_compat(&env).unwrap();
        assert_eq!(args.log_level, Some(LogLevel::Debug));
        let e = parse("--api-key sk-flag")
            .resolve_compat(&env)
            .unwrap_err()
            .0;
        assert!(e.contains("--api-key") && e.contains(VLLM_API_KEY), "{e}");
        assert!(!e.contains("sk-"), "keys are never echoed: {e}");
    }
}
