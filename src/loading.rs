//! Turns the model settings (built from the model flags of model_flags.rs) into a loaded `Model` on
//! the chosen backend, with a progress bar while weights load.

use crate::kv_cache_dtype::{resolve_kv_cache_dtype, KvCacheChoice};
use crate::model_flags::{BackendKind, LoadFormat, Quantization};
use crate::serve_flags::flag_values::KvCacheDtype;
use crate::weight_format::fp8_scheme_at_load;
use anyhow::{bail, Context, Result};
use deltaserve_cuda::{CudaBackend, CudaOptions, GemmPrecision, NcclCommunicator};
use deltaserve_model::config::ModelConfig;
use deltaserve_model::draft_fp8::DraftFp8Source;
use deltaserve_model::draft_vocab::{limit_draft_head, read_token_map};
use deltaserve_model::dummy::DummySource;
use deltaserve_model::online_fp8::Fp8QuantizingSource;
use deltaserve_model::quantization::Fp8Quantization;
use deltaserve_model::safetensors::SafetensorsSource;
use deltaserve_model::source::TensorSource;
use deltaserve_model::weights::Weights;
use deltaserve_model::{load_tensor_parallel, rank_config, Model};
use deltaserve_tensor::cpu::{CpuBackend, CpuOptions, IsaLevel, MatmulPrecision, CPU_LEVEL_ENV};
use deltaserve_tensor::diagnostic::BrokenAttention;
use deltaserve_tensor::reference::ReferenceBackend;
use deltaserve_tensor::{Backend, Communicator, DType, InProcessGroup};
use std::path::{Path, PathBuf};

/// What to load and on what: built from the model flags (`ModelFlags::settings`), adjusted per
/// data-parallel replica by `serve`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSettings {
    /// The model directory (`demo` until `resolved`).
    pub model_path: PathBuf,
    /// `Auto` until `resolved`.
    pub backend: BackendKind,
    pub load_format: LoadFormat,
    pub quantization: Option<Quantization>,
    /// `--speculative-draft-model-quantization`: the MTP head's format (crate::draft_fp8).
    pub draft_quantization: Option<Quantization>,
    /// `--speculative-token-map`: the token ids the draft head keeps (crate::draft_vocab).
    pub draft_token_map: Option<PathBuf>,
    /// CPU threads of the cpu backend; 0 = all cores.
    pub threads: usize,
    pub cpu_matmul_precision: MatmulPrecision,
    pub cuda_gemm_precision: GemmPrecision,
    /// `--kv-cache-dtype` as given (`kv_cache_choice` resolves it for a backend).
    pub kv_cache_dtype: KvCacheDtype,
    /// Largest decode batch recorded as a CUDA graph; `None`: no CUDA graphs.
    pub cuda_graph_max_bs: Option<usize>,
    pub attention: Attention,
    pub tp_size: usize,
    /// With `tp_size` 1, run through the tensor-parallel path anyway (a one-rank group).
    pub tp_force_communicator: bool,
    /// The first GPU this model takes (cuda): data-parallel replica i of `serve --dp-size` starts
    /// at GPU i x tp_size.
    pub first_gpu: usize,
}

/// The attention implementation: the backend's own, or the diagnostic broken one (cpu only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attention {
    Native,
    /// Wraps the cpu backend and computes attention wrongly on purpose (docs: the founding failure).
    DiagnosticBroken,
}

/// A model on whichever backend the flags chose. Made once per process, so the size difference
/// between variants costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum AnyModel {
    Reference(Model<ReferenceBackend>),
    Cpu(Model<CpuBackend>),
    /// The diagnostic broken-attention wrapper around the cpu backend.
    BrokenCpu(Model<BrokenAttention<CpuBackend>>),
    Cuda(Model<CudaBackend>),
}

impl AnyModel {
    /// The cpu backend's kernel level (e.g. `avx2`, `avx512+bf16`); `None` for other backends.
    pub fn cpu_kernels(&self) -> Option<String> {
        let cpu = match self {
            AnyModel::Cpu(m) => &m.backend,
            AnyModel::BrokenCpu(m) => &m.backend.inner,
            AnyModel::Reference(_) | AnyModel::Cuda(_) => return None,
        };
        Some(cpu.isa().to_string())
    }
}

/// Runs `$body` with `$m` bound to the concrete `Model<B>`.
macro_rules! with_model {
    ($any:expr, $m:ident => $body:expr) => {
        match $any {
            $crate::loading::AnyModel::Reference($m) => $body,
            $crate::loading::AnyModel::Cpu($m) => $body,
            $crate::loading::AnyModel::BrokenCpu($m) => $body,
            $crate::loading::AnyModel::Cuda($m) => $body,
        }
    };
}
pub(crate) use with_model;

