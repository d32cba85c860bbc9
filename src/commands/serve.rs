//! `deltaserve serve`: loads the model, plans both cache pools, starts the engine and the HTTP server,
//! prints a start-up summary, and proves generation with the canary before /health says ready.

use crate::kv_cache_dtype::KvCacheChoice;
use crate::loading::{load_model, resolve_backend, with_model, AnyModel, ModelSettings};
use crate::model_flags::BackendKind;
use crate::serve_flags::chat_template_flag::load_chat_template;
use crate::serve_flags::{ModelDtype, ServeArgs, SpeculativeConfig};
use crate::weight_format::describe_weights;
use anyhow::{Context, Result};
use deltaserve_api::{AppState, EngineCapacity, HealthStatus, ModelIdentity};
use deltaserve_doctor::canary::{judge, CanaryOutcome, CanarySpec};
use deltaserve_engine::pool_plan::{plan_pools, Memory, PoolPlan, PoolRequest};
use deltaserve_engine::prefix_cache::DEFAULT_TRACK_INTERVAL;
use deltaserve_engine::{
    EngineConfig, EngineEvent, GenerationRequest, LocalEngine, PrefixCacheConfig, ReplicaSet,
    SamplingParams, SharedEngine, SpecConfig,
};
use deltaserve_model::config::ModelConfig;
use deltaserve_tensor::{Backend, DType};
use deltaserve_text::Tokenizer;
use std::path::PathBuf;
use std::sync::Arc;

/// Prefill chunk when `--chunked-prefill-size` is not given, a multiple of the GDN chunk (64). On a
/// GPU a step streams every weight once whatever its tokens, so chunks are large as in SGLang (a 32k
/// prompt in 256-token steps took 9.5 s on the H200 against 5.8 s in one forward); on the host a
/// prefill step is compute-bound and short chunks keep decode steps flowing beside it.
const DEFAULT_CHUNKED_PREFILL_DEVICE: usize = 8192;
const DEFAULT_CHUNKED_PREFILL_HOST: usize = 256;

const DEFAULT_PAGE_SIZE: usize = 16;
const DEFAULT_MAX_QUEUED: usize = 1024;
/// Decode statistics line every this many steps when `--decode-log-interval` is not given (SGLang's).
const DEFAULT_DECODE_LOG_INTERVAL: usize = 40;

/// Memory the pools may draw on: what the OS reports available now (weights already loaded).
fn available_memory_bytes() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:").map(str::to_owned))
        })
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map_or(4 << 30, |kib| kib * 1024)
}

/// How `--dp-size N` lays the replicas out: on cuda replica i takes GPUs i*TP..(i+1)*TP; on the CPU
/// backends the replicas share `--threads` (all cores when not given), an equal part each.
struct DataParallel {
    replicas: usize,
    /// CPU threads of each replica (CPU backends only).
    threads_each: Option<usize>,
    /// What the start-up summary says about the layout.
    summary: String,
}

impl DataParallel {
    fn plan(args: &ModelSettings, replicas: usize) -> Result<Self> {
        if replicas <= 1 {
            return Ok(Self {
                replicas: 1,
                threads_each: None,
                summary: String::new(),
            });
        }
        let tp = args.tp_size.max(1);
        if args.backend == BackendKind::Cuda {
            let gpus =
                deltaserve_cuda::gpu_count().map_err(|e| anyhow::anyhow!("--backend cuda: {e}"))?;
            if gpus < replicas * tp {
                anyhow::bail!(
                    "--dp-size {replicas} with --tp-size {tp} needs {} GPUs (replica i on GPUs i*{tp}..(i+1)*{tp}); this process sees {gpus}",
                    replicas * tp
                );
            }
            let summary = (0..replicas)
                .map(|i| match tp {
                    1 => format!("replica {i} on GPU {i}"),
                    _ => format!("replica {i} on GPUs {}-{}", i * tp, (i + 1) * tp - 1),
                })
                .collect::<Vec<_>>()
                .join(", ");
            return Ok(Self {
                replicas,
                threads_each: None,
                summary,
            });
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let total = match args.threads {
            0 => cores,
            t => t,
        };
        let each = (total / replicas).max(1);
        let shared = if each * replicas > total {
            format!("; {replicas} replicas x {each} thread > {total}: they take turns on the cores")
        } else {
            String::new()
        };
        Ok(Self {
            replicas,
            threads_each: Some(each),
            summary: format!(
                "the replicas share the cores: {each} cpu thread(s) each of {total} (--threads split {replicas} ways){shared}"
            ),
        })
    }

    /// The model settings of replica `i`.
    fn replica_settings(&self, args: &ModelSettings, i: usize) -> ModelSettings {
        ModelSettings {
            threads: self.threads_each.unwrap_or(args.threads),
            first_gpu: i * args.tp_size.max(1),
            ..args.clone()
        }
    }
}

/// `(free, total)` as if the device had only `cap` bytes: what is already in use (weights,
/// runtime) stays in use, the rest of the cap is free.
fn capped_device_memory(free: usize, total: usize, cap: usize) -> (usize, usize) {
    let used = total.saturating_sub(free);
    let total = total.min(cap);
    (total.saturating_sub(used), total)
}

fn human_bytes(bytes: usize) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", b / 1024.0)
    }
}

