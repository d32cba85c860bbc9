//! Numbers and the ops the model needs: dtypes, host tensors, the `Backend` trait, the cache pools a
//! backend owns, and the two CPU backends (`reference`, the yardstick, and `cpu`, the fast one).
//! Nothing here knows about checkpoints, configs or requests.

pub mod backend;
pub mod batch;
pub mod block_fp8_matrix;
pub mod cache;
pub mod comm;
pub mod cpu;
pub mod device;
pub mod device_sampling;
pub mod diagnostic;
pub mod dtype;
pub mod e4m3;
pub mod forwarding;
pub mod generated;
pub mod host;
pub mod kv_dtype;
pub mod moe;
pub mod op_check;
pub mod op_profile;
pub mod reference;
pub mod step_graph;

pub use backend::{AttnShape, Backend, GdnGateInputs, GdnShape, RouteChoice};
pub use batch::{BatchLayout, SeqLayout};
pub use block_fp8_matrix::BlockFp8Matrix;
pub use cache::{kv_offset, KvLayerPool, StateLayerPool};
pub use comm::{Communicator, InProcessGroup};
pub use cpu::CpuBackend;
pub use device::Device;
pub use device_sampling::RowSampling;
pub use dtype::DType;
pub use generated::GeneratedMatrix;
pub use host::{ByteOwner, HostTensor, TensorError};
pub use kv_dtype::KvDtype;
pub use moe::{ExpertShape, ExpertTensors, ExpertWeights, Experts, MoeRouting, SharedExpert};
pub use op_profile::OpTiming;
pub use step_graph::{StepGraph, StepInputs};
