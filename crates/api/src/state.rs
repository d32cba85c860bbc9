//! What every route handler shares: the engine (attached once loading is done), the tokenizer and its
//! compiled chat templates, server settings, the degeneration detector every output is watched with,
//! the health monitor and the metrics. Construction only; the routes decide what to do with it.

use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deltaserve_engine::SharedEngine;
use deltaserve_grammar::GrammarCompiler;
use deltaserve_health::DegenerationDetector;
use deltaserve_text::ToolCallFormat;
use deltaserve_text::{ChatTemplate, TemplateError, Tokenizer};

use crate::auth::ApiKey;
use crate::error::ApiError;
use crate::health::HealthMonitor;
use crate::limits::RequestLimits;
use crate::metrics::HttpMetrics;
use crate::output_watch::DegenerationAction;
use crate::output_watch::WatchSpec;
use crate::server_seed::SeedSequence;
use crate::worker_info::{EngineCapacity, ModelIdentity};

/// Produces the engine's Prometheus text for /metrics.
pub type MetricsSource = Arc<dyn Fn() -> String + Send + Sync>;

/// Server settings that come from the flags (or from tests). `Debug` redacts the API key.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// The name in /v1/models; requests naming another model get 404.
    pub model_name: String,
    /// Other names requests may use (`--served-model-name NAME ALIAS...`).
    pub model_aliases: Vec<String>,
    /// `--reasoning-parser qwen3`: split output into reasoning_content and content.
    pub reasoning_parser: bool,
    /// Parse tool calls out of output (on for every served model).
    pub tool_call_parser: bool,
    /// `--tool-call-parser`: the tool-call syntax (`None`: the one the chat template writes).
    pub tool_call_format: Option<ToolCallFormat>,
    /// `--enable-metrics`: serve /metrics.
    pub enable_metrics: bool,
    /// /health runs a probe generation when none succeeded within this interval.
    pub health_interval: Duration,
    /// How long /health waits for its probe generation.
    pub health_probe_timeout: Duration,
    /// `--max-body-bytes`: largest request body accepted (413 above).
    pub max_body_bytes: usize,
    /// On shutdown, how long in-flight requests may take to finish.
    pub grace_period: Duration,
    /// `--degeneration-action`: what happens when an output degenerates.
    pub degeneration_action: DegenerationAction,
    /// Thresholds of the degeneration detector watching every output.
    pub degeneration: deltaserve_health::Config,
    /// `--api-key` / `DELTASERVE_API_KEY`: when set, every route but /health needs
    /// `Authorization: Bearer KEY`.
    pub api_key: Option<ApiKey>,
    /// `--metrics-no-auth`: /metrics answers without the API key.
    pub metrics_no_auth: bool,
    /// `--max-messages`, `--max-prompt-tokens`, `--max-tokens-cap`, `--max-n`, `--max-top-logprobs`,
    /// `--max-stop-strings`.
    pub limits: RequestLimits,
    /// `--request-timeout`: wall-clock limit of a generation request (`None`: no limit).
    pub request_timeout: Option<Duration>,
    /// `--max-concurrent-connections`: open connections beyond this wait to be accepted (0 counts as 1).
    pub max_connections: usize,
    /// `--random-seed`: requests without a `seed` get seeds derived from it (`None`: fresh seeds).
    pub random_seed: Option<u64>,
    /// `--default-chat-template-kwargs`: template variables under every chat request's own.
    pub default_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// Tensor-parallel ranks the model runs on (`/server_info`'s `tp_size`).
    pub tp_size: usize,
    /// Data-parallel engine replicas (`--dp-size`; `/server_info`'s `dp_size`).
    pub dp_size: usize,
}

/// Default request body limit: generous for long prompts, small enough to refuse abuse.
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// Default `--request-timeout` in seconds: long enough for a full 32k-token answer on a slow backend.
pub const DEFAULT_REQUEST_TIMEOUT_SECS: u64 = 600;
/// Default `--max-concurrent-connections`: far above the engine's batch; each connection holds a file
/// descriptor, so `ulimit -n` must leave room for this many.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

