//! Turns the model flags shared by every subcommand (`--model-path`, `--load-format`, `--backend`,
//! `--threads`) into a loaded `Model` on the chosen backend, with a progress bar while weights load.

use crate::kv_cache_dtype::{resolve_kv_cache_dtype, KvCacheChoice};
use crate::serve_flags::flag_values::KvCacheDtype;
/// The same backend and load-format choices as `serve` (one definition, with serve's flags).
pub use crate::serve_flags::{
    BackendKind, CpuMatmulPrecision as CpuPrecision, LoadFormat, Quantization,
};
use anyhow::{bail, Context, Result};
use clap::Args;
use deltaserve_cuda::{CudaBackend, CudaOptions, GemmPrecision, NcclCommunicator};
use deltaserve_model::config::ModelConfig;
use deltaserve_model::dummy::DummySource;
use deltaserve_model::online_fp8::Fp8QuantizingSource;
use deltaserve_model::quantization::Fp8Quantization;
use deltaserve_model::safetensors::SafetensorsSource;
use deltaserve_model::source::TensorSource;
use deltaserve_model::weights::Weights;
use deltaserve_model::{load_tensor_parallel, rank_config, Model};
use deltaserve_tensor::cpu::{CpuBackend, CpuOptions, IsaLevel, MatmulPrecision, CPU_LEVEL_ENV};
use deltaserve_tensor::diagnostic::{BrokenAttention, BROKEN_ATTENTION_NAME};
use deltaserve_tensor::reference::ReferenceBackend;
use deltaserve_tensor::{Backend, Communicator, DType, InProcessGroup};
use std::path::{Path, PathBuf};

#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Directory holding config.json and the safetensors weights (Hugging Face layout); `demo` (the
    /// default) is the bundled demo model.
    #[arg(long = "model-path", alias = "model", default_value = crate::demo_model::DEMO_MODEL_NAME)]
    pub model_path: PathBuf,
    /// Compute backend; `auto` picks cuda when a usable NVIDIA GPU is present, else cpu.
    #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
    pub backend: BackendKind,
    #[arg(long = "load-format", value_enum, default_value_t = LoadFormat::Auto)]
    pub load_format: LoadFormat,
    /// `fp8`: quantize an unquantized checkpoint's linear weights to block FP8 (128 x 128 tiles,
    /// scale = amax / 448) at load, as SGLang's flag does; a block-FP8 checkpoint is read as stored
    /// either way. The backends keep the dequantized values (docs/fp8.md).
    #[arg(long, value_enum)]
    pub quantization: Option<Quantization>,
    /// CPU threads for the cpu backend (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// How the cpu backend multiplies by bf16 weights: `f32` (exact widening, agrees with the
    /// reference to ~1e-6) or `bf16` (activations rounded to bf16, AVX512_BF16 dot products: about
    /// twice the prefill throughput, ~1.5e-3 relative error; still batch-invariant).
    #[arg(long = "cpu-matmul-precision", value_enum, default_value_t = CpuPrecision::F32)]
    pub cpu_matmul_precision: CpuPrecision,
    /// How the cuda backend multiplies: `bf16` (weights and activations in bf16, f32 accumulation;
    /// the serving default) or `f32` (f32 weights and pedantic f32 GEMMs: twice the memory, for
    /// checking the backend against transformers without bf16 rounding in the way).
    #[arg(long = "cuda-matmul-precision", value_enum, default_value_t = CpuPrecision::Bf16)]
    pub cuda_matmul_precision: CpuPrecision,
    /// How the KV cache stores K and V: `auto` (the dtype the model runs in: bf16 on cuda with
    /// --cuda-matmul-precision bf16, else fp32), `bf16` (cuda only: half the memory per token) or
    /// `fp32`.
    #[arg(long = "kv-cache-dtype", value_name = "DTYPE", value_parser = KvCacheDtype::parse, default_value = "auto")]
    pub kv_cache_dtype: KvCacheDtype,
    /// Largest decode batch the cuda backend records as a CUDA graph and replays (SGLang's flag).
    #[arg(long = "cuda-graph-max-bs", default_value_t = DEFAULT_CUDA_GRAPH_MAX_BS)]
    pub cuda_graph_max_bs: usize,
    /// Launch every op of every step one by one (no CUDA graphs).
    #[arg(long = "disable-cuda-graph")]
    pub disable_cuda_graph: bool,
    /// Attention implementation. The CPU backends have one (`native`); `diagnostic-broken-attention`
    /// deliberately computes attention wrongly, to show doctor, the canary and the detector at work.
    #[arg(long = "attention-backend", default_value = "native")]
    pub attention_backend: String,
    /// Tensor-parallel ranks: the model split over N GPUs (cuda, NCCL between them) or N
    /// in-process ranks (cpu, reference; --threads is then shared among them).
    #[arg(long = "tp-size", alias = "tensor-parallel-size", default_value_t = 1)]
    pub tp_size: usize,
    /// With --tp-size 1, run through the tensor-parallel path anyway: a one-rank group (NCCL on
    /// cuda) whose collectives change nothing. Checks the communicator's plumbing on one GPU.
    #[arg(long = "tp-force-communicator", hide = true)]
    pub tp_force_communicator: bool,
    /// The first GPU this model takes (cuda): data-parallel replica i of `serve --dp-size` starts
    /// at GPU i x --tp-size. Not a flag.
    #[arg(skip)]
    pub first_gpu: usize,
}