/// How the model is spread: tensor-parallel ranks and their communicator, data-parallel replicas.
struct Parallelism<'a> {
    tp: Option<(usize, &'a str)>,
    dp: &'a DataParallel,
}

#[allow(clippy::too_many_arguments)]
fn print_summary(
    args: &ServeArgs,
    config: &ModelConfig,
    backend: &str,
    kv_cache: &KvCacheChoice,
    plan: &PoolPlan,
    spec: Option<&SpecConfig>,
    parallel: Parallelism,
    prefix: &PrefixCacheConfig,
) {
    let Parallelism { tp, dp } = parallel;
    let dtype = config
        .dtype
        .map_or("unknown".to_string(), |d| d.to_string());
    eprintln!("deltaserve ready to prove itself:");
    eprintln!(
        "  model            {} ({:?}, {} layers, dtype {dtype})",
        args.model_path().display(),
        config.architecture,
        config.num_hidden_layers
    );
    eprintln!(
        "  weights          {}",
        describe_weights(config, args.model.load_format, args.model.quantization)
    );
    eprintln!("  backend          {backend}");
    if dp.replicas > 1 {
        eprintln!(
            "  data parallel    {} replicas, each a whole engine (weights, pools below, scheduler thread); each request to the least loaded; {}",
            dp.replicas, dp.summary
        );
    }
    let per_gpu = match (tp, dp.replicas > 1) {
        (Some((n, comm)), replicated) => {
            eprintln!(
                "  tensor parallel  {n} ranks ({comm}); heads, MLP widths and vocabulary split {n} ways"
            );
            if replicated {
                " per rank of each replica"
            } else {
                " per rank"
            }
        }
        (None, true) => " per replica",
        (None, false) => "",
    };
    eprintln!(
        "  KV pool          {} blocks x {} tokens = {} tokens, {}{per_gpu} ({} per token)",
        plan.num_kv_blocks,
        plan.block_size,
        plan.kv_tokens(),
        human_bytes(plan.kv_bytes()),
        human_bytes(plan.kv_bytes_per_token)
    );
    eprintln!("  KV cache dtype   {kv_cache}");
    eprintln!(
        "  state-slot pool  {} slots x {} = {}{per_gpu} ({} for running requests, {} for prefix-cache snapshots)",
        plan.state_slots,
        human_bytes(plan.state_bytes_per_slot),
        human_bytes(plan.state_bytes()),
        plan.state_slots - plan.cache_snapshot_slots,
        plan.cache_snapshot_slots
    );
    if prefix.enabled {
        eprintln!(
            "  prefix cache     radix tree over {}-token pages; GDN snapshots at each prompt's last message end{} ({} each); it also uses free slots and yields them on demand",
            plan.block_size,
            if prefix.track_interval > 0 {
                format!(" and every {} tokens (--mamba-track-interval)", prefix.track_interval)
            } else {
                String::new()
            },
            human_bytes(plan.state_bytes_per_slot)
        );
    } else {
        eprintln!("  prefix cache     off (--disable-radix-cache)");
    }
    let fp8_draft = if args.model.speculative_draft_model_quantization.is_some() {
        "; the draft model (MTP layer and its own head) in block FP8 \
         (--speculative-draft-model-quantization)"
    } else {
        ""
    };
    let token_map = match &args.model.speculative_token_map {
        Some(path) => format!(
            "; the draft head keeps the token ids listed in {} (--speculative-token-map)",
            path.display()
        ),
        None => String::new(),
    };
    let draft_format = format!("{fp8_draft}{token_map}");
    match spec {
        Some(s) => eprintln!(
            "  speculative      NEXTN (MTP), {} draft steps, {} snapshot slots per running request{draft_format}",
            s.num_steps, plan.snapshot_slots_per_sequence
        ),
        None if !draft_format.is_empty() => eprintln!(
            "  speculative      off (--speculative-draft-model-quantization and \
             --speculative-token-map do nothing without --speculative-algorithm)"
        ),
        None => eprintln!("  speculative      off"),
    }
    let each = if dp.replicas > 1 { " per replica" } else { "" };
    eprintln!(
        "  max running      {} requests{each}",
        plan.max_running_requests
    );
    eprintln!("  context length   {} tokens", plan.context_length);
    for note in &plan.notes {
        eprintln!("  note             {note}");
    }
}

