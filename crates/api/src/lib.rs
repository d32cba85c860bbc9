//! The OpenAI-compatible HTTP server of deltaserve: routes, request validation, SSE streaming, error
//! objects, /health and /metrics, the degeneration watch on every output. It talks to the engine only
//! through `EngineHandle` and to text only through deltaserve-text; it never touches tensors. The
//! clients that drive a server from outside (`smoke`, `bench serve`) live in deltaserve-client.

pub mod args;
pub mod auth;
mod chat;
mod chat_output;
pub mod chat_template_flag;
mod choices;
mod common;
pub mod compat;
pub mod compat_argv;
mod completions;
pub mod diagnosis;
pub mod error;
mod fields;
pub mod flag_values;
pub mod foreign_flags;
pub mod generation;
pub mod health;
pub mod limits;
pub mod metrics;
pub mod output_watch;
pub mod request;
mod response;
mod responses;
mod routes;
pub mod server;
mod server_seed;
pub mod spec_counters;
pub mod speculative_config;
mod sse;
pub mod state;
pub mod stop;
mod token_bytes;
pub mod worker_info;

pub use args::{
    ArgsError, BackendKind, CpuMatmulPrecision, DegenerationAction, LoadFormat, MambaSsmDtype,
    ServeArgs, SpeculativeConfig,
};
pub use auth::ApiKey;
pub use compat::CompatNote;
pub use error::ApiError;
pub use flag_values::{KvCacheDtype, LogLevel, ModelDtype, SchedulePolicy};
pub use health::{HealthMonitor, HealthReport, HealthStatus};
pub use limits::RequestLimits;
pub use output_watch::DegenerationReport;
pub use routes::router;
pub use server::{bind, serve, serve_until, termination_signal, ServeError, Shutdown};
pub use state::{AppState, MetricsSource, ServerConfig};
pub use worker_info::{EngineCapacity, ModelIdentity};
