//! The model-loading flags, declared once for every command that loads a model (`serve`, `chat`,
//! `generate`, `score`, `bench`, `doctor`), and their validation. `ModelFlags::settings` turns them
//! into the plain `ModelSettings` that loading.rs takes; nothing past that point sees clap.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use deltaserve_cuda::GemmPrecision;
use deltaserve_tensor::cpu::MatmulPrecision;
use deltaserve_tensor::diagnostic::BROKEN_ATTENTION_NAME;

use crate::demo_model::DEMO_MODEL_NAME;
use crate::loading::{Attention, ModelSettings};
use crate::serve_flags::flag_values::KvCacheDtype;
use crate::spellings::{merge, SpellingConflict};

/// Help heading of other servers' spellings of deltaserve's flags.
pub const OTHER_SPELLINGS_HEADING: &str = "SGLang / vLLM spellings of the flags above";

/// Decode batches up to this size are replayed as CUDA graphs by default. Measured on the H200
/// (35B-A3B shape): a batch-64 step 34.2 ms launched, 28.8 ms replayed; larger sizes not measured.
pub const DEFAULT_CUDA_GRAPH_MAX_BS: usize = 64;

/// Flags that choose the model, its backend and how its weights load.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct ModelFlags {
    /// Model directory (config.json, *.safetensors, tokenizer.json, generation_config.json); `demo`
    /// (the default) is the bundled demo model.
    #[arg(long, value_name = "DIR")]
    pub model_path: Option<PathBuf>,
    /// Compute backend; `auto` picks cuda when a usable NVIDIA GPU is present, else cpu.
    #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
    pub backend: BackendKind,
    /// `auto` reads the safetensors weights; `dummy` makes random weights of the right shapes.
    #[arg(long, value_enum, default_value_t = LoadFormat::Auto)]
    pub load_format: LoadFormat,
    /// `fp8`: quantize an unquantized checkpoint's linear weights to block FP8 (128 x 128 tiles,
    /// scale = amax / 448) at load, as SGLang's flag does; a block-FP8 checkpoint is read as stored
    /// either way. The cpu backend, and the cuda backend on Hopper and later, keep the FP8 codes
    /// (half the bytes of bf16); elsewhere the weights are the dequantized values (docs/fp8.md).
    #[arg(long, value_enum)]
    pub quantization: Option<Quantization>,
    /// `fp8`: the draft model, the MTP head (its decoder layer, and an output head of its own
    /// quantized from the trunk's), in block FP8 whatever the trunk's format, as SGLang's flag
    /// quantizes its draft model. Drafting then reads about half the bytes; verification and the
    /// text stay the trunk's, only the acceptance can change (docs/fp8.md).
    #[arg(long, value_enum, value_name = "QUANTIZATION")]
    pub speculative_draft_model_quantization: Option<Quantization>,
    /// A JSON array of token ids (SGLang's flag, FR-Spec): the draft model's output head keeps
    /// only these rows of the trunk's, so drafting reads a fraction of its bytes (the 27B's
    /// 248k-row head is 2.5 GB of bf16). Drafts can only be listed tokens; verification and the
    /// text stay the trunk's (docs/serving.md). `scripts/make_token_map.py` writes one.
    #[arg(long, value_name = "FILE")]
    pub speculative_token_map: Option<PathBuf>,
    /// CPU threads for the cpu backend (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// How the cpu backend multiplies by bf16 weights: `f32` (exact widening, agrees with the
    /// reference to ~1e-6) or `bf16` (activations rounded to bf16, AVX512_BF16 dot products: about
    /// twice the prefill throughput, ~1.5e-3 relative error; still batch-invariant).
    #[arg(long, value_enum, default_value_t = MatmulPrecisionFlag::F32)]
    pub cpu_matmul_precision: MatmulPrecisionFlag,
    /// How the cuda backend multiplies: `bf16` (weights and activations in bf16, f32 accumulation;
    /// the serving default) or `f32` (f32 weights and pedantic f32 GEMMs: twice the memory, for
    /// checking the backend against transformers without bf16 rounding in the way).
    #[arg(long, value_enum, default_value_t = MatmulPrecisionFlag::Bf16)]
    pub cuda_matmul_precision: MatmulPrecisionFlag,
    /// How the KV cache stores K and V: `auto` (the dtype the model runs in: bf16 on cuda with
    /// --cuda-matmul-precision bf16, else fp32), `bf16` (cuda only: half the memory per token) or
    /// `fp32`.
    #[arg(long, value_name = "DTYPE", value_parser = KvCacheDtype::parse, default_value = "auto")]
    pub kv_cache_dtype: KvCacheDtype,
    /// Largest decode batch the cuda backend records as a CUDA graph and replays (SGLang's flag).
    #[arg(long, default_value_t = DEFAULT_CUDA_GRAPH_MAX_BS)]
    pub cuda_graph_max_bs: usize,
    /// Launch every op of every step one by one (no CUDA graphs).
    #[arg(long)]
    pub disable_cuda_graph: bool,
    /// Attention implementation: one per --backend, `native` (`auto` is the same).
    /// `diagnostic-broken-attention` (cpu) deliberately computes attention wrongly, to show doctor,
    /// the canary and the detector at work. `serve` accepts SGLang's and vLLM's kernel names (triton,
    /// flashinfer, fa3, ...) with a start-up note.
    #[arg(long)]
    pub attention_backend: Option<String>,
    /// Tensor-parallel degree: the model split over N GPUs (cuda, NCCL between them) or N
    /// in-process ranks (cpu, reference; --threads is then shared among them). 1, the default: the
    /// whole model on one device.
    #[arg(long, value_name = "N")]
    pub tp_size: Option<usize>,
    /// With --tp-size 1, run through the tensor-parallel path anyway: a one-rank group (NCCL on
    /// cuda) whose collectives change nothing. Checks the communicator's plumbing on one GPU.
    #[arg(long, hide = true)]
    pub tp_force_communicator: bool,
    /// = --model-path.
    #[arg(long = "model", value_name = "DIR", help_heading = OTHER_SPELLINGS_HEADING)]
    pub model_flag: Option<PathBuf>,
    /// = --tp-size.
    #[arg(long, value_name = "N", help_heading = OTHER_SPELLINGS_HEADING)]
    pub tp: Option<usize>,
    /// = --tp-size (vLLM, SGLang; `serve -tp` too).
    #[arg(long, value_name = "N", help_heading = OTHER_SPELLINGS_HEADING)]
    pub tensor_parallel_size: Option<usize>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// `cuda` when a usable NVIDIA GPU is present, else `cpu`.
    Auto,
    Reference,
    Cpu,
    /// NVIDIA GPU (CUDA libraries loaded at run time).
    Cuda,
}

