//! The `deltaserve serve` flags (SGLang spellings where the meaning is the same) and their validation:
//! contradictory or unsupported combinations are refused at start-up with a message naming the flags.
//! The server's settings are built here (`server_config`); the engine's and the pools' in
//! commands/serve.rs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::TypedValueParser;
use clap::{Args, ValueEnum};

use crate::model_flags::ModelFlags;
use crate::serve_flags::compat::CompatArgs;
use crate::serve_flags::flag_values::{
    parse_template_kwargs, LogLevel, ModelDtype, SchedulePolicy,
};
use crate::spellings::SpellingConflict;
use deltaserve_api::limits::{
    RequestLimits, DEFAULT_MAX_MESSAGES, DEFAULT_MAX_N, DEFAULT_MAX_STOP_STRINGS,
    DEFAULT_MAX_TOKENS_CAP, DEFAULT_MAX_TOP_LOGPROBS,
};
use deltaserve_api::state::{
    DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONNECTIONS, DEFAULT_REQUEST_TIMEOUT_SECS,
};
use deltaserve_api::ApiKey;
use deltaserve_api::{DegenerationAction, ServerConfig};
use deltaserve_text::ToolCallFormat;
use serde_json::{Map, Value};

/// Flags of `deltaserve serve`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelFlags,
    /// Tokenizer directory (tokenizer.json, tokenizer_config.json, chat template) when it is not the
    /// model directory.
    #[arg(long, value_name = "DIR")]
    pub tokenizer_path: Option<PathBuf>,
    /// Chat template for every request: a Jinja file, or the template itself inline (replaces the
    /// model's own templates).
    #[arg(long, value_name = "FILE|TEMPLATE")]
    pub chat_template: Option<String>,
    /// Template variables every chat request starts from, as a JSON object (vLLM's flag), e.g.
    /// '{"enable_thinking": false}'; a request's own `chat_template_kwargs` win.
    #[arg(long, value_name = "JSON", value_parser = parse_template_kwargs)]
    pub default_chat_template_kwargs: Option<Map<String, Value>>,
    /// The dtype the weights run in: `auto` or the checkpoint's own (weights are never converted).
    #[arg(long, value_name = "DTYPE", value_parser = ModelDtype::parse, default_value = "auto")]
    pub dtype: ModelDtype,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// Model name reported by /v1/models and accepted in requests (default: --model-path as given).
    /// Several names (vLLM) are all accepted in requests; responses and /v1/models show the first.
    #[arg(long, num_args = 1.., value_name = "NAME")]
    pub served_model_name: Vec<String>,
    /// Maximum prompt + completion tokens of one request (default: the model's max_position_embeddings).
    #[arg(long)]
    pub context_length: Option<usize>,
    /// Maximum number of sequences decoded together.
    #[arg(long)]
    pub max_running_requests: Option<usize>,
    /// Fraction of device memory for weights and both cache pools, in (0, 1].
    #[arg(long)]
    pub mem_fraction_static: Option<f32>,
    /// Number of GDN state slots (each holds one sequence's conv window and recurrent state).
    #[arg(long)]
    pub max_mamba_cache_size: Option<usize>,
    /// Share of the cache memory given to the GDN state pool (the rest is KV), in (0, 1).
    #[arg(long)]
    pub mamba_full_memory_ratio: Option<f32>,
    /// Turn the prefix cache off: no KV pages or GDN snapshots are kept across requests, and every
    /// prompt is prefilled in full (SGLang's flag; docs/prefix-cache.md).
    #[arg(long)]
    pub disable_radix_cache: bool,
    /// With the prefix cache, also snapshot the GDN state every this many prompt tokens during
    /// prefill, so prompts sharing a long prefix hit even when they diverge later (SGLang's flag;
    /// default 256 on the host, the prefill chunk on a GPU; 0: only at the end of each prompt's last
    /// complete message).
    #[arg(long, value_name = "TOKENS")]
    pub mamba_track_interval: Option<usize>,
    /// Data type of the recurrent GDN state.
    #[arg(long, value_enum, default_value_t = MambaSsmDtype::Float32)]
    pub mamba_ssm_dtype: MambaSsmDtype,
    /// Speculative decoding with the model's own MTP head: NEXTN (alias MTP).
    #[arg(long)]
    pub speculative_algorithm: Option<String>,
    /// Draft tokens proposed per verify step.
    #[arg(long)]
    pub speculative_num_steps: Option<usize>,
    /// Drafts per position; only 1 (a chain, no tree) is supported.
    #[arg(long)]
    pub speculative_eagle_topk: Option<usize>,
    /// Tokens verified per step; must be --speculative-num-steps + 1 with top-k 1.
    #[arg(long)]
    pub speculative_num_draft_tokens: Option<usize>,
    /// Turn speculation off while more than this many requests are running.
    #[arg(long)]
    pub speculative_disable_batch_size: Option<usize>,
    /// Split model output into reasoning_content and content: qwen3.
    #[arg(long)]
    pub reasoning_parser: Option<String>,
    /// Parse tool calls out of model output: qwen3_coder (XML) or hermes / qwen (JSON in
    /// <tool_call>); default: the syntax the chat template writes.
    #[arg(long)]
    pub tool_call_parser: Option<String>,
    /// Plan the cache pools as if each GPU had only this many GB (10^9 bytes) of memory, what the
    /// weights and runtime already use counting against it: rehearses a deployment on smaller
    /// GPUs (e.g. 48 with --tp-size 2 for two 48 GB cards) on bigger ones.
    #[arg(long, value_name = "GB")]
    pub device_memory_cap_gb: Option<f64>,
    /// Data-parallel replicas: N whole engines (own weights, cache pools, scheduler) in this
    /// process behind one HTTP front, each request to the least loaded; on cuda replica i takes
    /// GPUs i*TP..(i+1)*TP, on cpu the replicas share --threads.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub dp_size: Option<usize>,
    /// Serve Prometheus metrics at /metrics.
    #[arg(long)]
    pub enable_metrics: bool,
    /// Maximum prompt tokens prefilled in one step (default 256 on the host, 8192 on a GPU); -1 turns
    /// chunking off.
    #[arg(long, allow_negative_numbers = true)]
    pub chunked_prefill_size: Option<i64>,
    /// Size of the KV pool in tokens (overrides the memory-fraction sizing).
    #[arg(long)]
    pub max_total_tokens: Option<usize>,
    /// Tokens per KV block.
    #[arg(long)]
    pub page_size: Option<usize>,
    /// Requests waiting beyond this many are refused with 429.
    #[arg(long)]
    pub max_queued_requests: Option<usize>,
    /// /health runs a one-token generation when none finished in this many seconds.
    #[arg(long, default_value_t = 30)]
    pub health_generate_interval: u64,
    /// On SIGTERM/SIGINT, in-flight requests get this many seconds to finish.
    #[arg(long, default_value_t = 30)]
    pub shutdown_grace_period: u64,
    /// Report ready without the start-up canary generation (not recommended: /health then only
    /// proves that something generates, not that it is right).
    #[arg(long)]
    pub skip_canary: bool,
    /// What to do when a request's output degenerates (loops, collapses, reasoning that never
    /// closes): `log` counts it, logs a diagnosis and adds a `degeneration` field to the choice;
    /// `stop` also ends the request there (`finish_reason: "stop"`).
    #[arg(long, value_parser = degeneration_action_parser(), default_value = "log")]
    pub degeneration_action: DegenerationAction,
    /// Clients must send `Authorization: Bearer KEY` on every route but /health (401 otherwise).
    /// Also read from DELTASERVE_API_KEY, which keeps the key out of the process list.
    #[arg(long, env = "DELTASERVE_API_KEY", hide_env_values = true)]
    pub api_key: Option<ApiKey>,
    /// With --api-key, let /metrics answer without the key (for a scraper on a trusted network).
    #[arg(long)]
    pub metrics_no_auth: bool,
    /// Most chat messages in one request (400 above).
    #[arg(long, default_value_t = DEFAULT_MAX_MESSAGES)]
    pub max_messages: usize,
    /// Most prompt tokens in one request (400 above; default: the context length).
    #[arg(long)]
    pub max_prompt_tokens: Option<usize>,
    /// Largest `max_tokens` / `max_completion_tokens` (400 above); also the budget of a request
    /// that sends neither.
    #[arg(long, default_value_t = DEFAULT_MAX_TOKENS_CAP)]
    pub max_tokens_cap: usize,
    /// Largest `n` (choices per request).
    #[arg(long, default_value_t = DEFAULT_MAX_N)]
    pub max_n: usize,
    /// Largest `top_logprobs` (chat) / `logprobs` (completions).
    #[arg(long, default_value_t = DEFAULT_MAX_TOP_LOGPROBS)]
    pub max_top_logprobs: usize,
    /// Most stop strings per request (each at most 256 bytes).
    #[arg(long, default_value_t = DEFAULT_MAX_STOP_STRINGS)]
    pub max_stop_strings: usize,
    /// Largest request body in bytes (413 above).
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Wall-clock limit of one generation request in seconds (0: none); when it expires the engine
    /// request is aborted and the client gets an error (504, or an error event in a stream).
    #[arg(long, default_value_t = DEFAULT_REQUEST_TIMEOUT_SECS)]
    pub request_timeout: u64,
    /// Most open client connections; further ones wait in the listen backlog until one closes.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_concurrent_connections: usize,
    /// Seed of the requests that bring none, so that a server's sampled outputs can be reproduced
    /// (default: a fresh seed per request).
    #[arg(long, value_name = "SEED")]
    pub random_seed: Option<u64>,
    /// `debug`, `info` (default), `warning`, `error`, `critical`; also read from VLLM_LOGGING_LEVEL.
    #[arg(long, value_enum, value_name = "LEVEL")]
    pub log_level: Option<LogLevel>,
    /// Print a decode statistics line every this many decode steps (0: never; default 40).
    #[arg(long, value_name = "STEPS")]
    pub decode_log_interval: Option<usize>,
    /// Exit (status 1, /health failed first) when requests are running and no forward step finished
    /// in this many seconds (default: no watchdog).
    #[arg(long, value_name = "SECS")]
    pub watchdog_timeout: Option<f64>,
    /// Order in which waiting requests are admitted: `fcfs` (deltaserve's; other SGLang policies are
    /// accepted with a note).
    #[arg(long, value_enum, value_name = "POLICY")]
    pub schedule_policy: Option<SchedulePolicy>,
    #[command(flatten)]
    pub compat: CompatArgs,
}

