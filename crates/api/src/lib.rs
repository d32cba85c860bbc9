//! The OpenAI-compatible HTTP side of deltaserve: routes, request validation, SSE streaming, error
//! objects, /health and /metrics, and the `bench serve` load generator. It talks to the engine only
//! through `EngineHandle` and to text only through deltaserve-text; it never touches tensors.

pub mod args;
mod bench_report;
pub mod bench_serve;
mod chat;
mod chat_output;
mod choices;
mod common;
mod completions;
pub mod error;
mod fields;
pub mod generation;
pub mod health;
pub mod metrics;
pub mod request;
mod response;
mod routes;
pub mod server;
mod sse;
pub mod state;
pub mod stop;
mod token_bytes;

pub use args::{ArgsError, BackendKind, LoadFormat, MambaSsmDtype, ServeArgs, SpeculativeConfig};
pub use bench_serve::{
    run_bench_serve, run_bench_serve_blocking, BenchEndpoint, BenchServeArgs, BenchServeError,
    BenchServeReport,
};
pub use error::ApiError;
pub use health::{HealthMonitor, HealthReport, HealthStatus};
pub use routes::router;
pub use server::{bind, serve, serve_until, termination_signal, ServeError, Shutdown};
pub use state::{AppState, MetricsSource, ServerConfig};