/// Generates the canary through the engine (as a request would) and judges it.
async fn run_canary(
    engine: &SharedEngine,
    spec: &CanarySpec,
    tokenizer: &Tokenizer,
) -> Result<CanaryOutcome, String> {
    let request = GenerationRequest {
        prompt_ids: spec.prompt_ids.clone(),
        sampling: SamplingParams::default(),
        max_new_tokens: spec.max_tokens,
        stop_token_ids: tokenizer.stop_token_ids().to_vec(),
        disable_speculation: false,
    };
    let (_, mut rx) = engine
        .submit(request)
        .map_err(|e| format!("submitting the canary: {e}"))?;
    let mut tokens = Vec::new();
    loop {
        match rx.recv().await {
            Some(EngineEvent::Token { id, .. }) => tokens.push(id),
            Some(EngineEvent::Finished { .. }) | None => break,
            Some(EngineEvent::Error { message }) => {
                return Err(format!("the canary generation failed: {message}"))
            }
        }
    }
    let stopped = tokens
        .last()
        .is_some_and(|t| tokenizer.stop_token_ids().contains(t));
    if stopped {
        tokens.pop();
    }
    Ok(judge(spec, &tokens, stopped, Some(tokenizer)))
}

/// What /model_info and /server_info report: paths as resolved, and config.json's top-level
/// `model_type` and `architectures` (what SGLang reports), the text model's type when there is no
/// top-level one.
fn model_identity(
    args: &ServeArgs,
    model_path: &std::path::Path,
    config: &ModelConfig,
) -> Result<ModelIdentity> {
    let tokenizer_path = match &args.tokenizer_path {
        Some(dir) => crate::demo_model::resolve_model_path("--tokenizer-path", dir)?,
        None => model_path.to_path_buf(),
    };
    let config_path = model_path.join("config.json");
    let raw: serde_json::Value = std::fs::read_to_string(&config_path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default();
    let model_type = raw["model_type"]
        .as_str()
        .map_or_else(|| config.model_type.clone(), str::to_owned);
    let architectures = raw["architectures"]
        .as_array()
        .map(|names| {
            names
                .iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    Ok(ModelIdentity {
        model_path: model_path.display().to_string(),
        tokenizer_path: tokenizer_path.display().to_string(),
        model_type,
        architectures,
    })
}

/// `--dtype` checks against the checkpoint's dtype (config.json), before any weight is read.
fn check_dtype(args: &ServeArgs, config: &ModelConfig) -> Result<()> {
    let checkpoint = match config.dtype {
        Some(DType::BF16) => ModelDtype::BFloat16,
        Some(DType::F16) => ModelDtype::Float16,
        Some(DType::F32) => ModelDtype::Float32,
        None => ModelDtype::Auto,
    };
    Ok(args.dtype.check_against(checkpoint)?)
}

/// The tokenizer of `--tokenizer-path` (else the model directory), with `--chat-template` in place of
/// the model's own templates.
fn load_tokenizer(args: &ServeArgs) -> Result<Tokenizer> {
    let (flag, dir) = match &args.tokenizer_path {
        Some(dir) => (
            "--tokenizer-path",
            crate::demo_model::resolve_model_path("--tokenizer-path", dir)?,
        ),
        None => ("--model-path", args.model_path()),
    };
    let tokenizer =
        Tokenizer::from_dir(&dir).with_context(|| format!("{flag} {}", dir.display()))?;
    Ok(match &args.chat_template {
        Some(value) => tokenizer.with_chat_template(load_chat_template(value)?),
        None => tokenizer,
    })
}

pub fn run(mut args: ServeArgs) -> Result<()> {
    let notes = args.resolve_compat(&|name| std::env::var(name).ok())?;
    let log_level = args.log_level();
    if log_level.shows_warnings() {
        for note in &notes {
            eprintln!("compatibility: {note}");
        }
    }
    // Every model this server runs (Qwen3.5 / Qwen3.6 / Qwen3-Next) writes <think> blocks, so the
    // reasoning parser is on unless another one is named. Tool calls are always parsed, in the
    // syntax --tool-call-parser names or else the one the chat template writes.
    args.reasoning_parser
        .get_or_insert_with(|| "qwen3".to_string());
    let speculative = args.validate()?;
    if args.served_model_name.is_empty()
        && args.model_path().as_os_str() == crate::demo_model::DEMO_MODEL_NAME
    {
        args.served_model_name = vec![crate::demo_model::DEMO_MODEL_NAME.to_string()];
    }
    let model_path = crate::demo_model::resolve_model_path("--model-path", &args.model_path())?;
    args.model.model_path = Some(model_path.clone());
    let model_config = ModelConfig::from_dir(&model_path)
        .with_context(|| format!("--model-path {}", model_path.display()))?;
    check_dtype(&args, &model_config)?;
    let tokenizer = Arc::new(load_tokenizer(&args)?);
    let identity = model_identity(&args, &model_path, &model_config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let startup = Startup {
        args,
        speculative,
        model_path,
        tokenizer,
        identity,
    };
    runtime.block_on(startup.serve())
}

/// What `run` settled before the async part: the flags resolved, the tokenizer loaded.
struct Startup {
    args: ServeArgs,
    speculative: Option<SpeculativeConfig>,
    /// `--model-path` resolved (the bundled demo model unpacked).
    model_path: PathBuf,
    tokenizer: Arc<Tokenizer>,
    identity: ModelIdentity,
}

impl Startup {
    /// Listens at once (/health answers 503 while loading), loads the model, starts the engine, runs
    /// the canary, then says where it listens and serves until SIGTERM/SIGINT.
    async fn serve(self) -> Result<()> {
        let args = &self.args;
        let log_level = args.log_level();
        let state = Arc::new(AppState::new(args.server_config(), self.tokenizer.clone()));
        state.set_model_identity(self.identity.clone());
        state
            .health
            .set(HealthStatus::Loading("loading weights".into()));
        let listener = deltaserve_api::bind(args.listen_addr()?).await?;
        let local_addr = listener.local_addr().context("the listening socket")?;
        let server = tokio::spawn(deltaserve_api::serve(listener, state.clone()));

        let mut settings = args.model.clone().settings()?;
        settings.backend = resolve_backend(settings.backend, settings.attention);
        // Refused before any weight is read.
        let kv_cache = settings.kv_cache_choice(settings.backend)?;
        let dp = DataParallel::plan(&settings, args.dp_size.unwrap_or(1))?;
        let replica_settings: Vec<ModelSettings> = (0..dp.replicas)
            .map(|i| dp.replica_settings(&settings, i))
            .collect();
        let models: Vec<AnyModel> = tokio::task::spawn_blocking(move || {
            replica_settings
                .iter()
                .map(load_model)
                .collect::<Result<Vec<_>>>()
        })
        .await
        .context("the loading thread failed")??;
        let engine = self.start_engine(models, &dp, &kv_cache, &state).await?;
        let health = if args.skip_canary {
            let flag = if args.compat.skip_server_warmup {
                "--skip-server-warmup"
            } else {
                "--skip-canary"
            };
            eprintln!("canary skipped ({flag}): /health proves generation, not correctness");
            HealthStatus::Ready
        } else {
            state
                .health
                .set(HealthStatus::Loading("running the start-up canary".into()));
            self.canary_health(&engine.replicas, engine.vocab_size)
                .await?
        };
        let ready = matches!(health, HealthStatus::Ready);
        state.health.set(health);
        if log_level.shows_info() {
            let status = if ready { "" } else { " (/health: 503)" };
            eprintln!("listening on http://{local_addr}{status}");
        }
        server.await.context("the server task failed")??;
        Ok(())
    }

    /// Plans both cache pools for the loaded model (every replica the same), prints the start-up
    /// summary and starts the engines behind `state`.
    async fn start_engine(
        &self,
        models: Vec<AnyModel>,
        dp: &DataParallel,
        kv_cache: &KvCacheChoice,
        state: &Arc<AppState>,
    ) -> Result<StartedEngine> {
        let args = &self.args;
        let log_level = args.log_level();
        let model = &models[0];
        let (config, backend_name) = with_model!(model, m => (m.config.clone(), m.backend.name()));
        let backend_name = match model.cpu_kernels() {
            Some(kernels) => format!("{backend_name} ({kernels} kernels)"),
            None => backend_name.to_string(),
        };
        let spec = self.spec_config(&config)?;
        // The pools are made in the backend's KV dtype, which the choice set.
        let kv_dtype = with_model!(model, m => m.backend.kv_dtype());
        debug_assert_eq!(kv_dtype, kv_cache.dtype);
        let request = pool_request(args, spec.as_ref(), kv_dtype.bytes());
        // Replicas get pools of the same size: planned on the tightest GPU, or on an equal share of
        // the host's memory (every replica's weights already loaded).
        let device = models
            .iter()
            .filter_map(|model| with_model!(model, m => m.device_memory()))
            .min_by_key(|&(free, _)| free);
        let plan = plan_pools(&config, &request, pool_memory(device, args, dp.replicas))?;
        let on_device = device.is_some();
        let default_chunk = if on_device {
            DEFAULT_CHUNKED_PREFILL_DEVICE
        } else {
            DEFAULT_CHUNKED_PREFILL_HOST
        };
        let chunk = args
            .chunked_prefill_tokens()
            .unwrap_or(default_chunk)
            .max(1);
        // Prefill is cut at every snapshot point, so on a GPU the interval defaults to the chunk:
        // 256-token steps would stream all weights once per 256 prompt tokens.
        let prefix = PrefixCacheConfig {
            enabled: !args.disable_radix_cache,
            track_interval: args.mamba_track_interval.unwrap_or(if on_device {
                chunk
            } else {
                DEFAULT_TRACK_INTERVAL
            }),
            boundary_tokens: self
                .tokenizer
                .token_to_id("<|im_start|>")
                .into_iter()
                .collect(),
        };
        let engine_config = engine_config(args, &plan, spec.clone(), chunk);
        state.set_engine_capacity(EngineCapacity {
            context_length: engine_config.context_length,
            max_running_requests: engine_config.max_running_requests,
            max_queued_requests: engine_config.max_queued_requests,
            page_size: engine_config.block_size,
            num_kv_blocks: engine_config.num_kv_blocks,
            state_slots: engine_config.state_slots,
            chunked_prefill_size: engine_config.chunked_prefill_size,
        });
        if log_level.shows_info() {
            let tp = with_model!(model, m => m.communicator_kind().map(|kind| (m.tp_size(), kind)));
            print_summary(
                args,
                &config,
                &backend_name,
                kv_cache,
                &plan,
                spec.as_ref(),
                Parallelism { tp, dp },
                &prefix,
            );
        }
        let locals: Vec<Arc<LocalEngine>> = models
            .into_iter()
            .map(|model| {
                with_model!(model, m => LocalEngine::spawn_with_cache(m, engine_config.clone(), prefix.clone()))
            })
            .collect();
        if let Some(timeout) = args.watchdog_timeout() {
            for local in &locals {
                crate::watchdog::spawn(local.clone(), state.clone(), timeout)?;
            }
        }
        let engine: SharedEngine = match locals.as_slice() {
            [one] => one.clone(),
            _ => ReplicaSet::new(locals.clone()),
        };
        state.attach_engine(engine.clone());
        let metrics_engine = engine.clone();
        state.set_engine_metrics(Arc::new(move || metrics_engine.prometheus_metrics()));
        Ok(StartedEngine {
            replicas: locals,
            vocab_size: config.vocab_size,
        })
    }

    /// The validated speculative settings, refused when the model has no MTP head.
    fn spec_config(&self, config: &ModelConfig) -> Result<Option<SpecConfig>> {
        match self.speculative {
            Some(_) if config.mtp_num_hidden_layers == 0 => anyhow::bail!(
                "--speculative-algorithm {}: {} has no MTP head (mtp_num_hidden_layers is 0)",
                self.args
                    .speculative_algorithm
                    .as_deref()
                    .unwrap_or("NEXTN"),
                self.model_path.display()
            ),
            Some(s) => Ok(Some(SpecConfig {
                num_steps: s.num_steps,
                disable_batch_size: s.disable_batch_size,
                fault: Default::default(),
            })),
            None => Ok(None),
        }
    }

    /// Runs the canary through every replica's engine (one bad GPU or a bad load must not hide
    /// behind the others): `Ready` when each generated correct text, `Failed` (and why, on stderr)
    /// at the first that did not.
    async fn canary_health(
        &self,
        replicas: &[Arc<LocalEngine>],
        vocab_size: usize,
    ) -> Result<HealthStatus> {
        let spec = CanarySpec::for_model(&self.model_path, Some(&self.tokenizer), vocab_size)
            .map_err(anyhow::Error::msg)?;
        for (i, local) in replicas.iter().enumerate() {
            let replica: SharedEngine = local.clone();
            let which = if replicas.len() > 1 {
                format!(" on replica {i}")
            } else {
                String::new()
            };
            let outcome = match run_canary(&replica, &spec, &self.tokenizer).await {
                Ok(outcome) => outcome,
                Err(why) => return Ok(HealthStatus::Failed(format!("{why}{which}"))),
            };
            match outcome.failure() {
                None => {
                    if self.args.log_level().shows_info() {
                        eprintln!("canary ok{which}: {:?}", outcome.text);
                    }
                }
                Some(why) => {
                    eprintln!(
                        "CANARY FAILED{which}: {why}\n  the model does not generate correct text on this backend; \
                         /health stays 503. Run `deltaserve doctor --model-path {}` to locate the fault.",
                        self.model_path.display()
                    );
                    return Ok(HealthStatus::Failed(format!(
                        "start-up canary failed{which}: {why}"
                    )));
                }
            }
        }
        Ok(HealthStatus::Ready)
    }
}

/// The engines as started (one per data-parallel replica), and what the canary needs of the model.
struct StartedEngine {
    replicas: Vec<Arc<LocalEngine>>,
    vocab_size: usize,
}

/// The pool sizes the flags ask for; what they leave open is planned from memory.
fn pool_request(
    args: &ServeArgs,
    spec: Option<&SpecConfig>,
    kv_element_bytes: usize,
) -> PoolRequest {
    PoolRequest {
        context_length: args.context_length,
        max_running_requests: args.max_running_requests,
        max_total_tokens: args.max_total_tokens,
        max_mamba_cache_size: args.max_mamba_cache_size,
        mamba_full_memory_ratio: args.mamba_full_memory_ratio.map(f64::from),
        mem_fraction_static: args.mem_fraction_static.map(f64::from),
        page_size: args.page_size.unwrap_or(DEFAULT_PAGE_SIZE),
        speculative_steps: spec.map_or(0, |s| s.num_steps),
        kv_element_bytes,
        prefix_cache: !args.disable_radix_cache,
    }
}

/// GPU backends plan from the device's memory (SGLang's rules), capped by
/// `--device-memory-cap-gb`; CPU ones from the host's, an equal share per replica. Split over GPUs,
/// `device` is the tightest rank's, and every rank holds pools of the same size.
fn pool_memory(device: Option<(usize, usize)>, args: &ServeArgs, replicas: usize) -> Memory {
    let device = match (device, args.device_memory_cap_gb) {
        (Some((free, total)), Some(gb)) => {
            Some(capped_device_memory(free, total, (gb * 1e9) as usize))
        }
        (device, _) => device,
    };
    match device {
        Some((free, total)) => Memory::Device { free, total },
        None => Memory::Host {
            available: available_memory_bytes() / replicas.max(1),
        },
    }
}

fn engine_config(
    args: &ServeArgs,
    plan: &PoolPlan,
    speculative: Option<SpecConfig>,
    chunk: usize,
) -> EngineConfig {
    EngineConfig {
        max_running_requests: plan.max_running_requests,
        num_kv_blocks: plan.num_kv_blocks,
        block_size: plan.block_size,
        state_slots: plan.state_slots,
        chunked_prefill_size: chunk,
        context_length: plan.context_length,
        max_queued_requests: args.max_queued_requests.unwrap_or(DEFAULT_MAX_QUEUED),
        decode_log_interval: if args.log_level().shows_info() {
            args.decode_log_interval
                .unwrap_or(DEFAULT_DECODE_LOG_INTERVAL)
        } else {
            0
        },
        speculative,
    }
}