/// `--degeneration-action` values (the server's `DegenerationAction`).
fn degeneration_action_parser() -> impl clap::builder::TypedValueParser<Value = DegenerationAction>
{
    clap::builder::PossibleValuesParser::new([
        clap::builder::PossibleValue::new("log")
            .help("Count, log and report the degeneration; let the request run on"),
        clap::builder::PossibleValue::new("stop")
            .help("Count, log and report it, and end the request at once"),
    ])
    .map(|value| match value.as_str() {
        "stop" => DegenerationAction::Stop,
        _ => DegenerationAction::Log,
    })
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum MambaSsmDtype {
    Float32,
    Bfloat16,
}

/// Speculative decoding settings after validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculativeConfig {
    pub num_steps: usize,
    pub num_draft_tokens: usize,
    pub disable_batch_size: Option<usize>,
}

/// Default draft length when only `--speculative-algorithm` is given (SGLang's NEXTN default).
const DEFAULT_SPECULATIVE_STEPS: usize = 3;

/// A flag combination refused at start-up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid flags: {0}")]
pub struct ArgsError(pub String);

impl From<SpellingConflict> for ArgsError {
    fn from(conflict: SpellingConflict) -> Self {
        ArgsError(conflict.0)
    }
}

fn refuse<T>(message: impl Into<String>) -> Result<T, ArgsError> {
    Err(ArgsError(message.into()))
}

