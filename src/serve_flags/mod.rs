//! The flags of `deltaserve serve`, declared here in the binary only: deltaserve's own in SGLang's
//! spelling (args.rs; the model-loading flags every model command shares are model_flags.rs's,
//! flattened in), other servers' spellings of the same settings (compat.rs, compat_argv.rs), SGLang /
//! vLLM flags with no setting here (foreign_flags.rs), and the values they take. Validated flags
//! become the libraries' plain settings (`ServeArgs::server_config`, the engine and pool configs in
//! commands/serve.rs, `ModelSettings` for loading); no library sees clap.

pub mod args;
pub mod chat_template_flag;
pub mod compat;
pub mod compat_argv;
pub mod flag_values;
pub mod foreign_flags;
pub mod speculative_config;

pub use args::{ServeArgs, SpeculativeConfig};
pub use flag_values::ModelDtype;