/// Decode batches up to this size are replayed as CUDA graphs by default. Measured on the H200
/// (35B-A3B shape): a batch-64 step 34.2 ms launched, 28.8 ms replayed; larger sizes not measured.
pub const DEFAULT_CUDA_GRAPH_MAX_BS: usize = 64;

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

/// Accepted `--attention-backend` values.
const NATIVE_ATTENTION: &str = "native";

/// Whether the flags ask for the diagnostic broken attention; an error for names we do not have.
fn broken_attention_requested(args: &ModelArgs) -> Result<bool> {
    match args.attention_backend.as_str() {
        NATIVE_ATTENTION => Ok(false),
        BROKEN_ATTENTION_NAME if matches!(args.backend, BackendKind::Cpu | BackendKind::Auto) => {
            Ok(true)
        }
        BROKEN_ATTENTION_NAME => bail!("--attention-backend {BROKEN_ATTENTION_NAME} wraps the cpu backend; use it with --backend cpu"),
        other => bail!(
            "--attention-backend {other}: the {:?} backend has one attention implementation, `{NATIVE_ATTENTION}` (or `{BROKEN_ATTENTION_NAME}` for diagnostics); GPU kernels such as flashinfer or triton do not apply",
            args.backend
        ),
    }
}

/// The model's config and a source of its weights, as the flags say.
pub fn open_source(args: &ModelArgs) -> Result<(ModelConfig, Box<dyn TensorSource>)> {
    let dir = &args.model_path;
    if !dir.is_dir() {
        bail!("--model-path {}: not a directory", dir.display());
    }
    let config = ModelConfig::from_dir(dir)?;
    let source: Box<dyn TensorSource> = match args.load_format {
        LoadFormat::Auto => Box::new(SafetensorsSource::open(dir)?),
        LoadFormat::Dummy => Box::new(
            DummySource::new(config.dtype.unwrap_or(DType::BF16), 0)
                .with_tied_embeddings(config.tie_word_embeddings),
        ),
    };
    // A block-FP8 checkpoint is already what --quantization fp8 asks for: its weights are read
    // as stored (quantizing its dequantized values again would change nothing but load time).
    let source = match args.quantization {
        Some(Quantization::Fp8) if config.quantization.is_none() => Box::new(
            Fp8QuantizingSource::new(source, Fp8Quantization::qwen_default()),
        ),
        _ => source,
    };
    Ok((config, source))
}

impl ModelArgs {
    /// Replaces `demo` by the bundled demo model's directory and `--backend auto` by the backend
    /// it picks.
    pub fn resolved(mut self) -> Result<Self> {
        self.model_path = crate::demo_model::resolve_model_path("--model-path", &self.model_path)?;
        self.backend = resolve_backend(self.backend, &self.attention_backend);
        Ok(self)
    }

    /// The KV cache dtype for these flags on `backend` (resolved from `auto`), and why.
    pub fn kv_cache_choice(&self, backend: BackendKind) -> Result<KvCacheChoice> {
        resolve_kv_cache_dtype(self.kv_cache_dtype, backend, self.cuda_matmul_precision)
    }
}

/// `auto`: cuda when a usable GPU is present (said on stderr, with the reason when not), else cpu.
/// The diagnostic broken attention wraps the cpu backend, so it always means cpu.
pub fn resolve_backend(kind: BackendKind, attention_backend: &str) -> BackendKind {
    if kind != BackendKind::Auto {
        return kind;
    }
    if attention_backend == BROKEN_ATTENTION_NAME {
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

pub fn load_model(args: &ModelArgs) -> Result<AnyModel> {
    let broken = broken_attention_requested(args)?;
    let backend = resolve_backend(args.backend, &args.attention_backend);
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
            if !args.disable_cuda_graph {
                model.enable_step_graphs(args.cuda_graph_max_bs);
            }
            AnyModel::Cuda(model)
        }
    })
}

/// `--tp-size N` (N > 1, or 1 with --tp-force-communicator): N ranks, each with its own backend,
/// in one process.
fn load_split(
    args: &ModelArgs,
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
fn cpu_rank_backend(args: &ModelArgs) -> Result<CpuBackend> {
    let total = match args.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        t => t,
    };
    let per_rank = (total / args.tp_size.max(1)).max(1);
    cpu_backend(&ModelArgs {
        threads: per_rank,
        ..args.clone()
    })
}

fn cuda_options(args: &ModelArgs, kv: &KvCacheChoice) -> CudaOptions {
    CudaOptions {
        gemm_precision: match args.cuda_matmul_precision {
            CpuPrecision::F32 => GemmPrecision::F32,
            CpuPrecision::Bf16 => GemmPrecision::Bf16,
        },
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
pub fn load_reference_rank0(args: &ModelArgs) -> Result<Model<ReferenceBackend>> {
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
pub fn load_reference(args: &ModelArgs) -> Result<Model<ReferenceBackend>> {
    let (config, source) = open_source(args)?;
    build(ReferenceBackend, config, source.as_ref(), &args.model_path)
}

fn cpu_backend(args: &ModelArgs) -> Result<CpuBackend> {
    let matmul_precision = match args.cpu_matmul_precision {
        CpuPrecision::F32 => MatmulPrecision::F32,
        CpuPrecision::Bf16 => MatmulPrecision::Bf16,
    };
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
        matmul_precision,
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
