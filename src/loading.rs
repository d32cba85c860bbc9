//! Turns the model flags shared by every subcommand (`--model-path`, `--load-format`, `--backend`,
//! `--threads`) into a loaded `Model` on the chosen backend, with a progress bar while weights load.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use deltaserve_model::config::ModelConfig;
use deltaserve_model::dummy::DummySource;
use deltaserve_model::safetensors::SafetensorsSource;
use deltaserve_model::source::TensorSource;
use deltaserve_model::weights::Weights;
use deltaserve_model::Model;
use deltaserve_tensor::cpu::CpuBackend;
use deltaserve_tensor::reference::ReferenceBackend;
use deltaserve_tensor::{Backend, DType};
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// Plain scalar code that mirrors the spec; slow, the yardstick.
    Reference,
    /// The fast CPU backend (threads, SIMD).
    Cpu,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LoadFormat {
    /// Safetensors weights from the model directory.
    Auto,
    /// Deterministic random weights of the right shapes, from config.json alone.
    Dummy,
}

#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Directory holding config.json and the safetensors weights (Hugging Face layout).
    #[arg(long = "model-path", alias = "model")]
    pub model_path: PathBuf,
    #[arg(long, value_enum, default_value_t = BackendKind::Cpu)]
    pub backend: BackendKind,
    #[arg(long = "load-format", value_enum, default_value_t = LoadFormat::Auto)]
    pub load_format: LoadFormat,
    /// CPU threads for the cpu backend (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// A model on whichever backend the flags chose.
pub enum AnyModel {
    Reference(Model<ReferenceBackend>),
    Cpu(Model<CpuBackend>),
}

/// Runs `$body` with `$m` bound to the concrete `Model<B>`.
macro_rules! with_model {
    ($any:expr, $m:ident => $body:expr) => {
        match $any {
            $crate::loading::AnyModel::Reference($m) => $body,
            $crate::loading::AnyModel::Cpu($m) => $body,
        }
    };
}
pub(crate) use with_model;

pub fn load_model(args: &ModelArgs) -> Result<AnyModel> {
    let dir = &args.model_path;
    if !dir.is_dir() {
        bail!("--model-path {}: not a directory", dir.display());
    }
    let config = ModelConfig::from_dir(dir)?;
    let source: Box<dyn TensorSource> = match args.load_format {
        LoadFormat::Auto => Box::new(SafetensorsSource::open(dir)?),
        LoadFormat::Dummy => Box::new(DummySource::new(config.dtype.unwrap_or(DType::BF16), 0)),
    };
    Ok(match args.backend {
        BackendKind::Reference => AnyModel::Reference(build(ReferenceBackend, config, source.as_ref(), dir)?),
        BackendKind::Cpu => AnyModel::Cpu(build(CpuBackend::new(args.threads), config, source.as_ref(), dir)?),
    })
}

fn build<B: Backend>(backend: B, config: ModelConfig, source: &dyn TensorSource, dir: &Path) -> Result<Model<B>> {
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template("loading weights [{bar:40}] {pos}/{len} tensors {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let weights = Weights::load(&backend, &config, source, true, &mut |done, total| {
        bar.set_length(total.max(done) as u64);
        bar.set_position(done as u64);
    })
    .with_context(|| format!("loading the model in {}", dir.display()))?;
    bar.finish_and_clear();
    Ok(Model::new(config, backend, weights))
}