/// The model's config and a source of its weights, as the flags say.
pub fn open_source(args: &ModelSettings) -> Result<(ModelConfig, Box<dyn TensorSource>)> {
    let dir = &args.model_path;
    if !dir.is_dir() {
        bail!("--model-path {}: not a directory", dir.display());
    }
    let mut config = ModelConfig::from_dir(dir)?;
    let source: Box<dyn TensorSource> = match args.load_format {
        LoadFormat::Auto => Box::new(SafetensorsSource::open(dir)?),
        LoadFormat::Dummy => Box::new(
            DummySource::new(config.dtype.unwrap_or(DType::BF16), 0)
                .with_tied_embeddings(config.tie_word_embeddings),
        ),
    };
    let scheme = fp8_scheme_at_load(
        args.load_format,
        config.quantization.as_ref(),
        args.quantization,
    );
    let source = match scheme {
        Some(scheme) => Box::new(Fp8QuantizingSource::new(source, scheme)),
        None => source,
    };
    if args.draft_quantization.is_some() && config.mtp_num_hidden_layers == 0 {
        bail!(
            "--speculative-draft-model-quantization: {} has no MTP head (mtp_num_hidden_layers is \
             0 in config.json), so there is no draft model to quantize",
            dir.display()
        );
    }
    let source = match &args.draft_token_map {
        Some(path) => {
            let ids = draft_token_ids(args, &config, path)?;
            Box::new(limit_draft_head(&mut config, source, ids)) as Box<dyn TensorSource>
        }
        None => source,
    };
    let source = match args.draft_quantization {
        Some(Quantization::Fp8) => {
            let scheme = config
                .quantization
                .clone()
                .unwrap_or_else(Fp8Quantization::qwen_default);
            let tied = config.tie_word_embeddings;
            Box::new(DraftFp8Source::new(source, scheme, tied)) as Box<dyn TensorSource>
        }
        None => source,
    };
    Ok((config, source))
}

/// The token map's ids, checked against the model and the tensor-parallel split.
fn draft_token_ids(args: &ModelSettings, config: &ModelConfig, path: &Path) -> Result<Vec<u32>> {
    if config.mtp_num_hidden_layers == 0 {
        bail!(
            "--speculative-token-map: {} has no MTP head (mtp_num_hidden_layers is 0 in \
             config.json), so there is no draft model whose head it could limit",
            args.model_path.display()
        );
    }
    let ids = read_token_map(path, config.vocab_size)?;
    if !ids.len().is_multiple_of(args.tp_size.max(1)) {
        bail!(
            "--speculative-token-map {}: {} token ids do not split evenly over --tp-size {} \
             (the draft head's rows are divided among the ranks); list a multiple of {}",
            path.display(),
            ids.len(),
            args.tp_size,
            args.tp_size
        );
    }
    Ok(ids)
}

impl ModelSettings {
    /// The KV cache dtype for these settings on `backend` (resolved from `auto`), and why.
    pub fn kv_cache_choice(&self, backend: BackendKind) -> Result<KvCacheChoice> {
        resolve_kv_cache_dtype(self.kv_cache_dtype, backend, self.cuda_gemm_precision)
    }

    /// Replaces `demo` by the bundled demo model's directory and `--backend auto` by the backend
    /// it picks.
    pub fn resolved(mut self) -> Result<Self> {
        self.model_path = crate::demo_model::resolve_model_path("--model-path", &self.model_path)?;
        self.backend = resolve_backend(self.backend, self.attention);
        Ok(self)
    }
}

/// `auto`: cuda when a usable GPU is present (said on stderr, with the reason when not), else cpu.
/// The diagnostic broken attention wraps the cpu backend, so it always means cpu.
pub fn resolve_backend(kind: BackendKind, attention: Attention) -> BackendKind {
    if kind != BackendKind::Auto {
        return kind;
    }
    if attention == Attention::DiagnosticBroken {
        return BackendKind::Cpu;
    }
    match deltaserve_cuda::usable_gpu() {
        Ok(name) => {
            eprintln!("backend auto: cuda ({name})");
            BackendKind::Cuda
        }
        Err(why) => {
            eprintln!("backend auto: cpu (no usable GPU: {why})");
            BackendKind::Cpu
        }
    }
}

