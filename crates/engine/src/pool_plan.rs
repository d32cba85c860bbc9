//! Sizing the two cache pools at start-up from the flags and the memory left after loading weights:
//! paged KV blocks for the full-attention layers (MTP layer included) and state slots for the GDN
//! layers (plus snapshot slots for speculative decoding). Memory is planned, not discovered: the plan
//! is printed, and impossible combinations are errors that name the flags.

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
    /// `--mem-fraction-static`: fraction of the memory left after the weights given to the pools.
    pub mem_fraction_static: Option<f64>,
    /// `--page-size`: tokens per KV block.
    pub page_size: usize,
    /// Speculative draft steps k (0 = off); each running sequence then needs k + 1 snapshot slots.
    pub speculative_steps: usize,
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

/// Bytes of KV per token over the full-attention layers (and the MTP layer when speculating), f32
/// as the CPU backends store it.
pub fn kv_bytes_per_token(config: &ModelConfig, with_mtp: bool) -> usize {
    let layers = (0..config.num_hidden_layers)
        .filter(|&i| config.is_full_attention(i))
        .count()
        + usize::from(with_mtp);
    layers * 2 * config.num_key_value_heads * config.head_dim * 4
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

const DEFAULT_MAX_RUNNING: usize = 16;
const DEFAULT_MEM_FRACTION: f64 = 0.3;

/// Plans the pools given `free_bytes` of memory left after the weights.
pub fn plan_pools(
    config: &ModelConfig,
    request: &PoolRequest,
    free_bytes: usize,
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
    let kv_per_token = kv_bytes_per_token(config, request.speculative_steps > 0);
    let state_per_slot = state_bytes_per_slot(config);
    let mut notes = Vec::new();

    let fraction = request.mem_fraction_static.unwrap_or(DEFAULT_MEM_FRACTION);
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(flag_error(
            "--mem-fraction-static",
            fraction,
            "must be in (0, 1]",
        ));
    }
    let budget = (free_bytes as f64 * fraction) as usize;

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
        (None, None) => DEFAULT_MAX_RUNNING,
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
    let state_slots = running_slots * (1 + snapshots);
    let state_bytes = state_slots * state_per_slot;

    let kv_tokens = match request.max_total_tokens {
        Some(tokens) => tokens,
        None => {
            let kv_budget = match request.mamba_full_memory_ratio {
                Some(ratio) if ratio > 0.0 => (budget as f64 / (1.0 + ratio)) as usize,
                Some(ratio) => {
                    return Err(flag_error(
                        "--mamba-full-memory-ratio",
                        ratio,
                        "must be positive",
                    ))
                }
                None => budget.saturating_sub(state_bytes),
            };
            if request.mamba_full_memory_ratio.is_none() && state_bytes > budget {
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
        notes,
    })
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
        // model-architecture.md §4/§5: 144 MiB of fp32 state + ~2.9 MB conv per sequence; 64 KiB KV per token in bf16.
        let ssm = 48 * 48 * 128 * 128 * 4;
        assert_eq!(ssm, 144 << 20);
        assert_eq!(state_bytes_per_slot(&c), ssm + 48 * 3 * 10240 * 4);
        assert_eq!(
            kv_bytes_per_token(&c, false),
            2 * (64 << 10),
            "f32 KV is twice the bf16 64 KiB"
        );
    }

    #[test]
    fn flags_and_memory_decide_the_pools() {
        let c = qwen35_27b();
        let req = PoolRequest {
            page_size: 16,
            max_running_requests: Some(4),
            speculative_steps: 3,
            ..Default::default()
        };
        let plan = plan_pools(&c, &req, 100 << 30).unwrap();
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
                max_running_requests: Some(400),
                ..Default::default()
            },
            10 << 30,
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
                max_total_tokens: Some(1000),
                context_length: Some(4096),
                ..Default::default()
            },
            100 << 30,
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
                max_running_requests: Some(8),
                max_mamba_cache_size: Some(2),
                ..Default::default()
            },
            100 << 30,
        )
        .unwrap();
        assert_eq!(bounded.max_running_requests, 2);
        assert!(bounded.notes[0].contains("--max-mamba-cache-size"));
    }
}