impl ServerConfig {
    /// Defaults for a model name, everything optional switched on (tests and embedding).
    pub fn new(model_name: impl Into<String>) -> Self {
        Self {
            model_name: model_name.into(),
            model_aliases: Vec::new(),
            reasoning_parser: true,
            tool_call_parser: true,
            tool_call_format: None,
            enable_metrics: true,
            health_interval: Duration::from_secs(30),
            health_probe_timeout: Duration::from_secs(60),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            grace_period: Duration::from_secs(30),
            degeneration_action: DegenerationAction::Log,
            degeneration: deltaserve_health::Config::default(),
            api_key: None,
            metrics_no_auth: false,
            limits: RequestLimits::default(),
            request_timeout: Some(Duration::from_secs(DEFAULT_REQUEST_TIMEOUT_SECS)),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            random_seed: None,
            default_template_kwargs: serde_json::Map::new(),
            tp_size: 1,
            dp_size: 1,
        }
    }
}

/// The chat templates compiled once at start-up: one without and one with tools (they may differ).
#[derive(Debug, Clone)]
struct Templates {
    plain: Result<ChatTemplate, TemplateError>,
    with_tools: Result<ChatTemplate, TemplateError>,
}

/// Shared state of the HTTP server.
pub struct AppState {
    pub config: ServerConfig,
    pub tokenizer: Arc<Tokenizer>,
    pub health: HealthMonitor,
    pub metrics: HttpMetrics,
    engine: RwLock<Option<SharedEngine>>,
    engine_metrics: RwLock<Option<MetricsSource>>,
    templates: Templates,
    /// A fresh detector built from `config.degeneration`, cloned for every choice (its buffers are
    /// allocated once here); `None` when that configuration is invalid (logged at start-up).
    detector: Option<DegenerationDetector>,
    /// Unix time of start-up, reported as `created` by /v1/models.
    pub created: u64,
    /// Set to true when the shutdown grace period runs out: every running choice then ends with an
    /// error event (streams) or error response instead of a cut connection.
    pub shutdown_cut: tokio::sync::watch::Sender<bool>,
    /// Seeds of requests that bring none, with `--random-seed`.
    default_seeds: Option<SeedSequence>,
    /// What /model_info and /server_info report; the model name until set.
    model_identity: RwLock<ModelIdentity>,
    /// The engine's limits for /server_info and /get_load, once the pools are planned.
    engine_capacity: RwLock<Option<EngineCapacity>>,
    /// The vocabulary as the grammar engine sees it, built on the first constrained request.
    grammar: OnceLock<Result<Arc<GrammarCompiler>, String>>,
}

impl AppState {
    /// State of a server whose engine is still loading (/health answers 503 until `attach_engine` and
    /// a successful generation).
    pub fn new(config: ServerConfig, tokenizer: Arc<Tokenizer>) -> Self {
        let templates = Templates {
            plain: ChatTemplate::from_tokenizer(&tokenizer, false),
            with_tools: ChatTemplate::from_tokenizer(&tokenizer, true),
        };
        let health = HealthMonitor::new(config.health_interval, config.health_probe_timeout);
        let default_seeds = config.random_seed.map(SeedSequence::new);
        let model_identity = ModelIdentity {
            model_path: config.model_name.clone(),
            tokenizer_path: config.model_name.clone(),
            ..ModelIdentity::default()
        };
        let detector = match DegenerationDetector::new(config.degeneration.clone()) {
            Ok(detector) => Some(detector),
            Err(error) => {
                eprintln!("WARNING outputs are not watched for degeneration: {error}");
                None
            }
        };
        Self {
            config,
            tokenizer,
            health,
            metrics: HttpMetrics::default(),
            engine: RwLock::new(None),
            engine_metrics: RwLock::new(None),
            templates,
            detector,
            shutdown_cut: tokio::sync::watch::channel(false).0,
            default_seeds,
            model_identity: RwLock::new(model_identity),
            engine_capacity: RwLock::new(None),
            grammar: OnceLock::new(),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        }
    }