impl BackendKind {
    /// The flag value naming this backend.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Auto => "auto",
            BackendKind::Reference => "reference",
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        }
    }
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadFormat {
    #[value(alias = "safetensors")]
    Auto,
    Dummy,
}

/// `--quantization`: weight quantization applied at load.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantization {
    /// Block FP8 (e4m3fn codes, one scale per 128 x 128 tile), the format of Qwen's FP8 releases.
    Fp8,
}

/// `--cpu-matmul-precision` and `--cuda-matmul-precision` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulPrecisionFlag {
    F32,
    Bf16,
}

impl ModelFlags {
    /// Folds the other spellings of `--model-path` and `--tp-size` into them: `--model`, then
    /// `serve`'s positional MODEL (`positional_model`); `--tp` and `--tensor-parallel-size`. The
    /// other spellings are emptied, so folding again changes nothing.
    pub fn fold_spellings(
        &mut self,
        positional_model: Option<PathBuf>,
    ) -> Result<(), SpellingConflict> {
        merge(
            &mut self.model_path,
            "--model-path",
            &[
                ("--model", self.model_flag.take()),
                ("MODEL (positional)", positional_model),
            ],
        )?;
        merge(
            &mut self.tp_size,
            "--tp-size",
            &[
                ("--tp", self.tp.take()),
                ("--tensor-parallel-size", self.tensor_parallel_size.take()),
            ],
        )?;
        Ok(())
    }