impl ServeArgs {
    /// Refuses contradictory or unsupported flag combinations; returns the speculative settings.
    pub fn validate(&self) -> Result<Option<SpeculativeConfig>, ArgsError> {
        self.validate_sizes()?;
        self.validate_security()?;
        self.validate_memory()?;
        self.validate_parsers()?;
        self.validate_model()?;
        self.speculative()
    }

    /// `--model-path` as given, or `demo`.
    pub fn model_path(&self) -> PathBuf {
        self.model.model_path()
    }

    /// The name clients use in `model` and see in /v1/models.
    pub fn model_name(&self) -> String {
        self.served_model_name
            .first()
            .cloned()
            .unwrap_or_else(|| self.model_path().display().to_string())
    }

    /// Further names requests may use (`--served-model-name NAME ALIAS...`).
    pub fn model_aliases(&self) -> Vec<String> {
        self.served_model_name.iter().skip(1).cloned().collect()
    }

    /// `--log-level`, or `info`.
    pub fn log_level(&self) -> LogLevel {
        self.log_level.unwrap_or_default()
    }

    /// `--watchdog-timeout` as a duration.
    pub fn watchdog_timeout(&self) -> Option<Duration> {
        self.watchdog_timeout.map(Duration::from_secs_f64)
    }

    /// `None` when chunked prefill is off (`--chunked-prefill-size -1`).
    pub fn chunked_prefill_tokens(&self) -> Option<usize> {
        self.chunked_prefill_size
            .and_then(|n| usize::try_from(n).ok())
    }

