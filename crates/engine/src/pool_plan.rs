//! Sizing the two cache pools at start-up from the flags and the memory left after loading weights:
//! paged KV blocks for the full-attention layers (MTP layer included) and state slots for the GDN
//! layers (plus snapshot slots for speculative decoding). Memory is planned, not discovered: the plan
//! is printed with how each number was derived, and impossible combinations are errors that name
//! the flags.
//!
//! On a device (the GPU) the rules are SGLang's: `--mem-fraction-static` is the share of the
//! device's *total* memory for everything static (weights and both pools), the rest is left for
//! activations and the runtime; the pool budget is split between state slots and KV by
//! `--mamba-full-memory-ratio`, and unless `--max-running-requests` says otherwise the number of
//! running requests is what the state slots hold. On the host (cpu backends) the defaults stay
//! modest: 30 % of the available memory and 16 running requests.

use deltaserve_model::config::ModelConfig;

/// What the user asked for (`None` = choose).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolRequest {
    pub context_length: Option<usize>,
    pub max_running_requests: Option<usize>,
    /// `--max-total-tokens`: KV pool capacity in tokens.
    pub max_total_tokens: Option<usize>,
    /// `--max-mamba-cache-size`: state slots for running sequences (snapshot slots are added).
    pub max_mamba_cache_size: Option<usize>,
    /// `--mamba-full-memory-ratio`: state-pool bytes / KV-pool bytes when both are derived from memory.
    pub mamba_full_memory_ratio: Option<f64>,
    /// `--mem-fraction-static`: on a device, the fraction of its total memory for weights and pools;
    /// on the host, the fraction of the available memory given to the pools.
    pub mem_fraction_static: Option<f64>,
    /// `--page-size`: tokens per KV block.
    pub page_size: usize,
    /// Speculative draft steps k (0 = off); each running sequence then needs k + 1 snapshot slots.
    pub speculative_steps: usize,
    /// Bytes of one KV element as the backend stores the cache (4 for f32, 2 for bf16).
    pub kv_element_bytes: usize,
    /// The prefix cache is on: the state pool gets one snapshot slot per running request on top
    /// (the cache may also use any slot no running request holds, and yields them on demand).
    pub prefix_cache: bool,
}

/// The memory the pools are planned from, measured after the weights were loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// A device of `total` bytes with `free` bytes left after the weights (SGLang's rules).
    Device { free: usize, total: usize },
    /// Host memory with `available` bytes (modest defaults).
    Host { available: usize },
}

/// The decided sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolPlan {
    pub context_length: usize,
    pub max_running_requests: usize,
    pub block_size: usize,
    pub num_kv_blocks: usize,
    pub kv_bytes_per_token: usize,
    pub state_slots: usize,
    pub state_bytes_per_slot: usize,
    pub snapshot_slots_per_sequence: usize,
    /// State slots planned for prefix-cache snapshots (included in `state_slots`).
    pub cache_snapshot_slots: usize,
    /// Why the context length is what it is, when it was not given.
    pub notes: Vec<String>,
}

impl PoolPlan {
    pub fn kv_tokens(&self) -> usize {
        self.num_kv_blocks * self.block_size
    }

    pub fn kv_bytes(&self) -> usize {
        self.kv_tokens() * self.kv_bytes_per_token
    }

    pub fn state_bytes(&self) -> usize {
        self.state_slots * self.state_bytes_per_slot
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("{flag} {value}: {why}")]
    Flag {
        flag: &'static str,
        value: String,
        why: String,
    },
}

fn flag_error(flag: &'static str, value: impl ToString, why: impl Into<String>) -> PlanError {
    PlanError::Flag {
        flag,
        value: value.to_string(),
        why: why.into(),
    }
}

/// Bytes of KV per token over the full-attention layers (and the MTP layer when speculating), with
/// `element_bytes` per stored value.
pub fn kv_bytes_per_token(config: &ModelConfig, with_mtp: bool, element_bytes: usize) -> usize {
    let layers = (0..config.num_hidden_layers)
        .filter(|&i| config.is_full_attention(i))
        .count()
        + usize::from(with_mtp);
    layers * 2 * config.num_key_value_heads * config.head_dim * element_bytes
}