pub fn load_model(args: &ModelSettings) -> Result<AnyModel> {
    let broken = args.attention == Attention::DiagnosticBroken;
    let backend = resolve_backend(args.backend, args.attention);
    // Refused before any weight is read.
    let kv = args.kv_cache_choice(backend)?;
    let (config, source) = open_source(args)?;
    let dir = &args.model_path;
    if args.tp_size == 0 {
        bail!("--tp-size must be at least 1, found 0");
    }
    if args.tp_size != 1 || args.tp_force_communicator {
        return load_split(args, broken, backend, &kv, config, source.as_ref());
    }
    Ok(match backend {
        BackendKind::Auto => unreachable!("resolve_backend always picks a concrete backend"),
        BackendKind::Reference => {
            AnyModel::Reference(build(ReferenceBackend, config, source.as_ref(), dir)?)
        }
        BackendKind::Cpu if broken => AnyModel::BrokenCpu(build(
            BrokenAttention {
                inner: cpu_backend(args)?,
            },
            config,
            source.as_ref(),
            dir,
        )?),
        BackendKind::Cpu => AnyModel::Cpu(build(cpu_backend(args)?, config, source.as_ref(), dir)?),
        BackendKind::Cuda => {
            let options = cuda_options(args, &kv);
            let gpu = args.first_gpu;
            let backend = CudaBackend::with_options(gpu, options)
                .map_err(|e| anyhow::anyhow!("--backend cuda, GPU {gpu}: {e}"))?;
            eprintln!(
                "cuda: GPU {gpu}: {} (compute capability {:?}); KV cache {kv}",
                backend.device_name(),
                backend.compute_capability()
            );
            let model = build(backend, config, source.as_ref(), dir)?;
            if let Some(max_batch) = args.cuda_graph_max_bs {
                model.enable_step_graphs(max_batch);
            }
            AnyModel::Cuda(model)
        }
    })
}

/// `--tp-size N` (N > 1, or 1 with --tp-force-communicator): N ranks, each with its own backend,
/// in one process.
fn load_split(
    args: &ModelSettings,
    broken: bool,
    backend: BackendKind,
    kv: &KvCacheChoice,
    config: ModelConfig,
    source: &dyn TensorSource,
) -> Result<AnyModel> {
    let n = args.tp_size;
    let dir = &args.model_path;
    // Refuse a split that does not divide before touching any device.
    rank_config(&config, n).with_context(|| format!("splitting the model in {}", dir.display()))?;
    Ok(match backend {
        BackendKind::Auto => unreachable!("resolve_backend always picks a concrete backend"),
        BackendKind::Reference => AnyModel::Reference(build_split(
            (0..n).map(|_| ReferenceBackend).collect(),
            in_process(n),
            &config,
            source,
            dir,
        )?),
        BackendKind::Cpu if broken => AnyModel::BrokenCpu(build_split(
            (0..n)
                .map(|_| {
                    Ok(BrokenAttention {
                        inner: cpu_rank_backend(args)?,
                    })
                })
                .collect::<Result<_>>()?,
            in_process(n),
            &config,
            source,
            dir,
        )?),
        BackendKind::Cpu => AnyModel::Cpu(build_split(
            (0..n)
                .map(|_| cpu_rank_backend(args))
                .collect::<Result<_>>()?,
            in_process(n),
            &config,
            source,
            dir,
        )?),
        BackendKind::Cuda => {
            let options = cuda_options(args, kv);
            let gpus =
                deltaserve_cuda::gpu_count().map_err(|e| anyhow::anyhow!("--backend cuda: {e}"))?;
            let first = args.first_gpu;
            if gpus < first + n {
                bail!(
                        "--tp-size {n} needs {n} GPUs, one per rank, from GPU {first} on; this process sees {gpus}"
                    );
            }
            let backends = (first..first + n)
                .map(|ordinal| {
                    CudaBackend::with_options(ordinal, options.clone())
                        .map_err(|e| anyhow::anyhow!("--backend cuda, GPU {ordinal}: {e}"))
                })
                .collect::<Result<Vec<_>>>()?;
            for (rank, b) in backends.iter().enumerate() {
                let ordinal = first + rank;
                eprintln!(
                    "cuda: rank {rank} on GPU {ordinal}: {} (compute capability {:?}); KV cache {kv}",
                    b.device_name(),
                    b.compute_capability()
                );
            }
            let comms = NcclCommunicator::group(&backends)
                .map_err(|e| anyhow::anyhow!("--tp-size {n}: {e}"))?
                .into_iter()
                .map(|c| Box::new(c) as Box<dyn Communicator<CudaBackend>>)
                .collect();
            // Split steps run plainly (no CUDA graphs: see Model::forward).
            AnyModel::Cuda(build_split(backends, comms, &config, source, dir)?)
        }
    })
}

