//! `LoadError`: everything that can go wrong while reading a config, a checkpoint or an .npy file,
//! each variant naming the file and the field or tensor involved. Only error types live here; the
//! code that raises them lives in config.rs, safetensors.rs, npy.rs and the weight builder.

use deltaserve_tensor::TensorError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A config.json field is missing, has the wrong JSON type, or is inconsistent with others.
    #[error("{}: field `{field}`: {message}", file.display())]
    Config {
        file: PathBuf,
        field: String,
        message: String,
    },

    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A safetensors file, safetensors index or checkpoint directory is malformed.
    #[error("{}: invalid checkpoint: {message}", file.display())]
    Format { file: PathBuf, message: String },

    /// The checkpoint has no tensor under any of the names the canonical name maps to.
    #[error("tensor `{name}` not found in {looked_in} (tried {})", tried.join(", "))]
    MissingTensor {
        name: String,
        looked_in: String,
        tried: Vec<String>,
    },

    #[error("tensor `{tensor}` in {}: expected shape {expected:?}, found {found:?}", file.display())]
    ShapeMismatch {
        tensor: String,
        file: PathBuf,
        expected: Vec<usize>,
        found: Vec<usize>,
    },

    /// The tensor's bytes lie (partly) outside the file, e.g. a truncated download.
    #[error("tensor `{tensor}` in {}: {message}", file.display())]
    DataOutOfRange {
        tensor: String,
        file: PathBuf,
        message: String,
    },

    #[error(
        "tensor `{tensor}` in {}: dtype {dtype} is not supported (supported: BF16, F16, F32)",
        file.display()
    )]
    UnsupportedDtype {
        tensor: String,
        file: PathBuf,
        dtype: String,
    },

    /// An .npy file is malformed or holds something other than little-endian C-order f4/f8.
    #[error("{}: npy: {message}", file.display())]
    Npy { file: PathBuf, message: String },

    /// The model cannot be split over this many tensor-parallel ranks.
    #[error("--tp-size {tp_size}: config field `{field}` = {value} is not divisible by {tp_size} ({message})")]
    TensorParallel {
        tp_size: usize,
        field: String,
        value: usize,
        message: String,
    },

    /// A tensor-parallel share of a block-FP8 weight would cut its scale blocks.
    #[error(
        "--tp-size {tp_size}: rank {rank}'s share of the block-FP8 weight `{tensor}` {shape:?} is {part}, \
         which cuts its {block:?} scale blocks; a block-FP8 checkpoint splits only at block \
         boundaries, so every rank's share of this width must be a whole number of blocks: use a \
         --tp-size that divides it into multiples of {block:?}, or the bf16 checkpoint"
    )]
    Fp8BlockSplit {
        tp_size: usize,
        rank: usize,
        tensor: String,
        shape: Vec<usize>,
        part: String,
        block: [usize; 2],
    },

    /// A tensor-level error raised while reshaping or slicing loaded weights.
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

impl LoadError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        LoadError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn format(file: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        LoadError::Format {
            file: file.into(),
            message: message.into(),
        }
    }
}