/// Bytes of one state slot over all GDN layers: the conv window and the f32 recurrent state.
pub fn state_bytes_per_slot(config: &ModelConfig) -> usize {
    let g = config.gdn_shape();
    let layers = (0..config.num_hidden_layers)
        .filter(|&i| !config.is_full_attention(i))
        .count();
    let conv = (config.linear_conv_kernel_dim - 1) * g.conv_dim();
    let ssm = g.value_heads * g.key_dim * g.value_dim;
    layers * (conv + ssm) * 4
}

/// Host defaults: a modest share of the machine, a modest concurrency.
const HOST_MAX_RUNNING: usize = 16;
const HOST_MEM_FRACTION: f64 = 0.3;
/// Device defaults. SGLang leaves ~10-15 % of a large GPU for activations and CUDA graphs; our
/// activations at the default prefill chunk fit well inside 15 % of an 80-141 GB device.
const DEVICE_MEM_FRACTION: f64 = 0.85;
/// SGLang's default split of a hybrid model's pool budget: state bytes / KV bytes.
const DEVICE_MAMBA_FULL_MEMORY_RATIO: f64 = 0.9;
/// Running requests derived from memory are capped here (the scheduler's batch, not the pools,
/// becomes the limit beyond it).
const DEVICE_MAX_RUNNING_CAP: usize = 512;