/// The in-process communicators of an N-rank group.
fn in_process<B: Backend>(n: usize) -> Vec<Box<dyn Communicator<B>>> {
    InProcessGroup::new(n)
        .into_iter()
        .map(|g| Box::new(g) as Box<dyn Communicator<B>>)
        .collect()
}

/// A cpu backend for one of `--tp-size` ranks: `--threads` (all cores when 0) shared among them.
fn cpu_rank_backend(args: &ModelSettings) -> Result<CpuBackend> {
    let total = match args.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        t => t,
    };
    let per_rank = (total / args.tp_size.max(1)).max(1);
    cpu_backend(&ModelSettings {
        threads: per_rank,
        ..args.clone()
    })
}

fn cuda_options(args: &ModelSettings, kv: &KvCacheChoice) -> CudaOptions {
    CudaOptions {
        gemm_precision: args.cuda_gemm_precision,
        kv_dtype: Some(kv.dtype),
        ..CudaOptions::default()
    }
}

fn build_split<B: Backend + 'static>(
    backends: Vec<B>,
    comms: Vec<Box<dyn Communicator<B>>>,
    config: &ModelConfig,
    source: &dyn TensorSource,
    dir: &Path,
) -> Result<Model<B>> {
    let n = backends.len();
    let bar = progress_bar(&format!("loading weights, rank 0 of {n}"));
    let model = load_tensor_parallel(backends, comms, config, source, true, &mut |done, total| {
        bar.set_length(total.max(done) as u64);
        bar.set_position(done as u64);
    })
    .with_context(|| {
        format!(
            "loading the model in {} split over {n} ranks",
            dir.display()
        )
    })?;
    bar.finish_and_clear();
    Ok(model)
}

fn progress_bar(what: &str) -> indicatif::ProgressBar {
    indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{what} [{{bar:40}}] {{pos}}/{{len}} tensors {{elapsed}}"
        ))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    )
}

/// Rank 0's share of the model (`--tp-size N`) on the reference backend, run unsplit: what the
/// op-by-op checks of a split target compare its rank 0 against (same weights, same shapes).
pub fn load_reference_rank0(args: &ModelSettings) -> Result<Model<ReferenceBackend>> {
    let (config, source) = open_source(args)?;
    let mut local = rank_config(&config, args.tp_size)?;
    // The op checks size the embedding lookup and the head by the vocabulary: rank 0's share.
    local.vocab_size /= args.tp_size.max(1);
    let shard = deltaserve_model::Shard {
        rank: 0,
        size: args.tp_size,
    };
    let weights = Weights::load_shard(
        &ReferenceBackend,
        &config,
        source.as_ref(),
        true,
        shard,
        &mut |_, _| {},
    )
    .with_context(|| format!("loading rank 0's share of {}", args.model_path.display()))?;
    Ok(Model::new(local, ReferenceBackend, weights))
}

/// The reference model on the same weights, for comparisons.
pub fn load_reference(args: &ModelSettings) -> Result<Model<ReferenceBackend>> {
    let (config, source) = open_source(args)?;
    build(ReferenceBackend, config, source.as_ref(), &args.model_path)
}

fn cpu_backend(args: &ModelSettings) -> Result<CpuBackend> {
    let max_isa = IsaLevel::from_env()
        .map_err(anyhow::Error::msg)?
        .unwrap_or(IsaLevel::Avx512);
    if !max_isa.supported() {
        eprintln!(
            "{CPU_LEVEL_ENV}={max_isa}: this CPU lacks it; using the best level below ({})",
            deltaserve_tensor::cpu::Isa::at_most(max_isa)
        );
    }
    let options = CpuOptions {
        threads: args.threads,
        matmul_precision: args.cpu_matmul_precision,
        max_isa,
    };
    CpuBackend::with_options(options)
        .map_err(|e| anyhow::anyhow!("--threads {}: {e}", args.threads))
}

pub fn build<B: Backend>(
    backend: B,
    config: ModelConfig,
    source: &dyn TensorSource,
    dir: &Path,
) -> Result<Model<B>> {
    let bar = progress_bar("loading weights");
    let weights = Weights::load(&backend, &config, source, true, &mut |done, total| {
        bar.set_length(total.max(done) as u64);
        bar.set_position(done as u64);
    })
    .with_context(|| format!("loading the model in {}", dir.display()))?;
    bar.finish_and_clear();
    Ok(Model::new(config, backend, weights))
}
