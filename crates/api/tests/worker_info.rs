//! The endpoints SGLang Model Gateway calls on a worker: /server_info, /model_info (and their
//! get_* names), /get_load and /flush_cache.

mod common;

use std::sync::Arc;

use common::{tokenizer, FakeEngine, TestServer};
use deltaserve_api::ApiKey;
use deltaserve_api::{AppState, EngineCapacity, HealthStatus, ModelIdentity, ServerConfig};
use deltaserve_engine::EngineStats;

fn identity() -> ModelIdentity {
    ModelIdentity {
        model_path: "/models/qwen3.5-demo".into(),
        tokenizer_path: "/models/qwen3.5-tokenizer".into(),
        model_type: "qwen3_5".into(),
        architectures: vec!["Qwen3_5ForConditionalGeneration".into()],
    }
}

fn capacity() -> EngineCapacity {
    EngineCapacity {
        context_length: 8192,
        max_running_requests: 48,
        max_queued_requests: 1024,
        page_size: 16,
        num_kv_blocks: 500,
        state_slots: 49,
        chunked_prefill_size: 256,
    }
}

async fn loaded_server() -> TestServer {
    let server = TestServer::start_with(FakeEngine::replying("hi"), |config| {
        config.model_aliases = vec!["alias".into()];
    })
    .await;
    server.state.set_model_identity(identity());
    server.state.set_engine_capacity(capacity());
    server
}

#[tokio::test]
async fn server_info_names_the_model_and_reports_the_engine_limits() {
    let server = loaded_server().await;
    let reply = server.get("/server_info").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let info = reply.json();
    assert_eq!(info["served_model_name"], "test-model");
    assert_eq!(info["served_model_aliases"][0], "alias");
    assert_eq!(info["model_path"], "/models/qwen3.5-demo");
    assert_eq!(info["tokenizer_path"], "/models/qwen3.5-tokenizer");
    assert_eq!(info["context_length"], 8192);
    assert_eq!(info["max_running_requests"], 48);
    assert_eq!(info["page_size"], 16);
    assert_eq!(info["max_total_num_tokens"], 16 * 500);
    assert_eq!(info["max_mamba_cache_size"], 49);
    assert_eq!(info["dp_size"], 1);
    assert_eq!(server.get("/get_server_info").await.json(), info);
}

#[tokio::test]
async fn model_info_reports_paths_type_and_architectures() {
    let server = loaded_server().await;
    let reply = server.get("/model_info").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let info = reply.json();
    assert_eq!(info["model_path"], "/models/qwen3.5-demo");
    assert_eq!(info["tokenizer_path"], "/models/qwen3.5-tokenizer");
    assert_eq!(info["is_generation"], true);
    assert_eq!(info["model_type"], "qwen3_5");
    assert_eq!(info["architectures"][0], "Qwen3_5ForConditionalGeneration");
    assert_eq!(server.get("/get_model_info").await.json(), info);
}

#[tokio::test]
async fn get_load_reports_requests_kv_tokens_and_pool_usage() {
    let server = loaded_server().await;
    *server.engine.stats.lock().unwrap() = EngineStats {
        running: 3,
        queued: 2,
        kv_blocks_used: 10,
        kv_blocks_total: 500,
        state_slots_used: 3,
        state_slots_total: 49,
        ..Default::default()
    };
    let reply = server.get("/get_load").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let loads = reply.json();
    let ranks = loads.as_array().expect("one entry per data-parallel rank");
    assert_eq!(ranks.len(), 1);
    let load = &ranks[0];
    assert_eq!(load["dp_rank"], 0);
    assert_eq!(load["num_reqs"], 5);
    assert_eq!(load["num_running_reqs"], 3);
    assert_eq!(load["num_waiting_reqs"], 2);
    assert_eq!(load["num_tokens"], 10 * 16);
    assert_eq!(load["kv_usage"], 10.0 / 500.0);
    assert_eq!(load["state_slot_usage"], 3.0 / 49.0);
}

#[tokio::test]
async fn while_loading_the_identity_is_known_and_the_limits_are_null() {
    let state = Arc::new(AppState::new(ServerConfig::new("test-model"), tokenizer()));
    state
        .health
        .set(HealthStatus::Loading("loading weights".into()));
    state.set_model_identity(identity());
    let server = TestServer::serve(state, FakeEngine::replying("hi")).await;

    let info = server.get("/server_info").await;
    assert_eq!(info.status, 200, "{}", info.body);
    assert_eq!(info.json()["model_path"], "/models/qwen3.5-demo");
    assert!(info.json()["max_running_requests"].is_null());

    let load = server.get("/get_load").await;
    assert_eq!(load.status, 200, "{}", load.body);
    assert_eq!(load.json()[0]["num_reqs"], 0);
    assert_eq!(load.json()[0]["num_tokens"], 0);
}

#[tokio::test]
async fn flush_cache_succeeds_and_says_there_was_nothing_to_flush() {
    let server = loaded_server().await;
    for reply in [
        server.post("/flush_cache", &serde_json::json!({})).await,
        server.get("/flush_cache").await,
    ] {
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.json()["success"], true);
        let message = reply.json()["message"].as_str().unwrap().to_owned();
        assert!(message.contains("no prefix cache"), "{message}");
    }
    let wrong_method = common::request(server.addr, "DELETE", "/flush_cache", None).await;
    assert_eq!(wrong_method.error(405)["code"], "method_not_allowed");
}

#[tokio::test]
async fn worker_endpoints_need_the_api_key_when_one_is_set() {
    let server = TestServer::start_with(FakeEngine::replying("hi"), |config| {
        config.api_key = Some(ApiKey::new("secret"));
    })
    .await;
    for path in ["/server_info", "/model_info", "/get_load"] {
        assert_eq!(server.get(path).await.status, 401, "{path}");
        let authorized = server
            .get_with(path, &[("authorization", "Bearer secret")])
            .await;
        assert_eq!(authorized.status, 200, "{path}: {}", authorized.body);
    }
}