/// Plans the pools given the memory measured after the weights were loaded.
pub fn plan_pools(
    config: &ModelConfig,
    request: &PoolRequest,
    memory: Memory,
) -> Result<PoolPlan, PlanError> {
    let block_size = request.page_size;
    if block_size == 0 {
        return Err(flag_error("--page-size", 0, "must be at least 1"));
    }
    let snapshots = if request.speculative_steps > 0 {
        request.speculative_steps + 1
    } else {
        0
    };
    let kv_per_token = kv_bytes_per_token(
        config,
        request.speculative_steps > 0,
        request.kv_element_bytes.max(1),
    );
    let state_per_slot = state_bytes_per_slot(config);
    let mut notes = Vec::new();
    let cache_per_request = usize::from(request.prefix_cache);

    let on_device = matches!(memory, Memory::Device { .. });
    let default_fraction = if on_device {
        DEVICE_MEM_FRACTION
    } else {
        HOST_MEM_FRACTION
    };
    let fraction = request.mem_fraction_static.unwrap_or(default_fraction);
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(flag_error(
            "--mem-fraction-static",
            fraction,
            "must be in (0, 1]",
        ));
    }
    let budget = match memory {
        Memory::Device { free, total } => {
            let reserved = ((1.0 - fraction) * total as f64) as usize;
            let budget = free.saturating_sub(reserved);
            if budget == 0 {
                return Err(flag_error(
                    "--mem-fraction-static",
                    fraction,
                    format!(
                        "{fraction} x {} device total leaves nothing for the cache pools: the weights and runtime already use {} (raise it, SGLang's meaning: the share of the whole device for weights and pools)",
                        human(total),
                        human(total.saturating_sub(free))
                    ),
                ));
            }
            notes.push(format!(
                "pools get {} = {} free after the weights - {} reserved ((1 - --mem-fraction-static {fraction}) x {} device total)",
                human(budget), human(free), human(reserved), human(total)
            ));
            budget
        }
        Memory::Host { available } => {
            let budget = (available as f64 * fraction) as usize;
            notes.push(format!(
                "pools get {} = --mem-fraction-static {fraction} x {} available host memory",
                human(budget),
                human(available)
            ));
            budget
        }
    };
    // On a device with neither concurrency flag, the state pool's share of the budget decides how
    // many requests run (SGLang's rule), instead of a constant.
    let derive_running = on_device
        && request.max_running_requests.is_none()
        && request.max_mamba_cache_size.is_none()
        && request.max_total_tokens.is_none();
    let ratio = match request.mamba_full_memory_ratio {
        Some(r) if r > 0.0 => Some(r),
        Some(r) => {
            return Err(flag_error(
                "--mamba-full-memory-ratio",
                r,
                "must be positive",
            ))
        }
        None if derive_running => Some(DEVICE_MAMBA_FULL_MEMORY_RATIO),
        None => None,
    };
    let derived_running = if derive_running {
        let ratio = ratio.unwrap_or(DEVICE_MAMBA_FULL_MEMORY_RATIO);
        let state_budget = (budget as f64 * ratio / (1.0 + ratio)) as usize;
        let per_request = state_per_slot * (1 + snapshots + cache_per_request);
        let fit = state_budget / per_request.max(1);
        let running = fit.clamp(1, DEVICE_MAX_RUNNING_CAP);
        notes.push(format!(
            "max running {running}: the state pool's share {} (--mamba-full-memory-ratio {ratio}: state/KV) holds {fit} requests of {} ({} slot(s) each){}",
            human(state_budget),
            human(per_request),
            1 + snapshots + cache_per_request,
            if fit > DEVICE_MAX_RUNNING_CAP { format!(", capped at {DEVICE_MAX_RUNNING_CAP}") } else { String::new() }
        ));
        Some(running)
    } else {
        None
    };

    let max_running = match (request.max_running_requests, request.max_mamba_cache_size) {
        (Some(0), _) => {
            return Err(flag_error(
                "--max-running-requests",
                0,
                "must be at least 1",
            ))
        }
        (Some(n), _) => n,
        (None, Some(slots)) => slots,
        (None, None) => derived_running.unwrap_or(HOST_MAX_RUNNING),
    };
    let running_slots = match request.max_mamba_cache_size {
        Some(0) => {
            return Err(flag_error(
                "--max-mamba-cache-size",
                0,
                "must be at least 1",
            ))
        }
        Some(slots) if slots < max_running => {
            notes.push(format!("concurrency is bounded by --max-mamba-cache-size {slots} (state slots), below --max-running-requests {max_running}"));
            slots
        }
        Some(slots) => slots,
        None => max_running,
    };
    let cache_snapshot_slots = running_slots * cache_per_request;
    let state_slots = running_slots * (1 + snapshots) + cache_snapshot_slots;
    let state_bytes = state_slots * state_per_slot;

    let kv_tokens = match request.max_total_tokens {
        Some(tokens) => tokens,
        None => {
            let kv_budget = match ratio {
                Some(ratio) => (budget as f64 / (1.0 + ratio)) as usize,
                None => budget.saturating_sub(state_bytes),
            };
            if ratio.is_none() && state_bytes > budget {
                return Err(flag_error(
                    "--max-running-requests",
                    max_running,
                    format!(
                        "{state_slots} state slots of {state_per_slot} bytes need {state_bytes} bytes but the pools may use {budget} bytes (raise --mem-fraction-static or lower the concurrency)"
                    ),
                ));
            }
            kv_budget / kv_per_token.max(1)
        }
    };
    let num_kv_blocks = kv_tokens / block_size;
    let capacity = num_kv_blocks * block_size;
    let context_length = match request.context_length {
        Some(c) if c > capacity => {
            return Err(flag_error("--context-length", c, format!("the KV pool holds only {capacity} tokens (raise --max-total-tokens or --mem-fraction-static)")))
        }
        Some(0) => return Err(flag_error("--context-length", 0, "must be at least 1")),
        Some(c) => c,
        None if config.max_position_embeddings > capacity => {
            notes.push(format!("context length {capacity}: the model allows {} but the KV pool holds {capacity} tokens", config.max_position_embeddings));
            capacity
        }
        None => config.max_position_embeddings,
    };
    if context_length == 0 {
        return Err(flag_error(
            "--mem-fraction-static",
            fraction,
            "leaves no memory for the KV pool",
        ));
    }
    Ok(PoolPlan {
        context_length,
        max_running_requests: max_running.min(running_slots),
        block_size,
        num_kv_blocks,
        kv_bytes_per_token: kv_per_token,
        state_slots,
        state_bytes_per_slot: state_per_slot,
        snapshot_slots_per_sequence: snapshots,
        cache_snapshot_slots,
        notes,
    })
}

