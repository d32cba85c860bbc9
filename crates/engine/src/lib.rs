//! The engine room: requests and sequences, the hybrid cache pools (paged KV blocks + GDN state
//! slots), the continuous-batching scheduler with chunked prefill and preemption, the sampler and the
//! metrics. It runs on its own thread and talks to the outside only through `EngineHandle`.

pub mod api;
mod commit;
mod device_sampling;
pub mod drafting;
pub mod engine;
mod host_gap;
pub mod metrics;
pub mod pool_plan;
pub mod pools;
pub mod prefix_cache;
pub mod replicas;
pub mod rng;
pub mod sampler;
pub mod scheduler;
pub mod sequence;
pub mod speculative;

pub use api::*;
pub use device_sampling::row_sampling;
pub use engine::{EngineConfig, LocalEngine};
pub use prefix_cache::PrefixCacheConfig;
pub use replicas::ReplicaSet;
pub use speculative::{DraftFault, DraftScript, SpecConfig};
