//! The Qwen3.5 / Qwen3.6 / Qwen3-Next text model: config parsing, checkpoint loading (safetensors,
//! sharded, dummy weights) and the forward pass written once against `deltaserve_tensor::Backend`.
//! Nothing here knows about requests, HTTP or tokenizers.

pub mod block_fp8;
pub mod cache;
pub mod config;
pub mod draft_fp8;
pub mod draft_vocab;
pub mod dummy;
pub mod error;
pub mod forward;
pub mod greedy;
pub mod mtp;
pub mod npy;
pub mod online_fp8;
pub mod quantization;
pub mod safetensors;
pub mod source;
pub mod step_graphs;
pub mod tp;
pub mod weight_bytes;
pub mod weights;

pub use cache::{CacheGeometry, HybridCache};
pub use forward::{ForwardInput, ForwardOutput, LayerObserver, Model};
pub use greedy::argmax;
pub use mtp::{MtpError, MtpInput};
pub use step_graphs::StepGraphCounts;
pub use tp::{load_tensor_parallel, rank_config, Shard};