    /// Makes the engine available to requests. Health stays as it is: the caller marks it ready.
    pub fn attach_engine(&self, engine: SharedEngine) {
        *self.engine.write().unwrap_or_else(|p| p.into_inner()) = Some(engine);
    }

    /// Sets the source of the engine's Prometheus text.
    pub fn set_engine_metrics(&self, source: MetricsSource) {
        *self
            .engine_metrics
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(source);
    }

    /// Sets what /model_info and /server_info say the model is.
    pub fn set_model_identity(&self, identity: ModelIdentity) {
        *self
            .model_identity
            .write()
            .unwrap_or_else(|p| p.into_inner()) = identity;
    }

    pub fn model_identity(&self) -> ModelIdentity {
        self.model_identity
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Sets the engine's limits reported by /server_info and /get_load.
    pub fn set_engine_capacity(&self, capacity: EngineCapacity) {
        *self
            .engine_capacity
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(capacity);
    }

    pub fn engine_capacity(&self) -> Option<EngineCapacity> {
        *self
            .engine_capacity
            .read()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The engine, or 503 while the model is loading.
    pub fn engine(&self) -> Result<SharedEngine, ApiError> {
        self.engine
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| ApiError::unavailable("The model is still loading; retry shortly"))
    }

    /// The engine's metrics text, empty when no source is set.
    pub fn engine_metrics_text(&self) -> String {
        let source = self
            .engine_metrics
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        source.map(|f| f()).unwrap_or_default()
    }

    /// How a choice's output is watched for degeneration; `starts_in_reasoning` when the prompt
    /// opens a think block.
    pub fn watch_spec(&self, starts_in_reasoning: bool) -> Option<WatchSpec> {
        self.detector.as_ref().map(|detector| WatchSpec {
            detector: detector.clone(),
            action: self.config.degeneration_action,
            starts_in_reasoning,
        })
    }

    /// Whether requests may name the model `name`.
    pub fn serves_model(&self, name: &str) -> bool {
        name == self.config.model_name || self.config.model_aliases.iter().any(|a| a == name)
    }

    /// The seed for a choice whose request brought none: derived from `--random-seed`, or `None`
    /// (the engine then picks a fresh one).
    pub fn default_seed(&self) -> Option<u64> {
        self.default_seeds.as_ref().map(SeedSequence::next_seed)
    }

    /// The grammar compiler for this model (logit rows of `vocab_size`), built once.
    pub fn grammar_compiler(&self, vocab_size: usize) -> Result<Arc<GrammarCompiler>, ApiError> {
        self.grammar
            .get_or_init(|| {
                let vocab = vocab_size.max(self.tokenizer.vocab_size());
                GrammarCompiler::new(Arc::clone(&self.tokenizer), vocab)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|e| ApiError::internal(format!("constrained decoding is unavailable: {e}")))
    }

    /// The tool-call syntax outputs are parsed (and forced calls constrained) in: the one
    /// `--tool-call-parser` names, else the one the model's template writes (Qwen3-Coder XML when it
    /// writes `<function=`, JSON in `<tool_call>` when it writes `<tool_call>` without it).
    pub fn tool_call_format(&self) -> ToolCallFormat {
        self.config.tool_call_format.unwrap_or_else(|| {
            ToolCallFormat::from_template(
                self.tokenizer.chat_template_for(true).unwrap_or_default(),
            )
        })
    }

    /// The chat template for a request with or without tools.
    pub fn chat_template(&self, with_tools: bool) -> Result<&ChatTemplate, ApiError> {
        let template = if with_tools {
            &self.templates.with_tools
        } else {
            &self.templates.plain
        };
        template.as_ref().map_err(|e| match e {
            TemplateError::Missing => ApiError::bad_request(format!(
                "{e}; this model can only be used through /v1/completions"
            )),
            other => ApiError::internal(format!("the model's chat template is unusable: {other}")),
        })
    }
}
