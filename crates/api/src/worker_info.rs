//! What a router asks a worker about itself, in SGLang's spelling, so that SGLang Model Gateway
//! (`sglang-router`) treats deltaserve as a first-class HTTP worker: `/server_info` and
//! `/model_info` (and their older names `/get_server_info`, `/get_model_info`) when it registers a
//! worker, `/get_load` for its load-based policies, `/flush_cache` when told to flush every worker.
//! The gateway takes the worker's model id from `served_model_name` (else `model_path`), and reads
//! `/get_load` as one object per data-parallel rank whose `num_tokens` it sums into the load. With
//! `--dp-size N` the capacity figures of /server_info are each replica's (every replica has the
//! same plan), as SGLang reports them per rank.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use deltaserve_engine::EngineStats;
use serde_json::json;

use crate::state::AppState;

/// What the model is, known before its weights load.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelIdentity {
    /// The model directory (`--model-path`, resolved).
    pub model_path: String,
    /// Where the tokenizer comes from (`--tokenizer-path`, else the model directory).
    pub tokenizer_path: String,
    /// The top-level `model_type` of config.json (e.g. `qwen3_5`).
    pub model_type: String,
    /// `architectures` of config.json.
    pub architectures: Vec<String>,
}

/// The engine's limits, known once the cache pools are planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineCapacity {
    pub context_length: usize,
    pub max_running_requests: usize,
    pub max_queued_requests: usize,
    /// Tokens per paged KV block (SGLang's `--page-size`).
    pub page_size: usize,
    pub num_kv_blocks: usize,
    pub state_slots: usize,
    pub chunked_prefill_size: usize,
}

impl EngineCapacity {
    /// Tokens the KV pool holds (SGLang's `max_total_num_tokens`).
    pub fn max_total_tokens(&self) -> usize {
        self.page_size * self.num_kv_blocks
    }
}

/// `GET /server_info`: the serving settings, with the capacity fields `null` while loading.
pub async fn server_info(State(state): State<Arc<AppState>>) -> Response {
    let identity = state.model_identity();
    let capacity = state.engine_capacity();
    let limit = |f: fn(&EngineCapacity) -> usize| capacity.as_ref().map(f);
    axum::Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "engine": "deltaserve",
        "model_path": identity.model_path,
        "tokenizer_path": identity.tokenizer_path,
        "served_model_name": state.config.model_name,
        "served_model_aliases": state.config.model_aliases,
        "context_length": limit(|c| c.context_length),
        "max_running_requests": limit(|c| c.max_running_requests),
        "max_queued_requests": limit(|c| c.max_queued_requests),
        "page_size": limit(|c| c.page_size),
        "max_total_num_tokens": limit(EngineCapacity::max_total_tokens),
        "max_mamba_cache_size": limit(|c| c.state_slots),
        "chunked_prefill_size": limit(|c| c.chunked_prefill_size),
        "dp_size": state.config.dp_size,
        "tp_size": state.config.tp_size,
        "enable_metrics": state.config.enable_metrics,
    }))
    .into_response()
}

/// `GET /model_info`: the model's identity.
pub async fn model_info(State(state): State<Arc<AppState>>) -> Response {
    let identity = state.model_identity();
    axum::Json(json!({
        "model_path": identity.model_path,
        "tokenizer_path": identity.tokenizer_path,
        "served_model_name": state.config.model_name,
        "is_generation": true,
        "model_type": identity.model_type,
        "architectures": identity.architectures,
        "has_image_understanding": false,
        "has_audio_understanding": false,
    }))
    .into_response()
}

/// `GET /get_load`: one entry per data-parallel replica (`--dp-size`), with SGLang's fields —
/// `num_reqs` running plus waiting, `num_waiting_reqs`, `num_tokens` held in the KV pool by requests
/// (pages only the prefix cache holds are evictable and not counted) — and the pool usage besides.
/// While loading, every figure is 0: nothing is running.
pub async fn get_load(State(state): State<Arc<AppState>>) -> Response {
    let page_size = state.engine_capacity().map_or(0, |c| c.page_size);
    let stats: Vec<EngineStats> = match state.engine() {
        Ok(engine) => {
            let replicas = engine.replicas();
            if replicas.is_empty() {
                vec![engine.stats()]
            } else {
                replicas.iter().map(|r| r.stats()).collect()
            }
        }
        Err(_) => vec![EngineStats::default(); state.config.dp_size.max(1)],
    };
    let entries: Vec<serde_json::Value> = stats
        .iter()
        .enumerate()
        .map(|(rank, stats)| load_entry(rank, stats, page_size))
        .collect();
    axum::Json(entries).into_response()
}

fn load_entry(dp_rank: usize, stats: &EngineStats, page_size: usize) -> serde_json::Value {
    let usage = |used: usize, total: usize| {
        if total == 0 {
            0.0
        } else {
            used as f64 / total as f64
        }
    };
    json!({
        "dp_rank": dp_rank,
        "num_reqs": stats.running + stats.queued,
        "num_running_reqs": stats.running,
        "num_waiting_reqs": stats.queued,
        // Pages only the prefix cache holds are free for the asking: not load.
        "num_tokens": stats.kv_blocks_used.saturating_sub(stats.cached_kv_blocks) * page_size,
        "cached_kv_blocks": stats.cached_kv_blocks,
        "kv_blocks_used": stats.kv_blocks_used,
        "kv_blocks_total": stats.kv_blocks_total,
        "kv_usage": usage(stats.kv_blocks_used, stats.kv_blocks_total),
        "state_slots_used": stats.state_slots_used,
        "state_slots_total": stats.state_slots_total,
        "state_slot_usage": usage(stats.state_slots_used, stats.state_slots_total),
    })
}

/// `POST /flush_cache` (GET too, as SGLang): empties the prefix cache's radix tree before the
/// engine's next step (pages and snapshots that running requests use stay theirs until they end).
/// Without a prefix cache (`--disable-radix-cache`, or still loading) it succeeds and says there
/// was nothing to flush, so that nobody reads the success as "something was freed".
pub async fn flush_cache(State(state): State<Arc<AppState>>) -> Response {
    let flushed = state
        .engine()
        .map(|engine| engine.flush_cache())
        .unwrap_or(false);
    let message = if flushed {
        "Cache flushed: the prefix cache let go of its KV pages and GDN snapshots"
    } else {
        "deltaserve has no prefix cache (--disable-radix-cache, or still loading): there was nothing to flush"
    };
    axum::Json(json!({ "success": true, "message": message })).into_response()
}
