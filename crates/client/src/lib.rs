//! Clients of any OpenAI-compatible server (deltaserve, SGLang, vLLM, llama.cpp): the `smoke`
//! correctness suite, the `bench serve` load generator, and the small HTTP/1.1 client they share. Only
//! HTTP connects them to a server; nothing here knows the engine or the server crate.

mod bench_report;
pub mod bench_serve;
pub mod http_client;
pub mod smoke;
mod smoke_checks;
mod smoke_report;

pub use bench_serve::{
    run_bench_serve, run_bench_serve_blocking, BenchEndpoint, BenchServeConfig, BenchServeError,
    BenchServeReport,
};
pub use smoke::{run_smoke, run_smoke_blocking, SmokeConfig, SmokeError, SmokeReport};