    pub fn health_interval(&self) -> Duration {
        Duration::from_secs(self.health_generate_interval)
    }

    /// The request limits of `--max-*`.
    pub fn request_limits(&self) -> RequestLimits {
        RequestLimits {
            max_messages: self.max_messages,
            max_prompt_tokens: self.max_prompt_tokens,
            max_tokens_cap: self.max_tokens_cap,
            max_n: self.max_n,
            max_top_logprobs: self.max_top_logprobs,
            max_stop_strings: self.max_stop_strings,
        }
    }

    pub fn grace_period(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_period)
    }

    /// `--request-timeout`; `None` for 0 (no limit).
    pub fn request_timeout(&self) -> Option<Duration> {
        (self.request_timeout > 0).then(|| Duration::from_secs(self.request_timeout))
    }

    /// The server's settings from validated flags.
    pub fn server_config(&self) -> ServerConfig {
        ServerConfig {
            model_name: self.model_name(),
            model_aliases: self.model_aliases(),
            reasoning_parser: self.reasoning_parser.is_some(),
            tool_call_parser: true,
            tool_call_format: self
                .tool_call_parser
                .as_deref()
                .and_then(ToolCallFormat::from_parser_name),
            enable_metrics: self.enable_metrics,
            health_interval: self.health_interval(),
            health_probe_timeout: Duration::from_secs(60),
            max_body_bytes: self.max_body_bytes,
            grace_period: self.grace_period(),
            degeneration_action: self.degeneration_action,
            degeneration: deltaserve_health::Config::default(),
            api_key: self.api_key.clone(),
            metrics_no_auth: self.metrics_no_auth,
            limits: self.request_limits(),
            request_timeout: self.request_timeout(),
            max_connections: self.max_concurrent_connections,
            random_seed: self.random_seed,
            default_template_kwargs: self
                .default_chat_template_kwargs
                .clone()
                .unwrap_or_default(),
            tp_size: self.model.tp_size.unwrap_or(1),
            dp_size: self.dp_size.unwrap_or(1),
        }
    }

    /// `--host` and `--port` as a socket address.
    pub fn listen_addr(&self) -> Result<SocketAddr, ArgsError> {
        let host = self.host.trim_start_matches('[').trim_end_matches(']');
        match host.parse::<std::net::IpAddr>() {
            Ok(ip) => Ok(SocketAddr::new(ip, self.port)),
            Err(_) if host == "localhost" => Ok(SocketAddr::from(([127, 0, 0, 1], self.port))),
            Err(_) => refuse(format!(
                "--host {:?} is not an IP address (use e.g. 127.0.0.1 or 0.0.0.0)",
                self.host
            )),
        }
    }

    fn validate_sizes(&self) -> Result<(), ArgsError> {
        let positive = [
            ("--context-length", self.context_length),
            ("--max-running-requests", self.max_running_requests),
            ("--max-mamba-cache-size", self.max_mamba_cache_size),
            ("--max-total-tokens", self.max_total_tokens),
            ("--page-size", self.page_size),
            ("--max-queued-requests", self.max_queued_requests),
            ("--threads", self.model.threads),
            (
                "--speculative-disable-batch-size",
                self.speculative_disable_batch_size,
            ),
        ];
        for (flag, value) in positive {
            if value == Some(0) {
                return refuse(format!("{flag} must be at least 1, found 0"));
            }
        }
        if self.dp_size == Some(0) {
            return refuse("--dp-size must be at least 1, found 0");
        }
        if let Some(secs) = self.watchdog_timeout {
            if !(secs > 0.0 && secs.is_finite()) {
                return refuse(format!(
                    "--watchdog-timeout must be a positive number of seconds, found {secs}"
                ));
            }
        }
        if let Some(n) = self.chunked_prefill_size {
            if n == 0 || n < -1 {
                return refuse(format!(
                    "--chunked-prefill-size must be a positive token count or -1 (off), found {n}"
                ));
            }
        }
        if let (Some(total), Some(context)) = (self.max_total_tokens, self.context_length) {
            if total < context {
                return refuse(format!(
                    "--max-total-tokens {total} is smaller than --context-length {context}: a request of full \
                     context length could never be admitted"
                ));
            }
        }
        if let (Some(total), Some(page)) = (self.max_total_tokens, self.page_size) {
            if total < page {
                return refuse(format!(
                    "--max-total-tokens {total} is smaller than one KV block (--page-size {page})"
                ));
            }
        }
        Ok(())
    }

    /// An empty key would lock every client out (no header can carry it), and a zero limit would refuse
    /// every request.
    fn validate_security(&self) -> Result<(), ArgsError> {
        if self.api_key.as_ref().is_some_and(ApiKey::is_empty) {
            return refuse(
                "--api-key (or DELTASERVE_API_KEY) is empty; give a key or leave it unset to serve without one",
            );
        }
        let positive = [
            ("--max-messages", Some(self.max_messages)),
            ("--max-prompt-tokens", self.max_prompt_tokens),
            ("--max-tokens-cap", Some(self.max_tokens_cap)),
            ("--max-n", Some(self.max_n)),
            ("--max-body-bytes", Some(self.max_body_bytes)),
            (
                "--max-concurrent-connections",
                Some(self.max_concurrent_connections),
            ),
        ];
        for (flag, value) in positive {
            if value == Some(0) {
                return refuse(format!("{flag} must be at least 1, found 0"));
            }
        }
        Ok(())
    }

    fn validate_memory(&self) -> Result<(), ArgsError> {
        if self.mamba_ssm_dtype == MambaSsmDtype::Bfloat16 {
            return refuse(
                "--mamba-ssm-dtype bfloat16 is not implemented yet: the GDN recurrent state is kept in \
                 float32 on every backend (use float32, the default)",
            );
        }
        if let Some(gb) = self.device_memory_cap_gb {
            if !(gb > 0.0 && gb.is_finite()) {
                return refuse(format!(
                    "--device-memory-cap-gb must be a positive number of GB, found {gb}"
                ));
            }
        }
        if let Some(f) = self.mem_fraction_static {
            if !(f > 0.0 && f <= 1.0) {
                return refuse(format!(
                    "--mem-fraction-static must be in (0, 1], found {f}"
                ));
            }
        }
        if let Some(r) = self.mamba_full_memory_ratio {
            if !(r > 0.0 && r < 1.0) {
                return refuse(format!(
                    "--mamba-full-memory-ratio must be in (0, 1), found {r}"
                ));
            }
        }
        if let (Some(slots), Some(ratio)) =
            (self.max_mamba_cache_size, self.mamba_full_memory_ratio)
        {
            return refuse(format!(
                "--max-mamba-cache-size {slots} and --mamba-full-memory-ratio {ratio} both size the state \
                 pool; give only one"
            ));
        }
        Ok(())
    }

    fn validate_parsers(&self) -> Result<(), ArgsError> {
        if let Some(parser) = &self.reasoning_parser {
            if parser != "qwen3" {
                return refuse(format!(
                    "--reasoning-parser {parser:?} is not supported; the only reasoning parser is \"qwen3\" \
                     (Qwen3.5 / Qwen3.6 / Qwen3-Next <think> blocks)"
                ));
            }
        }
        if let Some(parser) = &self.tool_call_parser {
            if ToolCallFormat::from_parser_name(parser).is_none() {
                return refuse(format!(
                    "--tool-call-parser {parser:?} is not supported; the tool-call parsers are \
                     \"qwen3_coder\" (the XML <tool_call><function=...> format of Qwen3.5 / Qwen3.6) and \
                     \"hermes\" (also spelled \"qwen\", \"qwen25\": JSON in <tool_call>, Qwen3-Next)"
                ));
            }
        }
        Ok(())
    }

    fn validate_model(&self) -> Result<(), ArgsError> {
        self.model.validate().map_err(ArgsError)
    }

    fn speculative(&self) -> Result<Option<SpeculativeConfig>, ArgsError> {
        let Some(algorithm) = &self.speculative_algorithm else {
            let given: Vec<&str> = [
                (
                    "--speculative-num-steps",
                    self.speculative_num_steps.is_some(),
                ),
                (
                    "--speculative-eagle-topk",
                    self.speculative_eagle_topk.is_some(),
                ),
                (
                    "--speculative-num-draft-tokens",
                    self.speculative_num_draft_tokens.is_some(),
                ),
                (
                    "--speculative-disable-batch-size",
                    self.speculative_disable_batch_size.is_some(),
                ),
            ]
            .into_iter()
            .filter_map(|(flag, set)| set.then_some(flag))
            .collect();
            if !given.is_empty() {
                return refuse(format!(
                    "{} given without --speculative-algorithm; add --speculative-algorithm NEXTN or drop them",
                    given.join(", ")
                ));
            }
            return Ok(None);
        };
        match algorithm.to_ascii_uppercase().as_str() {
            "NEXTN" | "MTP" => {}
            "EAGLE" | "EAGLE3" | "STANDALONE" | "NGRAM" | "LOOKAHEAD" => {
                return refuse(format!(
                    "--speculative-algorithm {algorithm} is not supported: deltaserve drafts with the model's own \
                     MTP head; use --speculative-algorithm NEXTN (alias MTP)"
                ))
            }
            _ => {
                return refuse(format!(
                    "--speculative-algorithm {algorithm:?} is unknown; the supported value is NEXTN (alias MTP)"
                ))
            }
        }
        if let Some(topk) = self.speculative_eagle_topk {
            if topk != 1 {
                return refuse(format!(
                    "--speculative-eagle-topk {topk} is unsupported: only chain drafting (top-k 1) is implemented"
                ));
            }
        }
        let num_steps = match (self.speculative_num_steps, self.speculative_num_draft_tokens) {
            (Some(0), _) => return refuse("--speculative-num-steps must be at least 1, found 0"),
            (_, Some(d)) if d < 2 => {
                return refuse(format!(
                    "--speculative-num-draft-tokens must be at least 2 (one draft plus the bonus token), found {d}"
                ))
            }
            (Some(steps), Some(draft)) if draft != steps + 1 => {
                return refuse(format!(
                    "--speculative-num-draft-tokens {draft} must equal --speculative-num-steps {steps} + 1 with \
                     top-k 1 (the verified chain is the drafts plus the bonus token)"
                ))
            }
            (Some(steps), _) => steps,
            (None, Some(draft)) => draft - 1,
            (None, None) => DEFAULT_SPECULATIVE_STEPS,
        };
        Ok(Some(SpeculativeConfig {
            num_steps,
            num_draft_tokens: num_steps + 1,
            disable_batch_size: self.speculative_disable_batch_size,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn parse(flags: &str) -> ServeArgs {
        let argv = std::iter::once("serve").chain(flags.split_whitespace());
        Cli::try_parse_from(argv).unwrap().serve
    }

    fn refused(flags: &str) -> String {
        parse(flags).validate().unwrap_err().0
    }

    #[test]
    fn defaults_follow_sglang() {
        let args = parse("--model-path /m");
        assert_eq!(args.host, "127.0.0.1");
        assert_eq!(args.port, 30000);
        assert_eq!(args.model.tp_size, None);
        assert_eq!(args.model_name(), "/m");
        let args = parse("--model-path /m --served-model-name qwen3-next qwen");
        assert_eq!(
            (args.model_name(), args.model_aliases()),
            ("qwen3-next".to_string(), vec!["qwen".to_string()])
        );
        assert_eq!(args.validate().unwrap(), None);
        assert_eq!(args.listen_addr().unwrap().to_string(), "127.0.0.1:30000");
        assert_eq!(args.degeneration_action, DegenerationAction::Log);
        let args = parse("--model-path /m --degeneration-action stop");
        assert_eq!(args.degeneration_action, DegenerationAction::Stop);
    }

    #[test]
    fn nextn_and_mtp_alias() {
        let spec = parse("--model-path m --speculative-algorithm MTP")
            .validate()
            .unwrap()
            .unwrap();
        assert_eq!((spec.num_steps, spec.num_draft_tokens), (3, 4));
        let spec = parse(
            "--model-path m --speculative-algorithm NEXTN --speculative-num-steps 2 --speculative-eagle-topk 1 \
             --speculative-num-draft-tokens 3",
        )
        .validate()
        .unwrap()
        .unwrap();
        assert_eq!((spec.num_steps, spec.num_draft_tokens), (2, 3));
        let spec =
            parse("--model-path m --speculative-algorithm nextn --speculative-num-draft-tokens 5")
                .validate()
                .unwrap()
                .unwrap();
        assert_eq!(spec.num_steps, 4);
    }

    #[test]
    fn contradictions_name_their_flags() {
        let e = refused("--model-path m --speculative-algorithm NEXTN --speculative-eagle-topk 4");
        assert!(e.contains("--speculative-eagle-topk 4"), "{e}");
        let e = refused(
            "--model-path m --speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-num-draft-tokens 3",
        );
        assert!(
            e.contains("--speculative-num-draft-tokens 3")
                && e.contains("--speculative-num-steps 3"),
            "{e}"
        );
        let e = refused("--model-path m --speculative-num-steps 3");
        assert!(
            e.contains("--speculative-num-steps") && e.contains("--speculative-algorithm"),
            "{e}"
        );
        let e = refused("--model-path m --speculative-algorithm EAGLE");
        assert!(e.contains("NEXTN"), "{e}");
        let e = refused("--model-path m --device-memory-cap-gb 0");
        assert!(e.contains("--device-memory-cap-gb"), "{e}");
        let e = refused("--model-path m --reasoning-parser deepseek-r1");
        assert!(e.contains("deepseek-r1") && e.contains("qwen3"), "{e}");
        let e = refused("--model-path m --tool-call-parser mistral");
        assert!(e.contains("mistral") && e.contains("hermes"), "{e}");
        let e = refused("--model-path m --attention-backend flashinfer-xl");
        assert!(e.contains("flashinfer-xl"), "{e}");
        let e = refused("--model-path m --dp-size 0");
        assert!(e.contains("--dp-size must be at least 1"), "{e}");
        let e = refused("--model-path m --watchdog-timeout 0");
        assert!(e.contains("--watchdog-timeout"), "{e}");
        let e = refused("--model-path m --max-mamba-cache-size 8 --mamba-full-memory-ratio 0.5");
        assert!(
            e.contains("--max-mamba-cache-size 8") && e.contains("--mamba-full-memory-ratio"),
            "{e}"
        );
        let e = refused("--model-path m --mem-fraction-static 1.5");
        assert!(e.contains("--mem-fraction-static"), "{e}");
        let e = refused("--model-path m --context-length 4096 --max-total-tokens 1024");
        assert!(e.contains("4096") && e.contains("1024"), "{e}");
        let e = refused("--model-path m --chunked-prefill-size 0");
        assert!(e.contains("--chunked-prefill-size"), "{e}");
        let e = refused("--model-path m --max-running-requests 0");
        assert!(e.contains("--max-running-requests"), "{e}");
    }

    #[test]
    fn request_timeout_and_connection_limit() {
        let args = parse("--model-path m");
        assert_eq!(args.request_timeout(), Some(Duration::from_secs(600)));
        assert_eq!(args.max_concurrent_connections, 1024);
        let config = args.server_config();
        assert_eq!(
            (config.request_timeout, config.max_connections),
            (Some(Duration::from_secs(600)), 1024)
        );
        let args = parse("--model-path m --request-timeout 0 --max-concurrent-connections 8");
        assert!(args.validate().is_ok());
        assert_eq!(args.request_timeout(), None);
        let config = args.server_config();
        assert_eq!((config.request_timeout, config.max_connections), (None, 8));
        let e = refused("--model-path m --max-concurrent-connections 0");
        assert!(e.contains("--max-concurrent-connections"), "{e}");
    }

    #[test]
    fn chunked_prefill_minus_one_is_off() {
        let args = parse("--model-path m --chunked-prefill-size -1");
        assert!(args.validate().is_ok());
        assert_eq!(args.chunked_prefill_tokens(), None);
        assert_eq!(
            parse("--model-path m --chunked-prefill-size 512").chunked_prefill_tokens(),
            Some(512)
        );
    }

    #[test]
    fn security_flags_and_limits() {
        let args = parse("--model-path m");
        assert_eq!(args.api_key, None);
        assert!(!args.metrics_no_auth);
        assert_eq!(args.request_limits(), RequestLimits::default());
        let args = parse(
            "--model-path m --api-key sk-123 --metrics-no-auth --max-messages 8 --max-prompt-tokens 100 \
             --max-tokens-cap 50 --max-n 2 --max-top-logprobs 5 --max-stop-strings 3",
        );
        assert!(args.validate().is_ok());
        assert_eq!(args.api_key, Some(ApiKey::new("sk-123")));
        assert!(
            !format!("{args:?}").contains("sk-123"),
            "Debug must redact the key"
        );
        let config = args.server_config();
        assert!(
            !format!("{config:?}").contains("sk-123"),
            "Debug must redact the key"
        );
        assert!(config.metrics_no_auth);
        assert_eq!(
            config.limits,
            RequestLimits {
                max_messages: 8,
                max_prompt_tokens: Some(100),
                max_tokens_cap: 50,
                max_n: 2,
                max_top_logprobs: 5,
                max_stop_strings: 3,
            }
        );
        let e = refused("--model-path m --max-n 0");
        assert!(e.contains("--max-n"), "{e}");
        let argv = ["serve", "--model-path", "m", "--api-key", ""];
        let e = Cli::try_parse_from(argv)
            .unwrap()
            .serve
            .validate()
            .unwrap_err()
            .0;
        assert!(e.contains("--api-key"), "{e}");
    }

    #[test]
    fn unknown_enum_values_fail_at_parse() {
        let argv = ["serve", "--model-path", "m", "--load-format", "gguf"];
        assert!(Cli::try_parse_from(argv).is_err());
        let argv = ["serve", "--model-path", "m", "--mamba-ssm-dtype", "float16"];
        assert!(Cli::try_parse_from(argv).is_err());
    }
}