/// Bytes in GiB (or MiB below one GiB) for the plan's notes.
fn human(bytes: usize) -> String {
    let gib = bytes as f64 / (1u64 << 30) as f64;
    if gib >= 1.0 {
        format!("{gib:.1} GiB")
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn qwen35_27b() -> ModelConfig {
        let json = r#"{"architectures":["Qwen3_5ForConditionalGeneration"],"model_type":"qwen3_5","text_config":{
            "model_type":"qwen3_5_text","vocab_size":248320,"hidden_size":5120,"intermediate_size":17408,
            "num_hidden_layers":64,"num_attention_heads":24,"num_key_value_heads":4,"head_dim":256,
            "linear_num_key_heads":16,"linear_num_value_heads":48,"linear_key_head_dim":128,"linear_value_head_dim":128,
            "linear_conv_kernel_dim":4,"full_attention_interval":4,"rms_norm_eps":1e-6,"max_position_embeddings":262144,
            "rope_parameters":{"rope_type":"default","rope_theta":10000000,"partial_rotary_factor":0.25},"mtp_num_hidden_layers":1}}"#;
        ModelConfig::from_json_str(json, Path::new("config.json")).unwrap()
    }

    #[test]
    fn state_and_kv_sizes_match_the_spec() {
        let c = qwen35_27b();
        // docs/model.md, "Cache state": 144 MiB of f32 state + ~5.9 MB of f32 conv window per
        // sequence; 64 KiB KV per token in bf16.
        let ssm = 48 * 48 * 128 * 128 * 4;
        assert_eq!(ssm, 144 << 20);
        assert_eq!(state_bytes_per_slot(&c), ssm + 48 * 3 * 10240 * 4);
        assert_eq!(kv_bytes_per_token(&c, false, 2), 64 << 10);
        assert_eq!(
            kv_bytes_per_token(&c, false, 4),
            2 * (64 << 10),
            "f32 KV is twice the bf16 64 KiB"
        );
    }

    #[test]
    fn flags_and_memory_decide_the_pools() {
        let c = qwen35_27b();
        let req = PoolRequest {
            page_size: 16,
            kv_element_bytes: 4,
            max_running_requests: Some(4),
            speculative_steps: 3,
            ..Default::default()
        };
        let plan = plan_pools(
            &c,
            &req,
            Memory::Host {
                available: 100 << 30,
            },
        )
        .unwrap();
        assert_eq!(
            plan.state_slots,
            4 * (1 + 4),
            "each speculating sequence holds k + 1 snapshots"
        );
        assert!(plan.kv_bytes() + plan.state_bytes() <= (30 << 30) + plan.kv_bytes_per_token * 16);
        assert_eq!(plan.context_length, plan.kv_tokens().min(262144));
        let too_small = plan_pools(
            &c,
            &PoolRequest {
                page_size: 16,
                kv_element_bytes: 4,
                max_running_requests: Some(400),
                ..Default::default()
            },
            Memory::Host {
                available: 10 << 30,
            },
        );
        assert!(matches!(
            too_small,
            Err(PlanError::Flag {
                flag: "--max-running-requests",
                ..
            })
        ));
        let ctx = plan_pools(
            &c,
            &PoolRequest {
                page_size: 16,
                kv_element_bytes: 4,
                max_total_tokens: Some(1000),
                context_length: Some(4096),
                ..Default::default()
            },
            Memory::Host {
                available: 100 << 30,
            },
        );
        assert!(matches!(
            ctx,
            Err(PlanError::Flag {
                flag: "--context-length",
                ..
            })
        ));
        let bounded = plan_pools(
            &c,
            &PoolRequest {
                page_size: 16,
                kv_element_bytes: 4,
                max_running_requests: Some(8),
                max_mamba_cache_size: Some(2),
                ..Default::default()
            },
            Memory::Host {
                available: 100 << 30,
            },
        )
        .unwrap();
        assert_eq!(bounded.max_running_requests, 2);
        assert!(bounded
            .notes
            .iter()
            .any(|n| n.contains("--max-mamba-cache-size")));
    }

    /// An H200 after loading the 27B's bf16 weights: 139 GiB total, 85 GiB free.
    const H200: Memory = Memory::Device {
        free: 85 << 30,
        total: 139 << 30,
    };

    #[test]
    fn device_defaults_follow_sglang() {
        let c = qwen35_27b();
        let req = PoolRequest {
            page_size: 16,
            kv_element_bytes: 2,
            ..Default::default()
        };
        let plan = plan_pools(&c, &req, H200).unwrap();
        let budget =
            (85usize << 30) - ((1.0 - DEVICE_MEM_FRACTION) * (139u64 << 30) as f64) as usize;
        assert!(plan.kv_bytes() + plan.state_bytes() <= budget);
        // The state pool's share (0.9 / 1.9 of the budget) in 150 MB slots, one per request.
        let state_share = (budget as f64 * 0.9 / 1.9) as usize;
        assert_eq!(
            plan.max_running_requests,
            state_share / plan.state_bytes_per_slot
        );
        assert!(plan.max_running_requests > 64, "{plan:?}");
        assert_eq!(plan.state_slots, plan.max_running_requests);
        assert!(plan
            .notes
            .iter()
            .any(|n| n.contains("--mamba-full-memory-ratio")));
        assert!(plan.notes.iter().any(|n| n.contains("reserved")));

        // With MTP k=3 every request holds 1 + 4 slots, so fewer run.
        let spec = plan_pools(
            &c,
            &PoolRequest {
                speculative_steps: 3,
                ..req.clone()
            },
            H200,
        )
        .unwrap();
        assert_eq!(
            spec.max_running_requests,
            state_share / (5 * spec.state_bytes_per_slot)
        );
        assert_eq!(spec.state_slots, 5 * spec.max_running_requests);

        // A flag wins over the derivation.
        let fixed = plan_pools(
            &c,
            &PoolRequest {
                max_running_requests: Some(8),
                ..req.clone()
            },
            H200,
        )
        .unwrap();
        assert_eq!(fixed.max_running_requests, 8);
    }

    #[test]
    fn a_bf16_kv_pool_holds_twice_the_tokens_of_an_f32_one() {
        let c = qwen35_27b();
        let bf16 = PoolRequest {
            page_size: 16,
            kv_element_bytes: 2,
            ..Default::default()
        };
        let f32 = PoolRequest {
            kv_element_bytes: 4,
            ..bf16.clone()
        };
        let (half, full) = (
            plan_pools(&c, &bf16, H200).unwrap(),
            plan_pools(&c, &f32, H200).unwrap(),
        );
        assert_eq!(2 * half.kv_bytes_per_token, full.kv_bytes_per_token);
        // The same KV share of the budget, cut into whole blocks.
        assert!(half.kv_bytes().abs_diff(full.kv_bytes()) <= 16 * full.kv_bytes_per_token);
        assert!(
            half.num_kv_blocks.abs_diff(2 * full.num_kv_blocks) <= 1,
            "{} vs {}",
            half.num_kv_blocks,
            full.num_kv_blocks
        );
        // The state pool and so the concurrency do not depend on the KV dtype.
        assert_eq!(half.max_running_requests, full.max_running_requests);
    }

    #[test]
    fn device_fraction_counts_the_weights() {
        let c = qwen35_27b();
        let req = PoolRequest {
            page_size: 16,
            kv_element_bytes: 2,
            mem_fraction_static: Some(0.3),
            ..Default::default()
        };
        // 30 % of 139 GiB is less than the 54 GiB the weights already use: nothing is left.
        let err = plan_pools(&c, &req, H200).unwrap_err();
        assert!(err.to_string().contains("--"), "{err}");
    }

    #[test]
    fn the_prefix_cache_gets_one_snapshot_slot_per_running_request() {
        let c = qwen35_27b();
        let req = PoolRequest {
            page_size: 16,
            kv_element_bytes: 2,
            prefix_cache: true,
            ..Default::default()
        };
        let plan = plan_pools(&c, &req, H200).unwrap();
        assert_eq!(plan.cache_snapshot_slots, plan.max_running_requests);
        assert_eq!(plan.state_slots, 2 * plan.max_running_requests);
        let without = plan_pools(
            &c,
            &PoolRequest {
                prefix_cache: false,
                ..req
            },
            H200,
        )
        .unwrap();
        assert_eq!(without.cache_snapshot_slots, 0);
        assert!(plan.max_running_requests < without.max_running_requests);
    }

    #[test]
    fn host_defaults_stay_modest() {
        let c = qwen35_27b();
        let req = PoolRequest {
            page_size: 16,
            kv_element_bytes: 4,
            ..Default::default()
        };
        let plan = plan_pools(
            &c,
            &req,
            Memory::Host {
                available: 100 << 30,
            },
        )
        .unwrap();
        assert_eq!(plan.max_running_requests, HOST_MAX_RUNNING);
        assert!(plan.kv_bytes() + plan.state_bytes() <= (30 << 30) + plan.kv_bytes_per_token * 16);
    }
}
