//! Numbers and the ops the model needs: dtypes, host tensors, the `Backend` trait, the cache pools a
//! backend owns, and the two CPU backends (`reference`, the yardstick, and `cpu`, the fast one).
//! Nothing here knows about checkpoints, configs or requests.

pub mod backend;
pub mod batch;
pub mod cache;
pub mod cpu;
pub mod diagnostic;
pub mod dtype;
pub mod host;
pub mod reference;

pub use backend::{AttnShape, Backend, GdnShape, RouteChoice};
pub use batch::{BatchLayout, SeqLayout};
pub use cache::{KvLayerPool, StateLayerPool};
pub use cpu::CpuBackend;
pub use dtype::DType;
pub use host::{ByteOwner, HostTensor, TensorError};