    /// `--model-path` as given, or `demo`.
    pub fn model_path(&self) -> PathBuf {
        self.model_path
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEMO_MODEL_NAME))
    }

    /// Refuses a tensor-parallel degree of 0 and attention implementations we do not have.
    pub fn validate(&self) -> Result<(), String> {
        if self.tp_size == Some(0) {
            return Err("--tp-size must be at least 1, found 0".into());
        }
        self.attention().map(|_| ())
    }

    /// The attention implementation `--attention-backend` names.
    fn attention(&self) -> Result<Attention, String> {
        match self.attention_backend.as_deref() {
            None | Some("auto" | "native") => Ok(Attention::Native),
            Some(BROKEN_ATTENTION_NAME)
                if matches!(self.backend, BackendKind::Cpu | BackendKind::Auto) =>
            {
                Ok(Attention::DiagnosticBroken)
            }
            Some(BROKEN_ATTENTION_NAME) => Err(format!(
                "--attention-backend {BROKEN_ATTENTION_NAME} wraps the cpu backend; use it with --backend cpu"
            )),
            Some(other) => Err(format!(
                "--attention-backend {other:?} is not available: deltaserve has one proven attention \
                 implementation per --backend (now {}); accepted values: auto, native (and \
                 {BROKEN_ATTENTION_NAME} on cpu, for diagnostics)",
                self.backend.name()
            )),
        }
    }

    /// The loading settings these flags ask for (spellings folded, values checked). `demo` and
    /// `--backend auto` are still to be resolved (`ModelSettings::resolved`).
    pub fn settings(mut self) -> anyhow::Result<ModelSettings> {
        self.fold_spellings(None)?;
        self.validate().map_err(anyhow::Error::msg)?;
        Ok(ModelSettings {
            model_path: self.model_path(),
            backend: self.backend,
            load_format: self.load_format,
            quantization: self.quantization,
            draft_quantization: self.speculative_draft_model_quantization,
            draft_token_map: self.speculative_token_map.clone(),
            threads: self.threads.unwrap_or(0),
            cpu_matmul_precision: match self.cpu_matmul_precision {
                MatmulPrecisionFlag::F32 => MatmulPrecision::F32,
                MatmulPrecisionFlag::Bf16 => MatmulPrecision::Bf16,
            },
            cuda_gemm_precision: match self.cuda_matmul_precision {
                MatmulPrecisionFlag::F32 => GemmPrecision::F32,
                MatmulPrecisionFlag::Bf16 => GemmPrecision::Bf16,
            },
            kv_cache_dtype: self.kv_cache_dtype,
            cuda_graph_max_bs: (!self.disable_cuda_graph).then_some(self.cuda_graph_max_bs),
            attention: self.attention().map_err(anyhow::Error::msg)?,
            tp_size: self.tp_size.unwrap_or(1),
            tp_force_communicator: self.tp_force_communicator,
            first_gpu: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        model: ModelFlags,
    }

    fn settings(flags: &str) -> anyhow::Result<ModelSettings> {
        let argv = std::iter::once("generate").chain(flags.split_whitespace());
        Cli::try_parse_from(argv)?.model.settings()
    }

    #[test]
    fn defaults() {
        let s = settings("").unwrap();
        assert_eq!(s.model_path, PathBuf::from(DEMO_MODEL_NAME));
        assert_eq!(
            (s.backend, s.load_format, s.quantization),
            (BackendKind::Auto, LoadFormat::Auto, None)
        );
        assert_eq!((s.threads, s.tp_size, s.first_gpu), (0, 1, 0));
        assert_eq!(s.cpu_matmul_precision, MatmulPrecision::F32);
        assert_eq!(s.cuda_gemm_precision, GemmPrecision::Bf16);
        assert_eq!(s.cuda_graph_max_bs, Some(DEFAULT_CUDA_GRAPH_MAX_BS));
        assert_eq!(s.attention, Attention::Native);
        assert!(!s.tp_force_communicator);
    }

    #[test]
    fn other_spellings_fold_and_conflicts_name_both_flags() {
        let s = settings("--model /m --tensor-parallel-size 2").unwrap();
        assert_eq!((s.model_path, s.tp_size), (PathBuf::from("/m"), 2));
        let s = settings("--model /m --tp 2").unwrap();
        assert_eq!((s.model_path, s.tp_size), (PathBuf::from("/m"), 2));
        let s =
            settings("--model /m --model-path /m --tp-size 2 --tensor-parallel-size 2").unwrap();
        assert_eq!((s.model_path, s.tp_size), (PathBuf::from("/m"), 2));
        let e = settings("--model-path /a --model /b")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--model-path") && e.contains("--model \"/b\""),
            "{e}"
        );
        let e = settings("--tp-size 2 --tensor-parallel-size 4")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--tp-size 2") && e.contains("--tensor-parallel-size 4"),
            "{e}"
        );
    }

    #[test]
    fn values_become_the_libraries_settings() {
        let s = settings(
            "--backend cpu --threads 3 --cpu-matmul-precision bf16 --cuda-matmul-precision f32 \
             --disable-cuda-graph --attention-backend diagnostic-broken-attention --load-format dummy \
             --quantization fp8 --speculative-draft-model-quantization fp8",
        )
        .unwrap();
        assert_eq!((s.backend, s.threads), (BackendKind::Cpu, 3));
        assert_eq!(s.cpu_matmul_precision, MatmulPrecision::Bf16);
        assert_eq!(s.cuda_gemm_precision, GemmPrecision::F32);
        assert_eq!(s.cuda_graph_max_bs, None);
        assert_eq!(s.attention, Attention::DiagnosticBroken);
        assert_eq!(
            (s.load_format, s.quantization, s.draft_quantization),
            (
                LoadFormat::Dummy,
                Some(Quantization::Fp8),
                Some(Quantization::Fp8)
            )
        );
        assert_eq!(
            settings("--load-format safetensors").unwrap().load_format,
            LoadFormat::Auto
        );
        assert_eq!(
            settings("--attention-backend auto").unwrap().attention,
            Attention::Native
        );
    }

    #[test]
    fn refusals_name_the_flag() {
        let e = settings("--tp-size 0").unwrap_err().to_string();
        assert!(e.contains("--tp-size must be at least 1"), "{e}");
        let e = settings("--attention-backend flashinfer")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--attention-backend \"flashinfer\""), "{e}");
        let e = settings("--backend cuda --attention-backend diagnostic-broken-attention")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--backend cpu"), "{e}");
        assert!(settings("--backend tpu").is_err());
    }
}
