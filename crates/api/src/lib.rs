//! The OpenAI-compatible HTTP server of deltaserve: routes, request validation, SSE streaming, error
//! objects, /health and /metrics, the degeneration watch on every output. It talks to the engine only
//! through `EngineHandle` and to text only through deltaserve-text; it never touches tensors. The
//! clients that drive a server from outside (`smoke`, `bench serve`) live in deltaserve-client.

pub mod auth;
mod chat;
mod chat_output;
mod choices;
mod common;
mod completions;
pub mod diagnosis;
pub mod error;
mod fields;
pub mod generation;
pub mod health;
pub mod limits;
pub mod metrics;
pub mod output_watch;
pub mod request;
mod response;
mod responses;
mod responses_stream;
mod routes;
pub mod server;
mod server_seed;
pub mod spec_counters;
mod sse;
pub mod state;
pub mod stop;
mod token_bytes;
pub mod worker_info;

pub use auth::ApiKey;
pub use error::ApiError;
pub use health::{HealthMonitor, HealthReport, HealthStatus};
pub use limits::RequestLimits;
pub use output_watch::{DegenerationAction, DegenerationReport};
pub use routes::router;
pub use server::{
    bind, device_loss, serve, serve_until, serve_until_stopped_or_lost, termination_signal,
    ServeError, Shutdown,
};
pub use state::{AppState, MetricsSource, ServerConfig};
pub use worker_info::{EngineCapacity, ModelIdentity};
